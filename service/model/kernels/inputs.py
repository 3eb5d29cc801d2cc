r"""The dense inputs' checks and normalisation compiled with numba: whether a batch is finite,
and each input centred, scaled and measured (how far it lies from the training data) in one
pass.

Written out once per row (no numpy temporaries): a one-digit request paid more for the
array calls of ``(x - mean) / scale`` and of its norm (five of them, each a dispatch and an
allocation, and a floating-point error context around them) than for the arithmetic. No
``fastmath``: the items are the ones numpy's ``subtract`` and ``divide`` give, to the bit.
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def all_finite(X):
    """Whether every value of ``X`` is finite (no NaN, no infinity).

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)

    Returns
    -------
    bool
    """
    for i in range(X.shape[0]):
        for j in range(X.shape[1]):
            if not np.isfinite(X[i, j]):
                return False
    return True


@numba.njit(cache=True, nogil=True)
def normalize_row(x, mean, scale, out_row):
    r"""Centre and scale one input, and return the norm of the result.

    .. math:: \hat x_j = \frac{x_j - \mu_j}{s_j}, \qquad
              \lVert \hat x \rVert_2 = \Bigl(\sum_j \hat x_j^2\Bigr)^{1/2}

    Parameters
    ----------
    x, mean, scale : ndarray of shape (n_features,)
    out_row : ndarray of shape (n_features,)
        Written in place.

    Returns
    -------
    float
        NaN or infinity where ``x`` holds them, or values too large to centre.
    """
    acc = 0.0
    for j in range(x.shape[0]):
        value = (x[j] - mean[j]) / scale[j]
        out_row[j] = value
        acc += value * value
    return np.sqrt(acc)


@numba.njit(cache=True, nogil=True)
def normalize_rows(X, mean, scale, out, norms):
    """Fill ``out[i] = (X[i] - mean) / scale`` and ``norms[i]`` its norm, on the calling thread
    (the work is a few operations per value: a parallel region would cost more).

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    mean, scale : ndarray of shape (n_features,)
    out : ndarray of shape (n_samples, n_features)
    norms : ndarray of shape (n_samples,)
        Both written in place.

    Returns
    -------
    float
        The largest norm; NaN if any is NaN (as ``norms.max()``).
    """
    largest = 0.0
    for i in range(X.shape[0]):
        norm = normalize_row(X[i], mean, scale, out[i])
        norms[i] = norm
        if largest == largest and not norm <= largest:  # NaN, once seen, stays
            largest = norm
    return largest
