"""A protocol request body read two ways: :func:`plain_request` (orjson and type checks, what
the server tries first) against pydantic's :class:`InferRequest` (the reference). Whatever the
plain reading takes, pydantic takes with the same values; what it leaves, pydantic reads (or
refuses) as it always did. The usual bodies must be taken, or the fast path is never used."""

from __future__ import annotations

import copy
import json

import pytest
from pydantic import ValidationError

from service.api.protocol.schemas import (
    MAX_OUTPUTS,
    MAX_TENSOR_DIMENSIONS,
    PLAIN_REQUEST_MAX_BYTES,
    InferRequest,
    ProtocolInput,
    ProtocolOutput,
    ProtocolRequest,
    plain_request,
)

DIGIT = {
    "id": "42",
    "inputs": [{"name": "input", "shape": [1, 8, 8], "datatype": "FP64", "data": [0.5] * 64}],
}
# As tritonclient's HTTP client sends JSON tensors: parameters on the tensors and outputs.
TRITON = {
    "inputs": [
        {
            "name": "input",
            "shape": [2, 64],
            "datatype": "FP32",
            "parameters": {"binary_data": False},
            "data": [[float(i) for i in range(64)], [1.25] * 64],
        }
    ],
    "outputs": [
        {"name": "scores", "parameters": {"binary_data": False}},
        {"name": "label", "parameters": {"binary_data": False}},
    ],
    "parameters": {"top_k": 3, "binary_data_output": False},
}
TEXTS = {
    "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a b", "ç ✓ 😀"]}],
    "outputs": [{"name": "label"}, {"name": "top_k_labels"}],
    "parameters": {"top_k": 1},
}
BINARY = {
    "inputs": [
        {
            "name": "input",
            "shape": [1, 64],
            "datatype": "FP64",
            "parameters": {"binary_data_size": 512},
        }
    ]
}
USUAL = [DIGIT, TRITON, TEXTS, BINARY]


def reference(raw: bytes) -> ProtocolRequest | None:
    """pydantic's reading, None where it refuses the body."""
    try:
        return InferRequest.model_validate_json(raw).protocol()
    except ValidationError:
        return None


def typed(value):
    """``value`` with the type of every number, string and container beside it: 2**70 and
    its float are equal to ``==``, and a reading that turned one into the other must not be."""
    if isinstance(value, (ProtocolRequest, ProtocolInput, ProtocolOutput)):
        fields = type(value).__dataclass_fields__
        return type(value).__name__, {name: typed(getattr(value, name)) for name in fields}
    if isinstance(value, dict):
        return "dict", {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return "list", [typed(item) for item in value]
    return type(value).__name__, value


def agree(raw: bytes) -> ProtocolRequest | None:
    plain = plain_request(raw)
    if plain is not None:
        assert typed(plain) == typed(reference(raw)), raw[:200]
    return plain


@pytest.mark.parametrize("body", USUAL, ids=["digit", "tritonclient", "texts", "binary"])
def test_the_usual_bodies_are_read_plainly_with_pydantics_values(body):
    raw = json.dumps(body).encode()
    plain = agree(raw)
    assert plain is not None
    assert plain.inputs[0] == ProtocolInput(**body["inputs"][0])
    assert plain.top_k == body.get("parameters", {}).get("top_k")
    assert plain.id == body.get("id")
    outputs = body.get("outputs")
    assert plain.outputs == (None if outputs is None else [ProtocolOutput(**o) for o in outputs])


# Values put in each place below: types pydantic refuses or converts, edges of the limits.
ODD_VALUES = [None, 0, 1, -1, 3.0, 3.5, True, "3", "", [], {}, [1], {"a": 1}, 2**63, 2**70, 1e300]


def _places(body: dict) -> list[tuple]:
    """Paths to every field of ``body`` and of its first tensor, output and parameters, and to a
    new unknown field at each level."""
    places = [(key,) for key in ("id", "parameters", "inputs", "outputs", "other")]
    places += [("parameters", key) for key in ("top_k", "other")]
    places += [
        ("inputs", 0, key) for key in ("name", "shape", "datatype", "parameters", "data", "other")
    ]
    places += [("inputs", 0, "shape", 0), ("inputs", 0, "shape", 1)]
    places += [("outputs", 0, key) for key in ("name", "parameters", "other")]
    return places


def _with(body: dict, place: tuple, value) -> dict | None:
    changed = copy.deepcopy(body)
    target = changed
    for step in place[:-1]:
        try:
            target = target[step]
        except (KeyError, IndexError, TypeError):
            return None
    if not isinstance(target, (dict, list)) or (
        isinstance(target, list) and place[-1] >= len(target)
    ):
        return None
    target[place[-1]] = value
    return changed


@pytest.mark.parametrize("body", [DIGIT, TRITON, TEXTS], ids=["digit", "tritonclient", "texts"])
def test_any_field_changed_to_any_value_reads_as_pydantic_reads_it_or_goes_to_pydantic(body):
    read_plainly = deferred = 0
    for place in _places(body):
        for value in ODD_VALUES:
            changed = _with(body, place, value)
            if changed is None:
                continue
            if agree(json.dumps(changed).encode()) is None:
                deferred += 1
            else:
                read_plainly += 1
    # Both sides taken: the check compared values, and refused what it must.
    assert read_plainly > 20
    assert deferred > 20


def _tensor(data: bytes) -> bytes:
    return (
        b'{"inputs": [{"name": "input", "shape": [1], "datatype": "FP64", "data": ' + data + b"}]}"
    )


@pytest.mark.parametrize(
    "raw",
    [
        b'\xef\xbb\xbf{"inputs": []}',  # a byte order mark
        b'{"inputs": []} x',  # trailing bytes
        _tensor(b"[NaN]"),
        _tensor(b"[1e400]"),
        # An integer past 64 bits: orjson would read it as a float, pydantic as an int.
        _tensor(b"[123456789012345678901234567890]"),
        _tensor(b"[-9223372036854775809]"),
        b'{"id": "\\ud800", "inputs": []}',  # a lone surrogate
        _tensor(b"[" * 250 + b"]" * 250),  # deeper than pydantic's parser goes
        b"[]",
        b"null",
        b"",
    ],
)
def test_bodies_at_the_edges_of_json_are_left_to_pydantic(raw):
    assert agree(raw) is None


def test_nested_data_within_the_bracket_count_reads_as_pydantic_reads_it():
    assert agree(_tensor(b"[[[[[[[[[[]]]]]]]]]]")) is not None


def test_the_comparison_sees_an_integer_read_as_a_float():
    assert typed([2**70]) != typed([float(2**70)])
    assert typed(ProtocolInput("a", [1], "FP64", None, [1])) != typed(
        ProtocolInput("a", [1], "FP64", None, [1.0])
    )


def test_what_pydantic_would_refuse_or_read_differently_is_left_to_it():
    long_integer = copy.deepcopy(DIGIT)
    long_integer["inputs"][0]["data"] = [10**25] + [0] * 63
    deep = copy.deepcopy(DIGIT)
    deep["inputs"][0]["data"] = [[[[[[0.5]]]]]] * 64  # more brackets than taken plainly
    too_many_dimensions = copy.deepcopy(DIGIT)
    too_many_dimensions["inputs"][0]["shape"] = [1] * (MAX_TENSOR_DIMENSIONS + 1)
    too_many_outputs = copy.deepcopy(TRITON)
    too_many_outputs["outputs"] = [{"name": "label"}] * (MAX_OUTPUTS + 1)
    whole_float_shape = copy.deepcopy(DIGIT)
    whole_float_shape["inputs"][0]["shape"] = [1.0, 8, 8]
    large = copy.deepcopy(DIGIT)
    large["inputs"][0]["data"] = [0.123456789] * (PLAIN_REQUEST_MAX_BYTES // 11)
    for body in (
        long_integer,
        deep,
        too_many_dimensions,
        too_many_outputs,
        whole_float_shape,
        large,
    ):
        assert plain_request(json.dumps(body).encode()) is None
    # pydantic still reads the ones it takes: a whole float as a dimension, a large body.
    assert reference(json.dumps(whole_float_shape).encode()).inputs[0].shape == [1, 8, 8]
    assert reference(json.dumps(large).encode()) is not None
    assert reference(json.dumps(too_many_outputs).encode()) is None
