r"""The Basis Expanding feature map (BE-SVM paper, eq. 3 and 4).

For M similarity measures on one shared basis :math:`b_1 \dots b_B`, the empirical kernel map of
measure m is :math:`\tilde\varphi_m(x) = [s_m(b_1, x) \dots s_m(b_B, x)]`, normalised with
statistics of the training set

.. math:: \varphi_m(x) = \frac{\tilde\varphi_m(x) - E[\tilde\varphi_m]}
                              {E\lVert \tilde\varphi_m - E[\tilde\varphi_m] \rVert_2}

and concatenated: :math:`\varphi(x) = [\varphi_1(x) \dots \varphi_M(x)]`, M*B features.
Every normalisation is stored as one affine map per feature, ``(raw - offset) / scale``, so that
:func:`expand` is the one function both training and serving compute features with.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data
from tqdm.auto import tqdm

from service.model.basis import BASIS_STRATEGIES, select_basis
from service.model.similarity import SimilaritySpec, format_spec, parse_specs

NORMALIZATIONS = ("besvm", "none")


def raw_similarities(
    X: np.ndarray,
    basis: np.ndarray,
    specs: Sequence[SimilaritySpec],
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Empirical kernel maps of every measure, side by side.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features), float64, C-contiguous
    basis : ndarray of shape (n_basis, n_features), float64, C-contiguous
    specs : sequence of SimilaritySpec, length M
    out : ndarray of shape (n_samples, M * n_basis), optional

    Returns
    -------
    out : ndarray of shape (n_samples, M * n_basis)
        Columns ``m * n_basis : (m + 1) * n_basis`` hold measure m.
    """
    n_basis = basis.shape[0]
    if out is None:
        out = np.empty((X.shape[0], len(specs) * n_basis), dtype=np.float64)
    for m, spec in enumerate(specs):
        spec.compute(basis, X, out[:, m * n_basis : (m + 1) * n_basis])
    return out


def expand(
    X: np.ndarray,
    basis: np.ndarray,
    specs: Sequence[SimilaritySpec],
    offset: np.ndarray,
    scale: np.ndarray,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Normalised basis-expanded features: the one feature function of training and serving.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features), float64, C-contiguous
        Inputs, already normalised.
    basis : ndarray of shape (n_basis, n_features)
    specs : sequence of SimilaritySpec, length M
    offset, scale : ndarray of shape (M * n_basis,)
    out : ndarray of shape (n_samples, M * n_basis), optional

    Returns
    -------
    features : ndarray of shape (n_samples, M * n_basis)
    """
    features = raw_similarities(X, basis, specs, out)
    features -= offset
    features /= scale
    return features


def normalization_statistics(
    raw: np.ndarray, n_measures: int, normalization: str
) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature ``offset`` and ``scale`` from the training set's raw kernel maps.

    Parameters
    ----------
    raw : ndarray of shape (n_samples, M * n_basis)
    n_measures : int
    normalization : {"besvm", "none"}

    Returns
    -------
    offset, scale : ndarray of shape (M * n_basis,)
    """
    n_features = raw.shape[1]
    if normalization == "none":
        return np.zeros(n_features), np.ones(n_features)
    if normalization != "besvm":
        raise ValueError(
            f"unknown normalization {normalization!r}; known: {', '.join(NORMALIZATIONS)}"
        )
    offset = raw.mean(axis=0)
    scale = np.empty(n_features)
    n_basis = n_features // n_measures
    for m in range(n_measures):
        block = slice(m * n_basis, (m + 1) * n_basis)
        mean_norm = float(np.linalg.norm(raw[:, block] - offset[block], axis=1).mean())
        scale[block] = mean_norm if mean_norm > 0.0 else 1.0
    return offset, scale


class BasisExpansion(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Similarities to a class-balanced basis of training items, normalised per measure.

    Parameters
    ----------
    similarities : str or sequence of str, default="rbf(gamma=1)"
        One or more similarity measures sharing the basis, e.g. ``"rbf(gamma=1) + linear"``.
    n_basis_per_class : int, default=25
        Basis items taken from each class (all of a smaller class).
    basis_strategy : {"index", "random"}, default="index"
    normalization : {"besvm", "none"}, default="besvm"
        ``besvm`` centres each measure's map and divides it by its mean norm (paper eq. 4).
    chunk_size : int, default=4096
        Rows expanded at a time, bounding the working memory of ``fit``.
    random_state : int or None, default=None
        Seed of the ``random`` basis strategy.
    verbose : bool, default=False
        Show a progress bar while expanding the training set.

    Attributes
    ----------
    specs_ : tuple of SimilaritySpec
        The parsed measures, length M.
    basis_indices_ : ndarray of shape (n_basis,)
        Rows of the training set chosen as basis.
    basis_ : ndarray of shape (n_basis, n_features_in_)
    basis_labels_ : ndarray of shape (n_basis,) or None
        Class of each basis item, if ``y`` was given.
    offset_, scale_ : ndarray of shape (M * n_basis,)
        The normalisation, ``(raw - offset_) / scale_``.
    n_features_in_ : int
    """

    def __init__(
        self,
        similarities="rbf(gamma=1)",
        n_basis_per_class=25,
        basis_strategy="index",
        normalization="besvm",
        chunk_size=4096,
        random_state=None,
        verbose=False,
    ):
        self.similarities = similarities
        self.n_basis_per_class = n_basis_per_class
        self.basis_strategy = basis_strategy
        self.normalization = normalization
        self.chunk_size = chunk_size
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(self) -> tuple[SimilaritySpec, ...]:
        if self.basis_strategy not in BASIS_STRATEGIES:
            raise ValueError(
                f"basis_strategy must be one of {BASIS_STRATEGIES}, got {self.basis_strategy!r}"
            )
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}"
            )
        for name in ("n_basis_per_class", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        return parse_specs(self.similarities)

    def fit(self, X, y=None):
        """Choose the basis and learn the normalisation.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Inputs, normalised already if they should be.
        y : array-like of shape (n_samples,), optional
            Class labels for a class-balanced basis.

        Returns
        -------
        self
        """
        self.fit_transform(X, y)
        return self

    def fit_transform(self, X, y=None, **fit_params):
        """Fit, and return the training set's features without computing them twice.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : array-like of shape (n_samples,), optional

        Returns
        -------
        features : ndarray of shape (n_samples, M * n_basis)
        """
        specs = self._check_params()
        if y is None:
            X = validate_data(self, X, dtype=np.float64, order="C")
        else:
            X, y = validate_data(self, X, y, dtype=np.float64, order="C")
        indices = select_basis(
            None if y is None else np.asarray(y),
            X.shape[0],
            self.n_basis_per_class,
            self.basis_strategy,
            self.random_state,
        )
        self.specs_ = specs
        self.basis_indices_ = indices
        self.basis_ = np.ascontiguousarray(X[indices])
        self.basis_labels_ = None if y is None else np.asarray(y)[indices]
        # The statistics need the raw map of the whole training set: compute it once, normalise
        # it in place rather than expanding the training set a second time.
        raw = np.empty((X.shape[0], len(specs) * len(indices)))
        for rows in self._chunks(X.shape[0], desc="expanding training set"):
            raw_similarities(X[rows], self.basis_, specs, raw[rows])
        self.offset_, self.scale_ = normalization_statistics(raw, len(specs), self.normalization)
        raw -= self.offset_
        raw /= self.scale_
        return raw

    def transform(self, X):
        """Basis-expanded, normalised features.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        features : ndarray of shape (n_samples, M * n_basis)
        """
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, order="C", reset=False)
        features = np.empty((X.shape[0], self._n_features_out))
        for rows in self._chunks(X.shape[0], desc="expanding"):
            expand(X[rows], self.basis_, self.specs_, self.offset_, self.scale_, features[rows])
        return features

    def _chunks(self, n_samples: int, desc: str):
        """Row slices of ``chunk_size``, with a progress bar if verbose (and on a terminal)."""
        starts = range(0, n_samples, self.chunk_size)
        for start in tqdm(starts, desc=desc, unit="chunk", disable=None if self.verbose else True):
            yield slice(start, min(start + self.chunk_size, n_samples))

    @property
    def similarity_names_(self) -> list[str]:
        """Canonical text of each measure."""
        check_is_fitted(self)
        return [format_spec(s) for s in self.specs_]

    @property
    def _n_features_out(self) -> int:
        return len(self.specs_) * self.basis_.shape[0]
