r"""The linear layer of a few inputs compiled with numba: their similarities times the folded
weights, plus the intercepts; and an explanation's contributions of the basis items.

For a batch of one, numpy's product and sum cost a request more than their arithmetic (its
dispatch, BLAS's entry and the addition, each run cold between requests), several times what
this loop costs (docs/measurements/benchmarks-operations.md, "The model's product"). Larger
batches go to BLAS
(:class:`service.model.predictor.Predictor` picks by
:data:`service.model.threads.SCORES_BLAS_MIN_SAMPLES` and
:data:`~service.model.threads.SCORES_BLAS_MIN_MULTIPLY_ADDS`).
"""

import numba
import numpy as np

# top_contributions selects the k largest item by item (k passes over the basis) up to this
# share of the basis (k * SELECTION_MAX_SHARE <= B), and sorts them all beyond it.
SELECTION_MAX_SHARE = 8


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
def top_contributions(raw, offset, W, columns, n_measures, indices, values, measures, totals):
    r"""For each input i, each basis item's contribution to the score of class ``columns[i]``,
    summed over the measures, and the ``k`` largest, largest first (ties: the lower index).

    .. math:: c_{ij} = \sum_m (\tilde\varphi_{i,mj} - o_{mj}) W_{mj,c_i}

    Parameters
    ----------
    raw : ndarray of shape (n, n_measures * n_basis)
        The inputs' raw similarities of every measure.
    offset : ndarray of shape (n_measures * n_basis,)
        The normalisation's offsets.
    W : ndarray of shape (n_measures * n_basis, n_classes)
        The weights folded through the normalisation.
    columns : ndarray of shape (n,), int64
        The class explained for each input.
    n_measures : int
    indices : ndarray of shape (n, k), int64
        Written: each input's items, largest contribution first.
    values : ndarray of shape (n, k), float64
        Written: their contributions.
    measures : ndarray of shape (n, k, n_measures), float64
        Written: their contributions measure by measure.
    totals : ndarray of shape (n,), float64
        Written: each input's contributions of every item, summed.
    """
    n_basis = raw.shape[1] // n_measures
    k = indices.shape[1]
    item_totals = np.empty(n_basis)
    order = np.empty(n_basis, dtype=np.int64)
    taken = np.zeros(n_basis, dtype=np.bool_)
    for i in range(raw.shape[0]):
        column = columns[i]
        total = 0.0
        for j in range(n_basis):
            t = 0.0
            for m in range(n_measures):
                f = m * n_basis + j
                t += (raw[i, f] - offset[f]) * W[f, column]
            item_totals[j] = t
            total += t
        totals[i] = total
        if k * SELECTION_MAX_SHARE <= n_basis:
            # A few of many: k passes of selection cost less than sorting them all.
            taken[:] = False
            for r in range(k):
                best = -1
                for j in range(n_basis):
                    if not taken[j] and (best < 0 or item_totals[j] > item_totals[best]):
                        best = j
                taken[best] = True
                order[r] = best
        else:
            order[:] = np.argsort(-item_totals, kind="mergesort")
        for r in range(k):
            j = order[r]
            indices[i, r] = j
            values[i, r] = item_totals[j]
            for m in range(n_measures):
                f = m * n_basis + j
                measures[i, r, m] = (raw[i, f] - offset[f]) * W[f, column]
