r"""Dense inputs, vectors and grids: transformed, then centred and scaled (BE-SVM paper,
section 3.1), and the rules of which transforms and measures apply to them.

``global`` input normalisation (the paper's): inputs are centred by the training mean and divided
by the mean L2 norm of the centred training vectors:

.. math:: \hat x = \frac{x - \mu}{\frac{1}{n}\sum_i \lVert x_i - \mu \rVert_2}

One scalar scale for all features keeps the geometry of the input space (unlike a z-score), so
``rbf(gamma=1)`` is a sensible default on data whose features share a unit (pixels).

``per-feature``: each feature is first divided by its training standard deviation (a z-score),
then the z-scores by their mean norm, so that the mean norm is 1 here too and the same gammas
mean the same:

.. math:: \hat x_j = \frac{x_j - \mu_j}{\sigma_j\, m}, \qquad
          m = \frac{1}{n}\sum_i \Bigl\lVert \frac{x_i - \mu}{\sigma} \Bigr\rVert_2

It wins where features have unrelated units (``load_wine``: one feature in the hundreds would
otherwise dominate every distance). Either way the model stores a mean and a scale (a scalar, or
one per feature) and the service applies ``(x - mean) / scale``
(:class:`training.estimator.preprocessing.InputNormalizer` fits them).

Dense models whose measures read several transforms of the input (``hog(4): rbf + pixels: rbf``)
hold one mean, scale and basis per transform (:class:`TransformedSpace`): the arrays of the
further transforms end in ``_1``, ``_2``, ... and the manifest lists them all in ``transforms``;
models over one transform have neither.

A fitted transform (``bof``, images as bags of visual words, :mod:`service.model.inputs.bof`)
makes a space of another kind: its output is word counts per pyramid cell, which are not
normalised (no mean, no scale) and which the measures read cell by cell; the model stores its
visual words (:class:`~service.model.inputs.bof.BagOfFeatures`, in ``bags``) and its basis as
cell counts. Each space is one small strategy (:class:`NormalisedSpace` or
:class:`~service.model.inputs.bof.BagSpace`) chosen once, when the model is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, NoReturn

import numpy as np

from service.model.errors import ArtifactIntegrityError, InvalidInputError, SpecError
from service.model.inputs.base import NO_TRANSFORM, InputKind
from service.model.inputs.bof import BagOfFeatures, BagSpace
from service.model.inputs.spaces import Spaces
from service.model.inputs.spec import InputSpec, instance_name
from service.model.inputs.transforms import (
    BoundTransform,
    InputTransform,
    default_transform,
    parse_transform,
)
from service.model.inputs.words import CellDocuments
from service.model.kernels.inputs import normalize_rows
from service.model.similarity import BoundSimilarity, SimilaritySpec

# The farthest a client's instance may lie from the training mean, in units of the scale (the
# training items' mean distance from it, so they lie near 1). Beyond about 1e6 a code learned
# from such an example keeps one atom (the example's direction alone counts), beyond about 1e13
# learning it takes seconds; up to 1e5 the answers are those of the instance's direction, and
# inputs on another scale than the training data's still fit (0..65535 images for a model of
# 0..16 digits lie at about 8,000).
MAX_INPUT_DISTANCE = 1e5

# The input normalisations a dense model may use (the manifest's ``input_normalization``).
GLOBAL_NORMALIZATION = "global"
PER_FEATURE_NORMALIZATION = "per-feature"
INPUT_NORMALIZATIONS = (GLOBAL_NORMALIZATION, PER_FEATURE_NORMALIZATION)


def normalize_inputs(X: np.ndarray, mean: np.ndarray, scale: float | np.ndarray) -> np.ndarray:
    """``(X - mean) / scale`` as a new C-contiguous float64 array: the serving path's step.

    ``scale`` is a float (global normalisation) or an array of shape (n_features,).
    """
    return normalize_measured(X, mean, feature_scales(scale, np.shape(mean)[-1]))[0]


def feature_scales(scale: float | np.ndarray, n_features: int) -> np.ndarray:
    """A stored scale, one per feature: shape (n_features,), float64, C-contiguous."""
    return np.ascontiguousarray(np.broadcast_to(np.asarray(scale, dtype=np.float64), n_features))


def normalize_measured(
    X: np.ndarray, mean: np.ndarray, scales: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float]:
    """``(X - mean) / scales``, the norm of each row and the largest, in one pass
    (:func:`service.model.kernels.inputs.normalize_rows`); no floating-point warnings: values
    too large to centre come out infinite, and their norms say so.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
    mean, scales : ndarray of shape (n_features,), float64, C-contiguous

    Returns
    -------
    items : ndarray of shape (n_samples, n_features), float64, C-contiguous
    norms : ndarray of shape (n_samples,)
    largest : float
        ``norms.max()``: NaN if any norm is.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != mean.shape[0]:
        raise ValueError(f"expected inputs of shape (n, {mean.shape[0]}), got {X.shape}")
    items = np.empty_like(X)
    norms = np.empty(X.shape[0])
    largest = normalize_rows(X, mean, scales, items, norms)
    return items, norms, largest


def input_normalization_of(scale: float | np.ndarray) -> str:
    """The normalisation a stored scale belongs to: a scalar is ``global``, a vector
    ``per-feature``."""
    return GLOBAL_NORMALIZATION if np.ndim(scale) == 0 else PER_FEATURE_NORMALIZATION


def _normalise_space_arrays(space) -> None:
    """Give a frozen space's ``mean`` and ``basis`` one dtype and layout (float64, C order),
    and its ``scale`` a float (global) or such an array (per feature), so that the compiled
    kernels see one signature. A fitted transform's space (no mean) is left as it is."""
    if space.mean is None:
        return
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
    mean : ndarray of shape (d_s,), or None
        Training mean of the inputs transformed by ``transform``; None for a fitted transform
        (``bof``), whose counts are not normalised.
    scale : float or ndarray of shape (d_s,), or None
        As :class:`DenseInputs`'s, of the same normalisation (global or per-feature); None
        with ``mean``.
    basis : ndarray of shape (B, d_s), or CellDocuments
        The model's basis items, transformed by ``transform`` and normalised (for ``bof``: as
        bags of visual words).
    """

    transform: InputTransform
    mean: np.ndarray | None
    scale: float | np.ndarray | None
    basis: np.ndarray | CellDocuments

    def __post_init__(self) -> None:
        _normalise_space_arrays(self)


class NormalisedSpace:
    """A transform's space whose items are dense vectors, centred and scaled: what
    :class:`DenseInputs` does with each transform but a fitted one (the other strategy is
    :class:`~service.model.inputs.bof.BagSpace`; both answer the same calls).

    Parameters
    ----------
    bound : BoundTransform
    mean : ndarray of shape (d,)
    scale : float or ndarray of shape (d,)
    basis : ndarray of shape (B, d)
    """

    has_normalized_form = True

    def __init__(self, bound: BoundTransform, mean: np.ndarray, scale, basis: np.ndarray):
        self.bound, self.mean, self.scale, self.basis = bound, mean, scale, basis
        # None when the scale does not fit the mean: problems() says so, and the model is
        # refused before it serves.
        fits = np.ndim(scale) == 0 or np.shape(scale) == mean.shape
        self._scales = feature_scales(scale, mean.shape[0]) if fits else None

    @property
    def transform(self) -> InputTransform:
        return self.bound.transform

    @property
    def n_features(self) -> int:
        return self.bound.n_features

    @property
    def grid_shape(self) -> tuple[int, int, int] | None:
        return self.bound.grid_shape

    @property
    def n_values(self) -> int:
        return int(self.basis.size)

    def prepare(self, batch: np.ndarray) -> np.ndarray:
        return self.prepare_measured(batch)[0]

    def prepare_measured(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        """:meth:`prepare`, each item's distance from the training mean in units of the scale
        (its norm) and the largest (NaN if any is NaN), in one pass."""
        return normalize_measured(self.bound.apply(batch), self.mean, self._scales)

    def runs_serially(self, n_samples: int) -> bool:
        return self.bound.runs_serially(n_samples)

    def bind(self, spec: SimilaritySpec) -> BoundSimilarity:
        return spec.bind(self.n_features, self.grid_shape)

    def problems(self, suffix: str, n_basis: int) -> list[str]:
        return _space_problems(self.n_features, n_basis, self.mean, self.scale, self.basis, suffix)

    def arrays(self, suffix: str) -> dict[str, np.ndarray]:
        return {
            f"input_scale{suffix}": np.asarray(self.scale, dtype=np.float64),
            f"input_mean{suffix}": self.mean,
            f"basis{suffix}": self.basis,
        }


@dataclass(frozen=True, eq=False)
class DenseInputs(InputKind):
    """Vectors and grids: transformed, then centred and scaled (BE-SVM paper, section 3.1), by
    one scale or one per feature (see :mod:`service.model.inputs.dense`).

    A model whose measures read different transforms of the same input
    (``hog(8): rbf + pixels: rbf``) holds one :class:`TransformedSpace` per transform besides its
    own; each request computes each transform once, and the prepared items are then
    :class:`~service.model.inputs.spaces.Spaces`, one array per transform.

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
        Applied to every instance first; see :mod:`service.model.inputs.transforms`. Measures
        written without a transform read its output.
    more_spaces : tuple of TransformedSpace, default ()
        The other transforms the measures read, each once; recorded in the manifest as
        ``transforms`` (every transform, this one first) only when there are any.
    bags : tuple of BagOfFeatures, default ()
        The fitted form (visual words) of every ``bof`` transform among them; such a space
        has no ``mean`` and ``scale`` (None) and its ``basis`` is CellDocuments.

    Raises
    ------
    SpecError
        The spec is not a vector or grid, a transform does not apply to it, or a transform is
        given twice, or a fitted transform has no fitted form in ``bags``.
    """

    spec: InputSpec
    mean: np.ndarray | None
    scale: float | np.ndarray | None
    basis: np.ndarray | CellDocuments
    transform: InputTransform = NO_TRANSFORM
    more_spaces: tuple[TransformedSpace, ...] = ()
    bags: tuple[BagOfFeatures, ...] = ()
    _spaces: tuple[NormalisedSpace | BagSpace, ...] = field(init=False, repr=False)
    _basis_items: np.ndarray | CellDocuments | Spaces = field(init=False, repr=False)

    ARRAYS: ClassVar[frozenset[str]] = (
        frozenset({"input_mean", "input_scale", "basis"}) | BagSpace.ARRAYS
    )

    def __post_init__(self) -> None:
        if self.spec.kind not in ("vector", "grid"):
            raise SpecError(f"dense inputs are vectors or grids, not {self.spec}")
        _normalise_space_arrays(self)
        object.__setattr__(self, "more_spaces", tuple(self.more_spaces))
        object.__setattr__(self, "bags", tuple(self.bags))
        names = self.transform_names
        if len(set(names)) != len(names):
            raise SpecError(f"a transform is given twice among {', '.join(names)}")
        spaces = (
            self._space(self.transform, self.mean, self.scale, self.basis),
            *(self._space(s.transform, s.mean, s.scale, s.basis) for s in self.more_spaces),
        )
        object.__setattr__(self, "_spaces", spaces)
        items = self.basis if not self.more_spaces else Spaces(tuple(s.basis for s in spaces))
        object.__setattr__(self, "_basis_items", items)

    def _space(self, transform: InputTransform, mean, scale, basis) -> NormalisedSpace | BagSpace:
        """The strategy of one transform's space."""
        if not transform.is_fitted:
            return NormalisedSpace(transform.bind(self.spec), mean, scale, basis)
        bag = next((b for b in self.bags if str(b.transform) == str(transform)), None)
        if bag is None:
            raise SpecError(f"transform {transform} has no visual words among the model's bags")
        return BagSpace(bag.bind(self.spec), basis)

    @property
    def has_normalized_form(self) -> bool:
        """Every space is dense vectors (no ``bof`` among the transforms)."""
        return all(space.has_normalized_form for space in self._spaces)

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
        """``global`` (one scale) or ``per-feature``, of the normalised spaces (``global``
        when every space is a fitted transform's, which is not normalised)."""
        scales = [s.scale for s in self._spaces if isinstance(s, NormalisedSpace)]
        return input_normalization_of(scales[0]) if scales else GLOBAL_NORMALIZATION

    @property
    def n_features(self) -> int:
        return self._spaces[0].n_features

    @property
    def grid_shape(self) -> tuple[int, int, int] | None:
        return self._spaces[0].grid_shape

    @property
    def basis_items(self) -> np.ndarray | Spaces:
        return self._basis_items

    @property
    def n_basis_values(self) -> int:
        return sum(space.n_values for space in self._spaces)

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
        return batch, self._prepare_checked(batch, names)

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
        self._prepare_checked(batch, names)

    def _prepare_checked(
        self, batch: np.ndarray, names: Sequence[str] | None
    ) -> np.ndarray | CellDocuments | Spaces:
        """:meth:`prepare`, with :meth:`check_distances` from the distances each space measures
        as it prepares (no pass of its own)."""
        measured = [space.prepare_measured(batch) for space in self._spaces]
        for _, _, farthest in measured:
            # NaN (a transform that could not compute) is not <= the bound: far.
            if not farthest <= MAX_INPUT_DISTANCE:
                self._refuse_far(np.column_stack([m[1] for m in measured]), names)
        return measured[0][0] if len(measured) == 1 else Spaces(tuple(m[0] for m in measured))

    def _refuse_far(self, distances: np.ndarray, names: Sequence[str] | None) -> NoReturn:
        """Name the first instance whose distances (shape (n_samples, n_spaces)) pass the
        bound, and why."""
        far_rows = np.flatnonzero(~(distances <= MAX_INPUT_DISTANCE).all(axis=1))
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
        return all(space.runs_serially(n_samples) for space in self._spaces)

    def prepare(self, batch: np.ndarray) -> np.ndarray | CellDocuments | Spaces:
        """Transformed, centred and scaled: ndarray of shape (n_samples, d) (``bof``: the
        images as CellDocuments); for a model over several transforms, :class:`Spaces` of each
        transform's, each computed once."""
        prepared = tuple(space.prepare(batch) for space in self._spaces)
        return prepared[0] if len(prepared) == 1 else Spaces(prepared)

    def normalized(self, X) -> np.ndarray:
        """:meth:`prepare` of :meth:`batch`, every transform's side by side (the model's own
        first): ndarray of shape (n_samples, sum of the transforms' d)."""
        return self.normalized_of(self.prepare(self.batch(X)))

    def normalized_of(self, items: np.ndarray | Spaces) -> np.ndarray:
        if not self.has_normalized_form:
            raise InvalidInputError(
                f"a model over {', '.join(self.transform_names)} reads bags of visual words, "
                "which have no dense normalised form"
            )
        return items.joined() if isinstance(items, Spaces) else items

    def warm_up_batch(self, n_rows: int) -> np.ndarray:
        return np.zeros((n_rows, self.spec.n_features))

    def bind(self, specs: Sequence[SimilaritySpec]) -> tuple[BoundSimilarity, ...]:
        names = self.transform_names
        several = len(names) > 1
        bound = []
        for spec in specs:
            space = spec.space_index(names)
            measure = self._spaces[space].bind(spec)
            bound.append(replace(measure, space=space) if several else measure)
        return tuple(bound)

    @classmethod
    def settle_transforms(
        cls,
        spec: InputSpec,
        measures: Sequence[SimilaritySpec],
        transform: str | None = None,
    ) -> tuple[InputTransform, ...]:
        """The model's transform, then each other one a measure names (``hog(4): rbf``), in
        order of the measures, once each. The model's is ``transform`` if given; else the
        default for the inputs (pixels for images) if a measure reads it; else the first
        measure's, so that no space is computed that no measure reads. Every measure is checked
        against the transform it reads (grid measures need a grid that fits).
        """
        default = default_transform(spec)
        if transform is not None:
            own = parse_transform(transform)
        elif any(str(m.transform_or(default)) == str(default) for m in measures):
            own = default
        else:
            own = measures[0].transform
        own.check(spec)
        transforms = {str(own): own}
        for measure in measures:
            if measure.transform is not None:
                measure.transform.check(spec)
                transforms.setdefault(str(measure.transform), measure.transform)
        settled = tuple(transforms.values())
        names = list(transforms)
        seen = set()
        for measure in measures:
            read = settled[measure.space_index(names)]
            if read.reads_cells:
                measure.check_cells(f"{read} of inputs {spec}")
            else:
                measure.check_documents(False, f"inputs {spec}")
                measure.check_grid(read.grid_shape(spec), read.n_features(spec))
            key = (str(read), measure.measure_name)
            if key in seen:
                terms = " + ".join(map(str, measures))
                raise SpecError(f"{measure.measure_name} on {key[0]} is given twice in {terms}")
            seen.add(key)
        return settled

    def problems(self) -> list[str]:
        problems = []
        for i, space in enumerate(self._spaces):
            suffix = _space_suffix(i)
            problems += space.problems(suffix, self.n_basis)
            if (
                isinstance(space, NormalisedSpace)
                and input_normalization_of(space.scale) != self.input_normalization
            ):
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
        for i, space in enumerate(self._spaces):
            arrays |= space.arrays(_space_suffix(i))
        return arrays

    @classmethod
    def array_names(cls, manifest: dict[str, Any]) -> frozenset[str]:
        names = set()
        for i, text in enumerate(_transform_texts(manifest)):
            kind = BagSpace.ARRAYS if parse_transform(text).is_fitted else _NORMALISED_ARRAYS
            names |= {f"{name}{_space_suffix(i)}" for name in kind}
        return frozenset(names)

    @classmethod
    def from_artifact(cls, spec, manifest, arrays, path) -> DenseInputs:
        normalization = manifest.get("input_normalization", GLOBAL_NORMALIZATION)
        if normalization not in INPUT_NORMALIZATIONS:
            raise ArtifactIntegrityError(
                f"{path}: input_normalization must be one of {', '.join(INPUT_NORMALIZATIONS)},"
                f" got {normalization!r}"
            )
        transform_texts = _transform_texts(manifest)
        if "transforms" in manifest and (
            len(transform_texts) < 2 or transform_texts[0] != manifest.get("transform")
        ):
            raise ArtifactIntegrityError(
                f"{path}: transforms must list two or more transforms, the model's "
                f"transform {manifest.get('transform')!r} first"
            )
        spaces, bags = [], []
        for i, text in enumerate(transform_texts):
            suffix = _space_suffix(i)
            transform = parse_transform(text)
            if transform.is_fitted:
                bag, basis = BagSpace.from_arrays(transform, spec, arrays, suffix, path)
                bags.append(bag)
                spaces.append(TransformedSpace(transform, None, None, basis))
                continue
            scale = arrays[f"input_scale{suffix}"]
            if input_normalization_of(scale) != normalization:
                raise ArtifactIntegrityError(
                    f"{path}: input_scale{suffix} of shape {list(scale.shape)} does "
                    f"not fit input_normalization {normalization!r} (a scalar for global, one "
                    "per feature for per-feature)"
                )
            spaces.append(
                TransformedSpace(
                    transform,
                    arrays[f"input_mean{suffix}"],
                    float(scale) if scale.ndim == 0 else scale,
                    arrays[f"basis{suffix}"],
                )
            )
        own = spaces[0]
        return cls(
            spec=spec,
            mean=own.mean,
            scale=own.scale,
            basis=own.basis,
            transform=own.transform,
            more_spaces=tuple(spaces[1:]),
            bags=tuple(bags),
        )


_NORMALISED_ARRAYS = frozenset({"input_mean", "input_scale", "basis"})


def _transform_texts(manifest: dict[str, Any]) -> list[str]:
    """Every transform a manifest records, canonical text, the model's first."""
    if "transforms" in manifest:
        return [str(t) for t in manifest["transforms"]]
    return [str(manifest.get("transform", "none"))]


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


def bind_in_spaces(
    specs: Sequence[SimilaritySpec],
    spaces: Sequence[tuple[str, int, tuple[int, int, int] | None]],
) -> tuple[BoundSimilarity, ...]:
    """Every measure bound to the transformed space it reads, for items given as
    :class:`Spaces` (one space: plain arrays, each measure as :meth:`SimilaritySpec.bind`
    binds it). Training binds its measures through this, before the model exists; a model
    binds through its spaces (:meth:`DenseInputs.bind`).

    Parameters
    ----------
    specs : sequence of SimilaritySpec, length M
    spaces : sequence of (transform, n_features, grid_shape[, cells])
        Each space's transform (canonical text), item length and layout, the model's own
        transform first (measures without a transform read it); ``cells`` > 0: the items are
        images as bags of visual words over that many pyramid cells (``n_features`` is cells
        times words).

    Raises
    ------
    SpecError
        A measure names a transform not among ``spaces``, or does not apply to its items.
    """
    names = [space[0] for space in spaces]
    bound = []
    for spec in specs:
        space = spec.space_index(names)
        _, n_features, grid_shape, *cells = spaces[space]
        if cells and cells[0]:
            measure = spec.bind(n_features // cells[0], cells=cells[0])
        else:
            measure = spec.bind(n_features, grid_shape)
        bound.append(replace(measure, space=space) if len(spaces) > 1 else measure)
    return tuple(bound)
