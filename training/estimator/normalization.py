"""How each measure's similarities are normalised: the rules a
:class:`~training.estimator.expansion.BasisExpansion` learns its normalisation by, from the
training set's raw kernel maps (block sums, :mod:`training.estimator.block_statistics`) or from
the basis Gram matrices (Nystroem's projections), and the projections themselves.

What they learn, an affine map per feature and for Nystroem one B x B projection per measure, is
what a model stores; :func:`service.model.features.normalize_features` applies it, in training
and in serving alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import scipy.linalg

from service.model.features import NORMALIZATIONS, SPECTRUM_FIXES
from training.estimator.block_statistics import BlockStatistics, Learned, learn_in_one_block

# Eigenvalues below this fraction of the largest magnitude count as zero: they are rounding
# noise of a PSD matrix, and inverting them would blow noise up into features.
EIGENVALUE_RELATIVE_TOLERANCE = 1e-10


class FeatureNormalization(BlockStatistics):
    """How one normalisation is learned from the training set's raw kernel maps: the sums of
    its passes over blocks of rows (:class:`~training.estimator.block_statistics.
    BlockStatistics`; one process is one block, a cluster's blocks are its workers' rows), then
    the affine map and projection a model stores (:meth:`statistics`).

    Parameters
    ----------
    n_measures : int
        M: the maps hold M blocks of columns, one per measure.
    kernels : sequence of bool, optional
        Which measures are positive definite (none if not given): what a rule may compute
        differently for kernels (:class:`_Nystroem`'s ``clip`` map).
    """

    def __init__(self, n_measures: int, kernels: Sequence[bool] | None = None):
        self.n_measures = n_measures
        self.kernels = (False,) * n_measures if kernels is None else tuple(kernels)

    def sums(self, block, step, learned):
        raise AssertionError(f"{type(self).__name__} reads no rows")

    def finish(self, totals, step, learned, n_samples):
        raise AssertionError(f"{type(self).__name__} reads no rows")

    def decomposes(self, measure: int) -> bool:
        """Whether measure ``measure``'s statistics are made of the eigendecomposition of its
        basis Gram matrix (:func:`symmetric_eigenvalues`)."""
        return False

    def statistics(
        self,
        learned: Learned,
        n_features: int,
        basis_gram: np.ndarray | None,
        spectra: Sequence[tuple[np.ndarray, np.ndarray] | None] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The offset and scale of every feature and the projection (or None), from what the
        passes learned and the basis Gram matrices (with the :func:`symmetric_eigenvalues` of
        those that :meth:`decomposes`, ``spectra``, when computed already; None for the
        others)."""
        return np.zeros(n_features), np.ones(n_features), None

    def _measure_columns(self, n_features: int) -> list[slice]:
        n_basis = n_features // self.n_measures
        return [slice(m * n_basis, (m + 1) * n_basis) for m in range(self.n_measures)]


class _Centred(FeatureNormalization):
    """Normalisations that centre each feature on its training mean (pass 0) and divide by a
    spread that the second pass measures around it."""

    passes = 2

    def sums(self, block, step, learned):
        if step == 0:
            return (block.sum(axis=0),)
        mean = learned["mean"]
        # One measure's columns at a time: the centred copy is n x B, not n x M * B.
        spreads = [
            self._spread_sums(block[:, columns] - mean[columns])
            for columns in self._measure_columns(block.shape[1])
        ]
        return (np.concatenate(spreads),)

    def finish(self, totals, step, learned, n_samples):
        if step == 0:
            return {"mean": totals[0] / n_samples}
        return {**learned, "spread": totals[0] / n_samples}

    def _spread_sums(self, centred: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class _ZScore(_Centred):
    """Each feature divided by its standard deviation."""

    def _spread_sums(self, centred):
        return (centred * centred).sum(axis=0)

    def statistics(self, learned, n_features, basis_gram, spectra=None):
        std = np.sqrt(learned["spread"])
        return learned["mean"], np.where(std > 0, std, 1.0), None


class _BeSVM(_Centred):
    """The paper's (eq. 4): each measure's map divided by the mean norm of its centred rows."""

    def _spread_sums(self, centred):
        return np.array([np.linalg.norm(centred, axis=1).sum()])

    def statistics(self, learned, n_features, basis_gram, spectra=None):
        mean_norms = learned["spread"]
        n_basis = n_features // self.n_measures
        scale = np.repeat(np.where(mean_norms > 0.0, mean_norms, 1.0), n_basis)
        return learned["mean"], scale, None


class _Nystroem(FeatureNormalization):
    """Each measure's map projected by the inverse square root of its basis Gram matrix,
    made positive definite by ``fix`` (:func:`nystroem_projection`): from the basis alone.

    A kernel's (a positive definite measure's) ``clip`` map is the inverse of its Gram matrix's
    pivoted Cholesky factor (:func:`kernel_map_projection`), at a fraction of the eigenvector
    map's cost (``benchmarks/bench_kernel_map.py``): the same map up to a rotation where the
    Gram matrix is well conditioned or exactly singular.
    """

    def __init__(self, n_measures: int, fix: str, kernels: Sequence[bool] | None = None):
        super().__init__(n_measures, kernels)
        self.fix = fix

    def decomposes(self, measure):
        return not (self.fix == "clip" and self.kernels[measure])

    def statistics(self, learned, n_features, basis_gram, spectra=None):
        if basis_gram is None:
            raise ValueError("nystroem normalization needs the basis Gram matrices")
        if spectra is None:
            spectra = [None] * len(basis_gram)
        projection = np.stack(
            [
                nystroem_projection(gram, self.fix, spectrum)
                if self.decomposes(m)
                else kernel_map_projection(gram)
                for m, (gram, spectrum) in enumerate(zip(basis_gram, spectra, strict=True))
            ]
        )
        return np.zeros(n_features), np.ones(n_features), projection


# Every normalisation (the canonical names of service.model.features.NORMALIZATIONS) and how it
# is learned, for maps of M measures.
NORMALIZATION_RULES: dict[str, Callable[..., FeatureNormalization]] = {
    "besvm": _BeSVM,
    "none": FeatureNormalization,
    "zscore": _ZScore,
    **{f"nystroem({fix})": functools.partial(_Nystroem, fix=fix) for fix in SPECTRUM_FIXES},
}


def normalization_rule(
    normalization: str, n_measures: int, kernels: Sequence[bool] | None = None
) -> FeatureNormalization:
    """How ``normalization`` (canonical, see :func:`resolve_normalization`) is learned from
    the maps of ``n_measures`` measures.

    ``kernels`` says which measures are positive definite (:attr:`SimilarityKind.
    positive_definite`; none if not given): Nystroem's ``clip`` map of a kernel needs no
    eigendecomposition (:func:`kernel_map_projection`).

    Raises
    ------
    ValueError
        An unknown normalisation.
    """
    if normalization not in NORMALIZATION_RULES:
        raise ValueError(
            f"unknown normalization {normalization!r}; known: {', '.join(NORMALIZATIONS)}"
        )
    return NORMALIZATION_RULES[normalization](n_measures, kernels=kernels)


def normalization_statistics(
    raw: np.ndarray,
    n_measures: int,
    normalization: str,
    basis_gram: np.ndarray | None = None,
    spectra: Sequence[tuple[np.ndarray, np.ndarray] | None] | None = None,
    kernels: Sequence[bool] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The normalisation learned from the training set's raw kernel maps, in one process (one
    block: every row); a cluster learns the same rule from its workers' rows
    (:mod:`training.estimator.cluster_fit`).

    Parameters
    ----------
    raw : ndarray of shape (n_samples, M * n_basis)
    n_measures : int
    normalization : str
        One of :data:`NORMALIZATION_RULES` (canonical form, see :func:`parse_normalization`).
    basis_gram : ndarray of shape (M, n_basis, n_basis), optional
        Each measure between the basis items; required by Nystroem.
    spectra : sequence of (eigenvalues, eigenvectors) or None, optional
        Each measure's :func:`symmetric_eigenvalues` of ``basis_gram``, when computed already
        (Nystroem then decomposes nothing again); None for a measure not decomposed.
    kernels : sequence of bool, optional
        Which measures are positive definite (see :func:`normalization_rule`).

    Returns
    -------
    offset, scale : ndarray of shape (M * n_basis,)
    projection : ndarray of shape (M, n_basis, n_basis) or None
    """
    rule = normalization_rule(normalization, n_measures, kernels)
    return rule.statistics(learn_in_one_block(rule, raw), raw.shape[1], basis_gram, spectra)


def symmetric_eigenvalues(gram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition of the symmetrised matrix ``(K + K^T) / 2``.

    Returns
    -------
    eigenvalues : ndarray of shape (n,), ascending
    eigenvectors : ndarray of shape (n, n), one per column
    """
    return np.linalg.eigh((gram + gram.T) / 2.0)


def eigenvalue_tolerance(eigenvalues: np.ndarray) -> float:
    """Magnitude below which an eigenvalue counts as zero (rounding noise)."""
    return EIGENVALUE_RELATIVE_TOLERANCE * max(float(np.abs(eigenvalues).max()), 1e-300)


def nystroem_projection(
    gram: np.ndarray | None,
    spectrum_fix: str,
    spectrum: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    r"""The Nystroem map :math:`K^{-1/2}` of a possibly indefinite basis Gram matrix, up to a
    rotation, in its rank's columns.

    With :math:`K = V \Lambda V^T` (symmetrised), the projection is :math:`V_r f(\Lambda_r)`
    in its first r columns (zero in the others), :math:`V_r, \Lambda_r` the eigenpairs kept:
    :math:`f(\lambda) = \lambda^{-1/2}` on the positive eigenvalues only (``clip``),
    :math:`|\lambda|^{-1/2}` (``flip``) or :math:`|\lambda|^{-1}` (``square``, the inverse
    square root of :math:`K^T K`). Eigenvalues within rounding of zero are dropped.

    That is :math:`V f(\Lambda) V^T` rotated by :math:`V_r`: the features
    :math:`k(x)^T P` have the same inner products,
    :math:`P P^T = V_r f(\Lambda_r)^2 V_r^T`, which is all an L2-regularised linear model
    sees, and their last B - r columns are zero on every item, which the solver leaves out
    (:func:`training.estimator.solver.training_design`): a ``linear`` measure of d input
    numbers on a basis of B > d items trains on at most d columns, not B.

    Parameters
    ----------
    gram : ndarray of shape (n_basis, n_basis), or None with ``spectrum``
    spectrum_fix : {"clip", "flip", "square"}
    spectrum : (eigenvalues, eigenvectors), optional
        :func:`symmetric_eigenvalues` of ``gram``, if computed already.

    Returns
    -------
    ndarray of shape (n_basis, n_basis)
    """
    eigenvalues, vectors = symmetric_eigenvalues(gram) if spectrum is None else spectrum
    tolerance = eigenvalue_tolerance(eigenvalues)
    magnitude = np.abs(eigenvalues)
    if spectrum_fix == "clip":
        keep = eigenvalues > tolerance
    elif spectrum_fix in ("flip", "square"):
        keep = magnitude > tolerance
    else:
        raise ValueError(f"spectrum fix must be one of {SPECTRUM_FIXES}, got {spectrum_fix!r}")
    power = 1.0 if spectrum_fix == "square" else 0.5
    projection = np.zeros_like(vectors)
    rank = int(keep.sum())
    projection[:, :rank] = vectors[:, keep] * magnitude[keep] ** -power
    return projection


def kernel_map_projection(gram: np.ndarray) -> np.ndarray:
    r"""The Nystroem map of a positive semi-definite basis Gram matrix, from its pivoted
    Cholesky factor: ``clip``'s map up to a rotation, without an eigendecomposition.

    With the pivoted factorisation :math:`\Pi^T K \Pi = L L^T` stopped at rank r (the pivots
    left below rounding of zero), the projection is

    .. math:: P = \Pi_{:, 1..r} L_{11}^{-T}, \qquad
              P^T k(x) = L_{11}^{-1} k_S(x),

    the Nystroem map on the r pivot items S. Where K is well conditioned, or exactly singular (a
    basis item repeated, a linear kernel on more items than its rank), its features have the
    inner products :math:`k(x)^T K^{+} k(y)` of :func:`nystroem_projection`'s
    :math:`K^{-1/2}`: the two differ by a rotation, which an L2-regularised linear model does
    not see. Where K is nearly singular (an rbf basis of thousands of items), each map drops
    its own near-null directions (pivots here, eigenvalues there, below rounding of zero), so
    the two are different rank-r Nystroem approximations of the kernel; on a new item the
    features' inner products can differ by percents, and test accuracies were the same
    (docs/measurements/model-selection.md, "The kernel's map from a Cholesky factor"). It
    costs :math:`B^3 / 3` floating point operations twice, against an eigendecomposition's
    several times :math:`B^3`, and holds two B x B matrices beside ``gram``.

    Parameters
    ----------
    gram : ndarray of shape (n_basis, n_basis)
        Symmetrised before it is factored; a kernel's, positive semi-definite up to rounding.

    Returns
    -------
    ndarray of shape (n_basis, n_basis)
        Rows of the pivots, columns 1..r; zero elsewhere.
    """
    # Symmetric, so its transpose is the Fortran-ordered array LAPACK factors in place.
    symmetric = ((gram + gram.T) / 2.0).T
    # The pivots fall with the eigenvalues they stand for; the trace bounds the largest.
    tolerance = EIGENVALUE_RELATIVE_TOLERANCE * max(float(np.trace(symmetric)), 1e-300)
    factor, pivots, rank, info = scipy.linalg.lapack.dpstrf(
        symmetric, tol=tolerance, lower=1, overwrite_a=1
    )
    if info < 0:
        raise np.linalg.LinAlgError(f"the pivoted Cholesky factorisation failed (info {info})")
    del symmetric
    projection = np.zeros(factor.shape, dtype=factor.dtype)
    if rank == 0:  # a measure that is zero on the basis: no features, as nystroem_projection
        return projection
    inverse, info = scipy.linalg.lapack.dtrtri(factor[:rank, :rank], lower=1, overwrite_c=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"the Cholesky factor's inverse failed (LAPACK info {info})")
    del factor
    # LAPACK writes the lower triangles only; the upper ones keep what the input held there.
    for column in range(1, rank):
        inverse[:column, column] = 0.0
    projection[pivots[:rank] - 1, :rank] = inverse.T
    return projection
