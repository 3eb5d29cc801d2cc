r"""Similarity kernels on sparse documents (bag-of-words counts), compiled with numba.

A batch of documents is CSR: ``indptr`` (n + 1), ``indices`` (word of each entry, no repeats
within a row) and ``values``. The basis is stored the other way round, as *postings*: for every
word, the basis items that hold it and their value (the basis matrix in CSC form). A row kernel
walks the input's words and, for each, the basis items sharing that word, so a pair costs only
its shared words: every measure here is a sum over shared words, where a word absent from either
document contributes exactly 0, plus a term of the two documents' totals.

Sensing kernels (sensing-aware kernel paper, eq. 7, in log form so that nothing overflows):

.. math:: \log K(b, x) = \sum_{w \in b \cap x} \left[\ln\Gamma(b_w + x_w + 1) - \ln\Gamma(b_w + 1)
          - \ln\Gamma(x_w + 1)\right] + \ln\Gamma(N_b + 1) + \ln\Gamma(N_x + 1)
          - \ln\Gamma(N_b + N_x + W)

The basis postings carry :math:`\ln\Gamma(b_w + 1)` precomputed, so a shared word costs one
log-Gamma. Same layout as :mod:`service.model.kernels.dense`: pure serial row kernels, a parallel
driver over input rows and a serial driver beside it, float64 accumulators.
"""

import math

import numba
import numpy as np

from service.model.kernels import row_drivers
from service.model.threads import FASTMATH


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def lgamma_overlap(b, x, lgamma_b1, lgamma_x1):
    r"""The contribution of one word both documents hold.

    .. math:: f(b_w, x_w) = \ln\Gamma(b_w + x_w + 1) - \ln\Gamma(b_w + 1) - \ln\Gamma(x_w + 1)

    Parameters
    ----------
    b, x : float
        The word's value in the basis item and in the input (> 0).
    lgamma_b1, lgamma_x1 : float
        :math:`\ln\Gamma(b_w + 1)` and :math:`\ln\Gamma(x_w + 1)`, computed once per entry by
        the callers (the basis's with its postings).

    Returns
    -------
    float
        :math:`\ln \binom{b_w + x_w}{b_w}` for integer counts, >= 0.
    """
    return math.lgamma(b + x + 1.0) - lgamma_b1 - lgamma_x1


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def add_lgamma_overlaps_row(
    post_indptr, post_items, post_values, post_lgamma1, x_indices, x_values, x_scale, out_row
):
    r"""Add :func:`lgamma_overlap` of every shared word to ``out_row``, for one input.

    .. math:: \text{out}_j \mathrel{+}= \sum_{w \in b_j \cap x} f(b_{jw}, s\,x_w)

    Parameters
    ----------
    post_indptr : ndarray of shape (W + 1,)
    post_items, post_values, post_lgamma1 : ndarray of shape (nnz_basis,)
        Basis postings: item, value and :math:`\ln\Gamma(\text{value} + 1)` of each entry.
    x_indices, x_values : ndarray of shape (nnz_x,)
        The input's words and values.
    x_scale : float
        Every input value is multiplied by this first (``n / N_x`` for sensing1, else 1).
    out_row : ndarray of shape (n_basis,)
    """
    for k in range(x_indices.shape[0]):
        word = x_indices[k]
        x = x_scale * x_values[k]
        lgamma_x1 = math.lgamma(x + 1.0)
        for p in range(post_indptr[word], post_indptr[word + 1]):
            out_row[post_items[p]] += lgamma_overlap(post_values[p], x, post_lgamma1[p], lgamma_x1)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def sensing0_row(
    post_indptr,
    post_items,
    post_values,
    post_lgamma1,
    basis_totals,
    basis_lgamma_totals1,
    x_indices,
    x_values,
    vocabulary_size,
    out_row,
):
    r"""Sensing 0 of one input against every basis item: :math:`\log K(b_j, x)`.

    .. math:: s(b, x) = \sum_{w \in b \cap x} f(b_w, x_w) + \ln\Gamma(N_b + 1)
              + \ln\Gamma(N_x + 1) - \ln\Gamma(N_b + N_x + W)

    Parameters
    ----------
    post_indptr, post_items, post_values, post_lgamma1
        Basis postings (see :func:`add_lgamma_overlaps_row`).
    basis_totals, basis_lgamma_totals1 : ndarray of shape (n_basis,)
        :math:`N_b`, the word total of each basis item, and :math:`\ln\Gamma(N_b + 1)`.
    x_indices, x_values : ndarray of shape (nnz_x,)
    vocabulary_size : int
        W.
    out_row : ndarray of shape (n_basis,)
    """
    total_x = 0.0
    for k in range(x_values.shape[0]):
        total_x += x_values[k]
    lgamma_total_x1 = math.lgamma(total_x + 1.0)
    for j in range(basis_totals.shape[0]):
        total_b = basis_totals[j]
        out_row[j] = (
            basis_lgamma_totals1[j]
            + lgamma_total_x1
            - math.lgamma(total_b + total_x + vocabulary_size)
        )
    add_lgamma_overlaps_row(
        post_indptr, post_items, post_values, post_lgamma1, x_indices, x_values, 1.0, out_row
    )


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def sensing1_row(
    post_indptr, post_items, post_values, post_lgamma1, x_indices, x_values, n, out_row
):
    r"""Sensing 1 of one input against every basis item, on word frequencies scaled by n.

    .. math:: s(b, x) = \sum_{w \in b \cap x} f(n \bar b_w, n \bar x_w),
              \quad \bar x = x / N_x

    The basis postings hold :math:`n \bar b_w` already. An empty input scores 0.

    Parameters
    ----------
    post_indptr, post_items, post_values, post_lgamma1
        Basis postings of the scaled frequencies.
    x_indices, x_values : ndarray of shape (nnz_x,)
        The input's counts.
    n : float
    out_row : ndarray of shape (n_basis,)
    """
    out_row[:] = 0.0
    total_x = 0.0
    for k in range(x_values.shape[0]):
        total_x += x_values[k]
    if total_x <= 0.0:
        return
    add_lgamma_overlaps_row(
        post_indptr,
        post_items,
        post_values,
        post_lgamma1,
        x_indices,
        x_values,
        n / total_x,
        out_row,
    )


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def dot_row(post_indptr, post_items, post_values, x_indices, x_values, out_row):
    r"""Inner products of one sparse input with every basis item.

    .. math:: s(b_j, x) = \sum_{w \in b_j \cap x} b_{jw} x_w

    Parameters
    ----------
    post_indptr, post_items, post_values
        Basis postings.
    x_indices, x_values : ndarray of shape (nnz_x,)
    out_row : ndarray of shape (n_basis,)
    """
    out_row[:] = 0.0
    for k in range(x_indices.shape[0]):
        word = x_indices[k]
        x = x_values[k]
        for p in range(post_indptr[word], post_indptr[word + 1]):
            out_row[post_items[p]] += post_values[p] * x


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def rbf_row(
    post_indptr, post_items, post_values, basis_sq_norms, x_indices, x_values, gamma, out_row
):
    r"""Gaussian RBF of one sparse input against every basis item, from inner products.

    .. math:: s(b, x) = \exp\left(-\gamma (\lVert b\rVert^2 + \lVert x\rVert^2
              - 2 b \cdot x)\right)

    Parameters
    ----------
    post_indptr, post_items, post_values
        Basis postings.
    basis_sq_norms : ndarray of shape (n_basis,)
    x_indices, x_values : ndarray of shape (nnz_x,)
    gamma : float
    out_row : ndarray of shape (n_basis,)
    """
    dot_row(post_indptr, post_items, post_values, x_indices, x_values, out_row)
    x_sq_norm = 0.0
    for k in range(x_values.shape[0]):
        x_sq_norm += x_values[k] * x_values[k]
    for j in range(out_row.shape[0]):
        distance = max(basis_sq_norms[j] + x_sq_norm - 2.0 * out_row[j], 0.0)
        out_row[j] = np.exp(-gamma * distance)


# -- drivers: out[i, :] for every row i of a CSR batch ------------------------------------------


def sensing0_similarities(
    post_indptr, post_items, post_values, post_lgamma1, basis_totals, basis_lgamma_totals1,
    X_indptr, X_indices, X_values, vocabulary_size, out,
):  # fmt: skip
    """Fill ``out[i]`` with :func:`sensing0_row` of CSR row i, rows in parallel.

    Parameters
    ----------
    post_indptr, post_items, post_values, post_lgamma1, basis_totals, basis_lgamma_totals1
        The basis (see :func:`sensing0_row`).
    X_indptr, X_indices, X_values
        The inputs, CSR of shape (n_samples, W).
    vocabulary_size : int
    out : ndarray of shape (n_samples, n_basis)
        Written in place.
    """
    for i in numba.prange(X_indptr.shape[0] - 1):
        start, stop = X_indptr[i], X_indptr[i + 1]
        sensing0_row(
            post_indptr, post_items, post_values, post_lgamma1, basis_totals,
            basis_lgamma_totals1, X_indices[start:stop], X_values[start:stop], vocabulary_size,
            out[i],
        )  # fmt: skip


sensing0_similarities, sensing0_similarities_serial = row_drivers(
    sensing0_similarities, fastmath=FASTMATH
)


def sensing1_similarities(
    post_indptr, post_items, post_values, post_lgamma1, X_indptr, X_indices, X_values, n, out
):
    """Fill ``out[i]`` with :func:`sensing1_row` of CSR row i, rows in parallel."""
    for i in numba.prange(X_indptr.shape[0] - 1):
        start, stop = X_indptr[i], X_indptr[i + 1]
        sensing1_row(
            post_indptr, post_items, post_values, post_lgamma1,
            X_indices[start:stop], X_values[start:stop], n, out[i],
        )  # fmt: skip


sensing1_similarities, sensing1_similarities_serial = row_drivers(
    sensing1_similarities, fastmath=FASTMATH
)


def dot_similarities(post_indptr, post_items, post_values, X_indptr, X_indices, X_values, out):
    """Fill ``out[i]`` with :func:`dot_row` of CSR row i, rows in parallel."""
    for i in numba.prange(X_indptr.shape[0] - 1):
        start, stop = X_indptr[i], X_indptr[i + 1]
        dot_row(
            post_indptr, post_items, post_values, X_indices[start:stop], X_values[start:stop],
            out[i],
        )  # fmt: skip


dot_similarities, dot_similarities_serial = row_drivers(dot_similarities, fastmath=FASTMATH)


def rbf_similarities(
    post_indptr, post_items, post_values, basis_sq_norms, X_indptr, X_indices, X_values, gamma,
    out,
):  # fmt: skip
    """Fill ``out[i]`` with :func:`rbf_row` of CSR row i, rows in parallel."""
    for i in numba.prange(X_indptr.shape[0] - 1):
        start, stop = X_indptr[i], X_indptr[i + 1]
        rbf_row(
            post_indptr, post_items, post_values, basis_sq_norms,
            X_indices[start:stop], X_values[start:stop], gamma, out[i],
        )  # fmt: skip


rbf_similarities, rbf_similarities_serial = row_drivers(rbf_similarities, fastmath=FASTMATH)


# -- drivers on images as bags of visual words: a weighted sum over pyramid cells ------------------
#
# An image is ``n_cells`` documents (service.model.kernels.bof): CSR rows ``i * n_cells + c``. The
# basis postings run over ``n_cells * W`` columns, cell ``c``'s words at ``c * W + w``, so
# ``post_indptr[c * W : (c + 1) * W + 1]`` are cell c's postings; per-cell basis totals and norms
# are arrays of shape (n_cells, n_basis). Each measure is its row kernel per cell, weighted:
#
#     s(b, x) = sum_c  weight_c * kappa(b_c, x_c)


def sensing0_cell_similarities(
    post_indptr, post_items, post_values, post_lgamma1, cell_totals, cell_lgamma_totals1,
    X_indptr, X_indices, X_values, vocabulary_size, cell_weights, out,
):  # fmt: skip
    r"""Fill ``out[i]`` with the weighted sum over cells of :func:`sensing0_row`, images in
    parallel.

    .. math:: s(b, x) = \sum_c \alpha_c \log K(b_c, x_c)

    Parameters
    ----------
    post_indptr : ndarray of shape (n_cells * W + 1,)
    post_items, post_values, post_lgamma1 : ndarray of shape (nnz_basis,)
    cell_totals, cell_lgamma_totals1 : ndarray of shape (n_cells, n_basis)
        :math:`N_{b_c}` and :math:`\ln\Gamma(N_{b_c} + 1)` of every basis item's cells.
    X_indptr, X_indices, X_values
        The inputs' cells, CSR of shape (n_samples * n_cells, W).
    vocabulary_size : float
        W, the words of one cell.
    cell_weights : ndarray of shape (n_cells,)
        :math:`\alpha_c`.
    out : ndarray of shape (n_samples, n_basis)
        Written in place.
    """
    n_cells = cell_weights.shape[0]
    n_words = int(vocabulary_size)
    for i in numba.prange(out.shape[0]):
        scratch = np.empty(out.shape[1])
        out[i, :] = 0.0
        for c in range(n_cells):
            start, stop = X_indptr[i * n_cells + c], X_indptr[i * n_cells + c + 1]
            sensing0_row(
                post_indptr[c * n_words : (c + 1) * n_words + 1], post_items, post_values,
                post_lgamma1, cell_totals[c], cell_lgamma_totals1[c], X_indices[start:stop],
                X_values[start:stop], vocabulary_size, scratch,
            )  # fmt: skip
            weight = cell_weights[c]
            for j in range(scratch.shape[0]):
                out[i, j] += weight * scratch[j]


sensing0_cell_similarities, sensing0_cell_similarities_serial = row_drivers(
    sensing0_cell_similarities, fastmath=FASTMATH
)


def sensing1_cell_similarities(
    post_indptr, post_items, post_values, post_lgamma1, X_indptr, X_indices, X_values, n,
    vocabulary_size, cell_weights, out,
):  # fmt: skip
    r"""Fill ``out[i]`` with the weighted sum over cells of :func:`sensing1_row` (each cell's
    frequencies scaled by n), images in parallel.

    .. math:: s(b, x) = \sum_c \alpha_c \sum_{w \in b_c \cap x_c} f(n \bar b_{cw},
              n \bar x_{cw})
    """
    n_cells = cell_weights.shape[0]
    n_words = int(vocabulary_size)
    for i in numba.prange(out.shape[0]):
        scratch = np.empty(out.shape[1])
        out[i, :] = 0.0
        for c in range(n_cells):
            start, stop = X_indptr[i * n_cells + c], X_indptr[i * n_cells + c + 1]
            sensing1_row(
                post_indptr[c * n_words : (c + 1) * n_words + 1], post_items, post_values,
                post_lgamma1, X_indices[start:stop], X_values[start:stop], n, scratch,
            )  # fmt: skip
            weight = cell_weights[c]
            for j in range(scratch.shape[0]):
                out[i, j] += weight * scratch[j]


sensing1_cell_similarities, sensing1_cell_similarities_serial = row_drivers(
    sensing1_cell_similarities, fastmath=FASTMATH
)


def dot_cell_similarities(
    post_indptr, post_items, post_values, X_indptr, X_indices, X_values, vocabulary_size,
    cell_weights, out,
):  # fmt: skip
    r"""Fill ``out[i]`` with the weighted sum over cells of :func:`dot_row`, images in
    parallel.

    .. math:: s(b, x) = \sum_c \alpha_c \, b_c \cdot x_c
    """
    n_cells = cell_weights.shape[0]
    n_words = int(vocabulary_size)
    for i in numba.prange(out.shape[0]):
        scratch = np.empty(out.shape[1])
        out[i, :] = 0.0
        for c in range(n_cells):
            start, stop = X_indptr[i * n_cells + c], X_indptr[i * n_cells + c + 1]
            dot_row(
                post_indptr[c * n_words : (c + 1) * n_words + 1], post_items, post_values,
                X_indices[start:stop], X_values[start:stop], scratch,
            )  # fmt: skip
            weight = cell_weights[c]
            for j in range(scratch.shape[0]):
                out[i, j] += weight * scratch[j]


dot_cell_similarities, dot_cell_similarities_serial = row_drivers(
    dot_cell_similarities, fastmath=FASTMATH
)


def rbf_cell_similarities(
    post_indptr, post_items, post_values, cell_sq_norms, X_indptr, X_indices, X_values, gamma,
    vocabulary_size, cell_weights, out,
):  # fmt: skip
    r"""Fill ``out[i]`` with the weighted sum over cells of :func:`rbf_row`, images in
    parallel.

    .. math:: s(b, x) = \sum_c \alpha_c \exp(-\gamma \lVert b_c - x_c \rVert^2)

    ``cell_sq_norms`` : ndarray of shape (n_cells, n_basis), the basis cells' squared norms.
    """
    n_cells = cell_weights.shape[0]
    n_words = int(vocabulary_size)
    for i in numba.prange(out.shape[0]):
        scratch = np.empty(out.shape[1])
        out[i, :] = 0.0
        for c in range(n_cells):
            start, stop = X_indptr[i * n_cells + c], X_indptr[i * n_cells + c + 1]
            rbf_row(
                post_indptr[c * n_words : (c + 1) * n_words + 1], post_items, post_values,
                cell_sq_norms[c], X_indices[start:stop], X_values[start:stop], gamma, scratch,
            )  # fmt: skip
            weight = cell_weights[c]
            for j in range(scratch.shape[0]):
                out[i, j] += weight * scratch[j]


rbf_cell_similarities, rbf_cell_similarities_serial = row_drivers(
    rbf_cell_similarities, fastmath=FASTMATH
)


# -- deterministic resampling (sensing2) --------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@numba.njit(cache=True, nogil=True)
def _splitmix64(state):
    """One step of SplitMix64: the next state and its 64-bit output."""
    state = state + _GOLDEN
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return state, z ^ (z >> np.uint64(31))


@numba.njit(cache=True, nogil=True)
def content_seed(indices, values):
    """A 64-bit seed from a document's words and counts (same document, same seed)."""
    state = np.uint64(len(indices))
    for k in range(indices.shape[0]):
        state, mixed = _splitmix64(state ^ np.uint64(indices[k]))
        state = mixed ^ np.uint64(values[k])
        state, _ = _splitmix64(state)
    return state


@numba.njit(cache=True, nogil=True)
def resample_row(indices, values, n_words, out_counts):
    r"""Draw ``n_words`` words with replacement from one document's own word distribution.

    .. math:: w_t \sim \mathrm{Categorical}(x / N_x), \quad t = 1 \dots N

    The random stream is SplitMix64 seeded by :func:`content_seed`, so a document gets the same
    resample in any batch, on any machine. Writes the count of each of the document's words
    into ``out_counts`` (shape (nnz,)); an empty document draws nothing.
    """
    out_counts[:] = 0.0
    total = 0.0
    for k in range(values.shape[0]):
        total += values[k]
    if total <= 0.0:
        return
    cumulative = np.empty(values.shape[0])
    running = 0.0
    for k in range(values.shape[0]):
        running += values[k]
        cumulative[k] = running
    state = content_seed(indices, values)
    for _ in range(n_words):
        state, bits = _splitmix64(state)
        u = (bits >> np.uint64(11)) * (1.0 / 9007199254740992.0) * total  # 53 random bits
        k = np.searchsorted(cumulative, u, side="right")
        out_counts[min(k, values.shape[0] - 1)] += 1.0


@numba.njit(cache=True, nogil=True)
def resample_rows(X_indptr, X_indices, X_values, n_words, out_values):
    """:func:`resample_row` for every CSR row; ``out_values`` (nnz,) takes the new counts on the
    rows' own sparsity pattern (zeros where a word was not drawn)."""
    for i in range(X_indptr.shape[0] - 1):
        start, stop = X_indptr[i], X_indptr[i + 1]
        resample_row(X_indices[start:stop], X_values[start:stop], n_words, out_values[start:stop])
