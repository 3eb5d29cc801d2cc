r"""Similarity kernels compiled with numba.

Each measure is a small pure serial kernel on one pair ``(b, x)`` of flattened items and one on
a row (one input against the whole basis), with two drivers beside them that fill a preallocated
``(n_samples, n_basis)`` output: a parallel one over rows, and a serial one for small batches,
where starting a parallel region costs more than the work (and stalls behind a busy core).
Accumulators are float64. Everything is compiled with ``cache=True`` so a server starting on a
warm cache does not recompile.

Callers go through :meth:`service.model.similarity.BoundSimilarity.compute`, which picks the
driver (:meth:`~service.model.similarity.BoundSimilarity.driver_for`: serial, BLAS or parallel,
by the size of the call) and serialises the parallel ones (numba's ``workqueue`` threading layer
must not be entered from two threads at once).
"""

import numba
import numpy as np

from service.model.kernels import Drivers, row_drivers
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


linear_similarities, linear_similarities_serial = row_drivers(
    linear_similarities, fastmath=FASTMATH
)


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


rbf_similarities, rbf_similarities_serial = row_drivers(rbf_similarities, fastmath=FASTMATH)


# -- drivers through BLAS, for batches on one thread -------------------------------------------
#
# A batch of inputs against the basis is a matrix product: ``X @ basis.T`` for linear, and for
# rbf the squared distances ``|x|^2 + |b|^2 - 2 x . b`` from it. BLAS's blocked product reuses
# each loaded value across many pairs, where the pair kernels above load both items per pair, and
# numpy's exp is vectorised, where numba's calls libm once per value: on one core, rbf for a
# batch takes this way less than half the time of rbf_similarities_serial
# (benchmarks/bench_classify.py; docs/measurements/benchmarks.md#prediction-and-kernels-make-bench).


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def rbf_exponent_from_products(products, x_norms, b_norms, gamma):
    r"""Turn inner products into rbf exponents, in place.

    .. math:: e_{ij} = -\gamma \max\left(0, \lVert x_i\rVert^2 + \lVert b_j\rVert^2
                                              - 2 \langle x_i, b_j\rangle\right)

    The clip at zero undoes rounding: a distance computed from norms can come out slightly
    negative for nearly equal items.

    Parameters
    ----------
    products : ndarray of shape (n_samples, n_basis)
        ``X @ basis.T`` on entry, the exponents on exit.
    x_norms : ndarray of shape (n_samples,)
        Squared norms of the inputs.
    b_norms : ndarray of shape (n_basis,)
        Squared norms of the basis items.
    gamma : float
    """
    for i in range(products.shape[0]):
        for j in range(products.shape[1]):
            distance = x_norms[i] + b_norms[j] - 2.0 * products[i, j]
            products[i, j] = -gamma * max(distance, 0.0)


def linear_similarities_blas(basis, X, out):
    """:func:`linear_similarities` as one BLAS matrix product, on the calling thread's BLAS.

    Parameters
    ----------
    basis : ndarray of shape (n_basis, n_features)
    X : ndarray of shape (n_samples, n_features)
    out : ndarray of shape (n_samples, n_basis)
        Written in place.
    """
    np.matmul(X, basis.T, out=out)


def rbf_similarities_blas(basis, X, gamma, out):
    r""":func:`rbf_similarities` through one BLAS matrix product and numpy's vectorised exp.

    .. math:: s(b, x) = \exp\left(-\gamma \max(0, \lVert x\rVert^2 + \lVert b\rVert^2
                                            - 2 \langle x, b\rangle)\right)

    Equal to :func:`rbf_similarities` up to the rounding of the norms (absolute error in the
    exponent of about :math:`\gamma \epsilon (\lVert x\rVert^2 + \lVert b\rVert^2)`, which for
    normalised inputs is a few ulps).

    Parameters
    ----------
    basis : ndarray of shape (n_basis, n_features)
    X : ndarray of shape (n_samples, n_features)
    gamma : float
    out : ndarray of shape (n_samples, n_basis)
        Written in place.
    """
    # A view (a measure's block of a wider feature matrix) is computed in a contiguous buffer,
    # so that the exponent kernel has one signature (a C-contiguous array) to compile and cache.
    target = out if out.flags.c_contiguous else np.empty(out.shape)
    np.matmul(X, basis.T, out=target)
    x_norms = np.einsum("ij,ij->i", X, X)
    b_norms = np.einsum("ij,ij->i", basis, basis)
    rbf_exponent_from_products(target, x_norms, b_norms, gamma)
    np.exp(target, out=target)
    if target is not out:
        out[...] = target


LINEAR = Drivers(linear_similarities_serial, linear_similarities, linear_similarities_blas)
RBF = Drivers(rbf_similarities_serial, rbf_similarities, rbf_similarities_blas)
