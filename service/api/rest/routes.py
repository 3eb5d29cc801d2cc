"""HTTP routes. Thin on purpose: read the request, ask the data plane, shape the answer.

Every route is ``async`` and has no dependencies, so a request never waits for the thread pool
unless its work does (the data plane decides). Answers are serialised once, straight to bytes
(FastAPI's response-model validation is skipped: the data are built here from typed results;
the schemas document them).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from service.api.catalogue_plane import MAX_FACET_VALUES
from service.api.dataplane import MAX_STRONGEST_ATOMS, DataPlane
from service.api.errors import documented_errors, is_protocol_route
from service.api.machinery.limits import HOLD_KEY
from service.api.machinery.responses import ModelName, json_answer, read_body
from service.api.rest.schemas.admin import AliasRequest, RepositoryIndexRequest
from service.api.rest.schemas.classify import ClassifyRequest, ClassifyResponse
from service.api.rest.schemas.models import Health, ModelInfo, ModelList, VocabularyInfo
from service.api.rest.schemas.search import (
    AtomResponse,
    SearchBatchRequest,
    SearchBatchResponse,
    SearchBody,
    SearchRequest,
    SearchResponse,
)
from service.api.settings import Settings
from service.api.versions import ModelSnapshot
from service.model import ModelNotReadyError
from service.model.answers import Answer
from service.model.errors import located
from service.model.search import SearchQuery, SearchResult

router = APIRouter()

_NO_SEARCH = "No model of that name, or it has no search model or catalogue."
# Every status each route can answer besides 200, each with the one error body.
_MODEL_ERRORS = documented_errors(404, 503)
_CLASSIFY_ERRORS = documented_errors(400, 404, 408, 413, 415, 422, 503, 504)
_SEARCH_ERRORS = documented_errors(
    400, 404, 408, 413, 415, 422, 503, 504, meanings={404: _NO_SEARCH}
)


def _plane(request: Request) -> DataPlane:
    return request.app.state.dataplane


def _documented(
    body: type[BaseModel] | tuple[type[BaseModel], ...], answer: Any, tag: str, errors: dict
) -> dict[str, Any]:
    """Route options documenting a body read by :func:`read_body` (the app factory adds the
    schemas of :data:`BODY_SCHEMAS` to the components; a tuple of them is one of them) and its
    answer (a schema, or a union of schemas)."""
    request_body = {"required": True, "content": {"application/json": {"schema": _one_of(body)}}}
    return {
        "tags": [tag],
        "responses": {200: {"model": answer}, **errors},
        "response_class": Response,
        "openapi_extra": {"requestBody": request_body},
    }


def _one_of(schemas: type[BaseModel] | tuple[type[BaseModel], ...]) -> dict[str, Any]:
    """A reference to a schema of the components, or ``oneOf`` references to several."""
    if isinstance(schemas, type):
        return {"$ref": f"#/components/schemas/{schemas.__name__}"}
    return {"oneOf": [_one_of(schema) for schema in schemas]}


BODY_SCHEMAS: tuple[type[BaseModel], ...] = (
    ClassifyRequest,
    SearchRequest,
    SearchBatchRequest,
    RepositoryIndexRequest,
    AliasRequest,
)


@router.get("/healthz", response_model=Health, tags=["operations"])
async def healthz() -> Response:
    """Liveness: the process answers."""
    return json_answer({"status": "ok", "detail": None})


@router.get(
    "/readyz",
    response_model=Health,
    tags=["operations"],
    responses=documented_errors(503, meanings={503: "The default model is not ready; says why."}),
)
async def readyz(request: Request) -> Response:
    """Readiness: the models are loaded and warmed up, the default one included."""
    ready, detail = _plane(request).readiness()
    if not ready:
        raise ModelNotReadyError(detail)
    return json_answer({"status": "ready", "detail": detail})


# -- classification ----------------------------------------------------------------------------


def _classify_payload(snapshot: ModelSnapshot, answers: list[Answer]) -> dict[str, Any]:
    predictions = []
    for answer in answers:
        prediction = {
            "label": answer.label,
            "top_k": [{"label": c, "score": s} for c, s in answer.ranked],
        }
        if answer.known_words is not None:
            prediction["known_words"] = answer.known_words
        if answer.explanation is not None:
            prediction["explanation"] = answer.explanation.as_dict()
        predictions.append(prediction)
    return {"model": snapshot.name, "model_version": snapshot.version, "predictions": predictions}


async def _classify(request: Request, name: str | None) -> Response:
    body = await read_body(request, ClassifyRequest)
    snapshot, answers = await _plane(request).classify(
        name, body.instances, body.texts, body.top_k, explain=body.explain or 0
    )
    return json_answer(_classify_payload(snapshot, answers), snapshot)


_CLASSIFY_DOC = _documented(ClassifyRequest, ClassifyResponse, "predictions", _CLASSIFY_ERRORS)


@router.post("/classify", **_CLASSIFY_DOC)
async def classify(request: Request) -> Response:
    """Classify a batch with the default model: per instance the predicted label and the top-k
    classes with scores.

    Send ``instances`` in the model's input shape, or ``texts`` to a bag-of-words model."""
    return await _classify(request, None)


@router.post("/v1/models/{name}/classify", **_CLASSIFY_DOC)
async def classify_with(request: Request, name: ModelName) -> Response:
    """Classify a batch with the model ``name``; as POST /classify."""
    return await _classify(request, name)


# -- search ------------------------------------------------------------------------------------


def _hits(items: list[tuple[str, float]]) -> list[dict[str, Any]]:
    return [{"id": i, "score": s} for i, s in items]


def _search_payload(
    snapshot: ModelSnapshot, result: SearchResult, strongest: bool
) -> dict[str, Any]:
    code, learned = result.code, result.kind == "positives"
    return {
        "model": snapshot.name,
        "model_version": snapshot.version,
        "search_version": snapshot.search_version,
        "query": result.kind,
        "code": {
            "indices": code.atoms.tolist(),
            "values": code.weights.tolist(),
            "bias": code.bias,
        },
        "sparsity": code.n_nonzero,
        "results": _hits(result.items),
        "strongest_atoms": [
            {"atom": a.atom, "weight": a.weight, "items": _hits(a.items)}
            for a in result.strongest_atoms
        ]
        if strongest
        else None,
        "n_positives": result.n_positives if learned else None,
        "n_negatives": result.n_negatives if learned else None,
        "catalogue_version": result.catalogue_version,
        "next_cursor": result.next_cursor,
        "partial": bool(result.missing_shards),
        "missing_shards": list(result.missing_shards),
    }


def _query(plane: DataPlane, body: SearchRequest) -> SearchQuery:
    return SearchQuery(
        class_label=None if body.class_ is None else str(body.class_),
        code=None if body.code is None else (body.code.indices, body.code.values),
        bias=body.bias,
        positives=body.positives,
        negatives=body.negatives,
        top_k=plane.default_search_top_k if body.top_k is None else body.top_k,
        sparsity=body.sparsity,
        exclude=body.exclude,
        exclude_positives=body.exclude_positives,
        strongest_atoms=body.strongest_atoms,
        filter=None if body.filter is None else body.filter.model_dump(exclude_none=True),
        offset=body.offset or 0,
        cursor=body.cursor,
        allow_partial=body.allow_partial,
    )


async def _search(request: Request, name: str | None) -> Response:
    body = await read_body(request, SearchBody)
    plane = _plane(request)
    if isinstance(body, SearchBatchRequest):
        return await _search_batch(request, plane, name, body)
    snapshot, result = await plane.search(name, _query(plane, body))
    return json_answer(_search_payload(snapshot, result, bool(body.strongest_atoms)), snapshot)


async def _search_batch(
    request: Request, plane: DataPlane, name: str | None, body: SearchBatchRequest
) -> Response:
    queries = []
    for i, search in enumerate(body.searches):
        with located(f"searches[{i}]"):
            queries.append(_query(plane, search))
    snapshot, results = await plane.search_many(name, queries, request.scope.get(HOLD_KEY))
    answers = [
        _search_payload(snapshot, result, bool(search.strongest_atoms))
        for search, result in zip(body.searches, results, strict=True)
    ]
    payload = {"model": snapshot.name, "model_version": snapshot.version, "searches": answers}
    return json_answer(payload, snapshot)


_SEARCH_DOC = _documented(
    (SearchRequest, SearchBatchRequest), SearchResponse | SearchBatchResponse, "search",
    _SEARCH_ERRORS,
)  # fmt: skip


@router.post("/search", **_SEARCH_DOC)
async def search(request: Request) -> Response:
    """Rank the default model's catalogue for a class, a sparse code, or examples, reading only
    the rows of X' = D^T X where the code is non-zero. Answers the top-k ids, best first, and
    the code.

    A batch, ``{"searches": [query, ...]}``, is answered ``{"searches": [answer, ...]}`` in
    order, each answer what its query gets alone; queries by code are ranked together in one
    pass over the rows they read. One query that is not valid refuses the batch, its error
    naming it (``searches[3]: ...``)."""
    return await _search(request, None)


@router.post("/v1/models/{name}/search", **_SEARCH_DOC)
async def search_with(request: Request, name: ModelName) -> Response:
    """Search the catalogue of the model ``name``; as POST /search."""
    return await _search(request, name)


@router.get(
    "/v1/models/{name}/atoms/{atom}",
    tags=["search"],
    responses={
        200: {"model": AtomResponse},
        **documented_errors(
            404, 422, 503, meanings={404: "No such model, atom, search model or catalogue."}
        ),
    },
    response_class=Response,
)
async def get_atom(
    request: Request,
    name: ModelName,
    atom: int,
    top_k: Annotated[
        int | None,
        Query(
            ge=1,
            description="Items to return (default DEFAULT_SEARCH_TOP_K, at most "
            "MAX_SEARCH_TOP_K: the maximum stated here).",
        ),
    ] = None,
) -> Response:
    """The catalogue items that score highest on one atom alone (attribute discovery), and the
    classes whose codes use it."""
    snapshot, items, classes = await _plane(request).atom(name, atom, top_k)
    payload = {
        "model": snapshot.name,
        "model_version": snapshot.version,
        "atom": atom,
        "results": _hits(items),
        "classes": [{"label": c, "weight": w} for c, w in classes],
    }
    return json_answer(payload, snapshot)


# -- models ------------------------------------------------------------------------------------


def _search_info(snapshot: ModelSnapshot) -> dict[str, Any] | None:
    search = snapshot.search
    if search is None:
        return None
    model, meta = search.model, search.model.metadata
    return {
        "feature_space": model.feature_space,
        "n_atoms": model.n_atoms,
        "n_features": model.n_features,
        "n_nonzero": meta.get("n_nonzero"),
        "catalogue_size": None if search.catalogue is None else search.catalogue.n_items,
        "catalogue_version": None if search.catalogue is None else search.catalogue.version,
        "estimator": meta.get("estimator", {}),
        "training": meta.get("training", {}),
    }


def _model_info(snapshot: ModelSnapshot) -> dict[str, Any]:
    predictor = snapshot.predictor
    meta = predictor.metadata
    vocabulary = predictor.vocabulary
    return {
        "model_type": "besvm",
        "created": meta.get("created"),
        "input": {
            "kind": predictor.input_spec.kind,
            "shape": list(predictor.input_spec.shape),
            "spec": str(predictor.input_spec),
            "accepts_texts": vocabulary is not None,
        },
        "classes": list(predictor.classes),
        "transform": str(predictor.transform),
        "similarities": predictor.similarity_names,
        "measures": predictor.describe_measures(),
        "vocabulary": None
        if vocabulary is None
        else {"size": vocabulary.size, **vocabulary.settings()},
        "normalization": predictor.normalization,
        "basis_size": predictor.n_basis,
        "n_features": int(predictor.coef.shape[1]),
        "diagnostics": meta.get("diagnostics", {}),
        "training": meta.get("training", {}),
        "versions": meta.get("versions", {}),
        "search": _search_info(snapshot),
        "search_problem": snapshot.search_problem,
    }


def _describe(status: dict[str, Any], snapshot: ModelSnapshot | None) -> dict[str, Any]:
    return status if snapshot is None else {**status, **_model_info(snapshot)}


@router.get("/v1/models", response_model=ModelList, tags=["models"])
async def list_models(request: Request) -> Response:
    """Every model of the repository with its state (loading, ready, failed with the reason,
    unloaded) and version; for ready models their metadata: classes, input shape,
    similarities, basis size, created. Then the aliases: the model each names, its canary and
    shadow (docs/operating/traffic.md)."""
    plane = _plane(request)
    models = [_describe(status, snapshot) for status, snapshot in plane.models()]
    return json_answer({"models": models, "aliases": plane.aliases()})


@router.get(
    "/v1/models/{name}",
    response_model=ModelInfo,
    tags=["models"],
    responses=_MODEL_ERRORS,
)
async def get_model(request: Request, name: ModelName) -> Response:
    """Metadata of one model, by name (503 while it is not ready, with the reason)."""
    status, snapshot = _plane(request).model(name)
    return json_answer(_describe(status, snapshot), snapshot)


@router.get(
    "/v1/models/{name}/vocabulary",
    response_model=VocabularyInfo,
    tags=["models"],
    responses=documented_errors(
        404, 503, meanings={404: "No such model, or it has no vocabulary."}
    ),
)
async def get_vocabulary(request: Request, name: ModelName) -> Response:
    """The words of a text model, in index order: what sparse ``counts`` instances index."""
    snapshot, vocabulary = _plane(request).vocabulary(name)
    payload = {"size": vocabulary.size, **vocabulary.settings(), "terms": list(vocabulary.terms)}
    return json_answer(payload, snapshot)


# The routes service.api.machinery.hotpath answers without FastAPI's dispatch, by template: each
# handler
# takes the request and its path parameters.
HOT_HANDLERS = {
    "/classify": lambda request, params: _classify(request, None),
    "/v1/models/{name}/classify": lambda request, params: _classify(request, params["name"]),
    "/search": lambda request, params: _search(request, None),
    "/v1/models/{name}/search": lambda request, params: _search(request, params["name"]),
}


def state_limits(document: dict[str, Any], settings: Settings) -> None:
    """State in the OpenAPI ``document`` the limits this server's ``settings`` set, where
    clients read bounds: ``maximum`` and ``maxItems`` of the fields they bound, and the numbers
    in the descriptions of 413. Breaking one answers 422 (``top_k``, ``strongest_atoms``) or 413
    (a batch, a body), as the route's responses say. The 422 that FastAPI documents with a body
    of its own (for routes with parameters) gets the one error body the server answers."""
    schemas = document.get("components", {}).get("schemas", {})
    batch, top_k = settings.max_batch_size, settings.max_search_top_k
    bounds = {
        ("ClassifyRequest", "instances"): {"minItems": 1, "maxItems": batch},
        ("ClassifyRequest", "texts"): {"minItems": 1, "maxItems": batch},
        ("SearchRequest", "positives"): {"minItems": 1, "maxItems": batch},
        ("SearchRequest", "negatives"): {"minItems": 1, "maxItems": batch},
        ("SearchRequest", "top_k"): {"maximum": top_k},
        ("SearchRequest", "strongest_atoms"): {"maximum": MAX_STRONGEST_ATOMS},
        ("SearchRequest", "offset"): {"maximum": settings.max_search_offset},
        ("CatalogueItemsRequest", "ids"): {"minItems": 1, "maxItems": batch},
        ("CatalogueItemsRequest", "instances"): {"minItems": 1, "maxItems": batch},
        ("CatalogueDeleteRequest", "ids"): {"minItems": 1, "maxItems": batch},
        ("SearchBatchRequest", "searches"): {"minItems": 1, "maxItems": batch},
        ("FacetRequest", "limit"): {"maximum": MAX_FACET_VALUES},
    }
    for (schema, field), bound in bounds.items():
        properties = schemas.get(schema, {}).get("properties", {})
        if field in properties:
            _bound(properties[field], bound)
    too_large = (
        f"The body is larger than {settings.max_request_bytes:,} bytes (MAX_REQUEST_BYTES), "
        f"holds more than {settings.max_json_values:,} JSON values (MAX_JSON_VALUES), or the "
        f"batch (instances, texts, searches, or positives and negatives together) holds more "
        f"than {batch:,} (MAX_BATCH_SIZE), or a batch of searches ranks more than "
        f"{settings.max_search_top_k + settings.max_search_offset:,} items in all "
        "(MAX_SEARCH_TOP_K + MAX_SEARCH_OFFSET)."
    )
    (answer_422,) = documented_errors(422).values()
    error_body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    protocol_error = {
        "application/json": {"schema": {"$ref": "#/components/schemas/ProtocolError"}}
    }
    for route, path in document.get("paths", {}).items():
        for operation in path.values():
            responses = operation.get("responses", {})
            if "HTTPValidationError" in str(responses.get("422", {})):
                # FastAPI's own entry for routes with parameters: every 422 has the one body,
                # and on the protocol's routes a malformed request is a 400 in its shape.
                if is_protocol_route(route):
                    del responses["422"]
                    responses.setdefault(
                        "400", {"description": "Malformed request.", "content": protocol_error}
                    )
                else:
                    responses["422"] = {
                        "description": answer_422["description"],
                        "content": error_body,
                    }
            if "413" in responses:
                responses["413"]["description"] = too_large
            for parameter in operation.get("parameters", []):
                if parameter.get("name") == "top_k" and parameter.get("in") == "query":
                    _bound(parameter["schema"], {"maximum": top_k})


def _bound(schema: dict[str, Any], bound: dict[str, int]) -> None:
    """Add ``bound`` to a property's schema, inside ``anyOf`` for an optional one."""
    for option in schema.get("anyOf", [schema]):
        if option.get("type") in ("array", "integer"):
            option.update(bound)
