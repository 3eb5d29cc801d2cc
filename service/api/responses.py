"""Answers as bytes: serialised once with orjson, with the version that answered in a header."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Path
from fastapi.responses import Response

from service.api.registry import ModelSnapshot

VERSION_HEADER = "x-model-version"

ModelName = Annotated[str, Path(description="A model's name (GET /v1/models lists them).")]


def json_answer(payload: Any, snapshot: ModelSnapshot | None = None) -> Response:
    """A 200 JSON response; ``snapshot`` names the answering version in ``X-Model-Version``."""
    headers = None if snapshot is None else {VERSION_HEADER: snapshot.version}
    return Response(orjson.dumps(payload), media_type="application/json", headers=headers)
