r"""The search kernels' drivers for one query: the serial one scans every segment of a
:class:`~service.model.kernels.search.ShardSet` into one heap, the parallel one a group of
segments per thread, each with its own heap, merged at the end.
"""

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from service.model.kernels.search_heap import heap_offer, sort_heap
from service.model.kernels.search_scan import scan_segment


@intrinsic
def float32_at(typingctx, address):
    """The float32 pointer at an address (an int64): how the kernels reach each shard's array
    from one int64 array of addresses (a typed list of arrays would compile its own code in
    every process, where everything here is cached)."""
    signature = types.CPointer(types.float32)(types.int64)

    def codegen(context, builder, _signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.float32)))

    return signature, codegen


@numba.njit(cache=True, nogil=True)
def scan_group(
    addresses, sizes, n_atoms, offsets, segments, first, last, atoms, weights, excluded,
    allowed, allowed_bases, after_sum, after_pos, buf, heap_scores, heap_positions, capacity,
):  # fmt: skip
    r"""The bounded top-k of segments ``first <= g < last``; return its size.

    .. math:: H = \operatorname{top}_{\text{capacity}} \bigcup_{g} \text{items}(g)

    Parameters
    ----------
    addresses : ndarray of shape (S,), int64
        The address of each shard's (A, n_s) float32 C-contiguous array (kept alive by the
        caller).
    sizes : ndarray of shape (S,), int64
        n_s.
    n_atoms : int
        A.
    offsets : ndarray of shape (S + 1,), int64
    segments : ndarray of shape (n_segments, 3), int64
        (shard, lo, hi) per segment.
    first, last : int
    atoms, weights, excluded, allowed, after_sum, after_pos
        As :func:`scan_segment`.
    allowed_bases : ndarray of shape (S,), int64
        Each shard's first word in ``allowed``.
    buf, heap_scores, heap_positions, capacity
        As :func:`scan_segment`.

    Returns
    -------
    int
    """
    size = 0
    for g in range(first, last):
        s = segments[g, 0]
        projected = numba.carray(float32_at(addresses[s]), (n_atoms, sizes[s]))
        size = scan_segment(
            projected, atoms, weights, offsets[s], segments[g, 1], segments[g, 2],
            excluded, allowed, allowed_bases[s], after_sum, after_pos, buf, heap_scores,
            heap_positions, size, capacity,
        )  # fmt: skip
    return size


@numba.njit(cache=True, nogil=True)
def search_shards_serial(
    addresses, sizes, n_atoms, offsets, segments, atoms, weights, excluded, allowed, allowed_bases,
    after_sum, after_pos, chunk, out_positions, out_sums,
):  # fmt: skip
    r"""The best ``m = out_positions.shape[0]`` items, best first, on the calling thread; return
    how many there are (fewer than m when the filter, exclusions or cursor leave fewer).

    .. math:: \text{out} = \operatorname{top}_m \{(\textstyle\sum_r w_r X'_{a_r j}, j) :
              j \notin E,\ \operatorname{bit}_j,\ (\cdot) \prec \text{after}\}

    Parameters
    ----------
    addresses, sizes, n_atoms, offsets, segments, atoms, weights, excluded, allowed,
    allowed_bases, after_sum, after_pos
        As :func:`scan_group`.
    chunk : int
        Items per chunk (>= 1; segments start at its multiples).
    out_positions : ndarray of shape (m,), int64
        Global positions.
    out_sums : ndarray of shape (m,), float64
        Unbiased scores.

    Returns
    -------
    int
    """
    m = out_positions.shape[0]
    buf = np.empty(chunk, dtype=np.float64)
    size = scan_group(
        addresses, sizes, n_atoms, offsets, segments, 0, segments.shape[0], atoms, weights,
        excluded, allowed, allowed_bases, after_sum, after_pos, buf, out_sums, out_positions, m,
    )  # fmt: skip
    sort_heap(out_sums, out_positions, size)
    return size


@numba.njit(parallel=True, cache=True, nogil=True)
def search_shards_parallel(
    addresses, sizes, n_atoms, offsets, segments, group_starts, atoms, weights, excluded, allowed,
    allowed_bases, after_sum, after_pos, chunk, out_positions, out_sums,
):  # fmt: skip
    r"""As :func:`search_shards_serial`, each group of segments ``group_starts[g] <= i <
    group_starts[g + 1]`` on a thread of its own with its own heap; the heaps are merged.

    .. math:: \text{out} = \operatorname{top}_m \bigcup_g H_g

    Parameters
    ----------
    group_starts : ndarray of shape (G + 1,), int64
    addresses, sizes, n_atoms, offsets, segments, atoms, weights, excluded, allowed,
    allowed_bases, after_sum, after_pos, chunk, out_positions, out_sums
        As :func:`search_shards_serial`.

    Returns
    -------
    int
    """
    m = out_positions.shape[0]
    n_groups = group_starts.shape[0] - 1
    group_sums = np.empty((n_groups, m), dtype=np.float64)
    group_positions = np.empty((n_groups, m), dtype=np.int64)
    group_sizes = np.zeros(n_groups, dtype=np.int64)
    for g in numba.prange(n_groups):
        buf = np.empty(chunk, dtype=np.float64)
        group_sizes[g] = scan_group(
            addresses, sizes, n_atoms, offsets, segments, group_starts[g], group_starts[g + 1],
            atoms, weights, excluded, allowed, allowed_bases, after_sum, after_pos, buf,
            group_sums[g], group_positions[g], m,
        )  # fmt: skip
    size = 0
    for g in range(n_groups):
        for i in range(group_sizes[g]):
            size = heap_offer(
                out_sums, out_positions, size, m, group_sums[g, i], group_positions[g, i]
            )
    sort_heap(out_sums, out_positions, size)
    return size
