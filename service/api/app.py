"""The application factory."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI
from threadpoolctl import threadpool_limits

import service
from service.api.errors import install_error_handlers
from service.api.limits import RequestSizeLimitMiddleware
from service.api.routes import router
from service.api.settings import Settings
from service.api.state import ModelHolder

DESCRIPTION = """
Large-margin classifiers on similarity measures.

**POST /classify** compares each instance with a small basis of training items under the
model's similarity measures, normalises the similarities and applies a one-vs-rest linear SVM.
See **GET /v1/models** for the input shape and classes the served model expects.

**POST /search** ranks a precomputed catalogue for a class, a sparse code over the model's
Union-of-Subspaces dictionary, or a few examples of something new (a code learned on the fly),
reading only the catalogue rows where the code is non-zero. **GET /v1/models/{name}/atoms/{a}**
shows the items one atom stands for.

Errors always have the body `{"error": {"type", "message", "details"?}}`.
"""


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
        holder = ModelHolder(settings.model_dir)
        app.state.models = holder
        # The server owns its threads: numba's parallel kernels use every core, so BLAS (used for
        # the small final matrix product) stays single-threaded instead of fighting them.
        with threadpool_limits(limits=1, user_api="blas"):
            holder.load()
            yield

    app = FastAPI(
        title="BE-SVM model service",
        version=service.__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.models = ModelHolder(settings.model_dir)  # not loaded: 503 until the lifespan runs
    install_error_handlers(app)
    app.add_middleware(RequestSizeLimitMiddleware, max_bytes=settings.max_request_bytes)
    app.include_router(router)
    return app
