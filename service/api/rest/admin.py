"""The Open Inference Protocol's repository extension: list, load and unload models.

Allowed only with an admin key (``ADMIN_TOKEN``, or an admin key of ``API_KEYS_FILE``), checked
before the route runs (:mod:`service.api.machinery.auth`); with no admin key configured the routes
answer
403 and say how to enable them. With several worker processes each request reaches one
of them: to update every worker, use RELOAD_INTERVAL_S (each worker polls) or SIGHUP.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from service.api.errors import (
    LoadRefusedError,
    documented_errors,
)
from service.api.machinery.responses import ModelName, json_answer, read_body
from service.api.registry import ModelRegistry, ModelState
from service.api.rest.schemas import RepositoryIndexRequest, RepositoryModel

router = APIRouter(prefix="/v2/repository", tags=["repository"])

_ADMIN_ERRORS = documented_errors(401, 403)


def _registry(request: Request) -> ModelRegistry:
    return request.app.state.dataplane.registry


@router.post(
    "/index",
    response_model=list[RepositoryModel],
    responses={**_ADMIN_ERRORS, **documented_errors(400, 413, 415, 422)},
    openapi_extra={
        "requestBody": {
            "required": False,
            "content": {
                "application/json": {
                    "schema": {"$ref": "#/components/schemas/RepositoryIndexRequest"}
                }
            },
        }
    },
)
async def repository_index(request: Request) -> Response:
    """Rescan the repository (new models are loaded, changed ones replaced, removed ones
    retired), then list every model with its state; ``{"ready": true}`` lists only the ready
    ones."""
    registry = _registry(request)
    # The body is optional (the key was checked before the route ran).
    only_ready = (
        bool(await request.body()) and (await read_body(request, RepositoryIndexRequest)).ready
    )
    entries = await registry.sync()
    listed = [
        {**entry.describe(), "reason": entry.reason or ""}
        for entry in entries
        if not only_ready or entry.state == ModelState.READY
    ]
    return json_answer(listed)


@router.post(
    "/models/{name}/load",
    responses={
        **_ADMIN_ERRORS,
        **documented_errors(404, 409, meanings={404: "No such model in the repository."}),
    },
)
async def load_model(request: Request, name: ModelName):
    """Load (or reload) the version of model ``name`` on disk, warm it up and swap it in.
    Answers once it serves, or 409 with the reason if it was refused."""
    registry = _registry(request)
    entry = await registry.load(name)
    if entry.reason is not None:
        raise LoadRefusedError(entry.reason)
    return json_answer({}, entry.snapshot)


@router.post(
    "/models/{name}/unload",
    responses={**_ADMIN_ERRORS, **documented_errors(404, meanings={404: "No such model."})},
)
async def unload_model(request: Request, name: ModelName):
    """Stop serving model ``name`` (until it is loaded again on request)."""
    registry = _registry(request)
    await registry.unload(name)
    return json_answer({})
