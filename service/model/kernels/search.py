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

from service.model import threads
from service.model.kernels.search_batch import (
    search_shards_many_parallel,
    search_shards_many_serial,
)
from service.model.kernels.search_single import search_shards_parallel, search_shards_serial

# Items per chunk: the float64 chunk buffer (32 KiB) stays in L1 while nnz row slices stream in.
CHUNK_ITEMS = 4096

# Groups per thread in the parallel driver: a thread slowed by another process holds up less.
GROUPS_PER_THREAD = 2


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
