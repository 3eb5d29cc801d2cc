r"""The squared-hinge solver's generalised Hessian on the active items only, compiled with numba.

The generalised Hessian of one-vs-rest problem k at its weights is :math:`2C X_{A_k}^\top
X_{A_k}` (with a column of ones for the bias), :math:`A_k` the items with positive slack. Near
the optimum :math:`A_k` is a small part of the items (about a tenth on 26 classes), different
for each class, so that the union of the classes' sets is nearly every item: a matrix product
over all items for all classes at once does ten times the work it needs. These kernels read each
item's row once and, for each problem it is active in, take its dot product with that problem's
vector and add the row back, scaled, into that problem's output: the work of the active items
only, with no copy of their rows (liblinear reads only the active items too, one class at a time).

Kernels are serial and release the GIL (``nogil``): the solver runs groups of classes in threads
(:func:`training.estimator.solver.fit_one_vs_rest`), a Dask worker runs one shard in each of its
threads. Accumulators are float64; everything compiles with ``cache=True``.
"""

import numba

from service.model.threads import FASTMATH


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def dense_row_dot(row, v):
    r"""The score of one item under one problem's weights and bias.

    .. math:: s = \sum_l x_l v_l + v_d

    Parameters
    ----------
    row : ndarray of shape (d,)
    v : ndarray of shape (d + 1,)
        Weights, then the bias.

    Returns
    -------
    float
    """
    acc = v[row.shape[0]]
    for c in range(row.shape[0]):
        acc += row[c] * v[c]
    return acc


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def dense_row_add(row, scale, out):
    r"""Add one item's row (and its bias input, 1), scaled, to one problem's output.

    .. math:: o_l \mathrel{+}= t x_l, \quad o_d \mathrel{+}= t

    Parameters
    ----------
    row : ndarray of shape (d,)
    scale : float
    out : ndarray of shape (d + 1,)
    """
    for c in range(row.shape[0]):
        out[c] += scale * row[c]
    out[row.shape[0]] += scale


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def dense_active_product(X, active, V, out):
    r"""Each problem's :math:`X_{A_k}^\top X_{A_k} v_k` (with the bias), added into ``out``.

    Parameters
    ----------
    X : ndarray of shape (n_samples, d)
    active : ndarray of shape (n_samples, k), bool
        Whether each item has positive slack in each problem.
    V : ndarray of shape (k, d + 1)
        One vector per problem (row-major, unlike the solver's column blocks).
    out : ndarray of shape (k, d + 1)
    """
    for i in range(X.shape[0]):
        row = X[i]
        for j in range(V.shape[0]):
            if active[i, j]:
                dense_row_add(row, dense_row_dot(row, V[j]), out[j])


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def sparse_row_dot(data, indices, v):
    r"""The score of one sparse item (its stored values and their columns) under one problem.

    .. math:: s = \sum_{l \in \mathrm{nz}(x)} x_l v_l + v_d

    Parameters
    ----------
    data : ndarray of shape (nnz,)
    indices : ndarray of shape (nnz,), int
    v : ndarray of shape (d + 1,)

    Returns
    -------
    float
    """
    acc = v[v.shape[0] - 1]
    for p in range(data.shape[0]):
        acc += data[p] * v[indices[p]]
    return acc


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def sparse_active_product(data, indices, indptr, active, V, out):
    r""":func:`dense_active_product` on a CSR matrix (``data``, ``indices``, ``indptr``).

    Parameters
    ----------
    data, indices, indptr : ndarray
        The matrix's CSR arrays, of n_samples rows.
    active : ndarray of shape (n_samples, k), bool
    V : ndarray of shape (k, d + 1)
    out : ndarray of shape (k, d + 1)
    """
    bias = V.shape[1] - 1
    for i in range(indptr.shape[0] - 1):
        start, stop = indptr[i], indptr[i + 1]
        values, columns = data[start:stop], indices[start:stop]
        for j in range(V.shape[0]):
            if active[i, j]:
                scale = sparse_row_dot(values, columns, V[j])
                o = out[j]
                for p in range(values.shape[0]):
                    o[columns[p]] += scale * values[p]
                o[bias] += scale
