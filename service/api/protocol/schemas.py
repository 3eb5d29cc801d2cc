"""Request and response bodies of the Open Inference Protocol (KServe V2 REST), and the
request as both transports hand it to the tensor codecs (:class:`ProtocolRequest`).

The schemas check the JSON's structure. What a tensor means for a model (its datatype, shape
and data length) is checked by the model's tensor codec (:mod:`service.api.protocol.tensors`), which
says what was wrong in a 400.

A request body is read by :func:`plain_request` when it is plain JSON of exactly the schema's
types (what clients send), else validated by :class:`InferRequest`: pydantic's validation of
the generic tensor, and its model objects, cost a one-digit request about as much as the
model's answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.api.rest.schemas.common import VERSION_DESCRIPTION

T = TypeVar("T")

# Most dimensions of a tensor (numpy's own limit is 64).
MAX_TENSOR_DIMENSIONS = 32
# Outputs a model answers: label, scores, top_k_labels, top_k_scores and explanation.
MAX_OUTPUTS = 5

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
    explain: JsonInt | None = Field(
        None,
        ge=1,
        description="Adds the output explanation, BYTES [n]: for each instance a JSON document "
        "naming the explain basis items that added most to the predicted class's score (as "
        "/classify's explanation). Without it, a requested explanation names 5.",
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

    name: str = Field(..., description="label, scores, top_k_labels, top_k_scores or explanation.")
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

    def protocol(self) -> ProtocolRequest:
        """This request as the tensor codecs read it."""
        return ProtocolRequest(
            inputs=[
                ProtocolInput(t.name, t.shape, t.datatype, t.parameters, t.data)
                for t in self.inputs
            ],
            outputs=None
            if self.outputs is None
            else [ProtocolOutput(o.name, o.parameters) for o in self.outputs],
            top_k=None if self.parameters is None else self.parameters.top_k,
            id=self.id,
            explain=None if self.parameters is None else self.parameters.explain,
        )


@dataclass(slots=True)
class ProtocolInput:
    """One input tensor, as :class:`RequestInput` has validated it (or a gRPC message holds
    it): ``shape`` of integers >= 0, ``data`` a list (flat or nested) or None."""

    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


@dataclass(slots=True)
class ProtocolOutput:
    """An output the client asks for."""

    name: str
    parameters: dict[str, Any] | None = None


@dataclass(slots=True)
class ProtocolRequest:
    """An inference request of either transport (REST JSON, gRPC), validated for structure.
    Read, never changed (not frozen: a frozen dataclass costs a request about a microsecond
    more to build)."""

    inputs: list[ProtocolInput]
    outputs: list[ProtocolOutput] | None = None
    top_k: int | None = None
    id: str | None = None
    explain: int | None = None


# Bodies up to this size may be read by plain_request (its check for long numbers copies one).
PLAIN_REQUEST_MAX_BYTES = 64 * 1024
# 19 digits in a row anywhere (a number's or a string's): maybe an integer past 64 bits, which
# orjson reads as a float (pydantic as an int, which no tensor takes). Such bodies are read by
# pydantic.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19
# Bodies with more opening brackets than this, in all, are read by pydantic: fewer cannot nest
# deeper than its parser goes (201 levels), which orjson's passes (1,024).
PLAIN_MAX_BRACKETS = 190


def plain_request(raw: bytes) -> ProtocolRequest | None:
    """The request of a JSON body of exactly the schema's types, or None for pydantic to
    validate (any other body: one pydantic may refuse, or read differently).

    What it takes, pydantic takes with the same values: JSON of at most
    :data:`PLAIN_REQUEST_MAX_BYTES`, with at most :data:`PLAIN_MAX_BRACKETS` opening brackets
    in all and no run of 19 digits (an integer past 64 bits may be one); ``id`` a string;
    ``parameters.top_k`` and ``parameters.explain`` integers >= 1; every tensor's name and
    datatype strings, its shape integers >= 0 (at most :data:`MAX_TENSOR_DIMENSIONS`), its
    parameters an object, its data an array; at most :data:`MAX_OUTPUTS` outputs, each with a
    string name. Fields may be absent or null where the schema allows it; other fields are
    ignored, as the schema ignores them.
    """
    if (
        len(raw) > PLAIN_REQUEST_MAX_BYTES
        or raw.count(b"[") + raw.count(b"{") > PLAIN_MAX_BRACKETS
        or _LONG_NUMBER in raw.translate(_DIGITS_AS_ZERO)
    ):
        return None
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(document) is not dict:
        return None
    get = document.get
    request_id, parameters, inputs, outputs = get("id"), get("parameters"), get("inputs"), None
    top_k = explain = None
    if request_id is not None and type(request_id) is not str:
        return None
    if parameters is not None:
        if type(parameters) is not dict:
            return None
        top_k, explain = parameters.get("top_k"), parameters.get("explain")
        if top_k is not None and (type(top_k) is not int or top_k < 1):
            return None
        if explain is not None and (type(explain) is not int or explain < 1):
            return None
    if type(inputs) is not list:
        return None
    tensors = _every_plain(inputs, _plain_input)
    if tensors is None:
        return None
    wanted = get("outputs")
    if wanted is not None:
        if type(wanted) is not list or len(wanted) > MAX_OUTPUTS:
            return None
        outputs = _every_plain(wanted, _plain_output)
        if outputs is None:
            return None
    return ProtocolRequest(tensors, outputs, top_k, request_id, explain)


def _every_plain(items: list, read: Callable[[Any], T | None]) -> list[T] | None:
    """``read`` of every item, or None if it leaves one to pydantic."""
    plain = []
    for item in items:
        value = read(item)
        if value is None:
            return None
        plain.append(value)
    return plain


def _plain_input(tensor: Any) -> ProtocolInput | None:
    if type(tensor) is not dict:
        return None
    get = tensor.get
    name, shape, datatype = get("name"), get("shape"), get("datatype")
    parameters, data = get("parameters"), get("data")
    if (
        type(name) is not str
        or type(datatype) is not str
        or type(shape) is not list
        or len(shape) > MAX_TENSOR_DIMENSIONS
        or (parameters is not None and type(parameters) is not dict)
        or (data is not None and type(data) is not list)
    ):
        return None
    for dimension in shape:
        if type(dimension) is not int or dimension < 0:
            return None
    return ProtocolInput(name, shape, datatype, parameters, data)


def _plain_output(output: Any) -> ProtocolOutput | None:
    if type(output) is not dict:
        return None
    name, parameters = output.get("name"), output.get("parameters")
    if type(name) is not str or (parameters is not None and type(parameters) is not dict):
        return None
    return ProtocolOutput(name, parameters)


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
