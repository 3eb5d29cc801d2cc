"""A model's catalogue as a live index: what it holds, and its items added, replaced and removed
while the service answers.

Updates need an admin key (``ADMIN_TOKEN``, or an admin key of ``API_KEYS_FILE``), checked
before the route runs (:mod:`service.api.machinery.auth`); reading needs what ``/search`` needs.
Each update is a new catalogue version, on disk before the answer (a process killed at any point
loses no acknowledged update) and served by this process from then on; searches in flight finish
on the version they started with. Other worker processes serve it at once (the supervisor passes
them a SIGHUP), and in any case at their next rescan (RELOAD_INTERVAL_S).

Snapshots and restores are jobs (:mod:`service.api.jobs`): the route waits for one up to
REQUEST_TIMEOUT_S and answers what it did, or 202 with its status route while it goes on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from service.api.dataplane import DataPlane
from service.api.errors import WorkTimeoutError, documented_errors
from service.api.jobs import RESTORE, SNAPSHOT, Claim, JobKind
from service.api.machinery.limits import HOLD_KEY
from service.api.machinery.responses import ModelName, json_answer, read_body
from service.api.rest.schemas.catalogue import (
    CatalogueDeleteRequest,
    CatalogueInfo,
    CatalogueItem,
    CatalogueItemsRequest,
    CatalogueUpdateResponse,
    CountRequest,
    CountResponse,
    FacetRequest,
    FacetResponse,
    RestoreResponse,
    RestoreStatus,
    SnapshotList,
    SnapshotResponse,
    SnapshotStatus,
)
from service.api.rest.schemas.search import SearchFilter
from service.api.versions import ModelSnapshot
from service.model.search import Filter, UpdateResult
from service.model.search.snapshots import Snapshot

router = APIRouter(prefix="/v1/models/{name}/catalogue", tags=["catalogue"])

BODY_SCHEMAS = (CatalogueItemsRequest, CatalogueDeleteRequest, CountRequest, FacetRequest)
_NO_CATALOGUE = "No model of that name, or it has no search model or catalogue (or no such item)."
_UPDATE_ERRORS = documented_errors(
    400, 401, 403, 404, 408, 413, 415, 422, 503, 504, meanings={404: _NO_CATALOGUE}
)
_READ_ERRORS = documented_errors(
    400, 404, 408, 413, 415, 422, 503, 504, meanings={404: _NO_CATALOGUE}
)
_NO_SNAPSHOT = (
    "No model of that name, no catalogue or snapshot, or no SNAPSHOTS_DIR (the message says which)."
)
_IN_PROGRESS = "in_progress: one runs already (one at a time per catalogue); Location: its status."
_SNAPSHOT_ERRORS = {
    404: _NO_SNAPSHOT,
    409: f"{_IN_PROGRESS[:-1]}; or a file of the catalogue damaged on disk (snapshot_refused).",
    503: "SNAPSHOTS_DIR cannot be written (the message says why), or the model is not loaded.",
}
_STATUS_ERRORS = {
    404: "No such model, SNAPSHOTS_DIR, or snapshot taken or being taken.",
    409: "The snapshot's document is damaged (snapshot_refused, naming the file).",
}
_RESTORE_ERRORS = {
    404: _NO_SNAPSHOT,
    409: f"{_IN_PROGRESS[:-1]}; or a damaged or partial snapshot, or one of another search "
    "model (snapshot_refused: the message names the file); nothing was written.",
}
_NO_RESTORE = "No such model or SNAPSHOTS_DIR, or no restore of that snapshot known."


def _plane(request: Request) -> DataPlane:
    return request.app.state.dataplane


def _body_doc(body: type, answer: type, errors: dict | None = None) -> dict[str, Any]:
    reference = {"$ref": f"#/components/schemas/{body.__name__}"}
    return {
        "responses": {200: {"model": answer}, **(_UPDATE_ERRORS if errors is None else errors)},
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


Update = TypeVar("Update", bound=BaseModel)


async def _read_update(request: Request, body: type[Update]) -> Update:
    """The update's body; a time out while it is decoded says the update was not applied."""
    try:
        return await read_body(request, body)
    except WorkTimeoutError as error:
        raise WorkTimeoutError(
            f"{error}: the update was not applied (its body was still being read); send it again"
        ) from None


@router.post("/items", **_body_doc(CatalogueItemsRequest, CatalogueUpdateResponse))
async def upsert_items(request: Request, name: ModelName) -> Response:
    """Add items (ids, instances in the model's input shape, optional attributes): projected
    and written as a new shard; an id already in the catalogue is replaced. Answers once the
    new version is on disk and served."""
    body = await _read_update(request, CatalogueItemsRequest)
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
    body = await _read_update(request, CatalogueDeleteRequest)
    ids = [str(i) for i in body.ids]
    snapshot, result = await _plane(request).update_catalogue(
        name, len(ids), lambda index, gate: index.delete(ids, gate)
    )
    return json_answer(_update_payload(snapshot, result), snapshot)


# -- counts and facets -------------------------------------------------------------------------


def _filter(body_filter: SearchFilter | None) -> Filter | None:
    return None if body_filter is None else Filter.parse(body_filter.model_dump(exclude_none=True))


@router.post("/count", **_body_doc(CountRequest, CountResponse, _READ_ERRORS))
async def count_items(request: Request, name: ModelName) -> Response:
    """How many live items a filter allows (every live item without one), exact: from the
    shards' bitmaps, in this process or on the cluster's workers."""
    body = await read_body(request, CountRequest)
    snapshot, version, count = await _plane(request).count(name, _filter(body.filter))
    payload = {
        "model": snapshot.name,
        "model_version": snapshot.version,
        "catalogue_version": version,
        "count": count,
    }
    return json_answer(payload, snapshot)


@router.post("/facet", **_body_doc(FacetRequest, FacetResponse, _READ_ERRORS))
async def facet_items(request: Request, name: ModelName) -> Response:
    """How many live items (those a filter allows, if given) hold each value of an attribute:
    the ``limit`` values with the most, exact (every shard's counts are summed before the
    values are ranked)."""
    body = await read_body(request, FacetRequest)
    snapshot, version, facet = await _plane(request).facet(
        name, body.key, _filter(body.filter), body.limit
    )
    payload = {
        "model": snapshot.name,
        "model_version": snapshot.version,
        "catalogue_version": version,
        "key": facet.key,
        "hits": [{"value": v, "count": c} for v, c in zip(facet.values, facet.counts, strict=True)],
        "n_values": facet.n_values,
    }
    return json_answer(payload, snapshot)


# -- snapshots (admin) -------------------------------------------------------------------------

_WAIT = Query(
    True,
    description="Wait for it up to REQUEST_TIMEOUT_S (true, the default), or answer 202 at once "
    "(false); either way it goes on until it is done, and its status route says so.",
)
SnapshotName = Annotated[
    str, Path(description="The snapshot's name (POST .../snapshots answers it, GET lists it).")
]


def _accepted(status: type, done: str) -> dict[int | str, dict[str, Any]]:
    return {
        202: {
            "model": status,
            "description": f"Not {done} within REQUEST_TIMEOUT_S (or wait=false): it goes on. "
            "Location is its status route (GET), which says when it is done or why it failed.",
        }
    }


def _job_answer(
    served: ModelSnapshot, claim: Claim, result: dict[str, Any] | None, done_status: int
) -> Response:
    """``result`` with ``done_status``, or the job's status with 202 while it is under way;
    ``Location``: its status route."""
    if result is None:
        response = json_answer(claim.current(), served)
        response.status_code = 202
    else:
        response = json_answer(result, served)
        response.status_code = done_status
    response.headers["location"] = claim.location
    return response


def _snapshot_payload(served: ModelSnapshot, taken: Snapshot) -> dict[str, Any]:
    return {"model": served.name, "model_version": served.version, **taken.describe()}


def _restore_payload(
    served: ModelSnapshot, result: UpdateResult, verified: Snapshot
) -> dict[str, Any]:
    return {**_update_payload(served, result), "snapshot": verified.describe()}


@router.post(
    "/snapshots",
    status_code=201,
    response_model=SnapshotResponse,
    responses={
        **_accepted(SnapshotStatus, "complete"),
        **documented_errors(401, 403, 404, 409, 503, meanings=_SNAPSHOT_ERRORS),
    },
)
async def take_snapshot(request: Request, name: ModelName, wait: bool = _WAIT) -> Response:
    """Take a snapshot of the catalogue's newest version into SNAPSHOTS_DIR/<model>/<name>: a
    consistent copy (the version's files pinned under the writer lock, then copied while
    searches and updates go on) with the sha256 of every file. One at a time per catalogue.
    201 with the snapshot once it is complete within REQUEST_TIMEOUT_S; else 202, and it goes
    on: Location is its status route. Until it is complete it is written under a hidden
    staging name, never listed."""
    served, claim, taken = await _plane(request).take_snapshot(name, wait, _snapshot_payload)
    return _job_answer(served, claim, taken, 201)


@router.get(
    "/snapshots",
    response_model=SnapshotList,
    responses=documented_errors(401, 403, 404, 503, meanings={404: _NO_SNAPSHOT}),
)
async def list_snapshots(request: Request, name: ModelName) -> Response:
    """The snapshots kept of the model's catalogue, oldest first, as their documents describe
    them (a restore verifies every file)."""
    plane = _plane(request)
    snapshot = plane.snapshot(name)
    found, unreadable = await plane.list_snapshots(name)
    payload = {
        "model": snapshot.name,
        "snapshots": [s.describe() for s in found],
        "unreadable": unreadable,
    }
    return json_answer(payload, snapshot)


@router.post(
    "/snapshots/{snapshot}/restore",
    response_model=RestoreResponse,
    responses={
        **_accepted(RestoreStatus, "restored"),
        **documented_errors(401, 403, 404, 409, 503, meanings=_RESTORE_ERRORS),
    },
)
async def restore_snapshot(
    request: Request,
    name: ModelName,
    snapshot: SnapshotName,
    wait: bool = _WAIT,
) -> Response:
    """Verify every file of a snapshot (a damaged or partial one is refused, the file named,
    nothing written), then make its version the catalogue's newest: a new version (the
    snapshot's shards that are there intact are kept), on disk and served by this process.
    One at a time per catalogue. 200 once it is served within REQUEST_TIMEOUT_S; else 202, and
    it goes on: Location is its status route."""
    served, claim, restored = await _plane(request).restore_snapshot(
        name, snapshot, wait, _restore_payload
    )
    return _job_answer(served, claim, restored, 200)


def _status_route(
    kind: JobKind, payload: Callable[..., dict[str, Any]], route_name: str, doc: str
) -> Callable[..., Awaitable[Response]]:
    """The status route of ``kind``'s jobs: its record (see :meth:`DataPlane.job_status`),
    done ones answering ``payload`` of what they did."""

    async def status(request: Request, name: ModelName, snapshot: SnapshotName) -> Response:
        served, record = await _plane(request).job_status(name, kind, snapshot, payload)
        return json_answer(record, served)

    status.__name__, status.__doc__ = route_name, doc
    return status


router.get(
    "/snapshots/{snapshot}",
    response_model=SnapshotStatus,
    responses=documented_errors(401, 403, 404, 409, 503, meanings=_STATUS_ERRORS),
)(
    _status_route(
        SNAPSHOT, _snapshot_payload, "snapshot_status",
        """A snapshot's status: in progress (how far), done (the snapshot, as the 201 answers
        it), or failed (the error it answered, or would have).""",
    )
)  # fmt: skip
router.get(
    "/snapshots/{snapshot}/restore",
    response_model=RestoreStatus,
    responses=documented_errors(401, 403, 404, 503, meanings={404: _NO_RESTORE}),
)(
    _status_route(
        RESTORE, _restore_payload, "restore_status",
        """The status of the last restore of a snapshot: in progress (how far), done (its
        answer), or failed (the error it answered, or would have).""",
    )
)  # fmt: skip
