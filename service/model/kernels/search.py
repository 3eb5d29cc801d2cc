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

Scoring and selection are fused: a separate scoring pass would write and reread 8 bytes of
float64 score per item on top of what the rows cost. Four rows are read per pass over the chunk
buffer (:func:`accumulate_chunk`), and blocks of items are tested against the heap's threshold
with one vectorised count (:func:`feed_ascending`). Each of these is faster than its
alternative, and a search runs near the memory-bandwidth bound
(docs/measurements/benchmarks.md#the-search-kernels-design-measured has the figures).

**Shards, filters and pages.** A catalogue may be several shards, each its own (A, n_s) array
(a memory map each), item j of shard s at global position ``offsets[s] + j``. The items are cut
into *segments* (a range of one shard, starting at a multiple of the chunk size in that shard,
so that every item is scored in the same chunk whatever the grouping), and the segments into
groups of about equal size (:class:`ShardSet`): the serial driver scans every group, the
parallel one a group per thread, each with its own heap, merged at the end; ties are broken by
global position, so a sharded catalogue ranks exactly as one shard of the same items. A filter
(with the live items of a catalogue version) arrives as a bitmap, one bit per item, each shard's
bits starting at a word of their own (``allowed_bases``): a chunk with no allowed item is not
read at all, a chunk with few has only those scored (:func:`accumulate_picked`, the same sums
as :func:`accumulate_chunk`), the others in full with the disallowed items skipped when fed. A page
after a cursor ``(after_sum, after_position)`` keeps only items ranked after it.

**Batches.** :func:`search_shards_many` ranks several queries in one pass: the segments and
chunks are the same, and each chunk is scanned for every query in turn (:func:`scan_chunk`, the
single driver's own step, with each query's heap, bitmap, exclusions and cursor), so that rows
the queries share are read from memory once per chunk and from cache by the others. Each item
is summed by each query exactly as alone, so every answer is the single query's, bit for bit;
a batch is bound by the arithmetic (nnz multiply-adds per item and query) where a single query
is bound by the memory (see docs/measurements/benchmarks.md).

Serial or parallel is chosen by the catalogue entries read, ``max(nnz, 1) * N``, against
:data:`service.model.threads.SEARCH_PARALLEL_MIN_ENTRIES`, in :func:`search_top_k` only. Parallel
calls are serialised with the similarity drivers' lock,
:data:`service.model.threads.PARALLEL_REGION` (numba's ``workqueue`` threading layer aborts when
two threads enter parallel regions at once).
This module sets no threading layer, and it matters: with ``omp``, a parallel search slows
several times over while another process holds one of the cores, where ``workqueue`` slows far
less (docs/measurements/benchmarks.md#threading-layer). Scores are assumed finite: a NaN in the
catalogue or the weights gives an unspecified ranking.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from service.model import threads
from service.model.threads import FASTMATH

# Items per chunk: the float64 chunk buffer (32 KiB) stays in L1 while nnz row slices stream in.
CHUNK_ITEMS = 4096

# Items whose scores are tested against the heap's threshold at once, in one vectorised count.
FEED_BLOCK = 64

# A chunk with at most this fraction of its items allowed by a filter has only those scored
# (gathers), instead of whole row slices: gathers cost about as much as whole slices from a few
# percent of the items on, and whole chunks, with the filter applied as they are fed, cost what
# no filter costs (docs/measurements/benchmarks.md#the-search-kernels-design-measured).
SPARSE_CHUNK_FRACTION = 1 / 50

# Groups per thread in the parallel driver: a thread slowed by another process holds up less.
GROUPS_PER_THREAD = 2

_ONE = np.uint64(1)


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
def popcount(word):
    r"""The number of set bits of a 64-bit word (SWAR).

    .. math:: \operatorname{popcount}(x) = \sum_{b=0}^{63} \lfloor x / 2^b \rfloor \bmod 2

    Parameters
    ----------
    word : uint64

    Returns
    -------
    uint64
    """
    x = word - ((word >> _ONE) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


@numba.njit(cache=True, nogil=True)
def bit_is_set(allowed, base, j):
    r"""Whether bit ``j`` of the bitmap starting at word ``base`` is set.

    .. math:: \lfloor a_{\text{base} + \lfloor j / 64 \rfloor} / 2^{j \bmod 64} \rfloor \bmod 2 = 1

    Parameters
    ----------
    allowed : ndarray of uint64
    base : int
    j : int

    Returns
    -------
    bool
    """
    return (allowed[base + (j >> 6)] >> np.uint64(j & 63)) & _ONE != 0


@numba.njit(cache=True, nogil=True)
def count_allowed(allowed, base, lo, hi):
    r"""The set bits ``lo <= j < hi`` of the bitmap starting at word ``base``.

    .. math:: \sum_{j = lo}^{hi - 1} \operatorname{bit}_j

    Parameters
    ----------
    allowed : ndarray of uint64
    base, lo, hi : int

    Returns
    -------
    int
    """
    count = 0
    for w in range(lo >> 6, (hi + 63) >> 6):
        word = allowed[base + w]
        if w == lo >> 6:
            word &= ~((_ONE << np.uint64(lo & 63)) - _ONE)  # the bits before lo
        if w == (hi - 1) >> 6 and hi & 63:
            word &= (_ONE << np.uint64(hi & 63)) - _ONE  # the bits from hi on
        count += np.int64(popcount(word))
    return count


@numba.njit(cache=True, nogil=True)
def offer_after(heap_scores, heap_positions, size, capacity, score, position, after_sum, after_pos):
    r"""Offer an item to the heap only if it ranks after the cursor item; return the new size.

    .. math:: H \leftarrow \operatorname{top}(H \cup \{(s, j)\}) \ \text{if}\ (s, j) \prec
              (s_\text{after}, j_\text{after})

    Parameters
    ----------
    heap_scores, heap_positions : ndarray of shape (capacity,)
    size, capacity : int
    score : float
    position : int
    after_sum : float
        ``inf`` without a cursor.
    after_pos : int

    Returns
    -------
    int
    """
    if not is_worse(score, position, after_sum, after_pos):
        return size
    return heap_offer(heap_scores, heap_positions, size, capacity, score, position)


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
            low = word & (~word + _ONE)
            j = w * 64 + np.int64(popcount(low - _ONE))
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


@intrinsic
def float32_at(typingctx, address):
    """The float32 pointer at an address (an int64): how the kernels reach each shard's array
    from one int64 array of addresses (a typed list of arrays would compile its own code in
    every process, where everything here is cached)."""
    signature = types.CPointer(types.float32)(types.int64)

    def codegen(context, builder, _signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.float32)))

    return signature, codegen


@intrinsic
def uint64_at(typingctx, address):
    """The uint64 pointer at an address (an int64): how the batch kernels reach each query's
    bitmap from one int64 array of addresses (see :func:`float32_at`), without copying them."""
    signature = types.CPointer(types.uint64)(types.int64)

    def codegen(context, builder, _signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.uint64)))

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


def search_runs_serially(n_nonzero: int, n_items: int) -> bool:
    """Whether a search of a code with ``n_nonzero`` atoms over ``n_items`` items runs on the
    calling thread (else in a parallel region, under
    :data:`service.model.threads.PARALLEL_REGION`)."""
    return max(n_nonzero, 1) * n_items < threads.SEARCH_PARALLEL_MIN_ENTRIES


class ShardSet:
    """Shards as the kernels read them: (A, n_s) float32 arrays (memory maps, usually), held
    here and passed by address, their global offsets, and their segments grouped for each
    number of threads. Built once per catalogue version: the shards' arrays are never copied.

    Parameters
    ----------
    projections : sequence of ndarray of shape (A, n_s), float32, C-contiguous
        At least one; every shard has the same A.
    first_position : int
        The global position of the first shard's first item (a part of a catalogue held
        elsewhere starts past 0).

    Raises
    ------
    ValueError
        No shard, or shards of another dtype, layout or number of atoms.
    """

    def __init__(self, projections, first_position: int = 0) -> None:
        arrays = []
        for projected in projections:
            projected = np.asarray(projected)  # a memmap's plain ndarray view, no copy
            if projected.ndim != 2 or projected.dtype != np.float32:
                raise ValueError(
                    f"projected must be a 2-D float32 array, got {projected.ndim}-D "
                    f"{projected.dtype}"
                )
            if not projected.flags.c_contiguous:
                raise ValueError("projected must be C-contiguous (atom-major rows)")
            view = projected.view()
            view.flags.writeable = False  # one compiled signature whatever the caller's arrays
            arrays.append(view)
        if not arrays:
            raise ValueError("a shard set needs at least one shard")
        if len({a.shape[0] for a in arrays}) != 1:
            raise ValueError("every shard must have the same number of atoms")
        self.n_atoms = int(arrays[0].shape[0])
        self.sizes = np.array([a.shape[1] for a in arrays], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.offsets += first_position
        self.n_items = int(self.sizes.sum())
        self.arrays = tuple(arrays)  # alive as long as their addresses are used
        self.addresses = np.array([a.ctypes.data for a in arrays], dtype=np.int64)
        # Each shard's bits in a bitmap start at a word of their own.
        words = (self.sizes + 63) // 64
        self.bitmap_bases = np.concatenate([[0], np.cumsum(words)[:-1]]).astype(np.int64)
        self.bitmap_words = int(words.sum())
        self._plans: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def empty_bitmap(self) -> np.ndarray:
        """A bitmap of this shard set's layout with no bit set."""
        return np.zeros(self.bitmap_words, dtype=np.uint64)

    def plan(self, n_groups: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        """Segments (shard, lo, hi) in global order, each within one chunk-aligned run of one
        shard, and ``group_starts`` cutting them into ``n_groups`` runs of about equal size."""
        key = (n_groups, chunk)
        if key not in self._plans:
            chunks = [
                (s, lo, min(lo + chunk, int(size)))
                for s, size in enumerate(self.sizes)
                for lo in range(0, int(size), chunk)
            ]
            n_groups = max(1, min(n_groups, len(chunks)))
            cumulative = np.cumsum([hi - lo for _, lo, hi in chunks])
            cuts = np.searchsorted(cumulative, np.arange(1, n_groups) * self.n_items / n_groups)
            group_of = np.zeros(len(chunks), dtype=np.int64)
            for cut in cuts:
                group_of[cut + 1 :] += 1
            segments, starts = [], [0]
            for i, (s, lo, hi) in enumerate(chunks):
                if segments and segments[-1][0] == s and group_of[i] == group_of[i - 1]:
                    segments[-1][2] = hi
                    continue
                if i and group_of[i] != group_of[i - 1]:
                    starts.append(len(segments))
                segments.append([s, lo, hi])
            starts.append(len(segments))
            self._plans[key] = (
                np.array(segments, dtype=np.int64).reshape(-1, 3),
                np.array(starts, dtype=np.int64),
            )
        return self._plans[key]

    def search(self, atoms, weights, k, excluded=None, allowed=None, after=None):
        """The best ``k`` items for a code, best first: see :func:`search_shards`."""
        return search_shards(self, atoms, weights, k, excluded, allowed, after)


@dataclass(frozen=True)
class KernelQuery:
    """One query of :func:`search_shards_many`, checked (see :func:`kernel_query`).

    Parameters
    ----------
    atoms : ndarray of shape (nnz,), int64
    weights : ndarray of shape (nnz,), float64
    excluded : ndarray of shape (n_excluded,), int64
    allowed : ndarray of uint64
        Empty: no filter.
    after_sum : float
    after_position : int
    m : int
        Items it ranks at most (``k``, less the excluded where fewer are left; may be 0).
    """

    atoms: np.ndarray
    weights: np.ndarray
    excluded: np.ndarray
    allowed: np.ndarray
    after_sum: float
    after_position: int
    m: int


def kernel_query(
    shards: ShardSet, atoms, weights, k, excluded=None, allowed=None, after=None
) -> KernelQuery:
    """A query of :func:`search_shards` checked against ``shards`` (the kernels check no
    bounds): see :func:`search_shards` for the parameters.

    Raises
    ------
    ValueError
        k < 1, or arrays of the wrong shape, type or range.
    """
    if int(k) != k or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    atoms = np.array(atoms, dtype=np.int64)
    weights = np.array(weights, dtype=np.float64)
    if atoms.ndim != 1 or atoms.shape != weights.shape:
        raise ValueError(
            f"atoms and weights must be 1-D of one length, got {atoms.shape} and {weights.shape}"
        )
    if atoms.size and (atoms.min() < 0 or atoms.max() >= shards.n_atoms):
        # the kernels do not check bounds: an atom outside the catalogue would read past it
        raise ValueError(f"atoms must be in 0..{shards.n_atoms - 1}")
    first, end = int(shards.offsets[0]), int(shards.offsets[-1])
    if excluded is None:
        excluded = np.empty(0, dtype=np.int64)
    else:
        excluded = np.array(excluded, dtype=np.int64)
        if excluded.ndim != 1:
            raise ValueError(f"excluded must be 1-D, got shape {excluded.shape}")
        if excluded.size and (
            excluded[0] < first or excluded[-1] >= end or np.any(excluded[1:] <= excluded[:-1])
        ):
            raise ValueError(f"excluded must be sorted unique positions in {first}..{end - 1}")
    if allowed is None:
        allowed = np.empty(0, dtype=np.uint64)
    elif allowed.dtype != np.uint64 or allowed.shape != (shards.bitmap_words,):
        raise ValueError(f"allowed must be a bitmap of {shards.bitmap_words} uint64 words")
    after_sum, after_pos = (np.inf, -1) if after is None else (float(after[0]), int(after[1]))
    m = max(min(int(k), shards.n_items - excluded.shape[0]), 0)
    return KernelQuery(atoms, weights, excluded, allowed, after_sum, after_pos, m)


def search_shards(shards: ShardSet, atoms, weights, k, excluded=None, allowed=None, after=None):
    """-> (positions int64 shape (m,), sums float64 shape (m,)): the best items, best first, by
    the unbiased score ``sum_r weights[r] * X'[atoms[r], j]``; ties by lower global position.

    Parameters
    ----------
    shards : ShardSet
    atoms : array-like of shape (nnz,), int
        Distinct atoms, each in ``0..A-1`` (the range is checked here: the kernels do not check
        bounds). nnz may be 0.
    weights : array-like of shape (nnz,), float
    k : int
        How many items at most (>= 1).
    excluded : array-like of int, optional
        Sorted unique global positions never to return.
    allowed : ndarray of uint64, optional
        A bitmap of ``shards.bitmap_words`` words (see :meth:`ShardSet.empty_bitmap`): only its
        items are returned. None: every item.
    after : (float, int), optional
        A cursor: only items ranked after the item of this unbiased score and global position.

    Returns
    -------
    positions : ndarray of shape (m,), int64
        ``m <= k``: fewer when the filter, the exclusions or the cursor leave fewer.
    sums : ndarray of shape (m,), float64
        Non-increasing; add the code's bias for scores.

    Raises
    ------
    ValueError
        k < 1, or arrays of the wrong shape, type or range.
    """
    return search_one(shards, kernel_query(shards, atoms, weights, k, excluded, allowed, after))


def search_one(shards: ShardSet, query: KernelQuery) -> tuple[np.ndarray, np.ndarray]:
    """:func:`search_shards` of a query already checked (see :func:`kernel_query`)."""
    positions = np.empty(query.m, dtype=np.int64)
    sums = np.empty(query.m, dtype=np.float64)
    if query.m == 0:
        return positions, sums
    arguments = (
        query.atoms, query.weights, query.excluded, query.allowed, shards.bitmap_bases,
        query.after_sum, query.after_position, CHUNK_ITEMS, positions, sums,
    )  # fmt: skip
    if search_runs_serially(query.atoms.shape[0], shards.n_items):
        segments, _ = shards.plan(1, CHUNK_ITEMS)
        size = search_shards_serial(
            shards.addresses, shards.sizes, shards.n_atoms, shards.offsets, segments, *arguments
        )
    else:
        segments, starts = shards.plan(GROUPS_PER_THREAD * numba.get_num_threads(), CHUNK_ITEMS)
        with threads.PARALLEL_REGION:
            size = search_shards_parallel(
                shards.addresses, shards.sizes, shards.n_atoms, shards.offsets, segments, starts,
                *arguments,
            )  # fmt: skip
    return positions[:size], sums[:size]


def batch_runs_serially(queries: Sequence[KernelQuery], n_items: int) -> bool:
    """Whether :func:`search_shards_many` of ``queries`` runs on the calling thread: the entries
    read by all of them together, as for one query (:func:`search_runs_serially`)."""
    entries = sum(max(query.atoms.shape[0], 1) for query in queries)
    return search_runs_serially(entries, n_items)


def search_many_bytes(n_bitmaps: int, n_items: int, n_ranked: int) -> int:
    """Bytes a batch holds while it ranks (:func:`search_shards_many`): ``n_bitmaps`` bitmaps
    of ``n_items`` items, and heaps of ``n_ranked`` items in all in every group of the parallel
    driver and in the merged answer (16 bytes an item: a score and a position)."""
    groups = GROUPS_PER_THREAD * numba.get_num_threads() + 1
    return n_bitmaps * 8 * ((n_items + 63) // 64) + 16 * n_ranked * groups


def _starts(lengths: Sequence[int]) -> np.ndarray:
    """Where each of consecutive parts of ``lengths`` starts, and the end; shape (n + 1,)."""
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


def search_shards_many(
    shards: ShardSet, queries: Sequence[KernelQuery]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """-> [(positions, sums), ...]: each query's answer, exactly what :func:`search_shards`
    answers it alone, from one pass over the shards (see :func:`scan_group_many`).

    Parameters
    ----------
    shards : ShardSet
    queries : sequence of KernelQuery
        Made by :func:`kernel_query` for ``shards``.

    Returns
    -------
    list of (ndarray of shape (m_q,), int64; ndarray of shape (m_q,), float64)
    """
    if len(queries) <= 1:
        return [search_one(shards, query) for query in queries]
    code_starts = _starts([q.atoms.shape[0] for q in queries])
    excluded_starts = _starts([q.excluded.shape[0] for q in queries])
    heap_starts = _starts([q.m for q in queries])
    atoms = np.concatenate([q.atoms for q in queries])
    weights = np.concatenate([q.weights for q in queries])
    excluded = np.concatenate([q.excluded for q in queries])
    # Each distinct bitmap once, by address (a version's live items are shared by its queries).
    bitmaps: dict[int, int] = {}
    bitmap_of = np.full(len(queries), -1, dtype=np.int64)
    for i, query in enumerate(queries):
        if query.allowed.shape[0]:
            address = query.allowed.ctypes.data
            bitmap_of[i] = bitmaps.setdefault(address, len(bitmaps))
    addresses = np.array(list(bitmaps), dtype=np.int64)
    after_sums = np.array([q.after_sum for q in queries], dtype=np.float64)
    after_positions = np.array([q.after_position for q in queries], dtype=np.int64)
    positions = np.empty(int(heap_starts[-1]), dtype=np.int64)
    sums = np.empty(int(heap_starts[-1]), dtype=np.float64)
    sizes = np.zeros(len(queries), dtype=np.int64)
    arguments = (
        code_starts, atoms, weights, excluded_starts, excluded, bitmap_of, addresses,
        shards.bitmap_words, shards.bitmap_bases, after_sums, after_positions, heap_starts,
        CHUNK_ITEMS, positions, sums, sizes,
    )  # fmt: skip
    if heap_starts[-1] > 0:
        if batch_runs_serially(queries, shards.n_items):
            segments, _ = shards.plan(1, CHUNK_ITEMS)
            search_shards_many_serial(
                shards.addresses, shards.sizes, shards.n_atoms, shards.offsets, segments,
                *arguments,
            )  # fmt: skip
        else:
            n_groups = GROUPS_PER_THREAD * numba.get_num_threads()
            segments, starts = shards.plan(n_groups, CHUNK_ITEMS)
            with threads.PARALLEL_REGION:
                search_shards_many_parallel(
                    shards.addresses, shards.sizes, shards.n_atoms, shards.offsets, segments,
                    starts, *arguments,
                )  # fmt: skip
    return [
        (positions[h0 : h0 + size].copy(), sums[h0 : h0 + size].copy())
        for h0, size in zip(heap_starts[:-1].tolist(), sizes.tolist(), strict=True)
    ]


def search_top_k(
    projected, atoms, weights, bias, k, excluded=None
) -> tuple[np.ndarray, np.ndarray]:
    """-> (positions int64 shape (m,), scores float64 shape (m,)), best first; ties by lower
    position. m = min(k, N - number of excluded positions). One catalogue array: a
    :class:`ShardSet` of one shard, built for this call.

    Parameters
    ----------
    projected : ndarray or np.memmap of shape (A, N), float32, C-contiguous
        The catalogue, atom-major. Read only; never copied.
    atoms : array-like of shape (nnz,), int
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
    positions, sums = search_shards(ShardSet([projected]), atoms, weights, k, excluded)
    return positions, float(bias) + sums
