"""Request and response bodies of the Open Inference Protocol (KServe V2 REST).

The schemas check the JSON's structure. What a tensor means for a model (its datatype, shape
and data length) is checked by the model's tensor codec (:mod:`service.api.v2_tensors`), which
says what was wrong in a 400.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.api.schemas import VERSION_DESCRIPTION

# Most dimensions of a tensor (numpy's own limit is 64).
MAX_TENSOR_DIMENSIONS = 32
# Outputs a model answers: label, scores, top_k_labels and top_k_scores.
MAX_OUTPUTS = 4

# Item 1,009 of scikit-learn's digits, flattened row-major: a 7.
_DIGIT_SEVEN_FLAT = [
    *(0, 0, 4, 15, 16, 13, 13, 10),
    *(0, 0, 12, 13, 10, 15, 14, 2),
    *(0, 2, 16, 6, 2, 14, 6, 0),
    *(0, 1, 5, 0, 9, 11, 0, 0),
    *(0, 0, 7, 12, 16, 14, 6, 0),
    *(0, 0, 8, 15, 15, 11, 2, 0),
    *(0, 0, 2, 16, 8, 0, 0, 0),
    *(0, 0, 7, 15, 4, 0, 0, 0),
]


def _json_integer(value: Any) -> Any:
    if isinstance(value, (str, bool)):
        raise ValueError("must be an integer")
    return value


# A JSON integer: 3 or 3.0 (both integers to JSON Schema), never "3" or true.
JsonInt = Annotated[int, BeforeValidator(_json_integer)]


class InferParameters(BaseModel):
    """Request parameters. Others (e.g. tritonclient's ``binary_data_output``) are ignored."""

    model_config = ConfigDict(extra="allow")

    top_k: JsonInt | None = Field(
        None,
        ge=1,
        description="Adds the outputs top_k_labels and top_k_scores, shape [n, min(top_k, K)]: "
        "each instance's best classes, best first. label and scores are unchanged.",
    )


class RequestInput(BaseModel):
    """One input tensor."""

    name: str = Field(..., description="The input's name, as the model metadata lists it.")
    shape: list[Annotated[JsonInt, Field(ge=0)]] = Field(
        ..., max_length=MAX_TENSOR_DIMENSIONS, description="[n, ...]: n instances."
    )
    datatype: str = Field(..., description="FP64 or FP32 (any numeric type), or BYTES for texts.")
    parameters: dict[str, Any] | None = Field(
        None,
        description="binary_data_size: the tensor's bytes follow the JSON header "
        "(Inference-Header-Content-Length), tritonclient's binary tensor data.",
    )
    data: list[Any] | None = Field(
        None,
        description="The values in row-major order, flat or nested (only their count must "
        "match the shape); texts as strings. Absent when binary_data_size is given.",
    )


class RequestOutput(BaseModel):
    """An output the client asks for."""

    name: str = Field(..., description="label, scores, top_k_labels or top_k_scores.")
    parameters: dict[str, Any] | None = Field(
        None, description="Ignored (answers are JSON: binary_data is not honoured)."
    )


class InferRequest(BaseModel):
    """An inference request: one input tensor, and optionally the outputs wanted."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "42",
                    "inputs": [
                        {
                            "name": "input",
                            "shape": [1, 8, 8, 1],
                            "datatype": "FP64",
                            "data": _DIGIT_SEVEN_FLAT,
                        }
                    ],
                },
                {
                    "inputs": [
                        {
                            "name": "text",
                            "shape": [1],
                            "datatype": "BYTES",
                            "data": ["A computer lets you make more mistakes faster."],
                        }
                    ],
                    "parameters": {"top_k": 2},
                    "outputs": [{"name": "label"}, {"name": "top_k_labels"}],
                },
            ]
        }
    )

    id: str | None = Field(None, description="Echoed in the response.")
    parameters: InferParameters | None = None
    inputs: list[RequestInput] = Field(..., description="Exactly one tensor.")
    outputs: list[RequestOutput] | None = Field(
        None,
        max_length=MAX_OUTPUTS,
        description="The outputs to answer, in this order, each at most once (default: label "
        "and scores, and top_k_labels and top_k_scores when parameters.top_k is given).",
    )


class MetadataTensor(BaseModel):
    name: str
    datatype: str
    shape: list[int] = Field(..., description="-1: any size (the batch dimension).")
    parameters: dict[str, Any] | None = Field(
        None,
        description="For scores: classes, the order of its K columns. For the input: "
        "measures, each similarity measure with the transform of the input it reads.",
    )


class ModelMetadata(BaseModel):
    name: str
    versions: list[str] = Field(..., description="The version served: " + VERSION_DESCRIPTION)
    platform: str = Field(..., description="Always besvm.")
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str] = Field(
        ..., description="model_repository: /v2/repository/... (with ADMIN_TOKEN)."
    )


class ResponseOutput(BaseModel):
    name: str
    datatype: str = Field(..., description="BYTES (labels) or FP64 (scores).")
    shape: list[int]
    data: list[Any] = Field(..., description="Row-major, flat.")


class InferResponse(BaseModel):
    model_name: str
    model_version: str = Field(..., description=VERSION_DESCRIPTION)
    id: str | None = Field(None, description="The request's id, if it had one.")
    outputs: list[ResponseOutput]


class LiveResponse(BaseModel):
    live: bool


class ReadyResponse(BaseModel):
    ready: bool


class ProtocolError(BaseModel):
    """Every error of a protocol route (/v2, /v2/health/..., /v2/models/...)."""

    error: str = Field(..., description="What was wrong.")
