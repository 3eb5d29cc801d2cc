r"""The /search scoring kernel: the k best items of a catalogue for one sparse code.

A catalogue is stored atom-major, ``projected`` = :math:`X' = D^\top X` of shape (A, N), float32,
C-contiguous (often a read-only ``np.memmap``). A query is a sparse code: distinct ``atoms``
:math:`a_r`, their ``weights`` :math:`w_r` and a ``bias`` :math:`b`. Item j scores

.. math:: s_j = b + \sum_{r=1}^{\text{nnz}} w_r X'_{a_r j}

and only the nnz rows of :math:`X'` named by the code are read, so a search costs about
``nnz * N * 4`` bytes of memory traffic: it is bound by the read bandwidth, not by arithmetic.

Design (fused, chunked): items are taken in chunks of :data:`CHUNK_ITEMS`. A chunk's scores are
accumulated in a float64 buffer that stays in L1 from row slices ``projected[a, lo:hi]`` (these
vectorise; element indexing ``Xp[r, j]`` in the inner loop did not), then the buffer is fed into
a bounded top-k: a min-heap of the k best so far whose root is the worst of them, so that an item
costs one compare against the root unless it enters the heap (about ``k ln(N / k)`` items do for
scores in random order). The parallel driver gives each thread a contiguous range of items with
its own heap and merges the heaps at the end.

Fused or separate, measured here (N = 1,000,000, A = 256, k = 100, 2 idle cores, numba's ``omp``
threading layer, medians of 30 calls, a fresh random code each call; the bound is nnz * N * 4
bytes at the 16 GB/s a numba ``prange`` sum read over the whole catalogue in the same run):

=====  =====  ============  =================  ===================  ======  ============
nnz    bound  fused (kept)  separate: scores,  separate: scores,    fused,  fused, one
                            then parallel      then                 serial  row per pass
                            heaps              ``np.argpartition``
=====  =====  ============  =================  ===================  ======  ============
5      1.25   1.81 ms       2.20 ms            13.2 ms              3.16    2.03
10     2.54   2.69 ms       3.29 ms            14.2 ms              4.82    3.56
20     5.11   4.54 ms       5.26 ms            15.9 ms              8.28    6.67
=====  =====  ============  =================  ===================  ======  ============

The fused pass is kept: the separate one writes and rereads 8 bytes of float64 score per item
on top of what the rows cost, and was 15-22% slower. Reading four rows per pass over the chunk
buffer (:func:`accumulate_chunk`) was 11-32% faster than one row per pass; testing blocks of
items against the heap's threshold with a vectorised count (:func:`feed_ascending`) took 28% off
the selection alone (0.65 to 0.47 ms for 500,000 scores). Chunks of 1,024 to 16,384 items
timed the same. Warm repeats of one code (its rows may stay in L3) timed the same as fresh codes.

Serial or parallel is chosen by the catalogue entries read, ``max(nnz, 1) * N``, against
:data:`service.model.threads.SEARCH_PARALLEL_MIN_ENTRIES`, in :func:`search_top_k` only. Parallel
calls are serialised with the similarity drivers' lock,
:data:`service.model.threads.PARALLEL_REGION` (numba's ``workqueue`` threading layer aborts when
two threads enter parallel regions at once).
This module sets no threading layer, and it matters. Measured here with another process
spinning on one of the 2 cores, at N = 1,000,000 and nnz = 5 / 10 / 20: with ``omp`` (what numba
picked here) the parallel driver took 21 / 23 / 29 ms against 1.9 / 2.7 / 4.6 ms idle, while the
serial driver took 2.8 / 13 / 20 ms; with ``workqueue`` the parallel driver took 3.0 / 6.0 /
8.9 ms loaded and 2.9 / 4.0 / 6.3 ms idle. Scores are assumed finite: a NaN in the catalogue or
the weights gives an unspecified ranking.
"""

import numba
import numpy as np

from service.model import threads
from service.model.threads import FASTMATH

# Items per chunk: the float64 chunk buffer (32 KiB) stays in L1 while nnz row slices stream in.
CHUNK_ITEMS = 4096

# Items whose scores are tested against the heap's threshold at once, in one vectorised count.
FEED_BLOCK = 64


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def accumulate_chunk(projected, atoms, weights, lo, hi, buf):
    r"""Unbiased scores of the items ``lo <= j < hi`` into ``buf[: hi - lo]``.

    .. math:: \text{buf}_{j - lo} = \sum_{r=1}^{\text{nnz}} w_r X'_{a_r j}

    Each row is read as one contiguous slice ``projected[a, lo:hi]``, so the loops vectorise,
    four rows per pass over the buffer (then two, then one for the rest): fewer passes over the
    buffer and more rows streaming at once were 15-20% faster than one row per pass here.
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


@numba.njit(cache=True, nogil=True)
def is_worse(score_a, position_a, score_b, position_b):
    r"""Whether item a ranks after item b: lower score, or equal score and higher position.

    .. math:: a \prec b \iff s_a < s_b \lor (s_a = s_b \land j_a > j_b)

    Parameters
    ----------
    score_a, score_b : float
    position_a, position_b : int

    Returns
    -------
    bool
    """
    return score_a < score_b or (score_a == score_b and position_a > position_b)


@numba.njit(cache=True, nogil=True)
def sift_down(heap_scores, heap_positions, size, i):
    r"""Restore the heap below node ``i``: every parent ranks no better than its children.

    .. math:: \forall c \in \{2i + 1, 2i + 2\},\ c < \text{size}:
              \neg\, (c \prec \text{parent}(c))

    Parameters
    ----------
    heap_scores : ndarray of shape (>= size,), float64
    heap_positions : ndarray of shape (>= size,), int64
    size : int
    i : int
        The node whose entry may rank better than a child's.
    """
    score = heap_scores[i]
    position = heap_positions[i]
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and is_worse(
            heap_scores[right], heap_positions[right], heap_scores[child], heap_positions[child]
        ):
            child = right
        if not is_worse(heap_scores[child], heap_positions[child], score, position):
            break
        heap_scores[i] = heap_scores[child]
        heap_positions[i] = heap_positions[child]
        i = child
    heap_scores[i] = score
    heap_positions[i] = position


@numba.njit(cache=True, nogil=True)
def heap_offer(heap_scores, heap_positions, size, capacity, score, position):
    r"""Offer one item to a bounded heap of the best ``capacity`` items; return the new size.

    The root holds the worst kept item. Below capacity the item is inserted (sifted up);
    at capacity it replaces the root only if it ranks better:

    .. math:: H \leftarrow \operatorname{top}_{\text{capacity}}(H \cup \{(s, j)\})

    Parameters
    ----------
    heap_scores : ndarray of shape (capacity,), float64
    heap_positions : ndarray of shape (capacity,), int64
    size, capacity : int
    score : float
    position : int

    Returns
    -------
    int
    """
    if size < capacity:
        i = size
        while i > 0:
            parent = (i - 1) // 2
            if not is_worse(score, position, heap_scores[parent], heap_positions[parent]):
                break
            heap_scores[i] = heap_scores[parent]
            heap_positions[i] = heap_positions[parent]
            i = parent
        heap_scores[i] = score
        heap_positions[i] = position
        return size + 1
    if capacity > 0 and is_worse(heap_scores[0], heap_positions[0], score, position):
        heap_scores[0] = score
        heap_positions[0] = position
        sift_down(heap_scores, heap_positions, size, 0)
    return size


@numba.njit(cache=True, nogil=True)
def feed_ascending(buf, offset, start, stop, heap_scores, heap_positions, size, capacity):
    r"""Offer the items ``start <= j < stop`` (scores ``buf[j - offset]``) in increasing position.

    .. math:: H \leftarrow \operatorname{top}_{\text{capacity}}(H \cup
              \{(\text{buf}_{j - \text{offset}}, j) : \text{start} \le j < \text{stop}\})

    Every kept position is below ``start``, so once the heap is full an item enters only if its
    score is strictly above the root's. That test runs first as a vectorised count over blocks
    of :data:`FEED_BLOCK` items, and only a block with a candidate is walked item by item
    (once the heap has warmed up, almost no block has one).

    Parameters
    ----------
    buf : ndarray, float64
    offset, start, stop : int
    heap_scores, heap_positions : ndarray of shape (capacity,)
    size, capacity : int

    Returns
    -------
    int
        The new size.
    """
    j = start
    while j < stop and size < capacity:
        size = heap_offer(heap_scores, heap_positions, size, capacity, buf[j - offset], j)
        j += 1
    if size == 0:
        return size
    threshold = heap_scores[0]
    end = stop - offset
    for block in range(j - offset, end, FEED_BLOCK):
        block_end = min(block + FEED_BLOCK, end)
        candidates = 0
        for i in range(block, block_end):
            candidates += buf[i] > threshold
        if candidates == 0:
            continue
        for i in range(block, block_end):
            score = buf[i]
            if score > threshold:
                heap_scores[0] = score
                heap_positions[0] = i + offset
                sift_down(heap_scores, heap_positions, size, 0)
                threshold = heap_scores[0]
    return size


@numba.njit(cache=True, nogil=True)
def scan_range(
    projected, atoms, weights, excluded, start, stop, buf, heap_scores, heap_positions, capacity
):
    r"""Bounded top-k of the items ``start <= j < stop`` not in ``excluded``; return its size.

    .. math:: H = \operatorname{top}_{\text{capacity}}
              \{(s_j - b, j) : \text{start} \le j < \text{stop},\ j \notin E\}

    Chunks of ``buf.shape[0]`` items are scored by :func:`accumulate_chunk` and fed by
    :func:`feed_ascending`, skipping the excluded positions.

    Parameters
    ----------
    projected : ndarray of shape (A, N), float32
    atoms, weights : ndarray of shape (nnz,)
    excluded : ndarray of shape (n_excluded,), int64, sorted, unique
    start, stop : int
    buf : ndarray of shape (chunk,), float64
    heap_scores, heap_positions : ndarray of shape (capacity,)
    capacity : int

    Returns
    -------
    int
    """
    chunk = buf.shape[0]
    size = 0
    e = np.searchsorted(excluded, start)
    for lo in range(start, stop, chunk):
        hi = min(lo + chunk, stop)
        accumulate_chunk(projected, atoms, weights, lo, hi, buf)
        segment = lo
        while e < excluded.shape[0] and excluded[e] < hi:
            size = feed_ascending(
                buf, lo, segment, excluded[e], heap_scores, heap_positions, size, capacity
            )
            segment = excluded[e] + 1
            e += 1
        size = feed_ascending(buf, lo, segment, hi, heap_scores, heap_positions, size, capacity)
    return size


@numba.njit(cache=True, nogil=True)
def sort_heap(heap_scores, heap_positions, size):
    r"""Sort a heap of :func:`heap_offer` in place, best first (heapsort).

    .. math:: (s_0, j_0) \succ (s_1, j_1) \succ \dots \succ (s_{\text{size}-1}, j_{\text{size}-1})

    Parameters
    ----------
    heap_scores, heap_positions : ndarray of shape (>= size,)
    size : int
    """
    for last in range(size - 1, 0, -1):
        score = heap_scores[0]
        position = heap_positions[0]
        heap_scores[0] = heap_scores[last]
        heap_positions[0] = heap_positions[last]
        heap_scores[last] = score
        heap_positions[last] = position
        sift_down(heap_scores, heap_positions, last, 0)


@numba.njit(cache=True, nogil=True)
def search_top_k_serial(
    projected, atoms, weights, bias, excluded, chunk, out_positions, out_scores
):
    r"""The best ``m = out_positions.shape[0]`` items, best first, on the calling thread.

    .. math:: \text{out} = \operatorname{top}_m \{(b + \sum_r w_r X'_{a_r j}, j) : j \notin E\}

    Parameters
    ----------
    projected : ndarray of shape (A, N), float32
    atoms : ndarray of shape (nnz,), int64
    weights : ndarray of shape (nnz,), float64
    bias : float
    excluded : ndarray, int64, sorted, unique, within 0..N-1
    chunk : int
        Items per chunk (>= 1).
    out_positions : ndarray of shape (m,), int64
        ``m <= N - len(excluded)``.
    out_scores : ndarray of shape (m,), float64
    """
    m = out_positions.shape[0]
    buf = np.empty(chunk, dtype=np.float64)
    size = scan_range(
        projected,
        atoms,
        weights,
        excluded,
        0,
        projected.shape[1],
        buf,
        out_scores,
        out_positions,
        m,
    )
    sort_heap(out_scores, out_positions, size)
    for i in range(size):
        out_scores[i] = bias + out_scores[i]


@numba.njit(parallel=True, cache=True, nogil=True)
def search_top_k_parallel(
    projected, atoms, weights, bias, excluded, chunk, n_groups, out_positions, out_scores
):
    r"""The best ``m = out_positions.shape[0]`` items, best first, over ``n_groups`` threads.

    Group g scans the items :math:`\lfloor gN/G \rfloor \le j < \lfloor (g+1)N/G \rfloor` into
    its own heap; the heaps are then merged:

    .. math:: \text{out} = \operatorname{top}_m \bigcup_g H_g

    Parameters
    ----------
    projected, atoms, weights, bias, excluded, chunk
        As :func:`search_top_k_serial`.
    n_groups : int
        Ranges scanned in parallel (>= 1), usually the number of threads.
    out_positions : ndarray of shape (m,), int64
    out_scores : ndarray of shape (m,), float64
    """
    m = out_positions.shape[0]
    n = projected.shape[1]
    group_scores = np.empty((n_groups, m), dtype=np.float64)
    group_positions = np.empty((n_groups, m), dtype=np.int64)
    group_sizes = np.zeros(n_groups, dtype=np.int64)
    for g in numba.prange(n_groups):
        buf = np.empty(chunk, dtype=np.float64)
        group_sizes[g] = scan_range(
            projected,
            atoms,
            weights,
            excluded,
            g * n // n_groups,
            (g + 1) * n // n_groups,
            buf,
            group_scores[g],
            group_positions[g],
            m,
        )
    size = 0
    for g in range(n_groups):
        for i in range(group_sizes[g]):
            size = heap_offer(
                out_scores, out_positions, size, m, group_scores[g, i], group_positions[g, i]
            )
    sort_heap(out_scores, out_positions, size)
    for i in range(size):
        out_scores[i] = bias + out_scores[i]


def search_runs_serially(n_nonzero: int, n_items: int) -> bool:
    """Whether :func:`search_top_k` of a code with ``n_nonzero`` atoms over ``n_items`` items
    runs on the calling thread (else in a parallel region, under
    :data:`service.model.threads.PARALLEL_REGION`)."""
    return max(n_nonzero, 1) * n_items < threads.SEARCH_PARALLEL_MIN_ENTRIES


def search_top_k(
    projected, atoms, weights, bias, k, excluded=None
) -> tuple[np.ndarray, np.ndarray]:
    """-> (positions int64 shape (m,), scores float64 shape (m,)), best first; ties by lower
    position. m = min(k, N - number of excluded positions). excluded: sorted unique int64
    positions to skip (or None).

    Parameters
    ----------
    projected : ndarray or np.memmap of shape (A, N), float32, C-contiguous
        The catalogue, atom-major. Read only; never copied.
    atoms : array-like of shape (nnz,), int
        Distinct atoms, each in ``0..A-1`` (the caller validates distinctness; the range is
        checked here, as the kernels do not check bounds). nnz may be 0.
    weights : array-like of shape (nnz,), float
    bias : float
    k : int
        How many items (>= 1).
    excluded : array-like of int, optional
        Sorted unique positions in ``0..N-1`` never to return.

    Returns
    -------
    positions : ndarray of shape (m,), int64
    scores : ndarray of shape (m,), float64
        ``bias + sum_r weights[r] * projected[atoms[r], position]``, non-increasing.

    Raises
    ------
    ValueError
        If k < 1, or the arrays' shapes, dtype or layout are not the documented ones.
    """
    if int(k) != k or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    projected = np.asarray(projected)  # a memmap's plain ndarray view, no copy
    if projected.ndim != 2 or projected.dtype != np.float32:
        raise ValueError(
            f"projected must be a 2-D float32 array, got {projected.ndim}-D {projected.dtype}"
        )
    if not projected.flags.c_contiguous:
        raise ValueError("projected must be C-contiguous (atom-major rows)")
    # fresh writeable copies (they are small) and a read-only view of the catalogue: one compiled
    # signature per driver, whatever the caller's arrays (numba types read-only arrays apart)
    view = projected.view()
    view.flags.writeable = False
    projected = view
    atoms = np.array(atoms, dtype=np.int64)
    weights = np.array(weights, dtype=np.float64)
    if atoms.ndim != 1 or atoms.shape != weights.shape:
        raise ValueError(
            f"atoms and weights must be 1-D of one length, got {atoms.shape} and {weights.shape}"
        )
    if atoms.size and (atoms.min() < 0 or atoms.max() >= projected.shape[0]):
        # the kernels do not check bounds: an atom outside the catalogue would read past it
        raise ValueError(f"atoms must be in 0..{projected.shape[0] - 1}")
    n = projected.shape[1]
    if excluded is None:
        excluded = np.empty(0, dtype=np.int64)
    else:
        excluded = np.array(excluded, dtype=np.int64)
        if excluded.ndim != 1:
            raise ValueError(f"excluded must be 1-D, got shape {excluded.shape}")
        if excluded.size and (
            excluded[0] < 0 or excluded[-1] >= n or np.any(excluded[1:] <= excluded[:-1])
        ):
            raise ValueError("excluded must be sorted unique positions in 0..N-1")
    m = min(int(k), n - excluded.shape[0])
    positions = np.empty(m, dtype=np.int64)
    scores = np.empty(m, dtype=np.float64)
    if m == 0:
        return positions, scores
    bias = float(bias)
    if search_runs_serially(atoms.shape[0], n):
        search_top_k_serial(
            projected, atoms, weights, bias, excluded, CHUNK_ITEMS, positions, scores
        )
    else:
        with threads.PARALLEL_REGION:
            search_top_k_parallel(
                projected,
                atoms,
                weights,
                bias,
                excluded,
                CHUNK_ITEMS,
                numba.get_num_threads(),
                positions,
                scores,
            )
    return positions, scores
