"""Bodies in and answers out: validated in one pass over the bytes, serialised once with
orjson, with the version that answered in a header."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

import orjson
from fastapi import Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from service.api.registry import ModelSnapshot

VERSION_HEADER = "x-model-version"

ModelName = Annotated[str, Path(description="A model's name (GET /v1/models lists them).")]


def json_answer(payload: Any, snapshot: ModelSnapshot | None = None) -> Response:
    """A 200 JSON response; ``snapshot`` names the answering version in ``X-Model-Version``."""
    headers = None if snapshot is None else {VERSION_HEADER: snapshot.version}
    return Response(orjson.dumps(payload), media_type="application/json", headers=headers)


Body = TypeVar("Body", bound=BaseModel)


async def read_body(request: Request, schema: type[Body]) -> Body:
    """The request body, parsed and validated by pydantic in one pass over the bytes.

    The hot routes read their bodies here instead of through a FastAPI body parameter: the same
    validation, without the generic parameter machinery (about 10 µs of a one-digit request).
    Errors take the one path of every malformed request (422, located by field).
    """
    try:
        return schema.model_validate_json(await request.body())
    except ValidationError as error:
        # Without the offending inputs: a message names a field, it does not echo its value.
        problems = error.errors(include_url=False, include_input=False, include_context=False)
        raise RequestValidationError(problems) from None
