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
(:class:`training.preprocessing.InputNormalizer` fits them).

Dense models whose measures read several transforms of the input (``hog(4): rbf + pixels: rbf``)
hold one mean, scale and basis per transform (:class:`TransformedSpace`): the arrays of the
further transforms end in ``_1``, ``_2``, ... and the manifest lists them all in ``transforms``;
models over one transform have neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from service.model.errors import ArtifactIntegrityError, InvalidInputError, SpecError
from service.model.inputs.base import NO_TRANSFORM, InputKind
from service.model.inputs.spaces import Spaces
from service.model.inputs.spec import InputSpec, instance_name
from service.model.inputs.transforms import (
    BoundTransform,
    InputTransform,
    default_transform,
    parse_transform,
)
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
    out = np.subtract(X, mean, dtype=np.float64)
    out /= scale
    return out


def input_normalization_of(scale: float | np.ndarray) -> str:
    """The normalisation a stored scale belongs to: a scalar is ``global``, a vector
    ``per-feature``."""
    return GLOBAL_NORMALIZATION if np.ndim(scale) == 0 else PER_FEATURE_NORMALIZATION


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
    transform: InputTransform = NO_TRANSFORM
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
            measure.check_documents(False, f"inputs {spec}")
            read = settled[measure.space_index(names)]
            measure.check_grid(read.grid_shape(spec), read.n_features(spec))
            key = (str(read), measure.measure_name)
            if key in seen:
                terms = " + ".join(map(str, measures))
                raise SpecError(f"{measure.measure_name} on {key[0]} is given twice in {terms}")
            seen.add(key)
        return settled

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
