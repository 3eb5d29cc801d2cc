"""Open Inference Protocol tensors: a request's input tensor as the model's batch, and the
answers as output tensors.

One codec per input kind, chosen once per model version (:func:`codec_for`), beside the model's
own strategies (:mod:`service.model.inputs`):

===============  =================================  =========================================
input kind       :class:`DenseInputs`               :class:`DocumentInputs`
===============  =================================  =========================================
codec            :class:`NumericTensor`             :class:`TextTensor`
input            ``input``: FP64 ``[-1, *shape]``   ``text``: BYTES ``[-1]``
accepts          any numeric datatype               BYTES (UTF-8); the model's vocabulary
                                                    counts the words
===============  =================================  =========================================

A codec only reads the tensor; the model validates what it gets as it does for ``/classify``
(shapes, NaN, an empty batch), and the data plane applies the limits.

Outputs (the same for every model): ``label`` BYTES ``[n]``, ``scores`` FP64 ``[n, K]`` (the
classes in the model metadata's order), and ``top_k_labels`` BYTES / ``top_k_scores`` FP64
``[n, k]``, each instance's ``k = min(top_k, K)`` best classes, best first; and
``explanation`` BYTES ``[n]``, each instance's explanation as a JSON document (``/classify``'s
``explanation``), when asked for or with ``parameters.explain``.
"""

from __future__ import annotations

import math
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import orjson

from service.api.protocol.schemas import ProtocolInput, ProtocolRequest
from service.model import BatchTooLargeError, InvalidInputError
from service.model.answers import Answer
from service.model.errors import brief
from service.model.inputs.base import InputKind
from service.model.inputs.dense import DenseInputs
from service.model.inputs.documents import DocumentInputs
from service.model.predictor import Predictor

# The numeric datatypes of the protocol, by name: their values are read as this dtype, then
# computed with in float64.
NUMERIC_DATATYPES: dict[str, np.dtype] = {
    name: np.dtype(dtype).newbyteorder("<")
    for name, dtype in {
        "FP16": np.float16,
        "FP32": np.float32,
        "FP64": np.float64,
        "INT8": np.int8,
        "INT16": np.int16,
        "INT32": np.int32,
        "INT64": np.int64,
        "UINT8": np.uint8,
        "UINT16": np.uint16,
        "UINT32": np.uint32,
        "UINT64": np.uint64,
    }.items()
}
_FLOAT64 = NUMERIC_DATATYPES["FP64"]
OUTPUT_NAMES = ("label", "scores", "top_k_labels", "top_k_scores", "explanation")
DEFAULT_OUTPUTS = ("label", "scores")
TOP_K_OUTPUTS = ("top_k_labels", "top_k_scores")
EXPLANATION_OUTPUT = "explanation"
# Basis items an explanation names when the output is asked for without parameters.explain.
DEFAULT_EXPLAIN_ITEMS = 5
BINARY_DATA_SIZE = "binary_data_size"
# Bytes of the length before each element of a binary BYTES tensor.
_LENGTH_PREFIX = 4


@dataclass(frozen=True)
class ModelInputs:
    """A decoded tensor, as the data plane's classify takes it: instances or texts."""

    instances: Any = None
    texts: list[str] | None = None


class TensorCodec(ABC):
    """How one input kind reads the protocol's input tensor."""

    input_name: ClassVar[str]

    @abstractmethod
    def input_metadata(self) -> dict[str, Any]:
        """The input's name, datatype and shape (-1: any batch size)."""

    @abstractmethod
    def decode(self, tensor: ProtocolInput, raw: bytes | None) -> ModelInputs:
        """The tensor's values, from its JSON ``data`` or its binary bytes ``raw``.

        Raises
        ------
        InvalidInputError
            Wrong datatype, shape, or data length, or data of the wrong type.
        """

    def _batch_size(self, tensor: ProtocolInput, expected: Callable[[], str]) -> int:
        """n, the shape's first dimension (the schema has made every dimension >= 0);
        ``expected()`` says which shapes the input takes, should it have none."""
        if not tensor.shape:
            raise InvalidInputError(
                f"input {self.input_name!r} has shape [], expected {expected()}"
            )
        return tensor.shape[0]


class NumericTensor(TensorCodec):
    """Vectors and grids: a numeric tensor ``[n, *spec.shape]`` (``[n, H, W]`` also for a
    one-channel grid), in any numeric datatype."""

    input_name = "input"

    def __init__(self, inputs: DenseInputs) -> None:
        self.spec = inputs.spec

    def input_metadata(self) -> dict[str, Any]:
        return {"name": self.input_name, "datatype": "FP64", "shape": [-1, *self.spec.shape]}

    def _expected(self) -> str:
        return " or ".join(str([-1, *shape]) for shape in self.spec.accepted_shapes)

    def decode(self, tensor: ProtocolInput, raw: bytes | None) -> ModelInputs:
        dtype = NUMERIC_DATATYPES.get(tensor.datatype)
        if dtype is None:
            raise InvalidInputError(
                f"input {self.input_name!r} has datatype {brief(tensor.datatype)}; this model "
                f"reads numbers: FP64 or FP32 (or {', '.join(list(NUMERIC_DATATYPES)[3:])})"
            )
        n = self._batch_size(tensor, self._expected)
        instance_shape = tuple(tensor.shape[1:])
        if instance_shape not in self.spec.accepted_shapes:
            raise InvalidInputError(
                f"input {self.input_name!r} has shape {brief(tensor.shape)}, expected "
                f"{self._expected()} for input {self.spec}"
            )
        size = n * math.prod(instance_shape)
        if raw is not None:
            if len(raw) != size * dtype.itemsize:
                raise InvalidInputError(
                    f"input {self.input_name!r} has {len(raw):,} bytes of binary data; shape "
                    f"{tensor.shape} of {tensor.datatype} takes {size * dtype.itemsize:,}"
                )
            # A copy: the buffer's view is read-only, which compiled kernels take as another type.
            values = np.frombuffer(raw, dtype=dtype).astype(np.float64)
        else:
            values = self._json_values(tensor, dtype, size)
        return ModelInputs(instances=values.reshape(n, *instance_shape))

    def _json_values(self, tensor: ProtocolInput, dtype: np.dtype, size: int) -> np.ndarray:
        """The JSON data's ``size`` values as float64, as ``dtype`` holds them (any shape)."""
        where = f"input {self.input_name!r}"
        if tensor.data is None:
            raise InvalidInputError(f"{where} has no data (and no {BINARY_DATA_SIZE})")
        try:
            values = np.asarray(tensor.data)
        except (ValueError, TypeError, OverflowError):
            raise InvalidInputError(
                f"{where}: data is ragged: send it flat, or nested as the shape says"
            ) from None
        if values.dtype.kind not in "iuf":
            raise InvalidInputError(f"{where}: data must hold only numbers (of {tensor.datatype})")
        if values.size != size:
            raise InvalidInputError(
                f"{where} has {values.size:,} values; shape {tensor.shape} takes {size:,}"
            )
        if dtype.kind in "iu" and values.dtype.kind == "f":
            raise InvalidInputError(f"{where}: data of {tensor.datatype} must be whole numbers")
        if dtype is _FLOAT64:  # float64 holds every number JSON data decodes to
            return values.astype(np.float64, copy=False)
        info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
        finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
        if finite.size and (finite.min() < info.min or finite.max() > info.max):
            raise InvalidInputError(f"{where}: a value is out of the range of {tensor.datatype}")
        # Values as the declared datatype holds them (an FP32 0.1 is float32's 0.1).
        return values.astype(dtype).astype(np.float64)


class TextTensor(TensorCodec):
    """Bag-of-words documents: a BYTES tensor ``[n]`` (or ``[n, 1]``) of UTF-8 texts, which
    the model's vocabulary counts (a model without one says so)."""

    input_name = "text"

    def __init__(self, inputs: DocumentInputs) -> None:
        pass  # every document model reads the same tensor

    def input_metadata(self) -> dict[str, Any]:
        return {"name": self.input_name, "datatype": "BYTES", "shape": [-1]}

    def decode(self, tensor: ProtocolInput, raw: bytes | None) -> ModelInputs:
        where = f"input {self.input_name!r}"
        if tensor.datatype != "BYTES":
            raise InvalidInputError(
                f"{where} has datatype {brief(tensor.datatype)}; this model reads texts: BYTES"
            )
        n = self._batch_size(tensor, lambda: "[-1] or [-1, 1]")
        if tuple(tensor.shape[1:]) not in ((), (1,)):
            raise InvalidInputError(
                f"{where} has shape {brief(tensor.shape)}, expected [-1] or [-1, 1]: one text "
                "per instance"
            )
        texts = _binary_texts(raw, where, n) if raw is not None else _json_texts(tensor, where)
        if len(texts) != n:
            raise InvalidInputError(
                f"{where} has {len(texts):,} texts; shape {tensor.shape} takes {n:,}"
            )
        return ModelInputs(texts=texts)


def _json_texts(tensor: ProtocolInput, where: str) -> list[str]:
    if tensor.data is None:
        raise InvalidInputError(f"{where} has no data (and no {BINARY_DATA_SIZE})")
    texts = [t[0] if isinstance(t, list) and len(t) == 1 else t for t in tensor.data]
    if not all(isinstance(t, str) for t in texts):
        raise InvalidInputError(f"{where}: data must hold only strings (the texts)")
    return texts


def _binary_texts(raw: bytes, where: str, n: int) -> list[str]:
    """The texts of binary BYTES data: each a 4-byte little-endian length, then its bytes.
    Reading stops past ``n`` texts (the shape's): the data's length bounds nothing."""
    texts, at = [], 0
    while at < len(raw):
        if len(texts) == n:
            raise InvalidInputError(f"{where}: binary BYTES data holds more than {n:,} texts")
        if at + _LENGTH_PREFIX > len(raw):
            raise InvalidInputError(f"{where}: binary BYTES data ends inside a length prefix")
        length = int.from_bytes(raw[at : at + _LENGTH_PREFIX], "little")
        at += _LENGTH_PREFIX
        if at + length > len(raw):
            raise InvalidInputError(f"{where}: binary BYTES data ends inside an element")
        try:
            texts.append(raw[at : at + length].decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidInputError(f"{where}: text {len(texts)} is not valid UTF-8") from None
        at += length
    return texts


_CODECS: dict[type[InputKind], type[TensorCodec]] = {
    DenseInputs: NumericTensor,
    DocumentInputs: TextTensor,
}
_codec_of: weakref.WeakKeyDictionary[Predictor, TensorCodec] = weakref.WeakKeyDictionary()


def codec_for(predictor: Predictor) -> TensorCodec:
    """The tensor codec of a model version's input kind (built once per version)."""
    codec = _codec_of.get(predictor)
    if codec is None:
        codec = _codec_of[predictor] = _CODECS[type(predictor.inputs)](predictor.inputs)
    return codec


def model_metadata(predictor: Predictor, name: str, version: str) -> dict[str, Any]:
    """The protocol's model metadata: name, version, inputs and outputs."""
    return {
        "name": name,
        "versions": [version],
        "platform": "besvm",
        "inputs": [
            {
                **codec_for(predictor).input_metadata(),
                # What the service computes from the raw input, per measure (not a client's job).
                "parameters": {"measures": predictor.describe_measures()},
            }
        ],
        "outputs": [
            {"name": "label", "datatype": "BYTES", "shape": [-1]},
            {
                "name": "scores",
                "datatype": "FP64",
                "shape": [-1, len(predictor.classes)],
                "parameters": {"classes": list(predictor.classes)},
            },
            {"name": "top_k_labels", "datatype": "BYTES", "shape": [-1, -1]},
            {"name": "top_k_scores", "datatype": "FP64", "shape": [-1, -1]},
            {"name": EXPLANATION_OUTPUT, "datatype": "BYTES", "shape": [-1]},
        ],
    }


def decode_request(
    request: ProtocolRequest, binary: bytes, predictor: Predictor, max_batch_size: int
) -> tuple[ModelInputs, tuple[str, ...]]:
    """The request's one input tensor, decoded for ``predictor``, and the outputs it wants.

    The outputs and the batch size are checked before the tensor is decoded.

    Parameters
    ----------
    request : ProtocolRequest
    binary : bytes
        What follows the JSON header (binary tensor data; empty if none).
    predictor : Predictor
    max_batch_size : int
        The most instances a request may hold (MAX_BATCH_SIZE).

    Raises
    ------
    InvalidInputError
        Not one input, an input of another name, a tensor the model cannot read, binary data
        that does not add up, or an unknown or repeated output.
    BatchTooLargeError
        The tensor's first dimension is over ``max_batch_size``.
    """
    codec = codec_for(predictor)
    if len(request.inputs) != 1:
        raise InvalidInputError(
            f"the model takes one input, {codec.input_name!r}; got {len(request.inputs):,}"
        )
    tensor = request.inputs[0]
    if tensor.name != codec.input_name:
        raise InvalidInputError(
            f"unknown input {brief(tensor.name)}: the model's input is {codec.input_name!r}"
        )
    outputs = _outputs_wanted(request)
    if tensor.shape and tensor.shape[0] > max_batch_size:
        raise BatchTooLargeError(
            f"the request holds {tensor.shape[0]:,} instances; the limit is {max_batch_size}"
        )
    raw = _binary_part(tensor, binary)
    return codec.decode(tensor, raw), outputs


def _binary_part(tensor: ProtocolInput, binary: bytes) -> bytes | None:
    size = (tensor.parameters or {}).get(BINARY_DATA_SIZE)
    if size is None:
        if binary:
            raise InvalidInputError(
                f"{len(binary):,} bytes follow the JSON header, but no input has a "
                f"{BINARY_DATA_SIZE}"
            )
        return None
    if type(size) is not int or size != len(binary):
        raise InvalidInputError(
            f"input {brief(tensor.name)} has {BINARY_DATA_SIZE} {brief(size)}, but "
            f"{len(binary):,} bytes follow the JSON header"
        )
    if tensor.data is not None:
        raise InvalidInputError(f"input {brief(tensor.name)} has both data and binary data")
    return binary


def _outputs_wanted(request: ProtocolRequest) -> tuple[str, ...]:
    if request.outputs is None:
        names = DEFAULT_OUTPUTS + TOP_K_OUTPUTS if request.top_k is not None else DEFAULT_OUTPUTS
        return (*names, EXPLANATION_OUTPUT) if request.explain is not None else names
    names = []
    for output in request.outputs:
        if output.name not in OUTPUT_NAMES:
            raise InvalidInputError(
                f"unknown output {brief(output.name)}; outputs: {', '.join(OUTPUT_NAMES)}"
            )
        if output.name in names:
            raise InvalidInputError(f"output {output.name!r} is asked for twice")
        if "classification" in (output.parameters or {}):
            raise InvalidInputError(
                "the classification extension is not supported: ask for top_k_labels and "
                "top_k_scores with parameters.top_k"
            )
        names.append(output.name)
    return tuple(names)


def items_to_explain(names: Sequence[str], explain: int | None) -> int:
    """Basis items each explanation names for the outputs ``names`` (0: no explanation)."""
    if EXPLANATION_OUTPUT not in names:
        return 0
    return DEFAULT_EXPLAIN_ITEMS if explain is None else explain


def classification(
    inputs: ModelInputs, names: Sequence[str], request: ProtocolRequest, top_k: int
) -> dict[str, Any]:
    """The data plane's classify arguments for a decoded request and the outputs ``names`` it
    wants: its instances or texts, the classes to rank, the basis items to explain."""
    return {
        "instances": inputs.instances,
        "texts": inputs.texts,
        "top_k": classes_to_rank(names, top_k),
        "explain": items_to_explain(names, request.explain),
    }


def classes_to_rank(names: Sequence[str], top_k: int) -> int:
    """How many classes each answer must rank for the outputs ``names``: ``top_k`` for the
    top-k outputs, else one (the label; scores come in the classes' order, unranked)."""
    return top_k if any(name in TOP_K_OUTPUTS for name in names) else 1


def output_tensors(
    answers: Sequence[Answer], classes: Sequence[str], names: Sequence[str], top_k: int
) -> list[dict[str, Any]]:
    """The outputs ``names`` of a batch's answers.

    Parameters
    ----------
    answers : sequence of Answer, length n
        Each ranking at least :func:`classes_to_rank` classes.
    classes : sequence of str, length K
        The order of the scores' columns.
    names : sequence of str
        Outputs of :data:`OUTPUT_NAMES`, in the order to answer them.
    top_k : int
        Columns of the top-k outputs, clipped to K.
    """
    n, n_classes = len(answers), len(classes)
    k = min(top_k, n_classes)
    tensors = {}
    for name in names:
        if name == "label":
            tensors[name] = ("BYTES", [n], [a.label for a in answers])
        elif name == "scores":
            tensors[name] = ("FP64", [n, n_classes], [s for a in answers for s in a.scores])
        elif name == "top_k_labels":
            tensors[name] = ("BYTES", [n, k], [c for a in answers for c, _ in a.ranked[:k]])
        elif name == EXPLANATION_OUTPUT:
            documents = [orjson.dumps(a.explanation.as_dict()).decode() for a in answers]
            tensors[name] = ("BYTES", [n], documents)
        else:
            tensors[name] = ("FP64", [n, k], [s for a in answers for _, s in a.ranked[:k]])
    return [
        {"name": name, "datatype": datatype, "shape": shape, "data": data}
        for name, (datatype, shape, data) in tensors.items()
    ]
