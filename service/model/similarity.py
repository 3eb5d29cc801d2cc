"""Similarity measures: their text form, their parameters and how each is computed.

A measure is written as ``name`` or ``name(value, key=value, ...)``; several measures on one
basis are joined with ``+``: ``rbf(gamma=1) + linear``. A term may name the input transform it
reads, ``transform: measure`` (``hog(8): rbf + pixels: rigid(1)``, see
:mod:`service.model.inputs.transforms`); a term without one reads the model's transform. The same
text is used by the command line, stored in the manifest and shown by the API. :func:`format_spec`
gives the canonical form (lower case, every parameter named), so parsing the canonical form
gives back the same spec.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numba
import numpy as np

from service.model import threads
from service.model.errors import SpecError
from service.model.inputs import words
from service.model.inputs.transforms import InputTransform, parse_transform
from service.model.inputs.words import CellDocuments, Documents
from service.model.kernels import Drivers
from service.model.kernels import dense as dense_kernels
from service.model.kernels import grid as grid_kernels
from service.model.notation import bind_arguments, parse_call


@dataclass(frozen=True)
class Parameter:
    """One numeric parameter of a similarity measure."""

    name: str
    default: float
    minimum: float = -math.inf
    exclusive_minimum: bool = False
    integer: bool = False

    def check(self, value: float, measure: str) -> float:
        if not math.isfinite(value):
            raise SpecError(f"{measure}: parameter {self.name} must be finite, got {value}")
        if self.integer and value != int(value):
            raise SpecError(f"{measure}: parameter {self.name} must be an integer, got {value}")
        too_small = value <= self.minimum if self.exclusive_minimum else value < self.minimum
        if too_small:
            relation = ">" if self.exclusive_minimum else ">="
            raise SpecError(
                f"{measure}: parameter {self.name} must be {relation} {self.minimum}, got {value}"
            )
        return value


def _unit_cost(*_params: float) -> float:
    return 1.0


@dataclass(frozen=True)
class SimilarityKind:
    """A family of similarity measures: its name, parameters, and its drivers on each kind of
    item it reads.

    ``dense`` computes the measure on dense arrays (a grid kind's drivers take the grid's
    ``height, width, channels`` after ``basis, X``), ``documents`` on bag-of-words
    :class:`~service.model.inputs.words.Documents`, ``cells`` on images as bags of visual words
    (:class:`~service.model.inputs.words.CellDocuments`: the documents measure on each pyramid
    cell, summed with the cells' weights); a kind reads the items it has drivers for.
    ``cost`` gives the multiply-adds per dense feature pair as a function of the parameters.
    ``linear_in_input``: on dense items the measure is the inner product of b and x, so a linear
    function of its similarities is one of the input (see :meth:`BoundSimilarity.input_weights`).
    """

    name: str
    parameters: tuple[Parameter, ...]
    description: str
    dense: Drivers | None
    documents: Drivers | None = None
    cells: Drivers | None = None
    needs_grid: bool = False
    cost: Callable[..., float] = _unit_cost
    positive_definite: bool = True
    linear_in_input: bool = False

    @property
    def documents_only(self) -> bool:
        return self.dense is None


def _shifts(h: float) -> float:
    return (2 * h + 1) ** 2


def _deformable_cost(h_r: float, h_l: float) -> float:
    return _shifts(h_r + h_l) + _shifts(h_r) * _shifts(h_l)


SIMILARITY_KINDS: dict[str, SimilarityKind] = {
    kind.name: kind
    for kind in (
        SimilarityKind(
            name="linear",
            parameters=(),
            description="inner product b . x (documents: of their tf-idf vectors)",
            dense=dense_kernels.LINEAR,
            documents=words.TFIDF_LINEAR,
            cells=words.TFIDF_LINEAR_CELLS,
            linear_in_input=True,
        ),
        SimilarityKind(
            name="rbf",
            parameters=(Parameter("gamma", 1.0, minimum=0.0, exclusive_minimum=True),),
            description="exp(-gamma ||b - x||^2) (documents: of their tf-idf vectors)",
            dense=dense_kernels.RBF,
            documents=words.TFIDF_RBF,
            cells=words.TFIDF_RBF_CELLS,
        ),
        SimilarityKind(
            name="rigid",
            parameters=(Parameter("h", 1, minimum=0, integer=True),),
            description="max over shifts z in {-h..h}^2 of sum_cells <b_c, x_(c+z)> (grids)",
            dense=grid_kernels.RIGID,
            needs_grid=True,
            cost=_shifts,
            positive_definite=False,
        ),
        SimilarityKind(
            name="deformable",
            parameters=(
                Parameter("h_r", 1, minimum=0, integer=True),
                Parameter("h_l", 1, minimum=0, integer=True),
            ),
            description=(
                "rigid shift h_r plus an independent local shift h_l per cell, "
                "max over both (grids)"
            ),
            dense=grid_kernels.DEFORMABLE,
            needs_grid=True,
            cost=_deformable_cost,
            positive_definite=False,
        ),
        SimilarityKind(
            name="sensing0",
            parameters=(),
            description="log of the multinomial sensing kernel on word counts (documents)",
            dense=None,
            documents=words.SENSING0,
            cells=words.SENSING0_CELLS,
            positive_definite=False,
        ),
        SimilarityKind(
            name="sensing1",
            parameters=(Parameter("n", 150.0, minimum=0.0, exclusive_minimum=True),),
            description="sensing kernel on word frequencies scaled to n words (documents)",
            dense=None,
            documents=words.SENSING1,
            cells=words.SENSING1_CELLS,
            positive_definite=False,
        ),
        SimilarityKind(
            name="sensing2",
            parameters=(Parameter("n_words", 150, minimum=1, integer=True),),
            description="sensing0 after resampling each document to n_words words (documents)",
            dense=None,
            documents=words.SENSING2,
            cells=words.SENSING2_CELLS,
            positive_definite=False,
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
    transform : InputTransform or None, default=None
        The input transform whose output the measure reads; None: the model's transform.
    """

    name: str
    params: tuple[tuple[str, float], ...] = ()
    transform: InputTransform | None = None

    @property
    def measure_name(self) -> str:
        """The measure's canonical text without its transform, e.g. ``rbf(gamma=1)``."""
        return format_spec(SimilaritySpec(self.name, self.params))

    def transform_or(self, model_transform: InputTransform) -> InputTransform:
        """The transform this measure reads in a model whose transform is ``model_transform``."""
        return model_transform if self.transform is None else self.transform

    def space_index(self, transform_names: Sequence[str]) -> int:
        """Which of a model's transformed spaces the measure reads.

        Parameters
        ----------
        transform_names : sequence of str
            Canonical text of each distinct transform of the model, the model's own first.

        Raises
        ------
        SpecError
            The measure names a transform the model does not compute.
        """
        if self.transform is None:
            return 0
        try:
            return list(transform_names).index(str(self.transform))
        except ValueError:
            raise SpecError(
                f"{self} reads transform {self.transform}; the model computes "
                f"{', '.join(transform_names)}"
            ) from None

    @property
    def kind(self) -> SimilarityKind:
        return SIMILARITY_KINDS[self.name]

    def __str__(self) -> str:
        return format_spec(self)

    @property
    def needs_grid(self) -> bool:
        return self.kind.needs_grid

    def check_grid(self, grid_shape: tuple[int, int, int] | None, n_features: int) -> None:
        """Refuse a grid measure on inputs that are not a grid of ``n_features`` numbers."""
        if not self.needs_grid:
            return
        if grid_shape is None:
            raise SpecError(f"{self} compares grids of cells; the inputs are not a grid")
        if int(np.prod(grid_shape)) != n_features:
            raise SpecError(f"grid {tuple(grid_shape)} does not hold {n_features} numbers")

    def check_cells(self, inputs: str = "the inputs") -> None:
        """Refuse a measure with no drivers on images as bags of visual words (grid
        measures)."""
        if self.kind.cells is None:
            raise SpecError(
                f"{self} does not apply to bags of visual words ({inputs}); the measures that "
                f"do: {', '.join(k.name for k in SIMILARITY_KINDS.values() if k.cells)}"
            )

    def check_documents(self, inputs_are_documents: bool, inputs: str = "the inputs") -> None:
        """Refuse a documents-only measure on dense inputs, and a dense-only one on documents."""
        if inputs_are_documents and self.kind.documents is None:
            raise SpecError(f"{self} does not apply to bag-of-words documents ({inputs})")
        if not inputs_are_documents and self.kind.documents_only:
            raise SpecError(f"{self} compares bag-of-words documents; {inputs} are not documents")

    def work(self, n_samples: int, n_basis: int, n_features: int) -> float:
        """Multiply-adds of one call, the measure for choosing the serial driver."""
        values = [value for _, value in self.params]
        return n_samples * n_basis * n_features * self.kind.cost(*values)

    def compute(
        self,
        basis: np.ndarray | Documents,
        X: np.ndarray | Documents,
        out: np.ndarray | None = None,
        grid_shape: tuple[int, int, int] | None = None,
    ) -> np.ndarray:
        """Similarities of every input to every basis item.

        Parameters
        ----------
        basis : ndarray of shape (n_basis, n_features), float64, C-contiguous, or Documents
        X : ndarray of shape (n_samples, n_features), float64, C-contiguous, or Documents
            Documents if and only if ``basis`` is.
        out : ndarray of shape (n_samples, n_basis), optional
            Preallocated output, written in place.
        grid_shape : (height, width, channels), optional
            How the flat items are laid out (row-major); required by grid measures.

        Returns
        -------
        out : ndarray of shape (n_samples, n_basis)

        Raises
        ------
        SpecError
            If the measure does not apply to the items (documents or not), or a grid measure
            gets no grid shape, or one that does not fit the items.

        Notes
        -----
        Checks and resolves the measure on every call; callers that compute many times on the
        same kind of items (the predictor) :meth:`bind` once and call
        :meth:`BoundSimilarity.compute`.
        """
        if isinstance(X, CellDocuments):
            bound = self.bind(X.documents.n_words, cells=X.n_cells)
        else:
            bound = self.bind(X.shape[1], grid_shape, documents=isinstance(X, Documents))
        return bound.compute(basis, X, out)

    def bind(
        self,
        n_features: int,
        grid_shape: tuple[int, int, int] | None = None,
        documents: bool = False,
        *,
        cells: int = 0,
    ) -> BoundSimilarity:
        """This measure checked against the items it will compare, its driver resolved.

        Parameters
        ----------
        n_features : int
            Length of an item (for documents: the vocabulary size W).
        grid_shape : (height, width, channels), optional
            How the flat items are laid out (row-major); required by grid measures.
        documents : bool, default=False
            The items are bag-of-words :class:`Documents`, not dense arrays.
        cells : int, default=0, keyword-only
            The items are images as bags of visual words over this many pyramid cells
            (:class:`~service.model.inputs.words.CellDocuments`); ``n_features`` is then the
            words of one cell.

        Returns
        -------
        BoundSimilarity

        Raises
        ------
        SpecError
            As :meth:`compute`.
        """
        if not cells:
            self.check_documents(documents)
        kind = self.kind
        args = tuple(
            int(value) if p.integer else value
            for p, (_, value) in zip(kind.parameters, self.params, strict=True)
        )
        if cells:
            self.check_cells()
            return BoundSimilarity(
                self, args, threads.DOCUMENT_PAIR_MULTIPLY_ADDS * cells, kind.cells
            )
        if documents:
            return BoundSimilarity(self, args, threads.DOCUMENT_PAIR_MULTIPLY_ADDS, kind.documents)
        if self.needs_grid:
            self.check_grid(grid_shape, n_features)
            args = (*(int(s) for s in grid_shape), *args)
        return BoundSimilarity(
            self,
            args,
            self.work(1, 1, n_features),
            kind.dense,
            linear_in_input=kind.linear_in_input,
        )


@dataclass(frozen=True, eq=False)
class BoundSimilarity:
    """A measure bound once to the items it compares (see :meth:`SimilaritySpec.bind`).

    Everything that does not depend on the call is settled here: the measure applies to the
    items, the grid fits, the drivers and their arguments are resolved. :meth:`compute` only
    picks the serial, BLAS or parallel driver by the size of the call and the numba threads
    (:meth:`driver_for`).

    Parameters
    ----------
    spec : SimilaritySpec
    args : tuple
        The driver's arguments between ``basis, X`` and ``out``: the grid's height, width and
        channels (grid measures), then the parameters (Python ints for integer ones).
    pair_work : float
        Multiply-adds of one (input, basis item) pair, the measure for choosing the serial
        driver (see :data:`service.model.threads.SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS`).
    drivers : Drivers
        The measure's drivers on these items, ``(basis, X, *args, out)``.
    space : int or None, default=None
        For items in several transformed spaces (:class:`~service.model.inputs.spaces.Spaces`),
        the index of the one the measure reads; None for items of one space (plain arrays).
    linear_in_input : bool, default=False
        The similarities are ``X @ basis.T`` (dense linear).
    """

    spec: SimilaritySpec
    args: tuple
    pair_work: float
    drivers: Drivers
    space: int | None = None
    linear_in_input: bool = False

    def items_of(self, items):
        """The array this measure reads from a batch (one space of several, or the batch)."""
        return items if self.space is None else items.arrays[self.space]

    def input_weights(self, basis, weights: np.ndarray) -> np.ndarray | None:
        """For a measure linear in its input, the weights on the input that give the same
        scores as ``weights`` on its similarities: ``compute(basis, X) @ weights ==
        X @ input_weights(basis, weights)`` (up to rounding). None for any other measure.

        Parameters
        ----------
        basis : ndarray of shape (n_basis, n_features), or items of several spaces
        weights : ndarray of shape (n_basis, K)

        Returns
        -------
        ndarray of shape (n_features, K) or None
        """
        if not self.linear_in_input:
            return None
        return np.ascontiguousarray(self.items_of(basis).T @ weights)

    def runs_serially(self, n_samples: int, n_basis: int) -> bool:
        """Whether :meth:`compute` of ``n_samples`` inputs against ``n_basis`` items is light
        work on the calling thread: under
        :data:`service.model.threads.SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS`, it never enters a
        parallel region (no wait for :data:`service.model.threads.PARALLEL_REGION`). Heavier
        work may still run on one thread (:meth:`driver_for`), but callers that schedule work
        (the service's data plane) should treat it as heavy."""
        work = n_samples * n_basis * self.pair_work
        return work < threads.SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS

    def driver_for(self, n_samples: int, n_basis: int) -> Callable[..., None]:
        """The driver of a call: BLAS where the measure has it for batches of at least
        :data:`service.model.threads.SIMILARITY_BLAS_MIN_SAMPLES`, unless the work is heavy
        and at least :data:`service.model.threads.SIMILARITY_PARALLEL_MIN_THREADS_OVER_BLAS`
        numba threads share it (then the parallel pair kernels); else the serial pair kernels
        for light work and the parallel ones for heavy work shared by several numba threads.

        On one numba thread the work stays on the calling thread, however heavy: a parallel
        region there gains nothing, waits for :data:`service.model.threads.PARALLEL_REGION`
        behind other callers, and under the ``workqueue`` threading layer (the image's) runs
        on numba's pool thread instead, where the caller's own CPU clock does not count it
        (the trainer's selection times a fold fit on one thread by that clock).
        """
        drivers = self.drivers
        blas = drivers.blas is not None and n_samples >= threads.SIMILARITY_BLAS_MIN_SAMPLES
        n_threads = numba.get_num_threads()
        if self.runs_serially(n_samples, n_basis) or n_threads < 2:
            return drivers.blas if blas else drivers.serial
        if blas and n_threads < threads.SIMILARITY_PARALLEL_MIN_THREADS_OVER_BLAS:
            return drivers.blas
        return drivers.parallel

    def compute(
        self,
        basis: np.ndarray | Documents,
        X: np.ndarray | Documents,
        out: np.ndarray | None = None,
    ) -> np.ndarray:
        """Similarities of every input to every basis item, with no checks.

        Parameters
        ----------
        basis : ndarray of shape (n_basis, n_features), float64, C-contiguous, or Documents
        X : ndarray of shape (n_samples, n_features), float64, C-contiguous, or Documents
            Items of the kind the measure was bound to (as ``basis``).
        out : ndarray of shape (n_samples, n_basis), optional
            Preallocated output, written in place.

        Returns
        -------
        out : ndarray of shape (n_samples, n_basis)
        """
        basis, X = self.items_of(basis), self.items_of(X)
        if out is None:
            out = np.empty((X.shape[0], basis.shape[0]), dtype=np.float64)
        driver = self.driver_for(X.shape[0], basis.shape[0])
        if driver is self.drivers.parallel:
            with threads.PARALLEL_REGION:
                driver(basis, X, *self.args, out)
        else:
            driver(basis, X, *self.args, out)
        return out


def _format_number(value: float) -> str:
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def format_spec(spec: SimilaritySpec) -> str:
    """The canonical text of a spec, e.g. ``rbf(gamma=0.5)``, ``linear`` or
    ``hog(cell_size=4, orientations=9): rbf(gamma=1)``."""
    prefix = "" if spec.transform is None else f"{spec.transform}: "
    if not spec.params:
        return prefix + spec.name
    inner = ", ".join(f"{key}={_format_number(value)}" for key, value in spec.params)
    return f"{prefix}{spec.name}({inner})"


def _split_transform(text: str) -> tuple[str | None, str]:
    """``transform: measure`` as its two texts (None if no colon outside parentheses)."""
    depth = 0
    for position, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == ":" and depth == 0:
            return text[:position], text[position + 1 :]
    return None, text


def parse_spec(text: str) -> SimilaritySpec:
    """Parse one similarity measure, e.g. ``rbf``, ``rbf(0.5)``, ``rbf(gamma=0.5)`` or, reading
    a transform of its own, ``hog(4): rbf``.

    Raises
    ------
    SpecError
        If the text is malformed, names an unknown measure or transform, or gives a bad
        parameter.
    """
    whole = text
    transform_text, text = _split_transform(text)
    transform = None
    if transform_text is not None:
        if not transform_text.strip():
            raise SpecError(f"empty transform before ':' in {whole!r}")
        transform = parse_transform(transform_text)
    name, arguments = parse_call(text, "similarity")
    if name not in SIMILARITY_KINDS:
        known = ", ".join(sorted(SIMILARITY_KINDS))
        raise SpecError(f"unknown similarity {name!r}; known: {known}")
    kind = SIMILARITY_KINDS[name]
    given = bind_arguments(name, arguments, [p.name for p in kind.parameters], text)
    values: dict[str, float] = {}
    for key, raw in given.items():
        try:
            values[key] = float(raw)
        except ValueError:
            raise SpecError(f"{name}: parameter {key} must be a number, got {raw!r}") from None
    params = tuple((p.name, p.check(values.get(p.name, p.default), name)) for p in kind.parameters)
    return SimilaritySpec(name, params, transform)


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
