r"""The search kernels' drivers for a batch of queries: one pass over the segments, each chunk
scanned for every query in turn, serially or a group of segments per thread (see
:func:`service.model.kernels.search.search_shards_many`).
"""

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from service.model.kernels.search_heap import heap_offer, sort_heap
from service.model.kernels.search_scan import scan_chunk
from service.model.kernels.search_single import float32_at


@intrinsic
def uint64_at(typingctx, address):
    """The uint64 pointer at an address (an int64): how the batch kernels reach each query's
    bitmap from one int64 array of addresses (see :func:`float32_at`), without copying them."""
    signature = types.CPointer(types.uint64)(types.int64)

    def codegen(context, builder, _signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.uint64)))

    return signature, codegen


@numba.njit(cache=True, nogil=True)
def scan_group_many(
    addresses, sizes, n_atoms, offsets, segments, first, last, code_starts, atoms, weights,
    excluded_starts, excluded, bitmap_of, bitmaps, allowed_words, allowed_bases, after_sums,
    after_positions, heap_starts, buf, picked, heap_scores, heap_positions, heap_sizes,
):  # fmt: skip
    r"""The bounded top-k of every query of a batch over segments ``first <= g < last``: each
    chunk is scanned for every query in turn (:func:`scan_chunk`), so that the rows the queries
    share are read from memory once per chunk and from cache by the others; sizes into
    ``heap_sizes``.

    .. math:: H_q = \operatorname{top}_{m_q} \bigcup_{g} \text{items}_q(g), \quad q = 1..Q

    Parameters
    ----------
    addresses, sizes, n_atoms, offsets, segments, first, last, allowed_bases
        As :func:`scan_group`.
    code_starts : ndarray of shape (Q + 1,), int64
        Query q's atoms and weights are ``atoms[code_starts[q]:code_starts[q + 1]]``.
    atoms : ndarray of shape (sum nnz,), int64
    weights : ndarray of shape (sum nnz,), float64
    excluded_starts : ndarray of shape (Q + 1,), int64
    excluded : ndarray, int64
        Each query's sorted unique excluded global positions, one after the other.
    bitmap_of : ndarray of shape (Q,), int64
        Which of ``bitmaps`` query q's filter is, -1 for none.
    bitmaps : ndarray of shape (B,), int64
        The address of each bitmap (B distinct bitmaps of ``allowed_words`` uint64 words, kept
        alive by the caller).
    allowed_words : int
    after_sums : ndarray of shape (Q,), float64
    after_positions : ndarray of shape (Q,), int64
    heap_starts : ndarray of shape (Q + 1,), int64
        Query q's heap is ``heap_*[heap_starts[q]:heap_starts[q + 1]]`` (its capacity m_q).
    buf : ndarray of shape (chunk,), float64
    picked : ndarray of shape (chunk,), int64
    heap_scores, heap_positions : ndarray of shape (sum m,)
    heap_sizes : ndarray of shape (Q,), int64
        Sizes so far; updated.
    """
    n_queries = code_starts.shape[0] - 1
    chunk = buf.shape[0]
    no_filter = np.empty(0, dtype=np.uint64)
    next_excluded = np.empty(n_queries, dtype=np.int64)
    for g in range(first, last):
        s = segments[g, 0]
        lo, hi = segments[g, 1], segments[g, 2]
        projected = numba.carray(float32_at(addresses[s]), (n_atoms, sizes[s]))
        for q in range(n_queries):
            next_excluded[q] = excluded_starts[q] + np.searchsorted(
                excluded[excluded_starts[q] : excluded_starts[q + 1]], offsets[s] + lo
            )
        for clo in range(lo, hi, chunk):
            chi = min(clo + chunk, hi)
            for q in range(n_queries):
                h0, h1 = heap_starts[q], heap_starts[q + 1]
                if h1 == h0:
                    continue
                e0 = excluded_starts[q]
                allowed = no_filter
                if bitmap_of[q] >= 0:
                    allowed = numba.carray(uint64_at(bitmaps[bitmap_of[q]]), (allowed_words,))
                size, e = scan_chunk(
                    projected, atoms[code_starts[q] : code_starts[q + 1]],
                    weights[code_starts[q] : code_starts[q + 1]], offsets[s], clo, chi,
                    excluded[e0 : excluded_starts[q + 1]], next_excluded[q] - e0, allowed,
                    allowed_bases[s], after_sums[q], after_positions[q], picked, buf,
                    heap_scores[h0:h1], heap_positions[h0:h1], heap_sizes[q], h1 - h0,
                )  # fmt: skip
                heap_sizes[q] = size
                next_excluded[q] = e0 + e


@numba.njit(cache=True, nogil=True)
def search_shards_many_serial(
    addresses, sizes, n_atoms, offsets, segments, code_starts, atoms, weights, excluded_starts,
    excluded, bitmap_of, bitmaps, allowed_words, allowed_bases, after_sums, after_positions,
    heap_starts, chunk, out_positions, out_sums, out_sizes,
):  # fmt: skip
    r"""The best ``m_q`` items of every query of a batch, best first, on the calling thread, in
    one pass over the segments (see :func:`scan_group_many`): query q's in
    ``out_*[heap_starts[q]:heap_starts[q] + out_sizes[q]]``.

    .. math:: \text{out}_q = \operatorname{top}_{m_q} \{(\textstyle\sum_r w_{qr} X'_{a_{qr} j},
              j) : j \notin E_q,\ \operatorname{bit}_{qj},\ (\cdot) \prec \text{after}_q\}

    Parameters
    ----------
    addresses, sizes, n_atoms, offsets, segments, code_starts, atoms, weights, excluded_starts,
    excluded, bitmap_of, bitmaps, allowed_words, allowed_bases, after_sums, after_positions,
    heap_starts
        As :func:`scan_group_many`.
    chunk : int
    out_positions : ndarray of shape (sum m,), int64
    out_sums : ndarray of shape (sum m,), float64
    out_sizes : ndarray of shape (Q,), int64
    """
    buf = np.empty(chunk, dtype=np.float64)
    picked = np.empty(chunk, dtype=np.int64)
    out_sizes[:] = 0
    scan_group_many(
        addresses, sizes, n_atoms, offsets, segments, 0, segments.shape[0], code_starts, atoms,
        weights, excluded_starts, excluded, bitmap_of, bitmaps, allowed_words, allowed_bases,
        after_sums, after_positions, heap_starts, buf, picked, out_sums, out_positions, out_sizes,
    )  # fmt: skip
    for q in range(code_starts.shape[0] - 1):
        h0, h1 = heap_starts[q], heap_starts[q + 1]
        sort_heap(out_sums[h0:h1], out_positions[h0:h1], out_sizes[q])


@numba.njit(parallel=True, cache=True, nogil=True)
def search_shards_many_parallel(
    addresses, sizes, n_atoms, offsets, segments, group_starts, code_starts, atoms, weights,
    excluded_starts, excluded, bitmap_of, bitmaps, allowed_words, allowed_bases, after_sums,
    after_positions, heap_starts, chunk, out_positions, out_sums, out_sizes,
):  # fmt: skip
    r"""As :func:`search_shards_many_serial`, each group of segments on a thread of its own with
    its own heaps (one per query); each query's heaps are merged.

    .. math:: \text{out}_q = \operatorname{top}_{m_q} \bigcup_g H_{gq}

    Parameters
    ----------
    group_starts : ndarray of shape (G + 1,), int64
    addresses, sizes, n_atoms, offsets, segments, code_starts, atoms, weights, excluded_starts,
    excluded, bitmap_of, bitmaps, allowed_words, allowed_bases, after_sums, after_positions,
    heap_starts, chunk, out_positions, out_sums, out_sizes
        As :func:`search_shards_many_serial`.
    """
    n_queries = code_starts.shape[0] - 1
    total = heap_starts[n_queries]
    n_groups = group_starts.shape[0] - 1
    group_sums = np.empty((n_groups, total), dtype=np.float64)
    group_positions = np.empty((n_groups, total), dtype=np.int64)
    group_sizes = np.zeros((n_groups, n_queries), dtype=np.int64)
    for g in numba.prange(n_groups):
        buf = np.empty(chunk, dtype=np.float64)
        picked = np.empty(chunk, dtype=np.int64)
        scan_group_many(
            addresses, sizes, n_atoms, offsets, segments, group_starts[g], group_starts[g + 1],
            code_starts, atoms, weights, excluded_starts, excluded, bitmap_of, bitmaps,
            allowed_words, allowed_bases, after_sums, after_positions, heap_starts, buf, picked,
            group_sums[g], group_positions[g], group_sizes[g],
        )  # fmt: skip
    for q in range(n_queries):
        h0, h1 = heap_starts[q], heap_starts[q + 1]
        size = 0
        for g in range(n_groups):
            for i in range(h0, h0 + group_sizes[g, q]):
                size = heap_offer(out_sums[h0:h1], out_positions[h0:h1], size, h1 - h0,
                                  group_sums[g, i], group_positions[g, i])  # fmt: skip
        sort_heap(out_sums[h0:h1], out_positions[h0:h1], size)
        out_sizes[q] = size
