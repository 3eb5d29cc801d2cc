r"""Learning the Basis Expanding feature map (BE-SVM paper, eq. 3 and 4): the basis, and the
normalisation of each measure's similarities from the training set.

:class:`BasisExpansion` is a scikit-learn transformer; what it learns (the basis, an affine map
per feature and, for Nystroem, one projection per measure) is what a model stores, and
:func:`service.model.features.expand` computes the features from it, in training and in serving
alike (that module's docstring has the formulas).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data
from tqdm.auto import tqdm

from service.model.errors import InvalidInputError, SpecError
from service.model.features import (
    expand,
    normalize_features,
    project_blocks,
    raw_similarities,
    resolve_normalization,
)
from service.model.inputs.dense import bind_in_spaces
from service.model.inputs.spaces import Spaces
from service.model.inputs.words import CellDocuments, Documents, canonical_counts, smooth_idf
from service.model.similarity import BoundSimilarity, SimilaritySpec, format_spec, parse_specs
from training.estimator.basis import BASIS_STRATEGIES, select_basis
from training.estimator.block_statistics import learn_in_one_block
from training.estimator.normalization import normalization_rule, symmetric_eigenvalues

# Items that reach the expansion prepared already (not validated as arrays): images as bags of
# visual words, alone or beside other spaces.
_PREPARED = (CellDocuments, Spaces)


def bind_similarities(
    specs: Sequence[SimilaritySpec],
    n_features: int,
    grid_shape: tuple[int, int, int] | None = None,
    documents: bool = False,
) -> tuple[BoundSimilarity, ...]:
    """Every measure bound to the items it will compare (see :meth:`SimilaritySpec.bind`).

    Parameters
    ----------
    specs : sequence of SimilaritySpec, length M
    n_features : int
        Length of an item (for documents: the vocabulary size).
    grid_shape : (height, width, channels), optional
        Layout of the items, for grid measures.
    documents : bool, default=False
        The items are :class:`Documents`.

    Returns
    -------
    tuple of BoundSimilarity, length M

    Raises
    ------
    SpecError
        A measure does not apply to the items.
    """
    return tuple(spec.bind(n_features, grid_shape, documents) for spec in specs)


class BasisExpansion(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Similarities to a class-balanced basis of training items, normalised per measure.

    Inputs are dense vectors (or flattened grids), or sparse bag-of-words counts (a scipy CSR
    matrix of non-negative whole numbers, one row per document), which the sensing measures read
    as they are and ``linear``/``rbf`` as tf-idf vectors (see :mod:`service.model.inputs.words`).

    Parameters
    ----------
    similarities : str or sequence of str, default="rbf(gamma=1)"
        One or more similarity measures sharing the basis, e.g. ``"rbf(gamma=1) + rigid(1)"``.
    n_basis_per_class : int, default=25
        Basis items taken from each class (all of a smaller class).
    basis_strategy : {"index", "random", "kmedoids"}, default="index"
        ``kmedoids`` clusters each class under the measures themselves.
    normalization : str, default="besvm"
        ``besvm`` centres each measure's map and divides it by its mean norm (paper eq. 4);
        also ``none``, ``zscore``, ``nystroem(clip|flip|square)`` and ``auto`` (see
        :func:`resolve_normalization`).
    grid_shape : tuple of (int, int, int) or None, default=None
        ``(height, width, channels)`` of the flattened inputs; needed by grid measures.
    spaces : sequence of (str, int, tuple or None[, int]), or None, default=None
        Dense inputs made of several transforms of the same input laid side by side in the
        columns: each one's transform (canonical text), numbers and grid layout, the one that
        measures without a transform read first (``grid_shape`` is then not used). Measures
        ``transform: measure`` read their transform's columns; the basis items are shared.
        A fourth number > 0 marks a space of images as bags of visual words over that many
        pyramid cells; such items come prepared, as
        :class:`~service.model.inputs.words.CellDocuments` (or :class:`Spaces` holding them),
        not as columns.
    chunk_size : int, default=4096
        Rows expanded at a time, bounding the working memory of ``fit``.
    random_state : int or None, default=None
        Seed of the ``random`` and ``kmedoids`` basis strategies.
    verbose : bool, default=False
        Show a progress bar while expanding the training set.

    Attributes
    ----------
    specs_ : tuple of SimilaritySpec
        The parsed measures, length M.
    normalization_ : str
        The canonical name of the normalisation (``auto`` resolved).
    basis_indices_ : ndarray of shape (n_basis,)
        Rows of the training set chosen as basis.
    basis_ : ndarray or csr_matrix of shape (n_basis, n_features_in_)
        Sparse counts for document inputs.
    idf_ : ndarray of shape (n_features_in_,) or None
        Smooth inverse document frequencies of the training documents (documents only).
    basis_items_ : ndarray or Documents of shape (n_basis, n_features_in_)
        The basis as the measures read it: ``basis_``, or for documents :class:`Documents`
        with their cached postings.
    basis_labels_ : ndarray of shape (n_basis,) or None
        Class of each basis item, if ``y`` was given.
    basis_gram_ : ndarray of shape (M, n_basis, n_basis)
        ``basis_gram_[m, i, j]`` is measure m of basis item j against basis item i.
    offset_, scale_ : ndarray of shape (M * n_basis,)
        The affine part of the normalisation, ``(raw - offset_) / scale_``.
    projection_ : ndarray of shape (M, n_basis, n_basis) or None
        Nystroem's per-measure projection, applied after the affine part.
    basis_eigenvalues_ : ndarray of shape (M, n_basis) or None
        With Nystroem: each measure's eigenvalues on the basis (ascending), from the one
        decomposition the projection is made of (the eigenvalue diagnostics read them). None
        unless every measure's projection was made of one (a kernel's ``clip`` map needs
        none, :func:`kernel_map_projection`): the diagnostics then compute the eigenvalues.
    timings_ : dict of str to float
        Seconds ``fit_transform`` spent in each step: ``similarities`` (the raw maps of the
        training set), ``normalization`` (its statistics: for Nystroem the eigendecomposition
        or the Cholesky factor, and the projection), ``projection`` (the training set's
        features projected).
    n_features_in_ : int
    """

    def __init__(
        self,
        similarities="rbf(gamma=1)",
        n_basis_per_class=25,
        basis_strategy="index",
        normalization="besvm",
        grid_shape=None,
        chunk_size=4096,
        random_state=None,
        verbose=False,
        spaces=None,
    ):
        self.similarities = similarities
        self.n_basis_per_class = n_basis_per_class
        self.basis_strategy = basis_strategy
        self.normalization = normalization
        self.grid_shape = grid_shape
        self.spaces = spaces
        self.chunk_size = chunk_size
        self.random_state = random_state
        self.verbose = verbose

    def _check_params(
        self, n_features: int, documents: bool
    ) -> tuple[tuple[SimilaritySpec, ...], str, tuple[BoundSimilarity, ...]]:
        if self.basis_strategy not in BASIS_STRATEGIES:
            raise ValueError(
                f"basis_strategy must be one of {BASIS_STRATEGIES}, got {self.basis_strategy!r}"
            )
        for name in ("n_basis_per_class", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        try:
            specs = parse_specs(self.similarities)
            normalization = resolve_normalization(self.normalization, specs)
            measures = self._bind(specs, n_features, documents)
        except SpecError as error:
            raise ValueError(str(error)) from None
        return specs, normalization, measures

    def _grid(self) -> tuple[int, int, int] | None:
        return None if self.grid_shape is None else tuple(int(s) for s in self.grid_shape)

    def _bind(self, specs, n_features: int, documents: bool) -> tuple[BoundSimilarity, ...]:
        if self.spaces is None or documents:
            prefixed = [spec for spec in specs if spec.transform is not None]
            if prefixed:
                raise SpecError(
                    f"{prefixed[0]} reads a transform of its own: these inputs have one space"
                )
            return bind_similarities(specs, n_features, self._grid(), documents)
        spaces = [(str(name), int(d), grid, *rest) for name, d, grid, *rest in self.spaces]
        total = sum(space[1] for space in spaces)
        if total != n_features:
            raise SpecError(f"spaces of {total} numbers in all, the inputs have {n_features}")
        return bind_in_spaces(specs, spaces)

    def _split(self, X):
        """Dense inputs of several spaces as :class:`Spaces`; others as they are."""
        if self.spaces is None or len(self.spaces) < 2 or isinstance(X, (Documents, *_PREPARED)):
            return X
        return Spaces.split(X, [int(space[1]) for space in self.spaces])

    def _validated(self, X, y, reset: bool):
        """``X`` (and ``y``) checked as scikit-learn checks them; items that come prepared
        (bags of visual words) only counted."""
        if not isinstance(X, _PREPARED):
            kwargs = {"accept_sparse": "csr", "dtype": np.float64, "order": "C", "reset": reset}
            if y is None:
                return validate_data(self, X, **kwargs), None
            return validate_data(self, X, y, **kwargs)
        if reset:
            self.n_features_in_ = X.shape[1]
        elif X.shape[1] != self.n_features_in_:
            raise ValueError(f"expected items of {self.n_features_in_} numbers, got {X.shape[1]}")
        if y is not None:
            y = column_or_1d(y)
            if len(y) != len(X):
                raise ValueError(f"{len(X)} items but {len(y)} labels")
        return X, y

    def fit(self, X, y=None):
        """Choose the basis and learn the normalisation.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
            Inputs, normalised already if they should be; sparse means word counts.
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
        X : array-like or sparse matrix of shape (n_samples, n_features)
        y : array-like of shape (n_samples,), optional

        Returns
        -------
        features : ndarray of shape (n_samples, M * n_basis)
        """
        X, y = self._validated(X, y, reset=True)
        documents = sp.issparse(X)  # sparse inputs are word counts
        specs, normalization, measures = self._check_params(X.shape[1], documents)
        X = self._split(self._items(X, reset=True))

        def class_similarities(rows: np.ndarray) -> np.ndarray:
            items = X[rows]  # a C-contiguous copy of dense rows, or Documents
            raw = raw_similarities(items, items, measures)
            return raw.reshape(len(rows), len(specs), len(rows)).transpose(1, 0, 2)

        indices = select_basis(
            None if y is None else np.asarray(y),
            X.shape[0],
            self.n_basis_per_class,
            self.basis_strategy,
            self.random_state,
            similarity=class_similarities,
        )
        self.specs_ = specs
        self.normalization_ = normalization
        self.basis_indices_ = indices
        self.basis_items_ = X[indices]
        self.basis_ = self.basis_items_.counts if documents else self.basis_items_
        self.basis_labels_ = None if y is None else np.asarray(y)[indices]
        # The statistics need the raw map of the whole training set: compute it once, normalise
        # it in place rather than expanding the training set a second time.
        n_basis = len(indices)
        self.timings_ = {}
        started = time.perf_counter()
        raw = np.empty((X.shape[0], len(specs) * n_basis))
        for rows in self._chunks(X.shape[0], desc="expanding training set"):
            raw_similarities(X[rows], self.basis_items_, measures, raw[rows])
        self.timings_["similarities"] = time.perf_counter() - started
        started = time.perf_counter()
        self.basis_gram_ = raw[indices].reshape(n_basis, len(specs), n_basis).transpose(1, 0, 2)
        self.basis_gram_ = np.ascontiguousarray(self.basis_gram_)
        # Nystroem's one eigendecomposition per measure that needs one: the projection is made
        # of it, and the eigenvalue diagnostics read its eigenvalues instead of solving the
        # problem again.
        rule = normalization_rule(
            normalization, len(specs), [spec.kind.positive_definite for spec in specs]
        )
        spectra = [
            symmetric_eigenvalues(K) if rule.decomposes(m) else None
            for m, K in enumerate(self.basis_gram_)
        ]
        self.basis_eigenvalues_ = None
        if all(pair is not None for pair in spectra):  # none for a normalisation without any
            self.basis_eigenvalues_ = np.stack([values for values, _ in spectra])
        self.offset_, self.scale_, self.projection_ = rule.statistics(
            learn_in_one_block(rule, raw), raw.shape[1], self.basis_gram_, spectra
        )
        del spectra
        self.timings_["normalization"] = time.perf_counter() - started
        started = time.perf_counter()
        self.normalize(raw)
        self.timings_["projection"] = time.perf_counter() - started
        return raw

    def transform(self, X):
        """Basis-expanded, normalised features.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)

        Returns
        -------
        features : ndarray of shape (n_samples, M * n_basis)
        """
        return self._expanded(X, normalized=True)

    def raw_maps(self, X):
        """:meth:`transform`'s features before their normalisation: the raw kernel maps, each
        measure of ``X`` against the basis, of shape (n_samples, M * n_basis); what the
        normalisation is learned from, and what :meth:`normalize` finishes."""
        return self._expanded(X, normalized=False)

    def normalize(self, raw: np.ndarray) -> np.ndarray:
        """Raw kernel maps (:meth:`raw_maps`) normalised in place by the fitted
        normalisation (:func:`service.model.features.normalize_features`, as serving does), by
        row chunks: a projection's temporary is one chunk, not a second training set.

        Parameters
        ----------
        raw : ndarray of shape (n_samples, M * n_basis)

        Returns
        -------
        raw : ndarray of shape (n_samples, M * n_basis)
            The same array, normalised.
        """
        check_is_fitted(self)
        # Nystroem's affine part is the identity: two passes over the features saved.
        if not self.offset_.any() and not (self.scale_ != 1.0).any():
            if self.projection_ is None:
                return raw
            for rows in self._chunks(raw.shape[0], desc="projecting"):
                project_blocks(raw[rows], self.projection_)
            return raw
        for rows in self._chunks(raw.shape[0], desc="normalising"):
            normalize_features(raw[rows], self.offset_, self.scale_, self.projection_)
        return raw

    def _expanded(self, X, normalized: bool) -> np.ndarray:
        check_is_fitted(self)
        X, _ = self._validated(X, None, reset=False)
        documents = self.idf_ is not None
        if sp.issparse(X) != documents:
            kind = "word counts (sparse)" if documents else "dense inputs"
            raise ValueError(f"this expansion was fitted on {kind}")
        measures = self._bind(self.specs_, X.shape[1], documents)
        X = self._split(self._items(X, reset=False))
        features = np.empty((X.shape[0], self._n_features_out))
        for rows in self._chunks(X.shape[0], desc="expanding"):
            if normalized:
                expand(
                    X[rows],
                    self.basis_items_,
                    measures,
                    self.offset_,
                    self.scale_,
                    features[rows],
                    projection=self.projection_,
                )
            else:
                raw_similarities(X[rows], self.basis_items_, measures, features[rows])
        return features

    def _items(self, X, reset: bool) -> np.ndarray | Documents:
        """Validated inputs as the measures read them: dense rows as they are; sparse rows are
        word counts, read as :class:`Documents` with the training set's idf (learned in
        ``idf_`` when ``reset``, None for dense inputs)."""
        if not sp.issparse(X):
            if reset:
                self.idf_ = None
            return X
        try:
            counts = canonical_counts(X)
        except InvalidInputError as error:
            raise ValueError(f"sparse inputs are word counts: {error}") from None
        if reset:
            self.idf_ = smooth_idf(counts)
        return Documents(counts, self.idf_)

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
