"""Bodies in and answers out: validated in one pass over the bytes, serialised once with
orjson, with the version that answered in a header.

A body is decoded only within the server's limits (:func:`decode_json`): its JSON values are
counted first (MAX_JSON_VALUES), what decoding them may hold is counted against the process's
memory budget (MAX_BUFFERED_BYTES), and a body over INLINE_BODY_BYTES is decoded on a worker
thread, never on the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from service.api.errors import (
    MalformedBodyError,
    UnsupportedMediaTypeError,
    malformed_body_message,
)
from service.api.machinery.headers import first_header
from service.api.machinery.limits import DECODED_BYTES_PER_VALUE, HOLD_KEY, json_values
from service.api.versions import ModelSnapshot
from service.model.errors import brief

VERSION_HEADER = "x-model-version"

ModelName = Annotated[str, Path(description="A model's name (GET /v1/models lists them).")]


def json_answer(payload: Any, snapshot: ModelSnapshot | None = None) -> Response:
    """A 200 JSON response; ``snapshot`` names the answering version in ``X-Model-Version``."""
    return JsonAnswer(orjson.dumps(payload), None if snapshot is None else snapshot.version)


class JsonAnswer(Response):
    """A 200 answer of JSON bytes, its headers written straight out (Starlette's general
    header building, for three known headers, is a measurable share of a one-digit request).

    Parameters
    ----------
    body : bytes
        The JSON document.
    version : str, optional
        The answering model version, in ``X-Model-Version``.
    """

    media_type = "application/json"

    def __init__(self, body: bytes, version: str | None = None) -> None:
        self.status_code = 200
        self.background = None
        self.body = body
        self.raw_headers = [
            (b"content-length", b"%d" % len(body)),
            (b"content-type", _JSON_TYPE),
        ]
        if version is not None:
            self.raw_headers.append((_VERSION_HEADER_BYTES, version.encode("latin-1")))


_JSON_TYPE = JsonAnswer.media_type.encode("latin-1")
_VERSION_HEADER_BYTES = VERSION_HEADER.encode("latin-1")


def header(request: Request, name: bytes) -> str | None:
    """The value of the request's header ``name`` (lower case), the first if repeated; None if
    absent (see :func:`service.api.machinery.headers.first_header`)."""
    value = first_header(request.scope["headers"], name)
    return None if value is None else value.decode("latin-1")


Body = TypeVar("Body", bound=BaseModel)
T = TypeVar("T")


async def decode_json(
    request: Request, raw: bytes, decode: Callable[[], T], size: int | None = None
) -> T:
    """``decode()`` of the JSON ``raw``, once its values are counted (RequestTooLargeError, a
    413, over MAX_JSON_VALUES) and what decoding them may hold is counted against the memory
    budget (MemoryLimitError, a 503, when it has no room): on the event loop for a body up to
    INLINE_BODY_BYTES (``size``, default the length of ``raw``), else on a worker thread (see
    :meth:`DataPlane.convert`)."""
    plane = request.app.state.dataplane
    hold = request.scope.get(HOLD_KEY)

    def bounded() -> T:
        values = json_values(raw, plane.max_json_values)
        if hold is not None:
            hold.add(DECODED_BYTES_PER_VALUE * values + len(raw), f"decoding {values:,} values")
        return decode()

    return await plane.convert(len(raw) if size is None else size, bounded)


def _declared_json(content_type: str) -> bool:
    """Whether a Content-Type names JSON: ``application/json`` or ``application/<x>+json``
    (parameters such as charset aside). No Content-Type at all is read as JSON too."""
    media = content_type.partition(";")[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return not media or (kind == "application" and (subtype == "json" or subtype.endswith("+json")))


async def read_body(request: Request, schema: type[Body]) -> Body:
    """The request body, parsed and validated by pydantic in one pass over the bytes.

    The hot routes read their bodies here instead of through a FastAPI body parameter: the same
    validation, without the generic parameter machinery (a measurable share of a one-digit
    request).

    Raises
    ------
    UnsupportedMediaTypeError
        A Content-Type other than JSON (415).
    MalformedBodyError
        Bytes that are not a JSON document (400): see :func:`malformed_body_message`.
    RequestValidationError
        JSON that does not fit ``schema`` (422, located by field).
    RequestTooLargeError, MemoryLimitError
        See :func:`decode_json`.
    """
    content_type = header(request, b"content-type") or ""
    if not _declared_json(content_type):
        raise UnsupportedMediaTypeError(
            f"the body must be JSON: send Content-Type: application/json, not {brief(content_type)}"
        )
    raw = await request.body()
    return await decode_json(request, raw, lambda: _validated(schema, raw))


def _validated(schema: type[Body], raw: bytes) -> Body:
    try:
        return schema.model_validate_json(raw)
    except ValidationError as error:
        for problem in error.errors(include_url=False, include_input=False):
            if problem["type"] == "json_invalid":
                reason = str(problem.get("ctx", {}).get("error", "cannot be parsed"))
                raise MalformedBodyError(malformed_body_message(reason, not raw.strip())) from None
        # Without the offending inputs: a message names a field, it does not echo its value.
        problems = error.errors(include_url=False, include_input=False, include_context=False)
        raise RequestValidationError(problems) from None
