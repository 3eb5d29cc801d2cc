"""The Open Inference Protocol (KServe V2 REST), beside our own routes: health, server and model
metadata, model readiness and inference. Thin, as :mod:`service.api.rest.routes`: the data plane
finds
the model and runs the work, :mod:`service.api.protocol.tensors` reads and writes the tensors, and
errors take the protocol's ``{"error": "message"}`` shape in :mod:`service.api.errors`.

Each model route also answers under ``/versions/{version}``: the version served (the sha256 of
its manifest) or 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

import service
from service.api.dataplane import DataPlane
from service.api.machinery.responses import ModelName, decode_json, header, json_answer
from service.api.protocol.schemas import (
    InferRequest,
    InferResponse,
    LiveResponse,
    ModelMetadata,
    ProtocolError,
    ProtocolRequest,
    ReadyResponse,
    ServerMetadata,
    plain_request,
)
from service.api.protocol.tensors import (
    ModelInputs,
    classification,
    decode_request,
    model_metadata,
    output_tensors,
)
from service.model import InvalidInputError, ModelNotReadyError

router = APIRouter(tags=["open inference protocol"])

SERVER_NAME = "besvm"
EXTENSIONS = ["model_repository"]
# The binary tensor data extension: the JSON header's length, binary tensors after it.
HEADER_LENGTH = "inference-header-content-length"
_HEADER_LENGTH_BYTES = HEADER_LENGTH.encode("ascii")

BODY_SCHEMAS: tuple[type[BaseModel], ...] = (InferRequest,)

ModelVersion = Annotated[
    str, Path(description="The version served (GET /v2/models/{name} lists it).")
]

_MODEL_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ProtocolError, "description": "No model of that name, or not that version."},
    503: {"model": ProtocolError, "description": "The model is not loaded (yet); says why."},
}
_INFER_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ProtocolError, "description": "Malformed request; the message says why."},
    **_MODEL_ERRORS,
    408: {"model": ProtocolError, "description": "The body did not arrive in time."},
    413: {
        "model": ProtocolError,
        "description": "Batch, body or JSON values over the configured limit.",
    },
    503: {
        "model": ProtocolError,
        "description": "The model is not loaded (yet), or the server is at its limit of "
        "concurrent requests; says which (with Retry-After).",
    },
    504: {"model": ProtocolError, "description": "The work took longer than REQUEST_TIMEOUT_S."},
}


def _plane(request: Request) -> DataPlane:
    return request.app.state.dataplane


@router.get("/v2/health/live", response_model=LiveResponse)
async def server_live() -> Response:
    """Liveness: the process answers (200)."""
    return json_answer({"live": True})


@router.get(
    "/v2/health/ready",
    response_model=ReadyResponse,
    responses={503: {"model": ProtocolError, "description": "Not ready; says why."}},
)
async def server_ready(request: Request) -> Response:
    """Readiness: the models are loaded and warmed up (as GET /readyz)."""
    ready, detail = _plane(request).readiness()
    if not ready:
        raise ModelNotReadyError(detail)
    return json_answer({"ready": True})


@router.get("/v2", response_model=ServerMetadata)
async def server_metadata() -> Response:
    """The server's name, version and protocol extensions."""
    return json_answer(
        {"name": SERVER_NAME, "version": service.__version__, "extensions": EXTENSIONS}
    )


async def _metadata(request: Request, name: str, version: str | None) -> Response:
    snapshot = _plane(request).snapshot(name, version)
    return json_answer(
        model_metadata(snapshot.predictor, snapshot.name, snapshot.version), snapshot
    )


_METADATA_DOC: dict[str, Any] = {"response_model": ModelMetadata, "responses": _MODEL_ERRORS}


@router.get("/v2/models/{name}", **_METADATA_DOC)
async def get_model_metadata(request: Request, name: ModelName) -> Response:
    """The model's version, input and outputs (name, datatype, shape; -1: any size), and in
    the scores output's parameters its classes, in the order of the scores' columns."""
    return await _metadata(request, name, None)


@router.get("/v2/models/{name}/versions/{version}", **_METADATA_DOC)
async def get_model_version_metadata(
    request: Request, name: ModelName, version: ModelVersion
) -> Response:
    """As GET /v2/models/{name}, for the version served."""
    return await _metadata(request, name, version)


async def _ready(request: Request, name: str, version: str | None) -> Response:
    snapshot = _plane(request).snapshot(name, version)
    return json_answer({"ready": True}, snapshot)


_READY_DOC: dict[str, Any] = {"response_model": ReadyResponse, "responses": _MODEL_ERRORS}


@router.get("/v2/models/{name}/ready", **_READY_DOC)
async def model_ready(request: Request, name: ModelName) -> Response:
    """200 when the model serves; 503 (with the reason) while it loads or after it failed."""
    return await _ready(request, name, None)


@router.get("/v2/models/{name}/versions/{version}/ready", **_READY_DOC)
async def model_version_ready(request: Request, name: ModelName, version: ModelVersion) -> Response:
    """As GET /v2/models/{name}/ready, for the version served."""
    return await _ready(request, name, version)


def _json_header(request: Request, body: bytes) -> tuple[bytes, bytes]:
    """The JSON request and the binary tensor data after it (empty if none)."""
    declared = header(request, _HEADER_LENGTH_BYTES)
    if declared is None:
        return body, b""
    # isdigit alone takes other digits ("²", read from a latin-1 header) that int() refuses.
    if not (declared.isascii() and declared.isdigit()) or int(declared) > len(body):
        raise InvalidInputError(
            f"{HEADER_LENGTH} must be the length of the JSON header, at most the body's "
            f"{len(body):,} bytes"
        )
    length = int(declared)
    return body[:length], body[length:]


def _parsed(header: bytes) -> ProtocolRequest:
    request = plain_request(header)
    if request is not None:
        return request
    try:
        return InferRequest.model_validate_json(header).protocol()
    except ValidationError as error:
        # The context carries the parser's reason, which the 400's message names.
        problems = error.errors(include_url=False, include_input=False)
        raise RequestValidationError(problems) from None


async def _infer(request: Request, name: str, version: str | None) -> Response:
    plane = _plane(request)
    header, binary = _json_header(request, await request.body())
    # Decoded for the version served now; should another be swapped in before classify takes
    # its snapshot, that version validates the batch as it does any (and names itself).
    predictor = plane.snapshot(name, version).predictor

    def decoded() -> tuple[ProtocolRequest, ModelInputs, tuple[str, ...]]:
        body = _parsed(header)
        return body, *decode_request(body, binary, predictor, plane.max_batch_size)

    body, inputs, outputs = await decode_json(
        request, header, decoded, size=len(header) + len(binary)
    )
    k = plane.default_top_k if body.top_k is None else body.top_k
    snapshot, answers = await plane.classify(
        name, version=version, **classification(inputs, outputs, body, k)
    )
    payload = {
        "model_name": snapshot.name,
        "model_version": snapshot.version,
        **({} if body.id is None else {"id": body.id}),
        "outputs": output_tensors(answers, snapshot.predictor.classes, outputs, k),
    }
    return json_answer(payload, snapshot)


_REQUEST_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/InferRequest"}}},
}
_INFER_DOC: dict[str, Any] = {
    "responses": {200: {"model": InferResponse}, **_INFER_ERRORS},
    "response_class": Response,
    "openapi_extra": {"requestBody": _REQUEST_BODY},
}


@router.post("/v2/models/{name}/infer", **_INFER_DOC)
async def infer(request: Request, name: ModelName) -> Response:
    """Classify a batch: one input tensor (see GET /v2/models/{name}) in; ``label`` (BYTES
    [n]) and ``scores`` (FP64 [n, K]) out, and with ``parameters.top_k`` also ``top_k_labels``
    and ``top_k_scores`` ([n, k], best first), and with ``parameters.explain`` (k) also
    ``explanation`` (BYTES [n], each a JSON document: the k basis items that added most to the
    predicted class's score). ``outputs`` picks which; ``id`` is echoed."""
    return await _infer(request, name, None)


@router.post("/v2/models/{name}/versions/{version}/infer", **_INFER_DOC)
async def infer_version(request: Request, name: ModelName, version: ModelVersion) -> Response:
    """As POST /v2/models/{name}/infer, by the version served."""
    return await _infer(request, name, version)


# The routes service.api.machinery.hotpath answers without FastAPI's dispatch (see
# routes.HOT_HANDLERS).
HOT_HANDLERS = {
    "/v2/models/{name}/infer": lambda request, params: _infer(request, params["name"], None),
    "/v2/models/{name}/versions/{version}/infer": lambda request, params: _infer(
        request, params["name"], params["version"]
    ),
}
