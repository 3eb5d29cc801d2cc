r"""The linear layer of a few inputs compiled with numba: their similarities times the folded
weights, plus the intercepts; and an explanation's contributions of the basis items.

For a batch of one, numpy's product and sum cost a request more than their arithmetic: a
measured 12 µs of a one-digit request's model in the server (its dispatch, BLAS's entry and the
addition, each run cold between requests) against under 2 µs here. Larger batches go to BLAS
(:class:`service.model.predictor.Predictor` picks by
:data:`service.model.threads.SCORES_BLAS_MIN_SAMPLES` and
:data:`~service.model.threads.SCORES_BLAS_MIN_MULTIPLY_ADDS`).
"""

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def affine_rows(S, W, b, out):
    r"""Fill ``out`` with ``S @ W + b``, row by row, on the calling thread.

    .. math:: o_{ik} = b_k + \sum_j s_{ij} W_{jk}

    Parameters
    ----------
    S : ndarray of shape (n_samples, n_columns)
    W : ndarray of shape (n_columns, n_classes)
    b : ndarray of shape (n_classes,)
    out : ndarray of shape (n_samples, n_classes), float64
        Written in place (the float64 accumulators). Nothing is returned: an array returned
        from compiled code is boxed again on every call (half of this call's cost for one
        digit).
    """
    n_classes = W.shape[1]
    for i in range(S.shape[0]):
        for k in range(n_classes):
            out[i, k] = b[k]
        for j in range(S.shape[1]):
            s = S[i, j]
            for k in range(n_classes):
                out[i, k] += s * W[j, k]


@numba.njit(cache=True, nogil=True)
def top_contributions(raw, offset, W, column, n_measures, indices, values, measures):
    r"""Each basis item's contribution to the score of class ``column``, summed over the
    measures, and the ``k = len(indices)`` largest, largest first (ties: the lower index);
    returns the sum over every item.

    .. math:: c_j = \sum_m (\tilde\varphi_{mj} - o_{mj}) W_{mj,c}

    Parameters
    ----------
    raw, offset : ndarray of shape (n_measures * n_basis,)
        One input's raw similarities of every measure, and the normalisation's offsets.
    W : ndarray of shape (n_measures * n_basis, n_classes)
        The weights folded through the normalisation.
    column : int
    n_measures : int
    indices : ndarray of shape (k,), int64
        Written: the items, largest contribution first.
    values : ndarray of shape (k,), float64
        Written: their contributions.
    measures : ndarray of shape (k, n_measures), float64
        Written: their contributions measure by measure.
    """
    n_basis = raw.shape[0] // n_measures
    totals = np.empty(n_basis)
    total = 0.0
    for j in range(n_basis):
        t = 0.0
        for m in range(n_measures):
            f = m * n_basis + j
            t += (raw[f] - offset[f]) * W[f, column]
        totals[j] = t
        total += t
    order = np.argsort(-totals, kind="mergesort")
    for i in range(indices.shape[0]):
        j = order[i]
        indices[i] = j
        values[i] = totals[j]
        for m in range(n_measures):
            f = m * n_basis + j
            measures[i, m] = (raw[f] - offset[f]) * W[f, column]
    return total
