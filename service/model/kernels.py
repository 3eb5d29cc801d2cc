r"""Similarity kernels compiled with numba.

Each measure is a small pure serial kernel on one pair ``(b, x)`` of flattened items and one on
a row (one input against the whole basis), with two drivers beside them that fill a preallocated
``(n_samples, n_basis)`` output: a parallel one over rows, and a serial one for small batches,
where starting a parallel region costs more than the work (and stalls behind a busy core).
Accumulators are float64. Everything is compiled with ``cache=True`` so a server starting on a
warm cache does not recompile.

Callers go through :meth:`service.model.similarity.SimilaritySpec.compute`, which picks the
driver and serialises the parallel ones (numba's ``workqueue`` threading layer must not be
entered from two threads at once).
"""

import numba
import numpy as np

from service.model.threads import FASTMATH


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def linear_pair(b, x):
    r"""Inner product of one basis item and one input.

    .. math:: s(b, x) = \sum_i b_i x_i

    Parameters
    ----------
    b, x : ndarray of shape (n_features,)

    Returns
    -------
    float
    """
    acc = 0.0
    for i in range(b.shape[0]):
        acc += b[i] * x[i]
    return acc


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def squared_euclidean_pair(b, x):
    r"""Squared Euclidean distance of one basis item and one input.

    .. math:: d(b, x) = \sum_i (b_i - x_i)^2

    Parameters
    ----------
    b, x : ndarray of shape (n_features,)

    Returns
    -------
    float
    """
    acc = 0.0
    for i in range(b.shape[0]):
        diff = b[i] - x[i]
        acc += diff * diff
    return acc


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def rbf_pair(b, x, gamma):
    r"""Gaussian RBF similarity of one basis item and one input.

    .. math:: s(b, x) = \exp\left(-\gamma \sum_i (b_i - x_i)^2\right)

    Parameters
    ----------
    b, x : ndarray of shape (n_features,)
    gamma : float

    Returns
    -------
    float
    """
    return np.exp(-gamma * squared_euclidean_pair(b, x))


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def linear_row(basis, x, out_row):
    """Fill ``out_row[j] = linear_pair(basis[j], x)`` for one input."""
    for j in range(basis.shape[0]):
        out_row[j] = linear_pair(basis[j], x)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def rbf_row(basis, x, gamma, out_row):
    """Fill ``out_row[j] = rbf_pair(basis[j], x, gamma)`` for one input."""
    for j in range(basis.shape[0]):
        out_row[j] = rbf_pair(basis[j], x, gamma)


@numba.njit(parallel=True, cache=True, nogil=True, fastmath=FASTMATH)
def linear_similarities(basis, X, out):
    """Fill ``out[i, j] = linear_pair(basis[j], X[i])``, rows in parallel.

    Parameters
    ----------
    basis : ndarray of shape (n_basis, n_features)
    X : ndarray of shape (n_samples, n_features)
    out : ndarray of shape (n_samples, n_basis)
        Written in place.
    """
    for i in numba.prange(X.shape[0]):
        linear_row(basis, X[i], out[i])


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def linear_similarities_serial(basis, X, out):
    """:func:`linear_similarities` on the calling thread, for small batches."""
    for i in range(X.shape[0]):
        linear_row(basis, X[i], out[i])


@numba.njit(parallel=True, cache=True, nogil=True, fastmath=FASTMATH)
def rbf_similarities(basis, X, gamma, out):
    """Fill ``out[i, j] = rbf_pair(basis[j], X[i], gamma)``, rows in parallel.

    Parameters
    ----------
    basis : ndarray of shape (n_basis, n_features)
    X : ndarray of shape (n_samples, n_features)
    gamma : float
    out : ndarray of shape (n_samples, n_basis)
        Written in place.
    """
    for i in numba.prange(X.shape[0]):
        rbf_row(basis, X[i], gamma, out[i])


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def rbf_similarities_serial(basis, X, gamma, out):
    """:func:`rbf_similarities` on the calling thread, for small batches."""
    for i in range(X.shape[0]):
        rbf_row(basis, X[i], gamma, out[i])
