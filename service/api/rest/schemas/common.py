"""What the bodies of every route family share: the answering version's description, the
error body, ids and numbers, the configuration of a strict request body, and an example digit."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# Item 1,009 of scikit-learn's digits (held out from the default model's training split): a 7.
DIGIT_SEVEN = [
    [0, 0, 4, 15, 16, 13, 13, 10],
    [0, 0, 12, 13, 10, 15, 14, 2],
    [0, 2, 16, 6, 2, 14, 6, 0],
    [0, 1, 5, 0, 9, 11, 0, 0],
    [0, 0, 7, 12, 16, 14, 6, 0],
    [0, 0, 8, 15, 15, 11, 2, 0],
    [0, 0, 2, 16, 8, 0, 0, 0],
    [0, 0, 7, 15, 4, 0, 0, 0],
]


VERSION_DESCRIPTION = (
    "The version that answered: the sha256 of its manifest (also in the X-Model-Version header)."
)


class ErrorBody(BaseModel):
    type: str = Field(..., description="Error class, e.g. invalid_input.")
    message: str = Field(..., description="What was wrong, in words.")
    details: list[dict[str, Any]] | None = Field(
        None, description="Per-field problems of a malformed request."
    )


class ErrorResponse(BaseModel):
    error: ErrorBody


Id = str | int


Number = int | float


def strict_body(*examples: dict[str, Any]) -> ConfigDict:
    """The configuration of a request body: no field beyond its own, strict types, and the
    ``examples`` the OpenAPI document shows."""
    return ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": list(examples)})
