"""The Open Inference Protocol's repository extension: list, load and unload models.

Allowed only with ``Authorization: Bearer <ADMIN_TOKEN>``; with no token configured the routes
answer 403 and say how to enable them. With several worker processes each request reaches one
of them: to update every worker, use RELOAD_INTERVAL_S (each worker polls) or SIGHUP.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response

from service.api.errors import (
    AdminDisabledError,
    LoadRefusedError,
    UnauthorizedError,
    documented_errors,
)
from service.api.registry import ModelRegistry, ModelState
from service.api.responses import ModelName, json_answer, read_body
from service.api.schemas import RepositoryIndexRequest, RepositoryModel

router = APIRouter(prefix="/v2/repository", tags=["repository"])

# FastAPI would document 422 with its own body (the Authorization header is a parameter): the
# error handlers answer every 422 with the one error body.
_ADMIN_ERRORS = documented_errors(401, 403, 422)


def authorize(request: Request, authorization: str | None) -> ModelRegistry:
    """The registry, for a request that carries the admin token (401, 403 otherwise)."""
    token = request.app.state.settings.admin_token
    if token is None:
        raise AdminDisabledError(
            "the repository routes are disabled: set ADMIN_TOKEN and send it as "
            "'Authorization: Bearer <token>'"
        )
    scheme, _, given = (authorization or "").partition(" ")
    expected = token.get_secret_value().encode()
    # Compared in constant time, and always compared, so timing tells nothing of the token.
    matches = hmac.compare_digest(given.strip().encode(), expected)
    if scheme.lower() != "bearer" or not matches:
        raise UnauthorizedError("send the admin token as 'Authorization: Bearer <token>'")
    return request.app.state.dataplane.registry


Authorization = Annotated[str | None, Header(description="Bearer <ADMIN_TOKEN>")]


@router.post(
    "/index",
    response_model=list[RepositoryModel],
    responses={**_ADMIN_ERRORS, **documented_errors(400, 413, 415)},
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
async def repository_index(request: Request, authorization: Authorization = None) -> Response:
    """Rescan the repository (new models are loaded, changed ones replaced, removed ones
    retired), then list every model with its state; ``{"ready": true}`` lists only the ready
    ones."""
    registry = authorize(request, authorization)
    # The body is optional, and read only once the token has been checked.
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
async def load_model(request: Request, name: ModelName, authorization: Authorization = None):
    """Load (or reload) the version of model ``name`` on disk, warm it up and swap it in.
    Answers once it serves, or 409 with the reason if it was refused."""
    registry = authorize(request, authorization)
    entry = await registry.load(name)
    if entry.reason is not None:
        raise LoadRefusedError(entry.reason)
    return json_answer({}, entry.snapshot)


@router.post(
    "/models/{name}/unload",
    responses={**_ADMIN_ERRORS, **documented_errors(404, meanings={404: "No such model."})},
)
async def unload_model(request: Request, name: ModelName, authorization: Authorization = None):
    """Stop serving model ``name`` (until it is loaded again on request)."""
    registry = authorize(request, authorization)
    await registry.unload(name)
    return json_answer({})
