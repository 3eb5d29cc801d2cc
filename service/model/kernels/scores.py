r"""The linear layer of a few inputs compiled with numba: their similarities times the folded
weights, plus the intercepts.

For a batch of one, numpy's product and sum cost a request more than their arithmetic: a
measured 12 µs of a one-digit request's model in the server (its dispatch, BLAS's entry and the
addition, each run cold between requests) against under 2 µs here. Larger batches go to BLAS
(:class:`service.model.predictor.Predictor` picks by
:data:`service.model.threads.SCORES_BLAS_MIN_SAMPLES` and
:data:`~service.model.threads.SCORES_BLAS_MIN_MULTIPLY_ADDS`).
"""

import numba


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
