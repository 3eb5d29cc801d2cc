"""The floor of benchmarks/bench_http.py: FastAPI with nothing behind the routes.

POST /classify takes the service's request for 8 x 8 images (``{"instances": [[8 rows of 8
floats]], "top_k": 3}``, validated by pydantic) and, from an ``async def`` route (no thread
pool, no model), answers a fixed answer of the service's shape and size: ``{"model": "digits",
"model_version": 64 hex digits, "predictions": [{"label": "7", "top_k": [3 label/score
pairs]}]}``. What is left is uvicorn, FastAPI, pydantic and JSON. POST /search does the same
for a code query (top_k ids and scores back). GET /readyz answers once the server is up.

With ``APP=thin``, the thinnest app instead: a raw ASGI callable (:func:`thin`), no framework,
that reads the body, parses its JSON (orjson, as the service reads JSON), and answers the same
fixed bytes on any POST (GET /readyz: ready). What is left is uvicorn and one JSON parse: what
any Python model server on uvicorn pays at the least.

Served like the service: ``HOST=127.0.0.1 PORT=8001 python benchmarks/bare_endpoint.py``, read
from HOST, PORT, WORKERS (uvicorn worker processes, default 1), LOG_LEVEL (default warning),
ACCESS_LOG (default false) and APP (``fastapi``, the default, or ``thin``).
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    instances: list[list[list[float]]] = Field(..., min_length=1)
    top_k: int = Field(3, ge=1)


class ClassScore(BaseModel):
    label: str
    score: float


class Prediction(BaseModel):
    label: str
    top_k: list[ClassScore]


class ClassifyResponse(BaseModel):
    model: str
    model_version: str
    predictions: list[Prediction]


class Code(BaseModel):
    indices: list[int]
    values: list[float]


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: Code
    top_k: int = Field(10, ge=1, le=1000)


class SearchHit(BaseModel):
    id: str
    score: float


class SearchResponse(BaseModel):
    model: str
    query: str
    code: Code
    sparsity: int
    results: list[SearchHit]


class Health(BaseModel):
    status: str


# Full-precision scores and a checksum-long version, as the service answers: the same bytes.
_RANKED = [("7", 0.6809618931138395), ("9", -0.7396256310298658), ("3", -0.9068777660610603)]
_VERSION = "0" * 64
_HITS = [(str(i), 10.0 - i / 100) for i in range(1000)]

app = FastAPI(title="bare endpoint (benchmark floor)")


@app.get("/readyz", response_model=Health)
async def readyz() -> Health:
    return Health(status="ready")


@app.post("/classify", response_model=ClassifyResponse)
async def classify(body: ClassifyRequest) -> ClassifyResponse:
    ranked = [ClassScore(label=label, score=score) for label, score in _RANKED[: body.top_k]]
    predictions = [Prediction(label=ranked[0].label, top_k=ranked) for _ in body.instances]
    return ClassifyResponse(model="digits", model_version=_VERSION, predictions=predictions)


@app.post("/search", response_model=SearchResponse)
async def search(body: SearchRequest) -> SearchResponse:
    hits = [SearchHit(id=item, score=score) for item, score in _HITS[: body.top_k]]
    return SearchResponse(
        model="synthetic",
        query="code",
        code=body.code,
        sparsity=len(body.code.indices),
        results=hits,
    )


_THIN_ANSWER = (
    ClassifyResponse(
        model="digits",
        model_version=_VERSION,
        predictions=[
            Prediction(label="7", top_k=[ClassScore(label=c, score=s) for c, s in _RANKED])
        ],
    )
    .model_dump_json()
    .encode()
)
_THIN_READY = b'{"status":"ready"}'


async def thin(scope, receive, send) -> None:
    """The thinnest app: read the body, parse its JSON, answer fixed bytes."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["method"] == "POST":
        orjson.loads(body)
        answer = _THIN_ANSWER
    else:
        answer = _THIN_READY
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def main() -> None:
    level = os.environ.get("LOG_LEVEL", "warning")
    app = "bare_endpoint:thin" if os.environ.get("APP") == "thin" else "bare_endpoint:app"
    uvicorn.run(
        app,
        app_dir=str(Path(__file__).resolve().parent),
        host=os.environ.get("HOST", "127.0.0.1"),
        port=int(os.environ.get("PORT", "8001")),
        workers=int(os.environ.get("WORKERS", "1")),
        log_level=level,
        access_log=os.environ.get("ACCESS_LOG", "false").lower() in ("1", "true", "yes", "on"),
    )


if __name__ == "__main__":
    main()
