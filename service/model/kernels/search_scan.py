r"""The search kernels' scan of one shard's items: a chunk's scores summed from row slices (or
only its allowed items' scores), fed into a bounded top-k around the exclusions, the filter and
the cursor (see :mod:`service.model.kernels.search`). Both the single-query and the batch drivers
step through a catalogue with :func:`scan_chunk`.
"""

import numba
import numpy as np

from service.model.kernels.search_bitmap import ONE, bit_is_set, count_allowed, popcount
from service.model.kernels.search_heap import is_worse, offer_after, sift_down
from service.model.threads import FASTMATH

# Items whose scores are tested against the heap's threshold at once, in one vectorised count.
FEED_BLOCK = 64

# A chunk with at most this fraction of its items allowed by a filter has only those scored
# (gathers), instead of whole row slices: gathers cost about as much as whole slices from a few
# percent of the items on, and whole chunks, with the filter applied as they are fed, cost what
# no filter costs (docs/measurements/benchmarks.md#the-search-kernels-design-measured).
SPARSE_CHUNK_FRACTION = 1 / 50


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def accumulate_chunk(projected, atoms, weights, lo, hi, buf):
    r"""Unbiased scores of the items ``lo <= j < hi`` into ``buf[: hi - lo]``.

    .. math:: \text{buf}_{j - lo} = \sum_{r=1}^{\text{nnz}} w_r X'_{a_r j}

    Each row is read as one contiguous slice ``projected[a, lo:hi]``, so the loops vectorise,
    four rows per pass over the buffer (then two, then one for the rest): fewer passes over the
    buffer, and more rows streaming at once, than one row per pass.
    Every item sees the same sequence of operations, so equal columns give equal scores.

    Parameters
    ----------
    projected : ndarray of shape (A, N), float32, C-contiguous
    atoms : ndarray of shape (nnz,), int64
    weights : ndarray of shape (nnz,), float64
    lo, hi : int
        The chunk, ``0 <= lo <= hi <= N`` and ``hi - lo <= buf.shape[0]``.
    buf : ndarray of shape (>= hi - lo,), float64
    """
    count = hi - lo
    nnz = atoms.shape[0]
    for j in range(count):
        buf[j] = 0.0
    r = 0
    while r + 4 <= nnz:
        row0 = projected[atoms[r], lo:hi]
        row1 = projected[atoms[r + 1], lo:hi]
        row2 = projected[atoms[r + 2], lo:hi]
        row3 = projected[atoms[r + 3], lo:hi]
        w0, w1, w2, w3 = weights[r], weights[r + 1], weights[r + 2], weights[r + 3]
        for j in range(count):
            buf[j] += (w0 * row0[j] + w1 * row1[j]) + (w2 * row2[j] + w3 * row3[j])
        r += 4
    if r + 2 <= nnz:
        row0 = projected[atoms[r], lo:hi]
        row1 = projected[atoms[r + 1], lo:hi]
        w0, w1 = weights[r], weights[r + 1]
        for j in range(count):
            buf[j] += w0 * row0[j] + w1 * row1[j]
        r += 2
    if r < nnz:
        row0 = projected[atoms[r], lo:hi]
        w0 = weights[r]
        for j in range(count):
            buf[j] += w0 * row0[j]


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def accumulate_picked(projected, atoms, weights, picked, count, buf):
    r"""Unbiased scores of the items ``picked[:count]`` into ``buf[:count]``, summed as
    :func:`accumulate_chunk` sums them.

    .. math:: \text{buf}_i = \sum_{r=1}^{\text{nnz}} w_r X'_{a_r, \text{picked}_i}

    Row by row, four rows per pass as the chunk kernel: each pass gathers the picked entries of
    its rows (independent loads, which the processor overlaps), and every item sees the same
    operations as in a chunk, so an item scores the same by either path.

    Parameters
    ----------
    projected : ndarray of shape (A, N), float32
    atoms : ndarray of shape (nnz,), int64
    weights : ndarray of shape (nnz,), float64
    picked : ndarray of shape (>= count,), int64
        Positions in ``projected``.
    count : int
    buf : ndarray of shape (>= count,), float64
    """
    nnz = atoms.shape[0]
    for i in range(count):
        buf[i] = 0.0
    r = 0
    while r + 4 <= nnz:
        row0 = projected[atoms[r]]
        row1 = projected[atoms[r + 1]]
        row2 = projected[atoms[r + 2]]
        row3 = projected[atoms[r + 3]]
        w0, w1, w2, w3 = weights[r], weights[r + 1], weights[r + 2], weights[r + 3]
        for i in range(count):
            j = picked[i]
            buf[i] += (w0 * row0[j] + w1 * row1[j]) + (w2 * row2[j] + w3 * row3[j])
        r += 4
    if r + 2 <= nnz:
        row0 = projected[atoms[r]]
        row1 = projected[atoms[r + 1]]
        w0, w1 = weights[r], weights[r + 1]
        for i in range(count):
            j = picked[i]
            buf[i] += w0 * row0[j] + w1 * row1[j]
        r += 2
    if r < nnz:
        row0 = projected[atoms[r]]
        w0 = weights[r]
        for i in range(count):
            buf[i] += w0 * row0[picked[i]]


@numba.njit(cache=True, nogil=True)
def feed_ascending(
    buf, buf_start, offset, start, stop, allowed, base, after_sum, after_pos,
    heap_scores, heap_positions, size, capacity,
):  # fmt: skip
    r"""Offer the shard's items ``start <= j < stop`` (sums ``buf[j - buf_start]``, global
    positions ``offset + j``) in increasing position, those allowed by the bitmap (if any) and
    ranked after the cursor.

    .. math:: H \leftarrow \operatorname{top}_{\text{capacity}}(H \cup
              \{(\text{buf}_{j - \text{buf\_start}}, \text{offset} + j) : \text{start} \le j <
              \text{stop},\ \operatorname{bit}_j,\ (\cdot) \prec \text{after}\})

    Every kept position is below the ones offered, so once the heap is full an item enters only
    if its sum is strictly above the root's. Without a bitmap that test runs first as a
    vectorised count over blocks of :data:`FEED_BLOCK` items, and only a block with a candidate
    is walked item by item (once the heap has warmed up, almost no block has one).

    Parameters
    ----------
    buf : ndarray, float64
    buf_start, offset, start, stop : int
    allowed : ndarray of uint64
        Empty: every item is allowed.
    base : int
        The shard's first word in ``allowed``.
    after_sum : float
    after_pos : int
    heap_scores, heap_positions : ndarray of shape (capacity,)
    size, capacity : int

    Returns
    -------
    int
        The new size.
    """
    masked = allowed.shape[0] > 0
    j = start
    while j < stop and size < capacity:
        if not masked or bit_is_set(allowed, base, j):
            size = offer_after(heap_scores, heap_positions, size, capacity, buf[j - buf_start],
                               offset + j, after_sum, after_pos)  # fmt: skip
        j += 1
    if size == 0 or j >= stop:
        return size
    threshold = heap_scores[0]
    end = stop - buf_start
    for block in range(j - buf_start, end, FEED_BLOCK):
        block_end = min(block + FEED_BLOCK, end)
        candidates = 0
        for i in range(block, block_end):
            candidates += buf[i] > threshold
        if candidates == 0:
            continue
        for i in range(block, block_end):
            score = buf[i]
            if score <= threshold:
                continue
            position = offset + buf_start + i
            if masked and not bit_is_set(allowed, base, buf_start + i):
                continue
            if not is_worse(score, position, after_sum, after_pos):
                continue
            heap_scores[0] = score
            heap_positions[0] = position
            sift_down(heap_scores, heap_positions, size, 0)
            threshold = heap_scores[0]
    return size


@numba.njit(cache=True, nogil=True)
def feed_sparse(
    projected, atoms, weights, offset, lo, hi, excluded, e, allowed, base, after_sum, after_pos,
    picked, buf, heap_scores, heap_positions, size, capacity,
):  # fmt: skip
    r"""Score only the allowed items ``lo <= j < hi`` of a shard (a chunk few of whose items a
    filter allows) and offer them in increasing position; return the new size.

    .. math:: H \leftarrow \operatorname{top}(H \cup \{(\textstyle\sum_r w_r X'_{a_r j},
              \text{offset} + j) : \operatorname{bit}_j,\ \text{offset} + j \notin E\})

    The allowed, not excluded items are listed first (walking the set bits of the chunk's
    words), then scored together by :func:`accumulate_picked`.

    Parameters
    ----------
    projected, atoms, weights
        As :func:`accumulate_chunk`.
    offset, lo, hi : int
    excluded : ndarray, int64, sorted global positions
    e : int
        The first index of ``excluded`` at or after ``offset + lo``.
    allowed : ndarray of uint64
    base : int
    after_sum, after_pos
        As :func:`feed_ascending`.
    picked : ndarray of shape (>= hi - lo,), int64
    buf : ndarray of shape (>= hi - lo,), float64
    heap_scores, heap_positions, size, capacity
        As :func:`feed_ascending`.

    Returns
    -------
    int
    """
    count = 0
    for w in range(lo >> 6, (hi + 63) >> 6):
        word = allowed[base + w]
        while word != 0:
            low = word & (~word + ONE)
            j = w * 64 + np.int64(popcount(low - ONE))
            word ^= low
            if j < lo:
                continue
            if j >= hi:
                break
            while e < excluded.shape[0] and excluded[e] < offset + j:
                e += 1
            if e < excluded.shape[0] and excluded[e] == offset + j:
                continue
            picked[count] = j
            count += 1
    accumulate_picked(projected, atoms, weights, picked, count, buf)
    for i in range(count):
        size = offer_after(heap_scores, heap_positions, size, capacity, buf[i],
                           offset + picked[i], after_sum, after_pos)  # fmt: skip
    return size


@numba.njit(cache=True, nogil=True)
def scan_chunk(
    projected, atoms, weights, offset, clo, chi, excluded, e, allowed, base, after_sum, after_pos,
    picked, buf, heap_scores, heap_positions, size, capacity,
):  # fmt: skip
    r"""Offer the items ``clo <= j < chi`` of one shard (one chunk, at most ``buf.shape[0]``
    items) to the heap; return its new size and the first index of ``excluded`` at or after
    ``offset + chi``.

    .. math:: H \leftarrow \operatorname{top}_{\text{capacity}}(H \cup
              \{(s_j - b, \text{offset} + j) : clo \le j < chi,\ \text{offset} + j \notin E,\
              \operatorname{bit}_j,\ (\cdot) \prec \text{after}\})

    A chunk no item of which the bitmap allows is skipped unread; one with at most
    :data:`SPARSE_CHUNK_FRACTION` of its items allowed is scored item by item
    (:func:`feed_sparse`); the others by :func:`accumulate_chunk` and :func:`feed_ascending`,
    around the excluded positions.

    Parameters
    ----------
    projected : ndarray of shape (A, n), float32
    atoms, weights : ndarray of shape (nnz,)
    offset : int
        The shard's first global position.
    clo, chi : int
    excluded : ndarray, int64, sorted unique global positions
    e : int
        The first index of ``excluded`` at or after ``offset + clo``.
    allowed : ndarray of uint64
        Empty: no filter.
    base : int
    after_sum : float
    after_pos : int
    picked : ndarray of shape (chunk,), int64
        Scratch (used with a bitmap only).
    buf : ndarray of shape (chunk,), float64
    heap_scores, heap_positions : ndarray of shape (capacity,)
    size, capacity : int

    Returns
    -------
    size : int
    e : int
    """
    if allowed.shape[0] > 0:
        n_allowed = count_allowed(allowed, base, clo, chi)
        if n_allowed == 0:
            while e < excluded.shape[0] and excluded[e] < offset + chi:
                e += 1
            return size, e
        if n_allowed <= SPARSE_CHUNK_FRACTION * (chi - clo):
            size = feed_sparse(
                projected, atoms, weights, offset, clo, chi, excluded, e, allowed, base,
                after_sum, after_pos, picked, buf, heap_scores, heap_positions, size, capacity,
            )  # fmt: skip
            while e < excluded.shape[0] and excluded[e] < offset + chi:
                e += 1
            return size, e
    accumulate_chunk(projected, atoms, weights, clo, chi, buf)
    segment = clo
    while e < excluded.shape[0] and excluded[e] < offset + chi:
        size = feed_ascending(
            buf, clo, offset, segment, excluded[e] - offset, allowed, base, after_sum,
            after_pos, heap_scores, heap_positions, size, capacity,
        )  # fmt: skip
        segment = excluded[e] - offset + 1
        e += 1
    size = feed_ascending(
        buf, clo, offset, segment, chi, allowed, base, after_sum, after_pos, heap_scores,
        heap_positions, size, capacity,
    )  # fmt: skip
    return size, e


@numba.njit(cache=True, nogil=True)
def scan_segment(
    projected, atoms, weights, offset, lo, hi, excluded, allowed, base, after_sum, after_pos,
    buf, heap_scores, heap_positions, size, capacity,
):  # fmt: skip
    r"""Offer the items ``lo <= j < hi`` of one shard to the heap; return its new size.

    .. math:: H \leftarrow \operatorname{top}_{\text{capacity}}(H \cup
              \{(s_j - b, \text{offset} + j) : lo \le j < hi,\ \text{offset} + j \notin E,\
              \operatorname{bit}_j,\ (\cdot) \prec \text{after}\})

    Chunks of ``buf.shape[0]`` items from ``lo`` (a multiple of the chunk size), each by
    :func:`scan_chunk`.

    Parameters
    ----------
    lo, hi : int
        The segment.
    projected, atoms, weights, offset, excluded, allowed, base, after_sum, after_pos, buf,
    heap_scores, heap_positions, size, capacity
        As :func:`scan_chunk`.

    Returns
    -------
    int
    """
    chunk = buf.shape[0]
    picked = np.empty(chunk if allowed.shape[0] > 0 else 0, dtype=np.int64)
    e = np.searchsorted(excluded, offset + lo)
    for clo in range(lo, hi, chunk):
        size, e = scan_chunk(
            projected, atoms, weights, offset, clo, min(clo + chunk, hi), excluded, e, allowed,
            base, after_sum, after_pos, picked, buf, heap_scores, heap_positions, size, capacity,
        )  # fmt: skip
    return size
