"""The application factory."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from contextlib import asynccontextmanager

from fastapi import FastAPI
from pydantic import BaseModel
from threadpoolctl import threadpool_limits

import service
from service.api import admin, routes
from service.api.dataplane import DataPlane
from service.api.errors import install_error_handlers
from service.api.limits import RequestSizeLimitMiddleware
from service.api.registry import ModelRegistry, Repository
from service.api.settings import DEFAULT_MODEL_DIR, Settings

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

Errors always have the body `{"error": {"type", "message", "details"?}}`.
"""


def repository_of(settings: Settings) -> Repository:
    """The models a server with ``settings`` serves."""
    if settings.model_repository is not None:
        return Repository(settings.model_repository)
    return Repository(settings.model_dir or DEFAULT_MODEL_DIR, single=True)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service. Nothing is loaded until the app starts (lifespan).

    Parameters
    ----------
    settings : Settings, optional
        Defaults to reading the environment.
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        registry = ModelRegistry(repository_of(settings), settings.default_model)
        app.state.dataplane = DataPlane(registry, settings)
        # The server owns its threads: numba's parallel kernels use the cores, so BLAS (used for
        # the small final matrix product) stays single-threaded instead of fighting them.
        with threadpool_limits(limits=1, user_api="blas"), _reload_triggers(registry, settings):
            await registry.sync()
            # What is loaded now lives as long as the process: keep it out of the collector's
            # full passes, which would otherwise walk the libraries' objects (a large heap)
            # again and again under the requests' small allocations.
            gc.freeze()
            yield

    app = FastAPI(
        title="BE-SVM model service",
        version=service.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    # Until the lifespan has run: a registry with nothing loaded, so every route answers 503.
    app.state.dataplane = DataPlane(ModelRegistry(repository_of(settings)), settings)
    app.openapi = _openapi_with(app, routes.BODY_SCHEMAS)
    install_error_handlers(app)
    app.add_middleware(RequestSizeLimitMiddleware, max_bytes=settings.max_request_bytes)
    # The routers' routes go straight into the app's route list: FastAPI matches an included
    # router through a slower, general path (a measurable share of a one-digit request).
    for router in (routes.router, admin.router):
        app.router.routes.extend(router.routes)
    return app


def _openapi_with(app: FastAPI, schemas: tuple[type[BaseModel], ...]):
    """The app's OpenAPI document, with the schemas of bodies the routes read themselves."""
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
            app.openapi_schema = document
        return app.openapi_schema

    return openapi


@contextlib.contextmanager
def _reload_triggers(registry: ModelRegistry, settings: Settings):
    """SIGHUP and, if RELOAD_INTERVAL_S is set, polling: both rescan the repository."""
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task] = set()

    def rescan(why: str) -> None:
        logger.info("rescanning the %s (%s)", registry.repository.describe(), why)
        task = loop.create_task(registry.sync())
        tasks.add(task)
        task.add_done_callback(_finished(tasks))

    hangup = False
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        # Only the main thread of a process may handle signals (not, e.g., a test client's).
        loop.add_signal_handler(signal.SIGHUP, rescan, "SIGHUP")
        hangup = True
    poller = None
    if settings.reload_interval_s > 0:
        poller = loop.create_task(_poll(registry, settings.reload_interval_s))
    try:
        yield
    finally:
        if hangup:
            loop.remove_signal_handler(signal.SIGHUP)
        if poller is not None:
            poller.cancel()
        for task in tasks:
            task.cancel()


async def _poll(registry: ModelRegistry, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await registry.sync()
        except Exception:  # a bad scan must not end polling
            logger.exception("rescanning the %s failed", registry.repository.describe())


def _finished(tasks: set[asyncio.Task]):
    def done(task: asyncio.Task) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("rescan failed: %r", task.exception())

    return done
