"""search_top_k against an independent numpy reference, on both drivers."""

import numpy as np
import pytest

from service.model import threads
from service.model.kernels import search as search_kernels
from service.model.kernels.search import ShardSet, search_shards, search_top_k
from service.model.kernels.search_bitmap import count_allowed
from service.model.kernels.search_scan import accumulate_chunk, accumulate_picked
from service.model.kernels.search_single import search_shards_parallel, search_shards_serial

SMALL_CHUNK = 64  # so that a catalogue of a thousand items spans many chunks


def reference(projected, atoms, weights, bias, k, excluded=()):
    """Top k by (-score, position) with numpy: a stable argsort of every score."""
    scores = bias + weights @ projected[atoms].astype(np.float64)
    keep = np.ones(projected.shape[1], dtype=bool)
    keep[np.asarray(excluded, dtype=np.int64)] = False
    candidates = np.flatnonzero(keep)
    order = candidates[np.argsort(-scores[candidates], kind="stable")][:k]
    return order, scores[order]


def assert_matches(result, expected, tolerance=1e-12):
    positions, scores = result
    expected_positions, expected_scores = expected
    assert positions.dtype == np.int64
    assert scores.dtype == np.float64
    np.testing.assert_array_equal(positions, expected_positions)
    scale = max(1.0, float(np.abs(expected_scores).max(initial=0.0)))
    np.testing.assert_allclose(scores, expected_scores, rtol=tolerance, atol=tolerance * scale)


@pytest.fixture(params=["serial", "parallel"])
def mode(request, monkeypatch):
    """Force search_top_k onto one driver, with small chunks."""
    threshold = 0 if request.param == "parallel" else 10**18
    monkeypatch.setattr(threads, "SEARCH_PARALLEL_MIN_ENTRIES", threshold)
    monkeypatch.setattr(search_kernels, "CHUNK_ITEMS", SMALL_CHUNK)
    return request.param


def random_catalogue(seed=0, n_atoms=12, n_items=1000):
    rng = np.random.default_rng(seed)
    projected = rng.standard_normal((n_atoms, n_items)).astype(np.float32)
    atoms = rng.choice(n_atoms, size=4, replace=False).astype(np.int64)
    weights = rng.standard_normal(4)
    return projected, atoms, weights


def test_hand_computed_scores(mode):
    projected = np.array([[1, 5, 3, 5], [0, 1, 2, -1], [9, 9, 9, 9]], dtype=np.float32)
    # scores: 0.5 + (1, 5, 3, 5) - 2 (0, 1, 2, -1) = (1.5, 3.5, -0.5, 7.5)
    positions, scores = search_top_k(projected, [0, 1], [1.0, -2.0], 0.5, 3)
    np.testing.assert_array_equal(positions, [3, 1, 0])
    np.testing.assert_array_equal(scores, [7.5, 3.5, 1.5])
    assert projected.flags.writeable  # the caller's array is left as it was
    assert projected[0, 1] == 5


@pytest.mark.parametrize("k", [1, 10, 999, 1000, 1001, 5000])
def test_matches_reference(mode, k):
    projected, atoms, weights = random_catalogue()
    result = search_top_k(projected, atoms, weights, 0.25, k)
    assert result[0].shape == (min(k, 1000),)
    assert_matches(result, reference(projected, atoms, weights, 0.25, k))


def test_k_equal_n_is_a_full_ranking(mode):
    projected, atoms, weights = random_catalogue(seed=1, n_items=300)
    positions, scores = search_top_k(projected, atoms, weights, -1.0, 300)
    assert sorted(positions.tolist()) == list(range(300))
    assert np.all(np.diff(scores) <= 0)
    assert_matches((positions, scores), reference(projected, atoms, weights, -1.0, 300))


def test_negative_weights(mode):
    projected, atoms, _ = random_catalogue(seed=2)
    weights = -np.array([0.5, 1.5, 2.0, 0.25])
    result = search_top_k(projected, atoms, weights, 3.0, 25)
    assert_matches(result, reference(projected, atoms, weights, 3.0, 25))
    # the best item under the negated (positive) weights is the worst under the negative ones
    worst = np.argmin(weights @ projected[atoms].astype(np.float64))
    assert search_top_k(projected, atoms, -weights, 0.0, 1)[0][0] == worst


def test_no_atoms_scores_the_bias_and_keeps_the_lowest_positions(mode):
    projected, _, _ = random_catalogue()
    positions, scores = search_top_k(projected, np.empty(0, np.int64), np.empty(0), 1.75, 5)
    np.testing.assert_array_equal(positions, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(scores, [1.75] * 5)
    positions, scores = search_top_k(projected, [], [], -2.0, 4, excluded=[0, 2, 3, 64, 65])
    np.testing.assert_array_equal(positions, [1, 4, 5, 6])
    np.testing.assert_array_equal(scores, [-2.0] * 4)


def test_duplicated_scores_rank_by_position(mode):
    rng = np.random.default_rng(3)
    # small integers: every score is exact, and many items tie (also across chunks and threads)
    projected = rng.integers(-2, 3, size=(6, 1000)).astype(np.float32)
    atoms = np.array([1, 4, 5], dtype=np.int64)
    weights = np.array([1.0, -2.0, 3.0])
    for k in (1, 7, 150, 1000):
        expected = reference(projected, atoms, weights, 0.0, k)
        assert_matches(search_top_k(projected, atoms, weights, 0.0, k), expected, tolerance=0.0)
    positions, scores = search_top_k(projected, atoms, weights, 0.0, 1000)
    # the top score, 12, is held by several items, listed by increasing position
    top = np.flatnonzero(weights @ projected[atoms] == 12.0)
    assert top.size > 1
    np.testing.assert_array_equal(positions[: top.size], top)
    np.testing.assert_array_equal(scores[: top.size], 12.0)


def test_exclusions_in_several_chunks(mode):
    projected, atoms, weights = random_catalogue(seed=4)
    best = reference(projected, atoms, weights, 0.0, 5)[0]
    excluded = np.unique(np.concatenate([best, [0, 63, 64, 127, 500, 999]]))
    positions, _ = result = search_top_k(projected, atoms, weights, 0.0, 20, excluded=excluded)
    assert not np.isin(positions, excluded).any()
    assert_matches(result, reference(projected, atoms, weights, 0.0, 20, excluded))


def test_excluding_everything_or_nearly_everything(mode):
    projected, atoms, weights = random_catalogue(seed=5, n_items=200)
    positions, scores = search_top_k(projected, atoms, weights, 0.0, 10, excluded=np.arange(200))
    assert positions.shape == (0,)
    assert scores.shape == (0,)
    assert positions.dtype == np.int64
    assert scores.dtype == np.float64
    kept = [3, 70, 199]
    excluded = np.setdiff1d(np.arange(200), kept)
    result = search_top_k(projected, atoms, weights, 0.0, 10, excluded=excluded)
    assert sorted(result[0].tolist()) == kept
    assert_matches(result, reference(projected, atoms, weights, 0.0, 10, excluded))


def test_read_only_memmap_catalogue(mode, tmp_path):
    projected, atoms, weights = random_catalogue(seed=6)
    np.save(tmp_path / "projected.npy", projected)
    mapped = np.load(tmp_path / "projected.npy", mmap_mode="r")
    assert isinstance(mapped, np.memmap)
    assert not mapped.flags.writeable
    result = search_top_k(mapped, atoms, weights, 0.5, 30, excluded=[1, 2, 700])
    assert_matches(result, reference(projected, atoms, weights, 0.5, 30, [1, 2, 700]))


@pytest.mark.parametrize("n_groups", [1, 2, 3, 7])
def test_drivers_directly(n_groups):
    rng = np.random.default_rng(7)
    # ties across group boundaries: few distinct values
    projected = rng.integers(0, 4, size=(5, 701)).astype(np.float32)
    atoms = np.array([0, 2, 3], dtype=np.int64)
    weights = np.array([1.0, 0.5, 0.25])
    excluded = np.array([0, 5, 100, 350, 351, 700], dtype=np.int64)
    expected = reference(projected, atoms, weights, 0.0, 40, excluded)
    shards = ShardSet(split(projected, [300, 1]))
    no_filter = np.empty(0, dtype=np.uint64)
    for chunk in (1, 13, 1000):
        segments, starts = shards.plan(n_groups, chunk)
        positions, sums = np.empty(40, np.int64), np.empty(40)
        size = search_shards_parallel(
            shards.addresses, shards.sizes, shards.n_atoms, shards.offsets, segments, starts,
            atoms, weights, excluded,
            no_filter, shards.bitmap_bases, np.inf, -1, chunk, positions, sums,
        )  # fmt: skip
        assert size == 40
        assert_matches((positions, sums), expected, tolerance=0.0)
        positions, sums = np.empty(40, np.int64), np.empty(40)
        size = search_shards_serial(
            shards.addresses, shards.sizes, shards.n_atoms, shards.offsets, segments, atoms,
            weights, excluded, no_filter,
            shards.bitmap_bases, np.inf, -1, chunk, positions, sums,
        )  # fmt: skip
        assert size == 40
        assert_matches((positions, sums), expected, tolerance=0.0)


def split(projected, sizes):
    """Shards of ``projected`` of the given sizes (the rest in a last one)."""
    cuts = np.cumsum(sizes)
    return [np.ascontiguousarray(part) for part in np.split(projected, cuts, axis=1)]


@pytest.mark.parametrize("sizes", [[1], [64, 64], [100, 1, 299], [999], [130, 130, 130, 130]])
def test_shards_rank_as_one_catalogue(mode, sizes):
    rng = np.random.default_rng(9)
    # few distinct values: ties everywhere, across shards too
    projected = rng.integers(-3, 4, size=(6, 1000)).astype(np.float32)
    atoms, weights = np.array([5, 0, 2], dtype=np.int64), np.array([1.0, -0.5, 2.0])
    shards = ShardSet(split(projected, sizes))
    excluded = np.array([0, 99, 100, 101, 640, 999], dtype=np.int64)
    for k in (1, 30, 1000):
        one = search_top_k(projected, atoms, weights, 0.0, k, excluded)
        positions, sums = search_shards(shards, atoms, weights, k, excluded)
        np.testing.assert_array_equal(positions, one[0])
        np.testing.assert_array_equal(sums, one[1])


def test_picked_sums_equal_chunk_sums():
    # The two paths a filtered search scores items by: the same sums, bit for bit.
    rng = np.random.default_rng(10)
    projected = rng.standard_normal((40, 3000)).astype(np.float32)
    for nnz in range(0, 12):
        atoms = rng.choice(40, size=nnz, replace=False).astype(np.int64)
        weights = rng.standard_normal(nnz)
        buf = np.empty(3000)
        accumulate_chunk(projected, atoms, weights, 0, 3000, buf)
        picked = np.sort(rng.choice(3000, size=700, replace=False)).astype(np.int64)
        sums = np.empty(700)
        accumulate_picked(projected, atoms, weights, picked, 700, sums)
        np.testing.assert_array_equal(sums, buf[picked])


def bitmap_of(shards: ShardSet, mask: np.ndarray) -> np.ndarray:
    """``mask`` (one bool per global position) in the kernels' bitmap layout."""
    bitmap = shards.empty_bitmap()
    for s, base in enumerate(shards.bitmap_bases):
        part = mask[shards.offsets[s] : shards.offsets[s + 1]]
        words = np.packbits(part, bitorder="little")
        words = np.pad(words, (0, -len(words) % 8)).view(np.uint64)
        bitmap[base : base + len(words)] = words
    return bitmap


def test_count_allowed_counts_bits_in_a_range():
    rng = np.random.default_rng(11)
    mask = rng.random(1000) < 0.3
    shards = ShardSet([np.zeros((1, 1000), dtype=np.float32)])
    bitmap = bitmap_of(shards, mask)
    for lo, hi in [(0, 1000), (64, 65), (128, 1000), (0, 63), (960, 1000), (64, 64), (3, 70),
                   (13, 26), (65, 127), (999, 1000)]:  # fmt: skip
        assert count_allowed(bitmap, 0, lo, hi) == mask[lo:hi].sum()


@pytest.mark.parametrize("chunk", [64, 100])
@pytest.mark.parametrize("density", [0.0, 0.002, 0.05, 0.3, 1.0])
def test_filtered_search_is_exact_among_the_allowed(mode, density, chunk, monkeypatch):
    monkeypatch.setattr(search_kernels, "CHUNK_ITEMS", chunk)  # chunks off the words too
    rng = np.random.default_rng(12)
    projected = rng.standard_normal((8, 3000)).astype(np.float32)
    atoms, weights = np.array([1, 6, 3, 0, 7], dtype=np.int64), rng.standard_normal(5)
    mask = rng.random(3000) < density
    mask[2048:2200] = density > 0.2  # a dense run beside sparse ones
    shards = ShardSet(split(projected, [700, 1300]))
    excluded = np.unique(rng.choice(3000, 50, replace=False)).astype(np.int64)
    scores = weights @ projected[atoms].astype(np.float64)
    keep = mask.copy()
    keep[excluded] = False
    candidates = np.flatnonzero(keep)
    for k in (1, 20, 3000):
        positions, sums = search_shards(
            shards, atoms, weights, k, excluded, bitmap_of(shards, mask)
        )
        expected = candidates[np.argsort(-scores[candidates], kind="stable")][:k]
        assert len(positions) == min(k, candidates.size)  # top k among the allowed, never fewer
        np.testing.assert_array_equal(positions, expected)
        np.testing.assert_allclose(sums, scores[expected], rtol=1e-12, atol=1e-12)


def test_pages_after_a_cursor_cover_the_ranking(mode):
    rng = np.random.default_rng(13)
    projected = rng.integers(-2, 3, size=(4, 900)).astype(np.float32)  # many ties
    atoms, weights = np.array([0, 1, 3], dtype=np.int64), np.array([1.0, 2.0, -1.0])
    shards = ShardSet(split(projected, [300, 300]))
    mask = rng.random(900) < 0.5
    for allowed in (None, bitmap_of(shards, mask)):
        full = search_shards(shards, atoms, weights, 900, allowed=allowed)
        pages, after = [], None
        while True:
            positions, sums = search_shards(
                shards, atoms, weights, 37, allowed=allowed, after=after
            )
            if not len(positions):
                break
            pages.append(positions)
            after = (sums[-1], positions[-1])
        np.testing.assert_array_equal(np.concatenate(pages), full[0])


@pytest.mark.parametrize("chunk", [64, 100])
def test_a_batch_ranks_every_query_exactly_as_alone(mode, chunk, monkeypatch):
    """Codes sharing atoms and not, filters shared and not, exclusions, cursors, a k past the
    items left, no atoms at all: one pass answers each query bit for bit as it answers alone,
    and a reference by numpy."""
    monkeypatch.setattr(search_kernels, "CHUNK_ITEMS", chunk)
    rng = np.random.default_rng(15)
    projected = rng.integers(-3, 4, size=(10, 2500)).astype(np.float32)  # ties everywhere
    shards = ShardSet(split(projected, [700, 1, 1100]))
    masks = [rng.random(2500) < 0.4, rng.random(2500) < 0.01, np.zeros(2500, bool)]
    bitmaps = [bitmap_of(shards, mask) for mask in masks]
    shared = bitmaps[0]
    specs = [
        ([1, 4, 7], [1.0, -0.5, 2.0], 30, None, None, None),
        ([4, 7, 1], [0.25, 1.0, -1.0], 2500, None, shared, None),
        ([9, 0, 4, 7, 2], rng.standard_normal(5), 17, np.arange(0, 2500, 7), shared, None),
        ([], [], 12, np.array([0, 1, 2]), None, None),
        ([3], [1.0], 40, None, bitmaps[1], None),
        ([5, 6], [1.0, 1.0], 10, None, bitmaps[2], None),  # nothing allowed
        ([2, 8], [-1.0, 0.5], 25, None, None, (1.0, 1200)),  # after a cursor
        ([1, 4], [1.0, 1.0], 5000, np.arange(2500), None, None),  # everything excluded
    ]
    queries, alone = [], []
    for atoms, weights, k, excluded, allowed, after in specs:
        queries.append(search_kernels.kernel_query(
            shards, atoms, weights, k, excluded, allowed, after
        ))  # fmt: skip
        alone.append(search_shards(shards, atoms, weights, k, excluded, allowed, after))
    batch = search_kernels.search_shards_many(shards, queries)
    assert len(batch) == len(specs)
    for (positions, sums), (expected, expected_sums), spec in zip(batch, alone, specs, strict=True):
        np.testing.assert_array_equal(positions, expected)
        np.testing.assert_array_equal(sums, expected_sums)  # the same sums, bit for bit
        atoms, weights, k, excluded, allowed, after = spec
        scores = np.asarray(weights) @ projected[np.asarray(atoms, dtype=np.int64)].astype(
            np.float64
        )
        keep = np.ones(2500, bool) if allowed is None else masks[
            next(i for i, b in enumerate(bitmaps) if b is allowed)]  # fmt: skip
        keep = keep.copy()
        if excluded is not None:
            keep[excluded] = False
        if after is not None:
            keep &= (scores < after[0]) | ((scores == after[0]) & (np.arange(2500) > after[1]))
        candidates = np.flatnonzero(keep)
        order = candidates[np.argsort(-scores[candidates], kind="stable")][:k]
        np.testing.assert_array_equal(positions, order)
    assert search_kernels.search_shards_many(shards, []) == []


def test_a_batch_sums_floats_as_each_query_alone(mode):
    """Real-valued rows, codes of 1 to 11 atoms (every pass of the chunk kernel: 4, 2, 1 rows):
    the batch's scores are the single queries' bit for bit, whatever the rounding."""
    rng = np.random.default_rng(16)
    projected = rng.standard_normal((32, 3000)).astype(np.float32)
    shards = ShardSet(split(projected, [1000, 1000]))
    scales = 10.0 ** rng.integers(-3, 3, size=11)
    codes = [(rng.choice(32, n, replace=False), rng.standard_normal(n) * scales[n - 1])
             for n in range(1, 12)]  # fmt: skip
    batch = search_kernels.search_shards_many(
        shards, [search_kernels.kernel_query(shards, a, w, 50) for a, w in codes]
    )
    for (positions, sums), (atoms, weights) in zip(batch, codes, strict=True):
        expected, expected_sums = search_shards(shards, atoms, weights, 50)
        np.testing.assert_array_equal(positions, expected)
        np.testing.assert_array_equal(sums, expected_sums)


def test_a_shard_set_may_start_past_zero():
    rng = np.random.default_rng(14)
    projected = rng.standard_normal((3, 200)).astype(np.float32)
    shards = ShardSet([projected], first_position=5000)
    positions, _ = search_shards(
        shards, [0], [1.0], 3, excluded=[5000 + int(np.argmax(projected[0]))]
    )
    expected = 5000 + np.argsort(-projected[0], kind="stable")[1:4]
    np.testing.assert_array_equal(positions, expected)
    with pytest.raises(ValueError, match=r"5000\.\.5199"):
        search_shards(shards, [0], [1.0], 3, excluded=[3])


def test_default_dispatch_on_a_large_catalogue():
    # at the real constants: a catalogue over the threshold takes the parallel driver
    n_items = threads.SEARCH_PARALLEL_MIN_ENTRIES // 4 + 3 * search_kernels.CHUNK_ITEMS + 5
    rng = np.random.default_rng(8)
    projected = rng.standard_normal((8, n_items), dtype=np.float32)
    atoms = np.array([7, 0, 3, 5], dtype=np.int64)
    weights = np.array([0.3, -1.2, 0.8, 2.0])
    excluded = np.array([1, search_kernels.CHUNK_ITEMS, n_items - 1], dtype=np.int64)
    result = search_top_k(projected, atoms, weights, 0.0, 100, excluded=excluded)
    assert_matches(result, reference(projected, atoms, weights, 0.0, 100, excluded))


@pytest.mark.parametrize("k", [0, -1, 2.5])
def test_invalid_k(k):
    projected, atoms, weights = random_catalogue()
    with pytest.raises(ValueError, match="k must be"):
        search_top_k(projected, atoms, weights, 0.0, k)


def test_invalid_catalogue_and_exclusions():
    projected, atoms, weights = random_catalogue()
    with pytest.raises(ValueError, match="float32"):
        search_top_k(projected.astype(np.float64), atoms, weights, 0.0, 3)
    with pytest.raises(ValueError, match="C-contiguous"):
        search_top_k(np.asfortranarray(projected), atoms, weights, 0.0, 3)
    with pytest.raises(ValueError, match="one length"):
        search_top_k(projected, atoms, weights[:2], 0.0, 3)
    for bad_atom in (-1, 12):
        with pytest.raises(ValueError, match=r"atoms must be in 0\.\.11"):
            search_top_k(projected, [0, bad_atom], [1.0, 1.0], 0.0, 3)
    for excluded in ([5, 3], [2, 2], [-1], [1000]):
        with pytest.raises(ValueError, match="sorted unique"):
            search_top_k(projected, atoms, weights, 0.0, 3, excluded=excluded)
