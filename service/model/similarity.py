"""Similarity measures: their text form, their parameters and how each is computed.

A measure is written as ``name`` or ``name(value, key=value, ...)``; several measures on one
basis are joined with ``+``: ``rbf(gamma=1) + linear``. The same text is used by the command
line, stored in the manifest and shown by the API. :func:`format_spec` gives the canonical form
(lower case, every parameter named), so parsing the canonical form gives back the same spec.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from service.model import kernels
from service.model.errors import SpecError

# numba's workqueue threading layer aborts the process when two threads enter parallel regions at
# once; serving runs handlers on a thread pool, so every driver call goes through this lock. The
# drivers already use every core, so serialising them costs no throughput.
_PARALLEL_REGION = threading.Lock()

# Below this many multiply-adds (n_samples * n_basis * n_features) a call runs on the calling
# thread: a parallel region costs tens of microseconds to start, and far more when another
# process holds a core. 250 bases of 64 features: batches of up to 12 items run serially.
PARALLEL_MIN_WORK = 200_000


@dataclass(frozen=True)
class Parameter:
    """One numeric parameter of a similarity measure."""

    name: str
    default: float
    minimum: float = -math.inf
    exclusive_minimum: bool = False

    def check(self, value: float, measure: str) -> float:
        if not math.isfinite(value):
            raise SpecError(f"{measure}: parameter {self.name} must be finite, got {value}")
        too_small = value <= self.minimum if self.exclusive_minimum else value < self.minimum
        if too_small:
            relation = ">" if self.exclusive_minimum else ">="
            raise SpecError(
                f"{measure}: parameter {self.name} must be {relation} {self.minimum}, got {value}"
            )
        return value


@dataclass(frozen=True)
class SimilarityKind:
    """A family of similarity measures: its name, parameters and drivers (parallel, serial)."""

    name: str
    parameters: tuple[Parameter, ...]
    driver: Callable[..., None]
    serial_driver: Callable[..., None]
    description: str


SIMILARITY_KINDS: dict[str, SimilarityKind] = {
    kind.name: kind
    for kind in (
        SimilarityKind(
            name="linear",
            parameters=(),
            driver=kernels.linear_similarities,
            serial_driver=kernels.linear_similarities_serial,
            description="inner product b . x",
        ),
        SimilarityKind(
            name="rbf",
            parameters=(Parameter("gamma", 1.0, minimum=0.0, exclusive_minimum=True),),
            driver=kernels.rbf_similarities,
            serial_driver=kernels.rbf_similarities_serial,
            description="exp(-gamma ||b - x||^2)",
        ),
    )
}


@dataclass(frozen=True)
class SimilaritySpec:
    """A similarity measure with all of its parameters set.

    Parameters
    ----------
    name : str
        A key of :data:`SIMILARITY_KINDS`.
    params : tuple of (str, float)
        Every parameter of the kind, in the kind's order.
    """

    name: str
    params: tuple[tuple[str, float], ...] = ()

    @property
    def kind(self) -> SimilarityKind:
        return SIMILARITY_KINDS[self.name]

    def __str__(self) -> str:
        return format_spec(self)

    def compute(
        self, basis: np.ndarray, X: np.ndarray, out: np.ndarray | None = None
    ) -> np.ndarray:
        """Similarities of every input to every basis item.

        Parameters
        ----------
        basis : ndarray of shape (n_basis, n_features), float64, C-contiguous
        X : ndarray of shape (n_samples, n_features), float64, C-contiguous
        out : ndarray of shape (n_samples, n_basis), optional
            Preallocated output, written in place.

        Returns
        -------
        out : ndarray of shape (n_samples, n_basis)
        """
        if out is None:
            out = np.empty((X.shape[0], basis.shape[0]), dtype=np.float64)
        args = [value for _, value in self.params]
        if X.shape[0] * basis.shape[0] * X.shape[1] < PARALLEL_MIN_WORK:
            self.kind.serial_driver(basis, X, *args, out)
        else:
            with _PARALLEL_REGION:
                self.kind.driver(basis, X, *args, out)
        return out


def _format_number(value: float) -> str:
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def format_spec(spec: SimilaritySpec) -> str:
    """The canonical text of a spec, e.g. ``rbf(gamma=0.5)`` or ``linear``."""
    if not spec.params:
        return spec.name
    inner = ", ".join(f"{key}={_format_number(value)}" for key, value in spec.params)
    return f"{spec.name}({inner})"


_SPEC_PATTERN = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:\((.*)\))?\s*$", re.DOTALL)


def parse_spec(text: str) -> SimilaritySpec:
    """Parse one similarity measure, e.g. ``rbf``, ``rbf(0.5)`` or ``rbf(gamma=0.5)``.

    Raises
    ------
    SpecError
        If the text is malformed, names an unknown measure or gives a bad parameter.
    """
    match = _SPEC_PATTERN.match(text)
    if match is None:
        raise SpecError(f"cannot parse similarity {text!r}: expected name or name(arguments)")
    name, arguments = match.group(1).lower(), match.group(2)
    if name not in SIMILARITY_KINDS:
        known = ", ".join(sorted(SIMILARITY_KINDS))
        raise SpecError(f"unknown similarity {name!r}; known: {known}")
    kind = SIMILARITY_KINDS[name]
    values: dict[str, float] = {}
    if arguments is not None and arguments.strip():
        for position, argument in enumerate(arguments.split(",")):
            key, sep, raw = argument.partition("=")
            if not sep:
                key, raw = "", key
                if position >= len(kind.parameters):
                    raise SpecError(
                        f"{name} takes {len(kind.parameters)} parameter(s), got more in {text!r}"
                    )
                key = kind.parameters[position].name
            key = key.strip().lower()
            if key not in {p.name for p in kind.parameters}:
                expected = ", ".join(p.name for p in kind.parameters) or "none"
                raise SpecError(f"{name} has no parameter {key!r} (parameters: {expected})")
            if key in values:
                raise SpecError(f"{name}: parameter {key} given twice in {text!r}")
            try:
                values[key] = float(raw.strip())
            except ValueError:
                raise SpecError(
                    f"{name}: parameter {key} must be a number, got {raw.strip()!r}"
                ) from None
    params = tuple((p.name, p.check(values.get(p.name, p.default), name)) for p in kind.parameters)
    return SimilaritySpec(name, params)


def split_specs(text: str) -> list[str]:
    """Split ``a + b(...) + c`` on the ``+`` signs outside parentheses."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "+" and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def parse_specs(text_or_list: str | list[str] | tuple[str, ...]) -> tuple[SimilaritySpec, ...]:
    """Parse one or more measures from ``"rbf + linear"`` or ``["rbf", "linear"]``.

    Raises
    ------
    SpecError
        If any measure is malformed, none is given, or one is given twice.
    """
    texts = split_specs(text_or_list) if isinstance(text_or_list, str) else list(text_or_list)
    if any(not t.strip() for t in texts) or not texts:
        raise SpecError(f"empty similarity in {text_or_list!r}")
    specs = tuple(parse_spec(t) for t in texts)
    canonical = [format_spec(s) for s in specs]
    duplicates = sorted({c for c in canonical if canonical.count(c) > 1})
    if duplicates:
        raise SpecError(f"similarity given twice: {', '.join(duplicates)}")
    return specs
