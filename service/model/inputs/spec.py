"""Input kinds a model accepts, and turning client payloads into validated arrays.

``vector(d)`` is a flat vector of ``d`` numbers. ``grid(H, W, C)`` is an image-like grid of
``H x W`` cells holding ``C`` numbers each (pixels: C = 1 or 3), flattened row-major (H, W, C)
before any similarity sees it. A grid with C = 1 may also be sent as ``H x W``.
``counts(W)`` is a bag-of-words document: word counts over a vocabulary of ``W`` words, kept
sparse (see :mod:`service.model.inputs.words`). ``text`` is a raw text document, the kind of a text
data set before a vocabulary turns it into ``counts(W)``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.model.errors import InvalidInputError, SpecError
from service.model.kernels.inputs import all_finite

INPUT_KINDS = ("vector", "grid", "counts", "text")
_RANKS = {"vector": 1, "grid": 3, "counts": 1, "text": 0}
_INPUT_PATTERN = re.compile(
    r"^\s*(vector|grid|counts)\s*\(([\d\s,]+)\)\s*$|^\s*(text)\s*$", re.IGNORECASE
)


@dataclass(frozen=True)
class InputSpec:
    """The kind and shape of one input instance.

    Parameters
    ----------
    kind : {"vector", "grid", "counts", "text"}
    shape : tuple of int
        ``(d,)`` for a vector, ``(H, W, C)`` for a grid, ``(W,)`` for counts, ``()`` for text.
    """

    kind: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.kind not in INPUT_KINDS:
            raise SpecError(f"unknown input kind {self.kind!r}; known: {', '.join(INPUT_KINDS)}")
        expected_rank = _RANKS[self.kind]
        if len(self.shape) != expected_rank or any(int(s) < 1 for s in self.shape):
            raise SpecError(
                f"{self.kind} needs {expected_rank} positive dimension(s), got {tuple(self.shape)}"
            )
        shape = tuple(int(s) for s in self.shape)
        object.__setattr__(self, "shape", shape)
        # Derived once (not fields: equality and the repr are the kind and shape alone); every
        # client batch asks for them.
        accepted = (shape, shape[:2]) if self.kind == "grid" and shape[2] == 1 else (shape,)
        object.__setattr__(self, "_accepted_shapes", accepted)
        object.__setattr__(self, "_n_features", math.prod(shape))

    @property
    def n_features(self) -> int:
        """Length of the flattened instance."""
        return self._n_features

    @property
    def accepted_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Instance shapes a client may send: the shape, or (H, W) for a one-channel grid."""
        return self._accepted_shapes

    @property
    def is_documents(self) -> bool:
        """Bag-of-words documents, raw (``text``) or counted (``counts(W)``), kept sparse.

        What a data set or a similarity check asks before a model exists; a model's own inputs
        are described by its input kind (:mod:`service.model.inputs`).
        """
        return self.kind in ("counts", "text")

    def __str__(self) -> str:
        if not self.shape:
            return self.kind
        return f"{self.kind}({', '.join(str(s) for s in self.shape)})"

    @classmethod
    def parse(cls, text: str) -> InputSpec:
        """Parse ``vector(64)``, ``grid(8, 8, 1)``, ``counts(5000)`` or ``text``."""
        match = _INPUT_PATTERN.match(text)
        if match is None:
            raise SpecError(
                f"cannot parse input kind {text!r}: expected vector(d), grid(H, W, C), "
                "counts(W) or text"
            )
        if match.group(3):
            return cls("text", ())
        try:
            dims = tuple(int(s) for s in match.group(2).split(","))
        except ValueError:
            raise SpecError(
                f"cannot parse input kind {text!r}: dimensions must be integers"
            ) from None
        return cls(match.group(1).lower(), dims)

    @classmethod
    def for_array(cls, X: np.ndarray) -> InputSpec:
        """The spec of a batch array: (n, d) is a vector, (n, H, W) or (n, H, W, C) a grid."""
        if X.ndim == 2:
            return cls("vector", X.shape[1:])
        if X.ndim == 3:
            return cls("grid", (*X.shape[1:], 1))
        if X.ndim == 4:
            return cls("grid", X.shape[1:])
        raise SpecError(f"a batch must have 2, 3 or 4 dimensions, got shape {X.shape}")

    def _describe_accepted(self) -> str:
        return " or ".join(str(list(s)) for s in self.accepted_shapes)

    def as_batch(
        self, instances: Sequence[Any] | np.ndarray, names: Sequence[str] | None = None
    ) -> np.ndarray:
        """Validate a batch of instances and flatten it.

        Parameters
        ----------
        instances : sequence of nested lists, or ndarray
            Each instance in one of :attr:`accepted_shapes`.
        names : sequence of str, optional
            What messages call each instance (default ``instances[i]``).

        Returns
        -------
        X : ndarray of shape (n_samples, n_features), float64, C-contiguous

        Raises
        ------
        InvalidInputError
            Naming the first offending instance: empty batch, wrong shape, ragged nesting,
            non-numeric values, NaN or infinity.
        """
        if len(instances) == 0:
            raise InvalidInputError("the batch is empty: send at least one instance")
        try:
            raw = np.asarray(instances)
        except (ValueError, TypeError, OverflowError):
            raw = None  # ragged or mixed: checked instance by instance below
        if raw is None or raw.dtype.kind not in "iuf" or raw.shape[1:] not in self.accepted_shapes:
            # The slow path: find the first bad instance and say what is wrong with it.
            raw = np.stack(
                [
                    self._check_instance(instance_name(names, i), inst)
                    for i, inst in enumerate(instances)
                ]
            )
        X = np.ascontiguousarray(raw.reshape(len(raw), -1), dtype=np.float64)
        if not all_finite(X):
            bad = int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])
            raise InvalidInputError(f"{instance_name(names, bad)} contains NaN or infinity")
        return X

    def _check_instance(self, where: str, instance: Any) -> np.ndarray:
        try:
            array = np.asarray(instance)
        except (ValueError, TypeError, OverflowError):
            raise InvalidInputError(
                f"{where} is ragged: expected a nested list of shape {self._describe_accepted()}"
            ) from None
        if array.dtype.kind == "O" and all(_is_number(v) for v in array.flat):
            # Integers numpy holds as objects (beyond int64): floats if float64 reaches them.
            try:
                array = array.astype(np.float64)
            except OverflowError:
                raise InvalidInputError(
                    f"{where} holds an integer beyond the range of float64 (about 1.8e308)"
                ) from None
        if array.dtype.kind not in "iuf":
            raise InvalidInputError(f"{where} must hold only numbers, got {_describe_dtype(array)}")
        if array.shape not in self.accepted_shapes:
            raise InvalidInputError(
                f"{where} has shape {list(array.shape)}, expected {self._describe_accepted()}"
                f" for input {self}"
            )
        return array.reshape(self.shape)


def instance_name(names: Sequence[str] | None, index: int) -> str:
    """What messages call instance ``index`` of a batch: ``names[index]``, or
    ``instances[index]``."""
    return f"instances[{index}]" if names is None else names[index]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _describe_dtype(array: np.ndarray) -> str:
    if array.dtype.kind == "b":
        return "booleans"
    if array.dtype.kind in "US":
        return "strings"
    return "null or mixed values"
