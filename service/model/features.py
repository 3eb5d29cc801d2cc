r"""The Basis Expanding feature map (BE-SVM paper, eq. 3 and 4).

For M similarity measures on one shared basis :math:`b_1 \dots b_B`, the empirical kernel map of
measure m is :math:`\tilde\varphi_m(x) = [s_m(b_1, x) \dots s_m(b_B, x)]`, normalised with
statistics of the training set

.. math:: \varphi_m(x) = \frac{\tilde\varphi_m(x) - E[\tilde\varphi_m]}
                              {E\lVert \tilde\varphi_m - E[\tilde\varphi_m] \rVert_2}

and concatenated: :math:`\varphi(x) = [\varphi_1(x) \dots \varphi_M(x)]`, M*B features.

Alternatives kept for comparison: ``none``; ``zscore`` (each feature centred and divided by its
standard deviation); ``nystroem(clip|flip|square)``, the Nystroem embedding
:math:`K_{BB}^{-1/2}\tilde\varphi_m(x)` with the symmetrised basis Gram matrix made positive
definite by clipping its negative eigenvalues, flipping their sign, or squaring the matrix
(:math:`(K^T K)^{-1/2}`); a kernel's ``clip`` map is learned from a pivoted Cholesky factor,
another B x B matrix with the same use here.

Every normalisation is stored as an affine map per feature, ``(raw - offset) / scale``, followed
for Nystroem by one B x B projection per measure, so that :func:`expand` is the one function both
training (:class:`training.estimator.expansion.BasisExpansion`, which learns the normalisation)
and serving compute features with, and :func:`normalize_features` the one normalisation of maps
computed already.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.model.errors import SpecError
from service.model.inputs.words import Documents
from service.model.notation import bind_arguments, parse_call
from service.model.similarity import BoundSimilarity, SimilaritySpec

SPECTRUM_FIXES = ("clip", "flip", "square")
NORMALIZATIONS = ("besvm", "none", "zscore", *(f"nystroem({fix})" for fix in SPECTRUM_FIXES))


# What ``auto`` picks: the digits report's winner for kernels, and the paper's normalisation,
# which needs no positive definite basis matrix, as soon as one measure is indefinite.
AUTO_NORMALIZATION_KERNELS = "nystroem(square)"
AUTO_NORMALIZATION_INDEFINITE = "besvm"


def resolve_normalization(text: str, specs: Sequence[SimilaritySpec]) -> str:
    """The canonical normalisation, with ``auto`` decided by the measures.

    ``auto`` is ``nystroem(square)`` when every measure is a positive definite kernel
    (``linear``, ``rbf``) and ``besvm`` as soon as one is indefinite (``rigid``, ``deformable``).

    Raises
    ------
    SpecError
    """
    if text.strip().lower() != "auto":
        return parse_normalization(text)
    if all(spec.kind.positive_definite for spec in specs):
        return AUTO_NORMALIZATION_KERNELS
    return AUTO_NORMALIZATION_INDEFINITE


def parse_normalization(text: str) -> str:
    """The canonical name of a normalisation: ``nystroem`` and ``nystroem(spectrum=clip)`` are
    both ``nystroem(clip)``.

    Raises
    ------
    SpecError
    """
    name, arguments = parse_call(text, "normalization")
    if name == "nystroem":
        spectrum = bind_arguments(name, arguments, ["spectrum"], text).get("spectrum", "clip")
        if spectrum.lower() not in SPECTRUM_FIXES:
            raise SpecError(
                f"nystroem: spectrum must be one of {', '.join(SPECTRUM_FIXES)}, got {spectrum!r}"
            )
        return f"nystroem({spectrum.lower()})"
    if name not in NORMALIZATIONS or arguments is not None:
        raise SpecError(f"unknown normalization {text!r}; known: {', '.join(NORMALIZATIONS)}")
    return name


def raw_similarities(
    X: np.ndarray | Documents,
    basis: np.ndarray | Documents,
    measures: Sequence[BoundSimilarity],
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Empirical kernel maps of every measure, side by side.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features), float64, C-contiguous, or Documents
    basis : ndarray of shape (n_basis, n_features), float64, C-contiguous, or Documents
    measures : sequence of BoundSimilarity, length M
        Bound to items like ``X`` and ``basis`` (see :func:`bind_similarities`).
    out : ndarray of shape (n_samples, M * n_basis), optional

    Returns
    -------
    out : ndarray of shape (n_samples, M * n_basis)
        Columns ``m * n_basis : (m + 1) * n_basis`` hold measure m.
    """
    n_basis = basis.shape[0]
    if out is None:
        out = np.empty((X.shape[0], len(measures) * n_basis), dtype=np.float64)
    for m, measure in enumerate(measures):
        measure.compute(basis, X, out[:, m * n_basis : (m + 1) * n_basis])
    return out


def expand(
    X: np.ndarray | Documents,
    basis: np.ndarray | Documents,
    measures: Sequence[BoundSimilarity],
    offset: np.ndarray,
    scale: np.ndarray,
    out: np.ndarray | None = None,
    *,
    projection: np.ndarray | None = None,
) -> np.ndarray:
    """Normalised basis-expanded features: the one feature function of training and serving.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features), float64, C-contiguous, or Documents
        Inputs, already normalised (dense ones).
    basis : ndarray of shape (n_basis, n_features), or Documents
    measures : sequence of BoundSimilarity, length M
        Bound to items like ``X`` and ``basis`` (see :func:`bind_similarities`).
    offset, scale : ndarray of shape (M * n_basis,)
    out : ndarray of shape (n_samples, M * n_basis), optional
    projection : ndarray of shape (M, n_basis, n_basis), optional
        Applied to each measure's block after the affine map (Nystroem).

    Returns
    -------
    features : ndarray of shape (n_samples, M * n_basis)
    """
    return normalize_features(raw_similarities(X, basis, measures, out), offset, scale, projection)


def normalize_features(
    raw: np.ndarray,
    offset: np.ndarray,
    scale: np.ndarray,
    projection: np.ndarray | None = None,
) -> np.ndarray:
    """Raw kernel maps normalised in place: ``(raw - offset) / scale``, then each measure's
    block times its projection (Nystroem); the normalisation :func:`expand` applies, for maps
    computed already (training's, over the whole training set or a cluster's rows).

    Parameters
    ----------
    raw : ndarray of shape (n_samples, M * n_basis)
    offset, scale : ndarray of shape (M * n_basis,)
    projection : ndarray of shape (M, n_basis, n_basis), optional

    Returns
    -------
    raw : ndarray of shape (n_samples, M * n_basis)
        The same array, normalised.
    """
    raw -= offset
    raw /= scale
    if projection is not None:
        project_blocks(raw, projection)
    return raw


def project_blocks(features: np.ndarray, projection: np.ndarray) -> None:
    """Multiply each measure's block of ``features`` by its projection, in place.

    A projection's columns past its last one that is not zero (a Nystroem map of rank r < B
    keeps its r columns first) give zeros, written without the product.

    Parameters
    ----------
    features : ndarray of shape (n_samples, M * n_basis)
    projection : ndarray of shape (M, n_basis, n_basis)
    """
    n_basis = projection.shape[1]
    for m, block_projection in enumerate(projection):
        block = features[:, m * n_basis : (m + 1) * n_basis]
        rank = n_basis
        while rank and not block_projection[:, rank - 1].any():  # older maps: one column read
            rank -= 1
        block[:, :rank] = block @ block_projection[:, :rank]
        block[:, rank:] = 0.0
