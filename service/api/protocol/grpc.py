"""The Open Inference Protocol over gRPC (``inference.GRPCInferenceService``, as KServe,
MLServer and Triton serve it), beside REST, on ``GRPC_PORT``.

Thin, as the REST routes are: the same data plane finds the model, applies the limits and runs
the work; the request's tensor goes through the REST protocol's decoding
(:func:`service.api.protocol.tensors.decode_request`, which sees typed ``contents`` as JSON ``data``
and ``raw_input_contents`` as binary tensor data), and the answer's tensors are those of
:func:`~service.api.protocol.tensors.output_tensors`, sent as ``raw_output_contents`` (as Triton
does, and as tritonclient reads them).

Around every call (:meth:`InferenceServicer._serve`): the request id (``x-request-id``
metadata, answered in the trailing metadata with ``x-model-version``), the API key
(``authorization: Bearer <key>`` or ``x-api-key`` metadata;
:class:`~service.api.machinery.auth.AccessPolicy`), the client's deadline (the work is waited for
at most
that long: DEADLINE_EXCEEDED), the errors as gRPC status codes, the
metrics (``besvm_grpc_requests_total``, ``besvm_grpc_request_duration_seconds``) and the access
line (method ``GRPC``). Messages over ``MAX_REQUEST_BYTES`` are refused by gRPC itself
(RESOURCE_EXHAUSTED).

Before a call's handler runs (:class:`CallGate`), on its headers alone: the key is checked
(refused calls never have their message read), and a slot of MAX_CONCURRENT_REQUESTS is taken
(UNAVAILABLE when none is free; health calls, ServerLive, ServerReady and ModelReady, take
none). Then its message must arrive within BODY_TIMEOUT_S of the call's start
(DEADLINE_EXCEEDED after), and takes its bytes from the process's one
:class:`~service.api.machinery.limits.MemoryBudget` (``MAX_BUFFERED_BYTES``), the budget HTTP
bodies take theirs from: counted twice (the bytes received and the message parsed from them) as
soon as it has arrived and before it is parsed, typed contents' values as they are decoded, and
given back when the call ends, however it ends. A message that finds no room is never parsed:
UNAVAILABLE (HTTP's 503), as Triton answers a full queue and as gRPC's retry policies expect of
a condition that passes; one larger than the whole budget on its own RESOURCE_EXHAUSTED (HTTP's
413, as gRPC answers a message over its size limit). One connection has at most
GRPC_MAX_STREAMS streams open at once (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS).

The server runs on the worker's event loop, started and stopped by the app's lifespan: each
worker process binds ``GRPC_PORT`` with SO_REUSEPORT (so that with ``WORKERS`` > 1 every worker
serves gRPC on the one port, the kernel spreading the connections), and SIGTERM drains it
as it drains HTTP (:func:`drain_on_signals`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from grpc import aio

import service
from service.api.dataplane import DataPlane
from service.api.errors import (
    BodyTimeoutError,
    LoadRefusedError,
    OverloadedError,
    RateLimitedError,
    status_of,
)
from service.api.machinery.auth import (
    Access,
    AccessPolicy,
    ForbiddenError,
    Key,
    MissingKeyError,
    identify,
    key_headers,
    presented_key,
)
from service.api.machinery.limits import (
    BODY_COPIES,
    DECODED_BYTES_PER_VALUE,
    MemoryBudget,
    RequestHold,
    concurrency_bound,
)
from service.api.machinery.metrics import Metrics
from service.api.machinery.observability import REQUEST_ID_HEADER, log_access, request_scope
from service.api.machinery.payloads import PayloadLog
from service.api.machinery.responses import VERSION_HEADER
from service.api.machinery.tls import TlsFiles
from service.api.protocol import inference_pb2 as pb
from service.api.protocol import inference_pb2_grpc as pb_grpc
from service.api.protocol.rest import EXTENSIONS, SERVER_NAME
from service.api.protocol.schemas import ProtocolInput, ProtocolOutput, ProtocolRequest
from service.api.protocol.tensors import (
    BINARY_DATA_SIZE,
    ModelInputs,
    classification,
    decode_request,
    model_metadata,
    output_tensors,
)
from service.api.registry import ModelState
from service.api.settings import Settings
from service.model import InvalidInputError, ModelError, ModelNotReadyError, NotFoundError

logger = logging.getLogger("service.api")

SERVICE = "inference.GRPCInferenceService"
# The HTTP status of a domain error (service.api.errors, the one mapping) as a gRPC code.
_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
# Where typed contents hold each datatype's values (FP16 has no field: raw contents only).
CONTENTS_FIELDS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_LENGTH_PREFIX = 4
# What the call under way in this task holds (see :class:`CallGate`): set by the gate before its
# message is read, in the call's own task, where the gRPC library also parses the message and
# runs the handler.
_CALL: contextvars.ContextVar[CallState | None] = contextvars.ContextVar(
    "besvm_grpc_call", default=None
)
# Calls answered however busy the server is: they take no slot of MAX_CONCURRENT_REQUESTS (an
# orchestrator's probe must never be turned away by the load it probes).
HEALTH_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
# Calls every client may make, and those of the repository extension (an admin key).
OPEN_METHODS = frozenset({"ServerLive", "ServerReady"})
ADMIN_METHODS = frozenset({"RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"})


@dataclass(eq=False)
class CallState:
    """One call's standing, from its start to its end: its bytes of the memory budget, the key
    that allowed it, or the error that refused it (the handler answers it)."""

    hold: RequestHold
    error: Exception | None = None
    key: Key | None = None
    checked: bool = False


_INTERNAL = grpc.StatusCode.INTERNAL
_MODEL_INFER = f"/{SERVICE}/ModelInfer"
_JSON = "application/json"


def _code_of(error: ModelError) -> grpc.StatusCode:
    """The gRPC status code of a domain error (its HTTP status's, see :data:`_CODES`)."""
    return _CODES.get(status_of(error)[0], _INTERNAL)


def _parameter_value(parameter) -> Any:
    choice = parameter.WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameter, choice)


def _parameters(parameters) -> dict[str, Any] | None:
    return {name: _parameter_value(value) for name, value in parameters.items()} or None


def _length_prefixed(elements: Sequence[bytes]) -> bytes:
    """BYTES elements as the protocol's raw form: each a 4-byte little-endian length, then it."""
    return b"".join(len(e).to_bytes(_LENGTH_PREFIX, "little") + e for e in elements)


def typed_values(request: pb.ModelInferRequest) -> int:
    """The values of the request's typed contents (what decoding them turns into objects)."""
    if request.raw_input_contents:
        return 0
    return sum(
        len(getattr(tensor.contents, CONTENTS_FIELDS[tensor.datatype]))
        for tensor in request.inputs
        if tensor.datatype in CONTENTS_FIELDS
    )


class CallGate(aio.ServerInterceptor):
    """What happens to a call before its handler runs, on its headers alone and then its
    message: the key is checked, a slot is taken (health calls take none), the message is
    waited for at most ``message_timeout_s`` and counted in the process's
    :class:`MemoryBudget` as it arrives, before it is parsed.

    grpcio's own limit (``maximum_concurrent_rpcs``) takes a slot as a call's headers arrive,
    before anything can look at them, and holds it while the message trickles in: slow calls
    without a key, as many as the limit, would turn every call away, health included.
    Here each unary method is served as a stream of one message, so that the handler runs
    before the message is read; a call refused (no valid key, no slot) never has its message
    read, and a slot is held only by a call with a key (when keys are required) and only until
    BODY_TIMEOUT_S if its message does not come. The refusal, like any error, is answered by
    the servicer (:meth:`InferenceServicer._serve`: status, metrics, access line).

    Parameters
    ----------
    budget : MemoryBudget
        The one the HTTP server counts its bodies in.
    servicer : InferenceServicer
        Says what each method needs (:meth:`InferenceServicer.access`).
    max_calls : int
        Calls under way at once, health calls aside (MAX_CONCURRENT_REQUESTS).
    message_timeout_s : float
        Seconds from a call's start for its message to arrive (BODY_TIMEOUT_S).
    """

    def __init__(
        self,
        budget: MemoryBudget,
        servicer: InferenceServicer,
        max_calls: int,
        message_timeout_s: float,
    ) -> None:
        self.budget = budget
        self.servicer = servicer
        self.max_calls = max_calls
        self.message_timeout_s = message_timeout_s
        self.calls = 0
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        gated = self._handlers.get(method)
        if gated is None:
            handler = await continuation(handler_call_details)
            if handler is None or handler.request_streaming or handler.response_streaming:
                return handler  # the protocol's calls are all unary
            gated = self._handlers[method] = grpc.stream_unary_rpc_method_handler(
                self._gated(method.rsplit("/", 1)[-1], handler.unary_unary),
                request_deserializer=self._counting(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return gated

    def _gated(self, name: str, behavior: Callable[[Any, Any], Awaitable[Any]]):
        slotted = name not in HEALTH_METHODS
        servicer = self.servicer

        async def handle(requests, context: aio.ServicerContext) -> Any:
            state = CallState(RequestHold(self.budget))
            token = _CALL.set(state)
            slot = False
            request = None
            try:
                try:
                    state.key = servicer.policy.check(
                        servicer.access(name),
                        presented_key(*key_headers(context.invocation_metadata() or ())),
                    )
                    state.checked = True
                    if slotted:
                        self._take_slot()
                        slot = True
                    request = await self._message(requests)
                except (MissingKeyError, ForbiddenError, ModelError) as error:
                    state.error = error
                return await behavior(request, context)
            finally:
                if slot:
                    self.calls -= 1
                state.hold.release()
                _CALL.reset(token)

        return handle

    def _take_slot(self) -> None:
        if self.calls >= self.max_calls:
            raise OverloadedError(
                f"the server is at its limit of {self.max_calls} concurrent gRPC calls "
                "(MAX_CONCURRENT_REQUESTS); try again shortly"
            )
        self.calls += 1

    async def _message(self, requests) -> Any:
        try:
            async with asyncio.timeout(self.message_timeout_s):
                return await anext(requests)
        except TimeoutError:
            raise BodyTimeoutError(
                f"the call's message did not arrive within {self.message_timeout_s:g} s of its "
                "start (BODY_TIMEOUT_S)"
            ) from None
        except StopAsyncIteration:
            raise InvalidInputError("the call ended without its message") from None

    def _counting(self, parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
        """The message counted in the call's hold (:data:`BODY_COPIES` times, the first
        :data:`~service.api.machinery.limits.UNCOUNTED_BYTES` free, as an HTTP body), before
        it is parsed; one that does not fit is not parsed (its handler answers the refusal)."""

        def counted(raw: bytes) -> Any:
            state = _CALL.get()
            if state is not None:
                try:
                    state.hold.add(BODY_COPIES * len(raw), "the message")
                except ModelError as error:
                    state.error = error
                    return None
            return parse(raw)

        return counted


def infer_request(request: pb.ModelInferRequest) -> tuple[ProtocolRequest, bytes]:
    """A gRPC inference request as the protocol's request and binary data: typed
    contents become ``data`` (BYTES: binary data), ``raw_input_contents`` binary data."""
    inputs, binary = [], b""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInputError(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs"
        )
    for index, tensor in enumerate(request.inputs):
        if any(dimension < 0 for dimension in tensor.shape):
            raise InvalidInputError(f"input {tensor.name!r}: a dimension of {tensor.shape} < 0")
        data = None
        parameters = _parameters(tensor.parameters) or {}
        if raw:
            binary = raw[index]
            parameters[BINARY_DATA_SIZE] = len(binary)
        else:
            field = CONTENTS_FIELDS.get(tensor.datatype)
            if field is None and tensor.datatype == "FP16":
                raise InvalidInputError("FP16 has no typed contents: send raw_input_contents")
            values = getattr(tensor.contents, field) if field is not None else ()
            if field == "bytes_contents":
                binary = _length_prefixed(values)
                parameters[BINARY_DATA_SIZE] = len(binary)
            else:
                data = list(values)
                if not data and tensor.contents.ByteSize():
                    raise InvalidInputError(
                        f"input {tensor.name!r} of {tensor.datatype} holds its values in "
                        f"contents.{field}"
                    )
        shape = list(tensor.shape)
        inputs.append(ProtocolInput(tensor.name, shape, tensor.datatype, parameters or None, data))
    top_k, explain = (_count_parameter(request.parameters, name) for name in ("top_k", "explain"))
    outputs = [ProtocolOutput(o.name, _parameters(o.parameters)) for o in request.outputs]
    protocol = ProtocolRequest(inputs, outputs or None, top_k, request.id or None, explain)
    return protocol, binary


def _count_parameter(parameters, name: str) -> int | None:
    """The request parameter ``name``, an integer of at least 1, or None when absent."""
    value = _parameter_value(parameters[name]) if name in parameters else None
    if value is not None and (type(value) is not int or value < 1):
        raise InvalidInputError(f"parameters.{name} must be an integer of at least 1")
    return value


def _raw_tensor(datatype: str, data: list) -> bytes:
    if datatype == "BYTES":
        return _length_prefixed([element.encode() for element in data])
    return np.asarray(data, dtype="<f8").tobytes()


def _tensor_metadata(tensor: dict[str, Any]) -> pb.ModelMetadataResponse.TensorMetadata:
    metadata = pb.ModelMetadataResponse.TensorMetadata(
        name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"]
    )
    for name, value in (tensor.get("parameters") or {}).items():
        # Lists and objects (the classes, the measures) as JSON text in a string parameter.
        metadata.parameters[name].string_param = json.dumps(value)
    return metadata


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """The protocol's calls on one data plane (see the module docstring).

    Parameters
    ----------
    plane : DataPlane
    policy : AccessPolicy
    metrics : Metrics
    """

    def __init__(
        self,
        plane: DataPlane,
        policy: AccessPolicy,
        metrics: Metrics,
        payloads: PayloadLog | None = None,
    ) -> None:
        self.plane = plane
        self.policy = policy
        self.metrics = metrics
        self.payloads = payloads

    def access(self, method: str) -> Access:
        """What a call of ``method`` needs (the gate checks it on the call's headers; each method
        gives :meth:`_serve` the same): nothing for liveness and readiness, an admin key for the
        repository extension, else what the REST routes need (a key once API_KEYS_FILE is
        set)."""
        if method in OPEN_METHODS:
            return Access.OPEN
        if method in ADMIN_METHODS:
            return Access.ADMIN
        return self.policy.default

    async def _serve(
        self,
        method: str,
        needed: Access,
        context: aio.ServicerContext,
        answer: Callable[[], Awaitable[Any]],
    ) -> Any:
        """Run ``answer`` as a call of ``method``: request id, key (checked by the
        :class:`CallGate` on the call's headers, as :meth:`access` says; here, ``needed``,
        without one), deadline, errors, metrics and the access line."""
        started = time.perf_counter()
        pairs = context.invocation_metadata() or ()
        metadata = dict(pairs)
        code, message, result = grpc.StatusCode.OK, "", None
        state = _CALL.get()
        with request_scope(metadata.get(REQUEST_ID_HEADER)) as request:
            # Answered in the trailing metadata, which travels with the status: a separate
            # send of initial metadata costs every call a write.
            trailing = [(REQUEST_ID_HEADER, request.request_id)]
            try:
                if state is not None and state.error is not None:
                    raise state.error
                if state is not None and state.checked:
                    key = state.key
                else:
                    key = self.policy.check(needed, presented_key(*key_headers(pairs)))
                identify(key)
                remaining = context.time_remaining()
                if remaining is not None and remaining <= 0:
                    # No work for a call already late: work that never yields (a small batch
                    # run inline) would finish before the timeout below could interrupt it.
                    raise TimeoutError
                async with asyncio.timeout(remaining):
                    result = await answer()
                version = getattr(result, "model_version", "")
                if version:
                    trailing.append((VERSION_HEADER, version))
            except TimeoutError:
                code = grpc.StatusCode.DEADLINE_EXCEEDED
                message = "the call's deadline passed before its work finished"
            except MissingKeyError as error:
                code, message = grpc.StatusCode.UNAUTHENTICATED, str(error)
            except ForbiddenError as error:
                code, message = grpc.StatusCode.PERMISSION_DENIED, str(error)
            except ModelError as error:
                code, message = _code_of(error), str(error)
                if isinstance(error, RateLimitedError):
                    trailing.append(("retry-after", error.retry_after()))
                if code is _INTERNAL:
                    logger.error("gRPC %s failed: %s", method, error)
            except asyncio.CancelledError:
                code, message = grpc.StatusCode.CANCELLED, "cancelled"
                raise
            except Exception:
                logger.exception("unhandled error in gRPC %s", method)
                code, message = grpc.StatusCode.INTERNAL, "internal error; the server log has it"
            finally:
                seconds = time.perf_counter() - started
                self.metrics.grpc_finished(method, request.model, code.name, seconds)
                log_access(
                    "GRPC", f"/{SERVICE}/{method}", code.name, seconds, context.peer(), request.key
                )
            if code is not grpc.StatusCode.OK:
                await context.abort(code, message, tuple(trailing))
            context.set_trailing_metadata(tuple(trailing))
            return result

    # -- health and metadata -------------------------------------------------------------------

    async def ServerLive(self, request, context):
        async def answer():
            return pb.ServerLiveResponse(live=True)

        return await self._serve("ServerLive", Access.OPEN, context, answer)

    async def ServerReady(self, request, context):
        async def answer():
            return pb.ServerReadyResponse(ready=self.plane.readiness()[0])

        return await self._serve("ServerReady", Access.OPEN, context, answer)

    async def ServerMetadata(self, request, context):
        async def answer():
            return pb.ServerMetadataResponse(
                name=SERVER_NAME, version=service.__version__, extensions=EXTENSIONS
            )

        return await self._serve("ServerMetadata", self.policy.default, context, answer)

    async def ModelReady(self, request, context):
        async def answer():
            try:
                self.plane.snapshot(request.name, request.version or None)
            except (ModelNotReadyError, NotFoundError):  # as REST answers tritonclient
                return pb.ModelReadyResponse(ready=False)
            return pb.ModelReadyResponse(ready=True)

        return await self._serve("ModelReady", self.policy.default, context, answer)

    async def ModelMetadata(self, request, context):
        async def answer():
            snapshot = self.plane.snapshot(request.name, request.version or None)
            meta = model_metadata(snapshot.predictor, snapshot.name, snapshot.version)
            return pb.ModelMetadataResponse(
                name=meta["name"],
                versions=meta["versions"],
                platform=meta["platform"],
                inputs=[_tensor_metadata(t) for t in meta["inputs"]],
                outputs=[_tensor_metadata(t) for t in meta["outputs"]],
            )

        return await self._serve("ModelMetadata", self.policy.default, context, answer)

    # -- inference -----------------------------------------------------------------------------

    async def ModelInfer(self, request, context):
        async def answer():
            name, version = request.model_name, request.model_version or None
            plane = self.plane
            predictor = plane.snapshot(name, version).predictor

            def decoded() -> tuple[ProtocolRequest, ModelInputs, tuple[str, ...]]:
                body, binary = infer_request(request)
                return body, *decode_request(body, binary, predictor, plane.max_batch_size)

            values, state = typed_values(request), _CALL.get()
            if values and state is not None:
                state.hold.add(DECODED_BYTES_PER_VALUE * values, f"decoding {values:,} values")
            # A large message's values are converted off the event loop, as REST's are.
            body, inputs, names = await plane.convert(request.ByteSize(), decoded)
            k = plane.default_top_k if body.top_k is None else body.top_k
            snapshot, answers = await plane.classify(
                name, **classification(inputs, names, body, k), version=version
            )
            tensors = output_tensors(answers, snapshot.predictor.classes, names, k)
            response = pb.ModelInferResponse(
                model_name=snapshot.name, model_version=snapshot.version, id=request.id
            )
            for tensor in tensors:
                response.outputs.add(
                    name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"]
                )
                response.raw_output_contents.append(_raw_tensor(tensor["datatype"], tensor["data"]))
            return response

        payloads = self.payloads
        if payloads is None or not payloads.sampled():
            return await self._serve("ModelInfer", self.policy.default, context, answer)

        async def recorded():
            try:
                response = await answer()
            except Exception as error:
                code = _code_of(error) if isinstance(error, ModelError) else None
                failure = json.dumps({"error": str(error)}).encode()  # as REST's protocol says
                status = (code or _INTERNAL).name
                payloads.record(_MODEL_INFER, request, "", failure, _JSON, status, None)
                raise
            payloads.record(_MODEL_INFER, request, "", response, "", "OK", response.model_version)
            return response

        return await self._serve("ModelInfer", self.policy.default, context, recorded)

    # -- the repository extension --------------------------------------------------------------

    async def RepositoryIndex(self, request, context):
        async def answer():
            entries = await self.plane.registry.sync()
            return pb.RepositoryIndexResponse(
                models=[
                    pb.RepositoryIndexResponse.ModelIndex(
                        name=entry.name,
                        version=entry.describe().get("version") or "",
                        state=str(entry.state),
                        reason=entry.reason or "",
                    )
                    for entry in entries
                    if not request.ready or entry.state == ModelState.READY
                ]
            )

        return await self._serve("RepositoryIndex", Access.ADMIN, context, answer)

    async def RepositoryModelLoad(self, request, context):
        async def answer():
            entry = await self.plane.registry.load(request.model_name)
            if entry.reason is not None:
                raise LoadRefusedError(entry.reason)
            return pb.RepositoryModelLoadResponse()

        return await self._serve("RepositoryModelLoad", Access.ADMIN, context, answer)

    async def RepositoryModelUnload(self, request, context):
        async def answer():
            await self.plane.registry.unload(request.model_name)
            return pb.RepositoryModelUnloadResponse()

        return await self._serve("RepositoryModelUnload", Access.ADMIN, context, answer)


async def start_grpc_server(
    settings: Settings,
    plane: DataPlane,
    policy: AccessPolicy,
    metrics: Metrics,
    budget: MemoryBudget,
    payloads: PayloadLog | None = None,
    servicer: type[InferenceServicer] | None = None,
) -> aio.Server:
    """Serve the protocol on ``HOST:GRPC_PORT`` (over TLS when TLS_CERT_FILE is set), its
    messages counted in ``budget`` (the process's, shared with HTTP)."""
    options = [
        ("grpc.max_receive_message_length", settings.max_request_bytes),
        # Streams one connection may have open at once (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS):
        # a client opens more only as others end.
        ("grpc.max_concurrent_streams", settings.grpc_max_streams),
        ("grpc.max_send_message_length", -1),
        # Workers share the port (the kernel spreads the connections); a lone server must not
        # share it unknowingly with another process.
        ("grpc.so_reuseport", 1 if settings.workers > 1 else 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]
    served = (servicer or InferenceServicer)(plane, policy, metrics, payloads)
    # Each call's message is held by the gRPC library while it arrives, before it can be
    # counted: the calls under way are bounded as the process's work is, by the gate (grpcio's
    # own bound, maximum_concurrent_rpcs, takes its slots before any key is seen).
    gate = CallGate(budget, served, concurrency_bound(settings), settings.body_timeout_s)
    server = aio.server(interceptors=[gate], options=options)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(served, server)
    address = f"{settings.host}:{settings.grpc_port}"
    tls = TlsFiles.from_settings(settings)
    if tls is None:
        server.add_insecure_port(address)
    else:
        server.add_secure_port(address, tls.grpc_credentials())
    await server.start()
    logger.info("gRPC (Open Inference Protocol) on %s%s", address, "" if tls is None else ", TLS")
    return server


def drain_on_signals(on_signal: Callable[[], None]) -> None:
    """Call ``on_signal`` on the running loop when SIGTERM or SIGINT arrives, before the handler
    in place (uvicorn's, which starts the HTTP drain). Only where signals can be handled (the
    main thread); elsewhere (a test client's thread) nothing is installed."""
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(signum)

        def handler(number, frame, previous=previous):
            loop.call_soon_threadsafe(on_signal)
            if callable(previous):
                previous(number, frame)

        with contextlib.suppress(ValueError):
            signal.signal(signum, handler)
