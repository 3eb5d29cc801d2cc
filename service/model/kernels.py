r"""Similarity kernels compiled with numba.

Each measure is a small pure serial kernel on one pair ``(b, x)`` of flattened items, with a
parallel driver beside it that fills a preallocated ``(n_samples, n_basis)`` output, one row per
input. Accumulators are float64 whatever the input dtype. Everything is compiled with
``cache=True`` so a server starting on a warm cache does not recompile.

The drivers are not safe to enter from several threads at once under numba's ``workqueue``
threading layer; callers go through :func:`service.model.similarity.compute_similarities`, which
serialises them.
"""

import numba
import numpy as np

# Let LLVM reorder the float64 sums so it can vectorise them (3-4x on the rbf driver here);
# no flag that assumes finite values: inputs are validated, but a kernel must not rely on it.
_FASTMATH = {"reassoc", "contract"}


@numba.njit(cache=True, nogil=True, fastmath=_FASTMATH)
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


@numba.njit(cache=True, nogil=True, fastmath=_FASTMATH)
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


@numba.njit(cache=True, nogil=True, fastmath=_FASTMATH)
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


@numba.njit(parallel=True, cache=True, nogil=True, fastmath=_FASTMATH)
def linear_similarities(basis, X, out):
    """Fill ``out[i, j] = linear_pair(basis[j], X[i])``.

    Parameters
    ----------
    basis : ndarray of shape (n_basis, n_features)
    X : ndarray of shape (n_samples, n_features)
    out : ndarray of shape (n_samples, n_basis)
        Written in place.
    """
    n_basis = basis.shape[0]
    for i in numba.prange(X.shape[0]):
        x = X[i]
        for j in range(n_basis):
            out[i, j] = linear_pair(basis[j], x)


@numba.njit(parallel=True, cache=True, nogil=True, fastmath=_FASTMATH)
def rbf_similarities(basis, X, gamma, out):
    """Fill ``out[i, j] = rbf_pair(basis[j], X[i], gamma)``.

    Parameters
    ----------
    basis : ndarray of shape (n_basis, n_features)
    X : ndarray of shape (n_samples, n_features)
    gamma : float
    out : ndarray of shape (n_samples, n_basis)
        Written in place.
    """
    n_basis = basis.shape[0]
    for i in numba.prange(X.shape[0]):
        x = X[i]
        for j in range(n_basis):
            out[i, j] = rbf_pair(basis[j], x, gamma)
