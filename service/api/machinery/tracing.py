"""OpenTelemetry tracing, off unless the standard ``OTEL_*`` variables configure it.

**When it is on** (:func:`tracing_from_environment`): ``OTEL_SDK_DISABLED`` is not ``true``, and
``OTEL_TRACES_EXPORTER`` names exporters (``otlp``, ``otlp_proto_grpc``, ``otlp_proto_http``,
``console``; ``none``: off) or, unset, an OTLP endpoint is given (``OTEL_EXPORTER_OTLP_ENDPOINT``
or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``: ``otlp``). ``otlp`` is sent as
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` says (``grpc``, the
Python SDK's default, or ``http/protobuf``). Everything else is the SDK's, from the same
variables: the endpoint, headers and timeout of the exporter, the sampler
(``OTEL_TRACES_SAMPLER``), the batching (``OTEL_BSP_*``), the resource (``OTEL_SERVICE_NAME``,
default ``besvm``; ``OTEL_RESOURCE_ATTRIBUTES``) and the propagators (``OTEL_PROPAGATORS``,
default W3C ``traceparent`` and baggage).

**What is traced.** A span per HTTP request (:class:`TracingMiddleware`, kind server, named by
method and route template) and per gRPC call (:class:`TracedInferenceServicer`), each the child
of the ``traceparent`` the client sent; inside it a span of the model's work
(:class:`TracedDataPlane`: ``classify`` or ``search``, with the model, its version and the batch
size). Probes and scrapes get none. The context is passed on to everything the request does:
the model's span, and the ``traceparent`` of its payload records.

**When it is off** nothing of it is installed: no middleware, the plain data plane and gRPC
servicer, and the OpenTelemetry packages are not even imported. The variant is chosen once,
when the app is built.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

import service
from service.api.dataplane import DataPlane
from service.api.machinery.observability import QUIET_PATHS, current_request, route_of
from service.api.protocol.grpc import SERVICE, InferenceServicer

EXPORTER_GROUP = "opentelemetry_traces_exporter"
EXPORTER_BY_PROTOCOL = {"grpc": "otlp_proto_grpc", "http/protobuf": "otlp_proto_http"}
DEFAULT_SERVICE_NAME = "besvm"
# gRPC calls that are probes: no span, as the HTTP probes.
QUIET_CALLS = frozenset({"ServerLive", "ServerReady"})


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters the environment asks for, as the SDK's entry points name them; empty:
    tracing is off (see the module docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not names:
        endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        names = "otlp" if any(environ.get(e, "").strip() for e in endpoints) else "none"
    chosen = []
    for name in (n.strip() for n in names.split(",")):
        if name in ("", "none"):
            continue
        if name == "otlp":
            protocol = (
                environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "grpc"
            ).strip()
            if protocol not in EXPORTER_BY_PROTOCOL:
                raise ValueError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r}: grpc or http/protobuf "
                    "(http/json is not supported by the OpenTelemetry Python SDK)"
                )
            name = EXPORTER_BY_PROTOCOL[protocol]
        chosen.append(name)
    return chosen


class Tracing:
    """A tracer provider exporting to ``names`` (the SDK's exporter entry points), and the
    traced variants of the service's parts.

    Parameters
    ----------
    names : list of str
    environ : Mapping
        Where OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are looked up (the exporters,
        sampler and processors read ``os.environ`` themselves, as the SDK does).
    """

    def __init__(self, names: list[str], environ: Mapping[str, str]) -> None:
        from opentelemetry import propagate, trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        attributes = {}
        named = "service.name=" in environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
        if not environ.get("OTEL_SERVICE_NAME") and not named:
            attributes["service.name"] = DEFAULT_SERVICE_NAME
        self.provider = TracerProvider(resource=Resource.create(attributes))
        for name in names:
            found = list(entry_points(group=EXPORTER_GROUP, name=name))
            if not found:
                available = sorted(e.name for e in entry_points(group=EXPORTER_GROUP))
                raise ValueError(f"OTEL_TRACES_EXPORTER {name!r}: not installed; {available}")
            self.provider.add_span_processor(BatchSpanProcessor(found[0].load()()))
        self.tracer = self.provider.get_tracer("service.api", service.__version__)
        self.trace = trace
        self.propagate = propagate
        self.server_kind = trace.SpanKind.SERVER
        self.error = trace.Status(trace.StatusCode.ERROR)

    def extract(self, carrier: Mapping[str, str]) -> Any:
        """The context of a request's ``traceparent`` (and what the propagators read)."""
        return self.propagate.extract(carrier)

    def recording(self) -> bool:
        """Whether the current span records (its request was sampled)."""
        return self.trace.get_current_span().is_recording()

    def traceparent(self) -> str | None:
        """The current span's W3C ``traceparent`` (None outside a sampled span)."""
        carrier: dict[str, str] = {}
        self.propagate.inject(carrier)
        return carrier.get("traceparent")

    def shutdown(self) -> None:
        """Export what is pending (within the processors' timeouts), then stop."""
        self.provider.shutdown()


def tracing_from_environment(environ: Mapping[str, str] | None = None) -> Tracing | None:
    """The process's tracing, or None when the environment does not configure it."""
    environ = os.environ if environ is None else environ
    names = exporter_names(environ)
    return Tracing(names, environ) if names else None


# -- the traced variants -----------------------------------------------------------------------


class TracingMiddleware:
    """ASGI middleware: a server span per HTTP request but probes and scrapes, the child of the
    request's ``traceparent``, current while the request is served."""

    def __init__(self, app: ASGIApp, tracing: Tracing, routes: list) -> None:
        self.app = app
        self.tracing = tracing
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in QUIET_PATHS:
            await self.app(scope, receive, send)
            return
        tracing = self.tracing
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in (b"traceparent", b"tracestate", b"baggage")
        }
        method = scope["method"]
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with tracing.tracer.start_as_current_span(
            method,
            context=tracing.extract(carrier),
            kind=tracing.server_kind,
            attributes={"http.request.method": method, "url.path": scope["path"]},
        ) as span:
            try:
                await self.app(scope, receive, send_status)
            finally:
                route = route_of(scope, self.routes)
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                request = current_request()
                if request is not None:
                    span.set_attribute("besvm.request_id", request.request_id)
                if status >= 500:
                    span.set_status(tracing.error)


class TracedDataPlane(DataPlane):
    """The data plane, each classification and search in a span of the model's work: the
    model and version that answered, and the batch size."""

    tracing: Tracing

    async def classify(self, *args, **kwargs):
        if not self.tracing.recording():  # the request is not sampled: nor is its work
            return await super().classify(*args, **kwargs)
        with self.tracing.tracer.start_as_current_span("classify") as span:
            snapshot, answers = await super().classify(*args, **kwargs)
            span.set_attributes(_model_attributes(snapshot, len(answers)))
            return snapshot, answers

    async def search(self, *args, **kwargs):
        if not self.tracing.recording():
            return await super().search(*args, **kwargs)
        with self.tracing.tracer.start_as_current_span("search") as span:
            snapshot, result = await super().search(*args, **kwargs)
            span.set_attributes(_model_attributes(snapshot, 1))
            span.set_attribute("besvm.search_version", snapshot.search_version or "")
            return snapshot, result


def _model_attributes(snapshot, batch_size: int) -> dict[str, Any]:
    return {
        "besvm.model": snapshot.name,
        "besvm.model_version": snapshot.version,
        "besvm.batch_size": batch_size,
    }


def traced_data_plane(tracing: Tracing | None) -> type[DataPlane]:
    """The data plane class of an app: traced when ``tracing`` is on."""
    if tracing is None:
        return DataPlane
    return type("TracedDataPlane", (TracedDataPlane,), {"tracing": tracing})


class TracedInferenceServicer(InferenceServicer):
    """The gRPC servicer, each call but the probes in a server span, the child of the
    ``traceparent`` of its metadata."""

    tracing: Tracing

    async def _serve(self, method, needed, context, answer):
        if method in QUIET_CALLS:
            return await super()._serve(method, needed, context, answer)
        tracing = self.tracing
        carrier = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        with tracing.tracer.start_as_current_span(
            f"{SERVICE}/{method}",
            context=tracing.extract(carrier),
            kind=tracing.server_kind,
            attributes={"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                return await super()._serve(method, needed, context, answer)
            finally:
                code = context.code()
                value = 0 if code is None else code.value[0]
                span.set_attribute("rpc.grpc.status_code", value)
                if value:
                    span.set_status(tracing.error)


def traced_servicer(tracing: Tracing | None) -> type[InferenceServicer]:
    """The gRPC servicer class of an app: traced when ``tracing`` is on."""
    if tracing is None:
        return InferenceServicer
    return type("TracedInferenceServicer", (TracedInferenceServicer,), {"tracing": tracing})
