"""The Open Inference Protocol's repository extension: list, load and unload models.

Allowed only with an admin key (``ADMIN_TOKEN``, or an admin key of ``API_KEYS_FILE``), checked
before the route runs (:mod:`service.api.machinery.auth`); with no admin key configured the routes
answer
403 and say how to enable them. With several worker processes each request reaches one
of them: to update every worker, use RELOAD_INTERVAL_S (each worker polls) or SIGHUP.
"""

from __future__ import annotations

import os
import signal
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from service.api import traffic
from service.api.errors import (
    LoadRefusedError,
    TrafficPolicyError,
    documented_errors,
)
from service.api.machinery.responses import ModelName, json_answer, read_body
from service.api.registry import ModelRegistry, ModelState
from service.api.rest.schemas.admin import (
    AliasInfo,
    AliasList,
    AliasRequest,
    RepositoryIndexRequest,
    RepositoryModel,
)
from service.model import InvalidInputError

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


# -- traffic policies (docs/operating/traffic.md) ----------------------------------------------

AliasName = Annotated[str, Path(description="An alias (GET /v2/repository/aliases lists them).")]
_ALIAS_ERRORS = {
    **_ADMIN_ERRORS,
    **documented_errors(
        404,
        409,
        meanings={
            404: "No such alias.",
            409: "The change is refused (a model it names is not in the repository or has no "
            "loaded version, no canary to promote, nothing to roll back to), or the traffic "
            "file cannot be read or written; the message says which. Nothing changed.",
        },
    ),
}


@router.get("/aliases", response_model=AliasList)
async def list_aliases(request: Request) -> Response:
    """The aliases served, each with its model, canary and shadow and the versions they serve;
    aliases of the traffic file that were refused, and why."""
    return json_answer(_registry(request).describe_aliases())


async def _changed(request: Request, alias: str, change) -> Response:
    registry = _registry(request)
    described = await registry.change_traffic(change)
    # Other worker processes read the file at once (the supervisor passes SIGHUP on to them).
    if request.app.state.dataplane.has_siblings:
        os.kill(os.getppid(), signal.SIGHUP)
    found: list[dict[str, Any]] = [a for a in described["aliases"] if a["name"] == alias]
    return json_answer(found[0] if found else {"name": alias, "removed": True})


@router.put(
    "/aliases/{alias}",
    response_model=AliasInfo,
    responses={**_ALIAS_ERRORS, **documented_errors(400, 413, 415, 422)},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/AliasRequest"}}
            },
        }
    },
)
async def set_alias(request: Request, alias: AliasName) -> Response:
    """Create or change an alias: the model that answers it, a canary share, a shadow share.
    Applied once every model it sends traffic to serves; written to the traffic file."""
    try:
        traffic.check_alias_name(alias)
    except TrafficPolicyError as error:
        raise InvalidInputError(str(error)) from None
    body = await read_body(request, AliasRequest)
    policy = traffic.AliasPolicy.from_json(alias, body.model_dump(exclude_none=True))
    return await _changed(request, alias, traffic.set_policy(alias, policy))


@router.delete("/aliases/{alias}", responses=_ALIAS_ERRORS)
async def remove_alias(request: Request, alias: AliasName) -> Response:
    """Remove an alias: its name answers 404 from then on."""
    return await _changed(request, alias, traffic.remove_policy(alias))


@router.post("/aliases/{alias}/promote", response_model=AliasInfo, responses=_ALIAS_ERRORS)
async def promote_alias(request: Request, alias: AliasName) -> Response:
    """Make the canary the alias's model (all its traffic); the model before it is kept as
    ``previous``, for a rollback."""
    return await _changed(request, alias, traffic.promote(alias))


@router.post("/aliases/{alias}/rollback", response_model=AliasInfo, responses=_ALIAS_ERRORS)
async def rollback_alias(request: Request, alias: AliasName) -> Response:
    """Take back the alias's last move: its canary (every request to the model again), else
    its last promotion or change of model (``previous`` answers again)."""
    return await _changed(request, alias, traffic.rollback(alias))
