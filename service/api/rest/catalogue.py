"""A model's catalogue as a live index: what it holds, and its items added, replaced and removed
while the service answers.

Updates need an admin key (``ADMIN_TOKEN``, or an admin key of ``API_KEYS_FILE``), checked
before the route runs (:mod:`service.api.machinery.auth`); reading needs what ``/search`` needs.
Each update
is a new catalogue
version, on disk before the answer (a process killed at any point loses no acknowledged update)
and served by this process from then on; searches in flight finish on the version they started
with. Other worker processes serve it at once (the supervisor passes them a SIGHUP), and in any
case at their next rescan (RELOAD_INTERVAL_S).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from service.api.dataplane import DataPlane
from service.api.errors import documented_errors
from service.api.machinery.limits import HOLD_KEY
from service.api.machinery.responses import ModelName, json_answer, read_body
from service.api.registry import ModelSnapshot
from service.api.rest.schemas import (
    CatalogueDeleteRequest,
    CatalogueInfo,
    CatalogueItem,
    CatalogueItemsRequest,
    CatalogueUpdateResponse,
)
from service.model.search import UpdateResult

router = APIRouter(prefix="/v1/models/{name}/catalogue", tags=["catalogue"])

BODY_SCHEMAS = (CatalogueItemsRequest, CatalogueDeleteRequest)
_NO_CATALOGUE = "No model of that name, or it has no search model or catalogue (or no such item)."
_UPDATE_ERRORS = documented_errors(
    400, 401, 403, 404, 408, 413, 415, 422, 503, 504, meanings={404: _NO_CATALOGUE}
)


def _plane(request: Request) -> DataPlane:
    return request.app.state.dataplane


def _body_doc(body: type, answer: type) -> dict[str, Any]:
    reference = {"$ref": f"#/components/schemas/{body.__name__}"}
    return {
        "responses": {200: {"model": answer}, **_UPDATE_ERRORS},
        "response_class": Response,
        "openapi_extra": {
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": reference}},
            }
        },
    }


def _update_payload(snapshot: ModelSnapshot, result: UpdateResult) -> dict[str, Any]:
    return {
        "model": snapshot.name,
        "model_version": snapshot.version,
        "catalogue_version": result.version,
        "n_items": result.n_items,
        "upserted": result.written,
        "replaced": result.replaced,
        "deleted": result.deleted,
        "missing": result.missing,
    }


@router.get(
    "",
    response_model=CatalogueInfo,
    responses=documented_errors(404, 503, meanings={404: _NO_CATALOGUE}),
)
async def describe(request: Request, name: ModelName) -> Response:
    """The catalogue version served: its items, shards and the attributes filters may name."""
    snapshot, catalogue = _plane(request).catalogue(name)
    payload = {
        "model": snapshot.name,
        "model_version": snapshot.version,
        "search_version": snapshot.search_version,
        **catalogue.describe(),
    }
    return json_answer(payload, snapshot)


@router.get(
    # A path parameter: an id may hold "/" (sent as %2F), which a plain one never matches.
    "/items/{item_id:path}",
    response_model=CatalogueItem,
    responses=documented_errors(404, 503, meanings={404: _NO_CATALOGUE}),
)
async def get_item(request: Request, name: ModelName, item_id: str) -> Response:
    """One item of the catalogue: its id and attributes (404 if it is not there)."""
    snapshot, version, attributes = await _plane(request).catalogue_item(name, item_id)
    payload = {
        "model": snapshot.name,
        "catalogue_version": version,
        "id": item_id,
        "attributes": attributes,
    }
    return json_answer(payload, snapshot)


@router.post("/items", **_body_doc(CatalogueItemsRequest, CatalogueUpdateResponse))
async def upsert_items(request: Request, name: ModelName) -> Response:
    """Add items (ids, instances in the model's input shape, optional attributes): projected
    and written as a new shard; an id already in the catalogue is replaced. Answers once the
    new version is on disk and served."""
    body = await read_body(request, CatalogueItemsRequest)
    ids = [str(i) for i in body.ids]
    plane = _plane(request)
    limits = plane.attribute_limits
    snapshot, result = await plane.update_catalogue(
        name,
        len(ids),
        lambda index, gate: index.upsert(ids, body.instances, body.attributes, limits, gate),
        request.scope.get(HOLD_KEY),
        lambda index: index.upsert_bytes(len(ids), body.attributes, limits),
    )
    return json_answer(_update_payload(snapshot, result), snapshot)


@router.post("/delete", **_body_doc(CatalogueDeleteRequest, CatalogueUpdateResponse))
async def delete_items(request: Request, name: ModelName) -> Response:
    """Remove items by id (tombstones, applied inside the search kernel); ids that are not
    there are listed in ``missing``. Answers once the new version is on disk and served."""
    body = await read_body(request, CatalogueDeleteRequest)
    ids = [str(i) for i in body.ids]
    snapshot, result = await _plane(request).update_catalogue(
        name, len(ids), lambda index, gate: index.delete(ids, gate)
    )
    return json_answer(_update_payload(snapshot, result), snapshot)
