"""Bodies in and answers out: validated in one pass over the bytes, serialised once with
orjson, with the version that answered in a header."""

from __future__ import annotations

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
from service.api.registry import ModelSnapshot
from service.model.errors import brief

VERSION_HEADER = "x-model-version"

ModelName = Annotated[str, Path(description="A model's name (GET /v1/models lists them).")]


def json_answer(payload: Any, snapshot: ModelSnapshot | None = None) -> Response:
    """A 200 JSON response; ``snapshot`` names the answering version in ``X-Model-Version``."""
    headers = None if snapshot is None else {VERSION_HEADER: snapshot.version}
    return Response(orjson.dumps(payload), media_type="application/json", headers=headers)


Body = TypeVar("Body", bound=BaseModel)


def _declared_json(content_type: str) -> bool:
    """Whether a Content-Type names JSON: ``application/json`` or ``application/<x>+json``
    (parameters such as charset aside). No Content-Type at all is read as JSON too."""
    media = content_type.partition(";")[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return not media or (kind == "application" and (subtype == "json" or subtype.endswith("+json")))


async def read_body(request: Request, schema: type[Body]) -> Body:
    """The request body, parsed and validated by pydantic in one pass over the bytes.

    The hot routes read their bodies here instead of through a FastAPI body parameter: the same
    validation, without the generic parameter machinery (about 10 µs of a one-digit request).

    Raises
    ------
    UnsupportedMediaTypeError
        A Content-Type other than JSON (415).
    MalformedBodyError
        Bytes that are not a JSON document (400): see :func:`malformed_body_message`.
    RequestValidationError
        JSON that does not fit ``schema`` (422, located by field).
    """
    content_type = request.headers.get("content-type", "")
    if not _declared_json(content_type):
        raise UnsupportedMediaTypeError(
            f"the body must be JSON: send Content-Type: application/json, not {brief(content_type)}"
        )
    raw = await request.body()
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
