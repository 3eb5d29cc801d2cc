"""The application factory."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from grpc import aio as grpc_aio
from pydantic import BaseModel

import service
from service.api.dataplane import DataPlane
from service.api.errors import install_error_handlers
from service.api.machinery import observability, tls
from service.api.machinery.auth import AccessPolicy, KeyCheckMiddleware, KeyStore, document_security
from service.api.machinery.hotpath import HotRoutes
from service.api.machinery.limits import MemoryBudget, install_limits
from service.api.machinery.metrics import Metrics, PrometheusMetrics
from service.api.machinery.payloads import PayloadLog, payload_log
from service.api.machinery.tracing import (
    TracingMiddleware,
    traced_data_plane,
    traced_servicer,
    tracing_from_environment,
)
from service.api.protocol import rest as protocol_rest
from service.api.protocol.grpc import InferenceServicer, drain_on_signals, start_grpc_server
from service.api.registry import ModelRegistry, off_loop
from service.api.repository import Repository
from service.api.rest import admin, catalogue, routes
from service.api.settings import DEFAULT_MODEL_DIR, Settings
from service.model.search.remote import CatalogueSource, SearchCluster
from service.model.threads import limit_threads
from service.probes import Heartbeat

logger = logging.getLogger("service.api")

DESCRIPTION = """
Large-margin classifiers on similarity measures, a whole repository of models per process.

**POST /classify** compares each instance with a small basis of training items under the
model's similarity measures, normalises the similarities and applies a one-vs-rest linear SVM.
See **GET /v1/models** for the models, their states, input shapes and classes.

**POST /search** ranks a precomputed catalogue for a class, a sparse code over the model's
Union-of-Subspaces dictionary, or a few examples of something new (a code learned on the fly),
reading only the catalogue rows where the code is non-zero. **GET /v1/models/{name}/atoms/{a}**
shows the items one atom stands for.

`/classify` and `/search` answer for the default model; `/v1/models/{name}/classify` and
`/v1/models/{name}/search` for any model by name. Every answer names the model version that
computed it (the sha256 of its manifest), in its body and in the `X-Model-Version` header.
New versions are swapped in without downtime (`/v2/repository/...`, SIGHUP or
RELOAD_INTERVAL_S).

The **Open Inference Protocol** (KServe V2 REST, as KServe, MLServer and Triton speak it) is
served beside: `GET /v2`, `/v2/health/live|ready`, `GET /v2/models/{name}[/ready]` and
`POST /v2/models/{name}/infer` (input `input`, numeric `[n, ...]`, or `text`, BYTES `[n]`;
outputs `label`, `scores`, `top_k_labels`, `top_k_scores`).

Errors have the body `{"error": {"type", "message", "details"?}}`, except on the protocol's
routes (`/v2`, `/v2/health/...`, `/v2/models/...`), where they take the protocol's
`{"error": "message"}` and a malformed request is a 400.
"""


def repository_of(settings: Settings) -> Repository:
    """The models a server with ``settings`` serves."""
    links, traffic = settings.allow_external_symlinks, settings.traffic_file
    if settings.model_repository is not None:
        return Repository(settings.model_repository, False, links, traffic)
    return Repository(settings.model_dir or DEFAULT_MODEL_DIR, True, links, traffic)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service. Nothing is loaded until the app starts (lifespan).

    Parameters
    ----------
    settings : Settings, optional
        Defaults to reading the environment.
    """
    settings = settings or Settings()
    # One set of metrics per app (and per process: in multi-process mode they are its files).
    metrics = PrometheusMetrics(settings.prometheus_multiproc_dir)
    keys = KeyStore(settings)
    policy = AccessPolicy(keys, settings)
    # The request bytes the process holds at once: one budget for HTTP bodies and gRPC messages.
    budget = MemoryBudget(settings.max_buffered_bytes)
    # Sampled requests and answers (PAYLOAD_LOG_RATE), None when none are.
    payloads = payload_log(settings, metrics)
    # OpenTelemetry (OTEL_*), None when off: then nothing of it is installed.
    tracing = tracing_from_environment()
    plane_class = traced_data_plane(tracing)
    if payloads is not None and tracing is not None:
        payloads.traceparent = tracing.traceparent

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        cluster = await search_cluster(settings)
        registry = ModelRegistry(
            repository_of(settings),
            settings.default_model,
            metrics,
            settings.load_timeout_s,
            CatalogueSource(cluster),
        )
        plane = app.state.dataplane = plane_class(registry, settings, metrics)
        async with beating(settings, plane), serving(registry, plane, cluster):
            yield

    @asynccontextmanager
    async def serving(registry: ModelRegistry, plane: DataPlane, cluster: SearchCluster | None):
        """The models loaded and served (and gRPC, and the rescans) within the ``async with``;
        everything closed at its end."""
        # The server owns its threads: numba's parallel kernels use the cores, so BLAS (the
        # final matrix product, and linear/rbf similarities of batches) stays single-threaded
        # instead of fighting them; that is also what makes a BLAS similarity call serial.
        with limit_threads(blas_threads=1):
            await registry.sync()
            # What is loaded now lives as long as the process: keep it out of the collector's
            # full passes, which would otherwise walk the libraries' objects (a large heap)
            # again and again under the requests' small allocations.
            gc.collect()
            gc.freeze()
            grpc_service = None
            try:
                if settings.grpc_port is not None:
                    grpc_service = await GrpcService.start(
                        settings, plane, policy, metrics, budget, payloads, traced_servicer(tracing)
                    )
                rescans = Rescans(
                    registry,
                    settings.reload_interval_s,
                    each=[keys.reload],
                    on_hangup=[tls.reload] if settings.tls_cert_file is not None else [],
                )
                async with rescans:
                    yield
            finally:
                if grpc_service is not None:
                    await grpc_service.stop()
                plane.close()
                if payloads is not None:
                    payloads.close()
                if tracing is not None:
                    tracing.shutdown()
                metrics.fold()  # what the last requests reported, before the process ends
                if cluster is not None:
                    await cluster.close()

    app = FastAPI(
        title="BE-SVM model service",
        version=service.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        # A path with a trailing slash is a 404: the redirect to the path without it would
        # be built from the client's Host header.
        redirect_slashes=False,
        # The service reports through its own metrics and logs. FastAPI's OpenTelemetry hooks
        # find no provider to report to, but looked for one in the environment on every
        # request (three lookups, a few microseconds of a one-digit request).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.keys = keys
    # Until the lifespan has run: a registry with nothing loaded, so every route answers 503.
    app.state.dataplane = DataPlane(ModelRegistry(repository_of(settings)), settings, metrics)
    app.openapi = _openapi_with(
        app, routes.BODY_SCHEMAS + protocol_rest.BODY_SCHEMAS + catalogue.BODY_SCHEMAS, policy
    )
    install_error_handlers(app)
    # Added first, so innermost of the middleware: the hot routes are answered inside every
    # limit and the key check, and CORS preflights before the key check.
    app.add_middleware(
        HotRoutes,
        routes=app.router.routes,
        handlers={**routes.HOT_HANDLERS, **protocol_rest.HOT_HANDLERS},
        payloads=payloads,
    )
    app.add_middleware(KeyCheckMiddleware, policy=policy)
    install_limits(app, settings, budget)
    if tracing is not None:
        # Outermost of the middleware: the key check's and the limits' refusals are traced too.
        app.add_middleware(TracingMiddleware, tracing=tracing, routes=app.router.routes)
    # The routers' routes go straight into the app's route list: FastAPI matches an included
    # router through a slower, general path (a measurable share of a one-digit request).
    for router in (
        routes.router,
        catalogue.router,
        protocol_rest.router,
        admin.router,
        observability.router,
    ):
        app.router.routes.extend(router.routes)
    observability.install(app, metrics, settings.access_log)
    return app


async def search_cluster(settings: Settings) -> SearchCluster | None:
    """The Dask cluster that holds the catalogues' shards (SEARCH_CLUSTER), connected; None
    when the shards are searched in this process."""
    if settings.search_cluster is None:
        return None
    try:
        import distributed  # noqa: F401 (only to say what is missing)
    except ImportError:
        raise RuntimeError(
            "SEARCH_CLUSTER is set but dask and distributed are not installed: install the "
            "cluster extra (requirements-cluster.lock)"
        ) from None
    logger.info("searching catalogues on the Dask cluster at %s", settings.search_cluster)
    return await SearchCluster(settings.search_cluster, settings.search_shard_timeout_s).start()


def _openapi_with(app: FastAPI, schemas: tuple[type[BaseModel], ...], policy: AccessPolicy):
    """The app's OpenAPI document, with the schemas of bodies the routes read themselves and
    the API key schemes (so that /docs can send a key)."""
    generate = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            document = generate()
            components = document.setdefault("components", {}).setdefault("schemas", {})
            for schema in schemas:
                definition = schema.model_json_schema(
                    ref_template="#/components/schemas/{model}", mode="validation"
                )
                components.update(definition.pop("$defs", {}))
                components[schema.__name__] = definition
            routes.state_limits(document, app.state.settings)
            document_security(document, policy)
            app.openapi_schema = document
        return app.openapi_schema

    return openapi


class Rescans:
    """Rescans of the repository on SIGHUP and, if ``interval_s`` > 0, every ``interval_s``
    seconds: one at a time, requests arriving during a rescan coalesced into the next one.

    ``each`` are called before every rescan (the API keys are re-read), ``on_hangup`` before
    the rescan a SIGHUP asks for (the TLS files are re-read): each on a thread of its own,
    waited for at most LOAD_TIMEOUT_S (:func:`~service.api.registry.off_loop`), so that a file
    that cannot be read at once never holds the event loop, the signals it handles, or the
    requests. An async context manager: the SIGHUP handler (where the process's main thread
    runs the loop) and the background task live as long as the ``async with``.
    """

    def __init__(
        self,
        registry: ModelRegistry,
        interval_s: float,
        each: list[Callable[[], None]] | None = None,
        on_hangup: list[Callable[[], None]] | None = None,
    ) -> None:
        self.registry = registry
        self.interval_s = interval_s
        self.each = each or []
        self.on_hangup = on_hangup or []
        self._wanted = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._hangup = False
        self._hung_up_since = False  # a SIGHUP since the last rescan: on_hangup is due

    def request(self, why: str) -> None:
        logger.info("rescan of the %s requested (%s)", self.registry.repository.describe(), why)
        self._wanted.set()

    def _hung_up(self) -> None:
        self._hung_up_since = True
        self.request("SIGHUP")

    async def _reread(self, reloads: list[Callable[[], None]]) -> None:
        """Run each of ``reloads`` off the loop; one that takes longer than LOAD_TIMEOUT_S is
        left to finish on its own (what it reads stays as it was until it does)."""
        for reload in reloads:
            try:
                await off_loop(reload, timeout_s=self.registry.load_timeout_s)
            except TimeoutError:
                logger.error(
                    "re-reading (%s) took longer than %g s (LOAD_TIMEOUT_S): what was read "
                    "before stays",
                    getattr(reload, "__qualname__", reload),
                    self.registry.load_timeout_s,
                )
            except Exception:  # a reload's bug must not end the rescans
                logger.exception("re-reading (%s) failed", getattr(reload, "__qualname__", reload))

    async def __aenter__(self) -> Rescans:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            # Only a process's main thread may handle signals (not, e.g., a test client's).
            loop.add_signal_handler(signal.SIGHUP, self._hung_up)
            self._hangup = True
        self._task = loop.create_task(self._run())
        return self

    async def __aexit__(self, *exc_info) -> None:
        if self._hangup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                timeout = self.interval_s if self.interval_s > 0 else None
                await asyncio.wait_for(self._wanted.wait(), timeout)
            except TimeoutError:
                pass
            self._wanted.clear()
            due = self.on_hangup if self._hung_up_since else []
            self._hung_up_since = False
            await self._reread([*due, *self.each])
            try:
                await self.registry.sync()
            except Exception:  # a failed rescan must not end the rescans
                logger.exception("rescanning the %s failed", self.registry.repository.describe())


@asynccontextmanager
async def beating(settings: Settings, plane: DataPlane):
    """This worker's heartbeat for the probe process (:mod:`service.probes`) within the
    ``async with``, beating on the running loop, ready as the data plane says; not ready from
    a SIGTERM on (the drain). Nothing without a probe port."""
    if settings.probe_heartbeat_dir is None:
        yield
        return
    heartbeat = Heartbeat(settings.probe_heartbeat_dir)
    drain_on_signals(heartbeat.drain)
    task = asyncio.get_running_loop().create_task(
        heartbeat.run(lambda: plane.readiness()[0]), name="heartbeat"
    )
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class GrpcService:
    """The gRPC server of one app: started by the lifespan, drained on SIGTERM (with HTTP),
    stopped at the end of the lifespan."""

    def __init__(self, server: grpc_aio.Server, grace_s: float) -> None:
        self.server = server
        self.grace_s = grace_s
        self._stopping: asyncio.Task | None = None

    @classmethod
    async def start(
        cls,
        settings: Settings,
        plane: DataPlane,
        policy: AccessPolicy,
        metrics: Metrics,
        budget: MemoryBudget,
        payloads: PayloadLog | None = None,
        servicer: type[InferenceServicer] = InferenceServicer,
    ) -> GrpcService:
        server = await start_grpc_server(
            settings, plane, policy, metrics, budget, payloads, servicer
        )
        service = cls(server, settings.shutdown_timeout_s)
        drain_on_signals(service.drain)
        return service

    def drain(self) -> None:
        """Refuse new calls, and let those under way finish within SHUTDOWN_TIMEOUT_S."""
        if self._stopping is None:
            logger.info("gRPC: draining")
            self._stopping = asyncio.get_running_loop().create_task(self.server.stop(self.grace_s))

    async def stop(self) -> None:
        self.drain()
        await self._stopping
