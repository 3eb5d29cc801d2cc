"""Input kinds: how a model reads its inputs, one strategy per kind, chosen once.

Everything on the way from a client's payload to the similarity measures depends on what an
input is, and on nothing else:

=====================  ==========================================  ===========================
                       :class:`DenseInputs`                        :class:`DocumentInputs`
=====================  ==========================================  ===========================
input spec             ``vector(d)``, ``grid(H, W, C)``            ``counts(W)``
client request         nested lists                                ``{"indices", "counts"}``
                                                                   objects, or raw texts (with
                                                                   a vocabulary)
batch                  flat float64 array (n, n_features)          :class:`Documents`
prepared for measures  transformed, centred and scaled array       the documents (with idf)
basis                  array (B, d) of prepared items              word counts (B, W), read
                                                                   through cached postings
artifact arrays        ``input_mean``, ``input_scale`` (a scalar,  ``basis_indptr``,
                       or one per feature), ``basis``
                                                                   ``basis_indices``,
                                                                   ``basis_counts``, ``idf``,
                                                                   ``input_scale`` (always 1),
                                                                   ``vocabulary`` (optional)
manifest keys          ``input``, ``transform``,                   ``input``, ``transform``
                       ``input_normalization`` (per-feature only)
                                                                   (always ``none``),
                                                                   ``vocabulary`` (optional)
=====================  ==========================================  ===========================

Dense models whose measures read several transforms of the input (``hog(4): rbf + pixels: rbf``)
hold one mean, scale and basis per transform (:class:`TransformedSpace`): the arrays of the
further transforms end in ``_1``, ``_2``, ... and the manifest lists them all in ``transforms``;
models over one transform have neither.

A :class:`~service.model.predictor.Predictor` holds one :class:`InputKind`, chosen from its input
spec by :func:`input_kind_for` when the model is fitted or loaded, and delegates to it: it never
asks which kind it holds. Checks that depend only on the model (the transform applies to the
inputs, the measures apply to the items, the grid fits) are made once, when the strategy is built
and the measures are bound (:meth:`InputKind.bind`); per call, only the client's payload is
checked.

The two ways in: :meth:`InputKind.parse` / :meth:`InputKind.parse_texts` take client requests,
:meth:`InputKind.batch` takes what a trainer holds (arrays, sparse counts, texts). Both give a
*batch*, which :meth:`InputKind.prepare` turns into the items the measures compare with
:attr:`InputKind.basis_items`.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from service.model.documents import Documents, Vocabulary, canonical_counts, counts_from_pairs
from service.model.errors import ArtifactIntegrityError, InvalidInputError, SpecError
from service.model.inputs import InputSpec, instance_name
from service.model.preprocessing import (
    GLOBAL_NORMALIZATION,
    INPUT_NORMALIZATIONS,
    MAX_INPUT_DISTANCE,
    input_normalization_of,
    normalize_inputs,
)
from service.model.similarity import BoundSimilarity, SimilaritySpec
from service.model.spaces import Spaces
from service.model.transforms import BoundTransform, InputTransform, parse_transform

# The manifest keys the input kinds write and read (a model's metadata never holds them).
MANIFEST_KEYS = frozenset({"input", "transform", "transforms", "vocabulary", "input_normalization"})

_NO_TRANSFORM = InputTransform("none")


class InputKind(ABC):
    """What a model's inputs are, and everything that depends on it (see the module docstring).

    Attributes
    ----------
    spec : InputSpec
        What one client instance is.
    has_normalized_form : bool
        Whether :meth:`normalized` gives the inputs as dense normalised vectors (the feature
        space a search model may read instead of the basis-expanded features).
    """

    spec: InputSpec
    has_normalized_form: ClassVar[bool]
    # Every array name the kind may own in an artifact (see :meth:`array_names`).
    ARRAYS: ClassVar[frozenset[str]]

    # -- what the inputs are -------------------------------------------------------------

    @property
    @abstractmethod
    def transform(self) -> InputTransform:
        """Applied to every instance before anything else (``none`` for documents)."""

    @property
    def vocabulary(self) -> Vocabulary | None:
        """Turns raw text into inputs; None if the model reads no text."""
        return None

    @property
    @abstractmethod
    def n_features(self) -> int:
        """Length of a prepared item (what the measures compare), ``d`` or ``W``."""

    @property
    @abstractmethod
    def grid_shape(self) -> tuple[int, int, int] | None:
        """Layout of a prepared item as (height, width, channels), or None if flat."""

    @property
    @abstractmethod
    def basis_items(self) -> np.ndarray | Documents:
        """The basis as the measures read it, shape (n_basis, n_features)."""

    @property
    def n_basis(self) -> int:
        """Basis items, B: the rows of the kind's ``basis``."""
        return int(self.basis.shape[0])

    @property
    @abstractmethod
    def n_basis_values(self) -> int:
        """Numbers the basis keeps: B * d for dense items, the non-zero counts of documents."""

    # -- batches -------------------------------------------------------------------------

    @abstractmethod
    def parse(
        self, instances: Sequence[Any], names: Sequence[str] | None = None
    ) -> np.ndarray | Documents:
        """A client's instances as a batch, each checked against what the model can read.

        Parameters
        ----------
        instances : sequence
        names : sequence of str, optional
            What messages call each instance (default ``instances[i]``).

        Raises
        ------
        InvalidInputError
            Naming the first offending instance; also for an empty batch.
        """

    def parse_prepared(
        self, instances: Sequence[Any], names: Sequence[str] | None = None
    ) -> tuple[np.ndarray | Documents, np.ndarray | Documents | Spaces]:
        """:meth:`parse`, and the batch :meth:`prepare`-d, each step done once.

        Raises
        ------
        InvalidInputError
            As :meth:`parse`.
        """
        batch = self.parse(instances, names)
        return batch, self.prepare(batch)

    def parse_texts(self, texts: Sequence[str]) -> np.ndarray | Documents:
        """A client's raw texts as a batch.

        Raises
        ------
        InvalidInputError
            The model reads no text, the batch is empty or an item is not a string.
        """
        raise InvalidInputError(f"this model reads {self.spec}, not text: send instances")

    @abstractmethod
    def batch(self, X) -> np.ndarray | Documents:
        """What a trainer holds (see the subclasses) as a batch; a batch passes unchanged.

        Raises
        ------
        InvalidInputError
        """

    @abstractmethod
    def prepare(self, batch: np.ndarray | Documents) -> np.ndarray | Documents:
        """A batch as the measures read it, shape (n_samples, n_features); no checks."""

    def prepares_serially(self, n_samples: int) -> bool:
        """Whether :meth:`prepare` of ``n_samples`` items is light work that enters no
        parallel region (see :meth:`service.model.transforms.BoundTransform.runs_serially`)."""
        return True

    def normalized(self, X) -> np.ndarray:
        """The inputs as dense normalised vectors (see :attr:`has_normalized_form`).

        Raises
        ------
        InvalidInputError
            The kind has no such form.
        """
        raise InvalidInputError(
            f"{self.spec} inputs have no normalised dense form: use the basis-expanded features"
        )

    def normalized_of(self, items) -> np.ndarray:
        """:meth:`normalized` of a batch already :meth:`prepare`-d.

        Raises
        ------
        InvalidInputError
            The kind has no such form.
        """
        return self.normalized(items)

    def known_words(self, batch: np.ndarray | Documents) -> list[int] | None:
        """Words of each instance the model knows, for kinds that count words; else None."""
        return None

    @abstractmethod
    def warm_up_batch(self, n_rows: int) -> np.ndarray | Documents:
        """A batch of ``n_rows`` typical instances, to run the prediction path on."""

    # -- measures ------------------------------------------------------------------------

    @abstractmethod
    def bind(self, specs: Sequence[SimilaritySpec]) -> tuple[BoundSimilarity, ...]:
        """The measures bound to this kind's prepared items (checked once).

        Raises
        ------
        SpecError
            A measure does not apply to these items.
        """

    # -- artifact form -------------------------------------------------------------------

    @abstractmethod
    def problems(self) -> list[str]:
        """What is inconsistent in this kind's own arrays (empty if nothing)."""

    @abstractmethod
    def manifest(self) -> dict[str, Any]:
        """This kind's manifest entries (keys of :data:`MANIFEST_KEYS`)."""

    @abstractmethod
    def arrays(self) -> dict[str, np.ndarray]:
        """This kind's arrays, by their artifact names."""

    @classmethod
    @abstractmethod
    def array_names(cls, manifest: dict[str, Any]) -> frozenset[str]:
        """The arrays an artifact with this manifest must hold for this kind."""

    @classmethod
    @abstractmethod
    def from_artifact(
        cls,
        spec: InputSpec,
        manifest: dict[str, Any],
        arrays: dict[str, np.ndarray],
        path: str | os.PathLike,
    ) -> InputKind:
        """Build from an artifact's manifest and verified arrays.

        Raises
        ------
        ArtifactIntegrityError
            The arrays do not form valid inputs of this kind.
        KeyError, TypeError, ModelError
            A malformed manifest entry (the caller names the manifest).
        """

    def _input_entry(self) -> dict[str, Any]:
        return {"input": {"kind": self.spec.kind, "shape": list(self.spec.shape)}}


def _normalise_space_arrays(space) -> None:
    """Give a frozen space's ``mean`` and ``basis`` one dtype and layout (float64, C order),
    and its ``scale`` a float (global) or such an array (per feature), so that the compiled
    kernels see one signature."""
    object.__setattr__(space, "mean", np.ascontiguousarray(space.mean, dtype=np.float64))
    object.__setattr__(space, "basis", np.ascontiguousarray(space.basis, dtype=np.float64))
    scale = (
        float(space.scale)
        if np.ndim(space.scale) == 0
        else np.ascontiguousarray(space.scale, dtype=np.float64)
    )
    object.__setattr__(space, "scale", scale)


@dataclass(frozen=True, eq=False)
class TransformedSpace:
    """One more input transform of a dense model, with its own normalisation and basis (the
    basis items are the model's: the same training items, transformed by this transform).

    Parameters
    ----------
    transform : InputTransform
    mean : ndarray of shape (d_s,)
        Training mean of the inputs transformed by ``transform``.
    scale : float or ndarray of shape (d_s,)
        As :class:`DenseInputs`'s, of the same normalisation (global or per-feature).
    basis : ndarray of shape (B, d_s)
        The model's basis items, transformed by ``transform`` and normalised.
    """

    transform: InputTransform
    mean: np.ndarray
    scale: float | np.ndarray
    basis: np.ndarray

    def __post_init__(self) -> None:
        _normalise_space_arrays(self)


@dataclass(frozen=True, eq=False)
class DenseInputs(InputKind):
    """Vectors and grids: transformed, then centred and scaled (BE-SVM paper, section 3.1), by
    one scale or one per feature (see :mod:`service.model.preprocessing`).

    A model whose measures read different transforms of the same input
    (``hog(8): rbf + pixels: rbf``) holds one :class:`TransformedSpace` per transform besides its
    own; each request computes each transform once, and the prepared items are then
    :class:`~service.model.spaces.Spaces`, one array per transform.

    Parameters
    ----------
    spec : InputSpec
        ``vector(d)`` or ``grid(H, W, C)``: what clients send.
    mean : ndarray of shape (d,)
        Training mean of the transformed inputs; ``d`` is the length of a transformed instance.
    scale : float or ndarray of shape (d,)
        A float: the mean L2 norm of the centred transformed training inputs (``global``
        normalisation). An array: one positive scale per feature (``per-feature``), recorded in
        the manifest as ``input_normalization``; artifacts without that key are ``global``.
    basis : ndarray of shape (B, d)
        Basis items, transformed and normalised.
    transform : InputTransform, default none
        Applied to every instance first; see :mod:`service.model.transforms`. Measures written
        without a transform read its output.
    more_spaces : tuple of TransformedSpace, default ()
        The other transforms the measures read, each once; recorded in the manifest as
        ``transforms`` (every transform, this one first) only when there are any.

    Raises
    ------
    SpecError
        The spec is not a vector or grid, a transform does not apply to it, or a transform is
        given twice.
    """

    spec: InputSpec
    mean: np.ndarray
    scale: float | np.ndarray
    basis: np.ndarray
    transform: InputTransform = _NO_TRANSFORM
    more_spaces: tuple[TransformedSpace, ...] = ()
    _bound: BoundTransform = field(init=False, repr=False)
    _spaces: tuple[tuple[BoundTransform, np.ndarray, Any, np.ndarray], ...] = field(
        init=False, repr=False
    )
    _basis_items: np.ndarray | Spaces = field(init=False, repr=False)

    has_normalized_form: ClassVar[bool] = True
    ARRAYS: ClassVar[frozenset[str]] = frozenset({"input_mean", "input_scale", "basis"})

    def __post_init__(self) -> None:
        if self.spec.kind not in ("vector", "grid"):
            raise SpecError(f"dense inputs are vectors or grids, not {self.spec}")
        _normalise_space_arrays(self)
        object.__setattr__(self, "more_spaces", tuple(self.more_spaces))
        object.__setattr__(self, "_bound", self.transform.bind(self.spec))
        names = self.transform_names
        if len(set(names)) != len(names):
            raise SpecError(f"a transform is given twice among {', '.join(names)}")
        spaces = (
            (self._bound, self.mean, self.scale, self.basis),
            *((s.transform.bind(self.spec), s.mean, s.scale, s.basis) for s in self.more_spaces),
        )
        object.__setattr__(self, "_spaces", spaces)
        items = self.basis if not self.more_spaces else Spaces(tuple(s[3] for s in spaces))
        object.__setattr__(self, "_basis_items", items)

    @property
    def transforms(self) -> tuple[InputTransform, ...]:
        """Every transform the model computes, its own first."""
        return (self.transform, *(space.transform for space in self.more_spaces))

    @property
    def transform_names(self) -> tuple[str, ...]:
        """Canonical text of :attr:`transforms`."""
        return tuple(str(t) for t in self.transforms)

    @property
    def input_normalization(self) -> str:
        """``global`` (one scale) or ``per-feature``."""
        return input_normalization_of(self.scale)

    @property
    def n_features(self) -> int:
        return self._bound.n_features

    @property
    def grid_shape(self) -> tuple[int, int, int] | None:
        return self._bound.grid_shape

    @property
    def basis_items(self) -> np.ndarray | Spaces:
        return self._basis_items

    @property
    def n_basis_values(self) -> int:
        return sum(int(space[3].size) for space in self._spaces)

    def parse(self, instances: Sequence[Any], names: Sequence[str] | None = None) -> np.ndarray:
        """Nested lists (or an array), each instance in one of the spec's accepted shapes and
        within :data:`MAX_INPUT_DISTANCE` of the training data (see :meth:`check_distances`).

        Returns
        -------
        ndarray of shape (n_samples, spec.n_features), float64, C-contiguous
            See :meth:`InputSpec.as_batch`.
        """
        return self.parse_prepared(instances, names)[0]

    def parse_prepared(
        self, instances: Sequence[Any], names: Sequence[str] | None = None
    ) -> tuple[np.ndarray, np.ndarray | Spaces]:
        """:meth:`parse`, and the batch prepared: each transform computed once, for the check
        and for the measures."""
        batch = self.spec.as_batch(instances, names)
        with np.errstate(over="ignore", invalid="ignore"):
            items = self.prepare(batch)
        self._check_prepared(items, names)
        return batch, items

    def check_distances(self, batch: np.ndarray, names: Sequence[str] | None = None) -> None:
        """Refuse instances absurdly far from the training data.

        An instance's distance is the norm of its prepared form: its distance from the training
        mean in units of the training items' mean distance (the normaliser's scale), so the
        training items lie near 1; a model over several transforms checks each transform's
        form. Finite but absurd inputs (values of 1e20, 1e300) would otherwise be answered with
        meaningless scores, or make a learned search code take seconds; the bound leaves room
        for inputs sent on another scale than the training data's (16-bit images to a model of
        4-bit digits are about 8,000).

        Parameters
        ----------
        batch : ndarray of shape (n_samples, spec.n_features)
        names : sequence of str, optional

        Raises
        ------
        InvalidInputError
            Naming the first instance beyond :data:`MAX_INPUT_DISTANCE`, or that a transform
            cannot compute (values too large for it).
        """
        with np.errstate(over="ignore", invalid="ignore"):
            items = self.prepare(batch)
        self._check_prepared(items, names)

    def _check_prepared(
        self, items: np.ndarray | Spaces, names: Sequence[str] | None = None
    ) -> None:
        """:meth:`check_distances` on a batch already prepared."""
        arrays = items.arrays if isinstance(items, Spaces) else (items,)
        with np.errstate(over="ignore", invalid="ignore"):
            distances = np.column_stack([np.sqrt(np.einsum("ij,ij->i", a, a)) for a in arrays])
        far_rows = np.flatnonzero(~(distances <= MAX_INPUT_DISTANCE).all(axis=1))  # NaN is far
        if far_rows.size == 0:
            return
        row = int(far_rows[0])
        # A transform that could not compute says more than a distance: name it first.
        nan = np.flatnonzero(np.isnan(distances[row]))
        space = int(nan[0]) if nan.size else int(np.argmax(distances[row]))
        where, distance = instance_name(names, row), distances[row, space]
        if np.isnan(distance):
            raise InvalidInputError(
                f"{where} holds values too large for the transform {self.transforms[space]}: "
                "send inputs on the scale of the training data"
            )
        times = "over 1.8e308" if np.isinf(distance) else f"{distance:.3g}"
        raise InvalidInputError(
            f"{where} lies {times} times farther from the training data's mean than its "
            f"items do on average; the bound is {MAX_INPUT_DISTANCE:,.0f}: send inputs on the "
            "scale of the training data"
        )

    def batch(self, X) -> np.ndarray:
        """Flat raw instances.

        Parameters
        ----------
        X : array-like of shape (n_samples, spec.n_features)

        Returns
        -------
        ndarray of shape (n_samples, spec.n_features), float64, C-contiguous
        """
        X = np.asarray(X)
        d = self.spec.n_features
        if X.ndim != 2 or X.shape[1] != d:
            raise InvalidInputError(f"expected flat inputs of shape (n, {d}), got {X.shape}")
        return np.ascontiguousarray(X, dtype=np.float64)

    def prepares_serially(self, n_samples: int) -> bool:
        return all(bound.runs_serially(n_samples) for bound, *_ in self._spaces)

    def prepare(self, batch: np.ndarray) -> np.ndarray | Spaces:
        """Transformed, centred and scaled: ndarray of shape (n_samples, d); for a model over
        several transforms, :class:`Spaces` of each transform's, each computed once."""
        prepared = tuple(
            normalize_inputs(bound.apply(batch), mean, scale)
            for bound, mean, scale, _ in self._spaces
        )
        return prepared[0] if len(prepared) == 1 else Spaces(prepared)

    def normalized(self, X) -> np.ndarray:
        """:meth:`prepare` of :meth:`batch`, every transform's side by side (the model's own
        first): ndarray of shape (n_samples, sum of the transforms' d)."""
        return self.normalized_of(self.prepare(self.batch(X)))

    def normalized_of(self, items: np.ndarray | Spaces) -> np.ndarray:
        return items.joined() if isinstance(items, Spaces) else items

    def warm_up_batch(self, n_rows: int) -> np.ndarray:
        return np.zeros((n_rows, self.spec.n_features))

    def bind(self, specs: Sequence[SimilaritySpec]) -> tuple[BoundSimilarity, ...]:
        names = self.transform_names
        several = len(names) > 1
        bound = []
        for spec in specs:
            space = spec.space_index(names)
            transform = self._spaces[space][0]
            measure = spec.bind(transform.n_features, transform.grid_shape)
            bound.append(replace(measure, space=space) if several else measure)
        return tuple(bound)

    def problems(self) -> list[str]:
        problems = []
        for i, (bound, mean, scale, basis) in enumerate(self._spaces):
            suffix = _space_suffix(i)
            problems += _space_problems(bound.n_features, self.n_basis, mean, scale, basis, suffix)
            if i and input_normalization_of(scale) != self.input_normalization:
                problems.append(
                    f"input_scale{suffix} is not of the {self.input_normalization} normalisation"
                )
        return problems

    def manifest(self) -> dict[str, Any]:
        entries = {**self._input_entry(), "transform": str(self.transform)}
        if self.more_spaces:
            # Written only for models over several transforms: others stay as they were.
            entries["transforms"] = list(self.transform_names)
        if self.input_normalization != GLOBAL_NORMALIZATION:
            # Written only when it is not the default, so global artifacts stay as they were.
            entries["input_normalization"] = self.input_normalization
        return entries

    def arrays(self) -> dict[str, np.ndarray]:
        arrays = {}
        for i, (_, mean, scale, basis) in enumerate(self._spaces):
            suffix = _space_suffix(i)
            arrays[f"input_scale{suffix}"] = np.asarray(scale, dtype=np.float64)
            arrays[f"input_mean{suffix}"] = mean
            arrays[f"basis{suffix}"] = basis
        return arrays

    @classmethod
    def array_names(cls, manifest: dict[str, Any]) -> frozenset[str]:
        n_spaces = len(manifest.get("transforms") or [None])
        return cls.ARRAYS | {
            f"{name}{_space_suffix(i)}" for i in range(1, n_spaces) for name in cls.ARRAYS
        }

    @classmethod
    def from_artifact(cls, spec, manifest, arrays, path) -> DenseInputs:
        _refuse_foreign_arrays(cls, spec, arrays, path)
        normalization = manifest.get("input_normalization", GLOBAL_NORMALIZATION)
        if normalization not in INPUT_NORMALIZATIONS:
            raise ArtifactIntegrityError(
                f"{path}: input_normalization must be one of {', '.join(INPUT_NORMALIZATIONS)},"
                f" got {normalization!r}"
            )
        transform_texts = [manifest.get("transform", "none")]
        if "transforms" in manifest:
            transform_texts = [str(t) for t in manifest["transforms"]]
            if len(transform_texts) < 2 or transform_texts[0] != manifest.get("transform"):
                raise ArtifactIntegrityError(
                    f"{path}: transforms must list two or more transforms, the model's "
                    f"transform {manifest.get('transform')!r} first"
                )
        scales = []
        for i in range(len(transform_texts)):
            scale = arrays[f"input_scale{_space_suffix(i)}"]
            if input_normalization_of(scale) != normalization:
                raise ArtifactIntegrityError(
                    f"{path}: input_scale{_space_suffix(i)} of shape {list(scale.shape)} does "
                    f"not fit input_normalization {normalization!r} (a scalar for global, one "
                    "per feature for per-feature)"
                )
            scales.append(float(scale) if scale.ndim == 0 else scale)
        more = tuple(
            TransformedSpace(
                transform=parse_transform(transform_texts[i]),
                mean=arrays[f"input_mean{_space_suffix(i)}"],
                scale=scales[i],
                basis=arrays[f"basis{_space_suffix(i)}"],
            )
            for i in range(1, len(transform_texts))
        )
        return cls(
            spec=spec,
            mean=arrays["input_mean"],
            scale=scales[0],
            basis=arrays["basis"],
            transform=parse_transform(transform_texts[0]),
            more_spaces=more,
        )


def _space_suffix(index: int) -> str:
    """The artifact names of space ``index``'s arrays end with this (the model's own: none)."""
    return f"_{index}" if index else ""


def _space_problems(d: int, n_basis: int, mean, scale, basis, suffix: str) -> list[str]:
    """What is inconsistent in one transformed space's arrays."""
    expected = {f"input_mean{suffix}": (mean, (d,)), f"basis{suffix}": (basis, (n_basis, d))}
    if np.ndim(scale):
        expected[f"input_scale{suffix}"] = (scale, (d,))
    problems = [
        f"{name} has shape {array.shape}, expected {shape}"
        for name, (array, shape) in expected.items()
        if array.shape != shape
    ]
    scale_array = np.asarray(scale)
    if not (np.isfinite(scale_array).all() and (scale_array > 0).all()):
        problems.append(
            f"input_scale{suffix} must be positive, got {scale}"
            if scale_array.ndim == 0
            else f"input_scale{suffix} must be positive and finite for every feature"
        )
    if not problems:
        problems += [
            f"{name} holds NaN or infinity"
            for name, (array, _) in expected.items()
            if not np.isfinite(array).all()
        ]
    return problems


@dataclass(frozen=True, eq=False)
class DocumentInputs(InputKind):
    """Bag-of-words documents: sparse word counts, neither transformed nor normalised.

    Parameters
    ----------
    spec : InputSpec
        ``counts(W)``.
    basis : sparse matrix of shape (B, W)
        Word counts of the basis items (made canonical, see :func:`canonical_counts`).
    idf : ndarray of shape (W,)
        The training set's inverse document frequencies (the tf-idf view).
    vocabulary : Vocabulary, optional
        Turns raw text into counts, so clients may send text.

    Raises
    ------
    SpecError
        The spec is not ``counts(W)``.
    ArtifactIntegrityError
        The basis is not word counts.
    """

    spec: InputSpec
    basis: sp.csr_matrix
    idf: np.ndarray
    vocabulary: Vocabulary | None = None
    _basis_items: Documents = field(init=False, repr=False)

    has_normalized_form: ClassVar[bool] = False
    ARRAYS: ClassVar[frozenset[str]] = frozenset(
        {"input_scale", "basis_indptr", "basis_indices", "basis_counts", "idf", "vocabulary"}
    )
    _REQUIRED: ClassVar[frozenset[str]] = ARRAYS - {"vocabulary"}

    def __post_init__(self) -> None:
        if self.spec.kind != "counts":
            raise SpecError(
                f"documents are counts(W) inputs, not {self.spec}"
                + ("; text needs a vocabulary" if self.spec.kind == "text" else "")
            )
        try:
            counts = canonical_counts(self.basis)
        except (InvalidInputError, TypeError, ValueError) as error:
            raise ArtifactIntegrityError(f"document basis: {error}") from None
        idf = np.empty(0) if self.idf is None else self.idf
        object.__setattr__(self, "basis", counts)
        object.__setattr__(self, "idf", np.ascontiguousarray(idf, dtype=np.float64))
        # The basis as the measures read it; its views' postings are built once and cached.
        object.__setattr__(self, "_basis_items", Documents(counts, self.idf))

    @property
    def transform(self) -> InputTransform:
        return _NO_TRANSFORM

    @property
    def n_features(self) -> int:
        return self.spec.shape[0]

    @property
    def grid_shape(self) -> None:
        return None

    @property
    def basis_items(self) -> Documents:
        return self._basis_items

    @property
    def n_basis_values(self) -> int:
        return int(self.basis.nnz)

    def parse(self, instances: Sequence[Any], names: Sequence[str] | None = None) -> Documents:
        """``{"indices": [...], "counts": [...]}`` objects, one per document (see
        :func:`counts_from_pairs`)."""
        if len(instances) == 0:
            raise InvalidInputError("the batch is empty: send at least one instance")
        return Documents(counts_from_pairs(instances, self.n_features, names), self.idf)

    def parse_texts(self, texts: Sequence[str]) -> Documents:
        """Raw texts, counted over the vocabulary (unknown words dropped)."""
        if self.vocabulary is None:
            raise InvalidInputError("this model has no vocabulary: send word counts as instances")
        if len(texts) == 0:
            raise InvalidInputError("the batch is empty: send at least one text")
        return Documents(self.vocabulary.encode(texts), self.idf)

    def batch(self, X) -> Documents:
        """:class:`Documents` as they are, a sparse count matrix of shape (n_samples, W), or
        raw texts (with a vocabulary)."""
        if isinstance(X, Documents):
            return X
        if sp.issparse(X):
            return Documents(canonical_counts(X, self.n_features), self.idf)
        return self.parse_texts(list(X))

    def prepare(self, batch: Documents) -> Documents:
        return batch

    def known_words(self, batch: Documents) -> list[int]:
        return batch.known_words().astype(int).tolist()

    def warm_up_batch(self, n_rows: int) -> Documents:
        one_word = sp.csr_matrix(
            (np.ones(n_rows), np.zeros(n_rows, dtype=np.int64), np.arange(n_rows + 1)),
            shape=(n_rows, self.n_features),
        )
        return Documents(canonical_counts(one_word), self.idf)

    def bind(self, specs: Sequence[SimilaritySpec]) -> tuple[BoundSimilarity, ...]:
        for spec in specs:
            spec.space_index((str(_NO_TRANSFORM),))  # documents are not transformed
        return tuple(spec.bind(self.n_features, documents=True) for spec in specs)

    def problems(self) -> list[str]:
        n_words = self.n_features
        if self.basis.shape[1] != n_words:
            return [f"basis has shape {self.basis.shape}, expected ({self.n_basis}, {n_words})"]
        if self.idf.shape != (n_words,):
            return [f"idf has shape {self.idf.shape}, expected {(n_words,)}"]
        if self.vocabulary is not None and self.vocabulary.size != n_words:
            return [f"the vocabulary holds {self.vocabulary.size} words, inputs {n_words}"]
        if not np.isfinite(self.idf).all():
            return ["idf holds NaN or infinity"]
        return []

    def manifest(self) -> dict[str, Any]:
        entries = {**self._input_entry(), "transform": str(self.transform)}
        if self.vocabulary is not None:
            entries["vocabulary"] = {"size": self.vocabulary.size, **self.vocabulary.settings()}
        return entries

    def arrays(self) -> dict[str, np.ndarray]:
        arrays = {
            # Documents are not scaled; every BE-SVM artifact records a scale all the same.
            "input_scale": np.asarray(1.0),
            "basis_indptr": self.basis.indptr,
            "basis_indices": self.basis.indices,
            "basis_counts": self.basis.data,
            "idf": self.idf,
        }
        if self.vocabulary is not None:
            arrays["vocabulary"] = np.asarray(self.vocabulary.terms, dtype=np.str_)
        return arrays

    @classmethod
    def array_names(cls, manifest: dict[str, Any]) -> frozenset[str]:
        return cls.ARRAYS if manifest.get("vocabulary") is not None else cls._REQUIRED

    @classmethod
    def from_artifact(cls, spec, manifest, arrays, path) -> DocumentInputs:
        _refuse_foreign_arrays(cls, spec, arrays, path)
        if parse_transform(manifest.get("transform", "none")) != _NO_TRANSFORM:
            raise ArtifactIntegrityError(f"{path}: documents are neither transformed nor scaled")
        if float(arrays["input_scale"]) != 1.0:
            raise ArtifactIntegrityError(f"{path}: documents are not scaled: input_scale must be 1")
        vocabulary = None
        settings = manifest.get("vocabulary")
        if settings is not None:
            try:
                vocabulary = Vocabulary(
                    tuple(arrays["vocabulary"].tolist()),
                    lowercase=bool(settings["lowercase"]),
                    token_pattern=str(settings["token_pattern"]),
                )
            except (KeyError, TypeError, ValueError, re.error) as error:
                raise ArtifactIntegrityError(f"{path}: bad vocabulary: {error!r}") from None
        basis = _basis_counts(path, arrays, spec.shape[0])
        return cls(spec=spec, basis=basis, idf=arrays["idf"], vocabulary=vocabulary)


def _basis_counts(path, arrays: dict[str, np.ndarray], n_words: int) -> sp.csr_matrix:
    """The basis of a documents model from its three CSR arrays, checked before use."""
    indptr, indices, counts = (arrays[k] for k in ("basis_indptr", "basis_indices", "basis_counts"))
    if (
        indptr.ndim != 1
        or indptr.shape[0] < 1
        or indptr[0] != 0
        or (np.diff(indptr) < 0).any()
        or indptr[-1] != indices.shape[0]
        or indices.ndim != 1
        or indices.shape != counts.shape
        or (indices.size and not 0 <= indices.min() <= indices.max() < n_words)
    ):
        raise ArtifactIntegrityError(f"{path}: basis_indptr/indices/counts are not a valid CSR")
    return sp.csr_matrix((counts, indices, indptr), shape=(indptr.shape[0] - 1, n_words))


_ALL_ARRAYS = DenseInputs.ARRAYS | DocumentInputs.ARRAYS


def _refuse_foreign_arrays(cls: type[InputKind], spec: InputSpec, arrays, path) -> None:
    foreign = sorted((arrays.keys() & _ALL_ARRAYS) - cls.ARRAYS)
    if foreign:
        raise ArtifactIntegrityError(f"{path}: {spec} inputs have no {', '.join(foreign)}")


_KINDS: dict[str, type[InputKind]] = {
    "vector": DenseInputs,
    "grid": DenseInputs,
    "counts": DocumentInputs,
}


def input_kind_for(spec: InputSpec) -> type[InputKind]:
    """The strategy class of a model's input spec.

    Raises
    ------
    SpecError
        No model reads such inputs (``text``: a vocabulary turns it into ``counts(W)``).
    """
    try:
        return _KINDS[spec.kind]
    except KeyError:
        raise SpecError(
            f"a model reads vector, grid or counts(W) inputs, not {spec}"
            + ("; text needs a vocabulary" if spec.kind == "text" else "")
        ) from None


def input_spec_of(manifest: dict[str, Any]) -> InputSpec:
    """The input spec a manifest records.

    Raises
    ------
    KeyError, TypeError, SpecError
        A malformed ``input`` entry.
    """
    return InputSpec(manifest["input"]["kind"], tuple(manifest["input"]["shape"]))


def input_arrays(manifest: dict[str, Any]) -> frozenset[str]:
    """The arrays of its input kind an artifact with this manifest must hold.

    Raises
    ------
    KeyError, TypeError, ModelError
        A malformed ``input`` entry.
    """
    return input_kind_for(input_spec_of(manifest)).array_names(manifest)


def read_inputs(
    manifest: dict[str, Any], arrays: dict[str, np.ndarray], path: str | os.PathLike
) -> InputKind:
    """The input kind of an artifact, from its manifest and verified arrays.

    Raises
    ------
    ArtifactIntegrityError
        The arrays do not form valid inputs of the kind.
    KeyError, TypeError, ModelError
        A malformed manifest entry (see :func:`service.model.artifact.manifest_fields`).
    """
    spec = input_spec_of(manifest)
    return input_kind_for(spec).from_artifact(spec, manifest, arrays, path)
