"""Catalogue versions: shards, upserts, deletions, compaction, filters and pages, against numpy
references on the same items."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from service.model import InvalidInputError, Predictor
from service.model.errors import VersionConflictError
from service.model.search import (
    CatalogueUpdate,
    SearchIndex,
    SearchQuery,
    catalogue_dir,
    read_catalogue,
    rows_filler,
    search_dir,
)
from service.model.search import store as store_module
from service.model.search import versions as versions_module
from tests.catalogues import attributes_of, rebuild_catalogue

PREVIOUS = Path(__file__).resolve().parents[1] / "fixtures" / "previous-layout"


@pytest.fixture
def model_copy(search_model_dir, tmp_path) -> Path:
    path = tmp_path / "model"
    shutil.copytree(search_model_dir, path)
    return path


def rebuild(path: Path, digits, shard_items: int, attributes=None) -> SearchIndex:
    return SearchIndex.load(rebuild_catalogue(path, digits, shard_items, attributes),
                            Predictor.load(path))  # fmt: skip


def ranked(index: SearchIndex, **query) -> list[tuple[str, float]]:
    return index.run(SearchQuery(**query)).items


def reference(index: SearchIndex, code, mask: np.ndarray, k: int) -> tuple[list, np.ndarray]:
    """Ids of the top k items allowed by ``mask`` (one bool per position), by numpy scores of
    the catalogue's own float32 values, ties by position; and every position's score."""
    catalogue = index.catalogue
    projected = np.asarray(catalogue.projected, dtype=np.float64)
    scores = code.bias + code.weights @ projected[code.atoms]
    candidates = np.flatnonzero(mask)
    order = candidates[np.argsort(-scores[candidates], kind="stable")][:k]
    return catalogue.ids[order].tolist(), scores


# -- shards ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shard_items", [64, 100, 500])
def test_a_sharded_catalogue_ranks_as_one_shard(model_copy, digits, shard_items):
    one = rebuild(model_copy, digits, 10_000)
    queries = [
        {"class_label": "7", "top_k": 20},
        {"code": ([3, 9, 12, 40, 41], [1.0, -0.5, 0.25, 2.0, -1.0]), "top_k": 797},
        {"positives": ["test-3", "test-40"], "top_k": 15},
        {"class_label": "1", "top_k": 5, "exclude": ["test-0", "test-400", "test-796"]},
    ]
    expected = [ranked(one, **q) for q in queries]
    sharded = rebuild(model_copy, digits, shard_items)
    assert len(sharded.catalogue.shards) == -(-797 // shard_items)
    for query, items in zip(queries, expected, strict=True):
        assert ranked(sharded, **query) == items


def test_a_catalogue_written_before_shards_loads_and_takes_updates(tmp_path, digits):
    path = tmp_path / "digits-v1"
    shutil.copytree(PREVIOUS / "digits-v1", path)
    index = SearchIndex.load(path, Predictor.load(path))
    assert index.catalogue.version == 0
    assert len(index.catalogue.shards) == 1
    before = ranked(index, class_label="7", top_k=10)
    new_item = digits.X_train[:1].reshape(1, 8, 8).tolist()
    result = index.upsert(["added-0"], new_item)
    assert (result.version, result.written, result.replaced) == (1, 1, 0)
    updated = SearchIndex.load(path, index.predictor, reuse=index)
    assert updated.catalogue.version == 1
    assert (catalogue_dir(path) / "shards").is_dir()
    assert updated.catalogue.n_items == index.catalogue.n_items + 1
    ranking = [item for item in ranked(updated, class_label="7", top_k=11) if item[0] != "added-0"]
    assert ranking[:10] == before


# -- upserts and deletions ---------------------------------------------------------------------


def test_upserts_add_and_replace_items(model_copy, digits):
    index = rebuild(model_copy, digits, 300)
    images = digits.X_train[:3].reshape(3, 8, 8)
    # test-5 replaced by a training image; two new items.
    result = index.upsert(["test-5", "new-a", "new-b"], images.tolist(),
                          [{"source": "scan"}, None, {"year": 2001}])  # fmt: skip
    assert (result.written, result.replaced, result.n_items) == (3, 1, 799)
    updated = SearchIndex.load(model_copy, index.predictor, reuse=index)
    catalogue = updated.catalogue
    assert catalogue.version == index.catalogue.version + 1
    assert catalogue.n_items == 799
    assert catalogue.n_positions == 800
    # The reused shards are the very objects of the version before.
    assert all(a is b for a, b in zip(catalogue.shards, index.catalogue.shards[:3], strict=False))
    positions = catalogue.positions(["test-5", "new-a", "new-b"])
    assert positions.tolist() == [797, 798, 799]
    expected = index.project_instances(images.tolist())
    np.testing.assert_allclose(catalogue.rows(positions), expected, rtol=1e-6, atol=1e-6)
    assert catalogue.attributes_at(positions) == [{"source": "scan"}, {}, {"year": 2001.0}]
    # The old test-5 (position 5) is never returned.
    everything = [i for i, _ in ranked(updated, code=([0], [1.0]), top_k=1000)]
    assert len(everything) == 799
    assert everything.count("test-5") == 1
    assert "test-5" not in catalogue.ids_at(np.array([p for p in range(797) if p != 5]))
    assert not catalogue.is_live(np.array([5]))[0]


def test_deletions_are_tombstones_applied_in_the_kernel(model_copy, digits):
    index = rebuild(model_copy, digits, 300)
    top = [i for i, _ in ranked(index, class_label="3", top_k=10)]
    result = index.delete([top[0], top[3], "nope"])
    assert (result.deleted, result.missing) == (2, ["nope"])
    updated = SearchIndex.load(model_copy, index.predictor, reuse=index)
    after = [i for i, _ in ranked(updated, class_label="3", top_k=8)]
    assert after == [i for i in top if i not in (top[0], top[3])]
    with pytest.raises(InvalidInputError, match="unknown catalogue id"):
        updated.run(SearchQuery(class_label="3", exclude=[top[0]]))
    # Deleting nothing writes no version.
    assert updated.delete(["nope"]).version == updated.catalogue.version


def test_compaction_drops_tombstones_and_keeps_the_ranking(model_copy, digits):
    index = rebuild(model_copy, digits, 100, attributes_of(797))
    index.delete([f"test-{j}" for j in range(0, 797, 3)])
    for j in range(4):
        index = SearchIndex.load(model_copy, index.predictor, reuse=index)
        index.upsert([f"extra-{j}"], digits.X_train[j : j + 1].reshape(1, 8, 8).tolist(),
                     [{"source": "photo", "year": 2000 + j}])  # fmt: skip
    index = SearchIndex.load(model_copy, index.predictor, reuse=index)
    query = {
        "class_label": "4",
        "top_k": 600,
        "filter": {"must_not": [{"key": "year", "range": {"lt": 1995}}]},
    }
    before = ranked(index, **query)
    assert len(index.catalogue.shards) == 12
    assert index.catalogue.tombstones.size == 266
    with CatalogueUpdate(catalogue_dir(model_copy), search_dir(model_copy), 64,
                         index.catalogue) as update:  # fmt: skip
        result = update.compact(shard_items=250)
    compacted = SearchIndex.load(model_copy, index.predictor, reuse=index)
    assert compacted.catalogue.tombstones.size == 0
    assert result.n_items == compacted.catalogue.n_items == 797 - 266 + 4
    # Runs of small shards merged up to 250 items, in order.
    sizes = [s.n_items for s in compacted.catalogue.shards]
    assert len(sizes) == 3
    assert max(sizes) <= 250
    assert sum(sizes) == 535
    assert ranked(compacted, **query) == before
    # Only this version's files and the previous one's are left.
    names = {p.name for p in (catalogue_dir(model_copy) / "shards").iterdir()}
    assert len(names) <= 12 + 3


def test_compaction_drops_attribute_keys_no_live_item_has(model_copy, digits):
    """Issue 36, defect 4: the catalogue's keys never shrank, whatever was deleted."""
    index = rebuild(model_copy, digits, 300, attributes_of(797))
    images = digits.X_train[:3].reshape(3, 8, 8).tolist()
    index.upsert(["odd-0", "odd-1", "odd-2"], images,
                 [{"colour": "red"}, {"size": 3.0}, {"colour": "blue", "year": 2001}])  # fmt: skip
    index = SearchIndex.load(model_copy, index.predictor, reuse=index)
    assert set(index.catalogue.attributes) == {"colour", "size", "source", "weight", "year"}
    index.delete(["odd-0", "odd-1"])
    index = SearchIndex.load(model_copy, index.predictor, reuse=index)
    with CatalogueUpdate(catalogue_dir(model_copy), search_dir(model_copy), 64,
                         index.catalogue) as update:  # fmt: skip
        update.compact(shard_items=10_000)
    compacted = SearchIndex.load(model_copy, index.predictor, reuse=index)
    # "size" went with odd-1; "colour" stays with odd-2, and its value.
    assert compacted.catalogue.attributes == {
        "colour": "string", "source": "string", "weight": "number", "year": "number"
    }  # fmt: skip
    (position,) = compacted.catalogue.lookup(["odd-2"]).tolist()
    assert compacted.catalogue.attributes_at([position]) == [{"colour": "blue", "year": 2001.0}]


def test_an_abandoned_change_leaves_nothing(model_copy, digits):
    """Issue 36, defect 4: a change whose caller stopped waiting committed all the same."""
    index = rebuild(model_copy, digits, 300)
    gate = store_module.CommitGate()
    assert gate.abandon()
    shards_before = {p.name for p in (catalogue_dir(model_copy) / "shards").iterdir()}
    images = digits.X_train[:1].reshape(1, 8, 8).tolist()
    with pytest.raises(store_module.ChangeAbandonedError):
        index.upsert(["never"], images, gate=gate)
    with pytest.raises(store_module.ChangeAbandonedError):
        index.delete(["test-1"], gate=gate)
    catalogue = read_catalogue(catalogue_dir(model_copy), search_dir(model_copy))
    assert catalogue.version == index.catalogue.version
    assert catalogue.lookup(["never", "test-1"]).tolist()[0] == -1
    assert catalogue.lookup(["test-1"])[0] >= 0
    assert {p.name for p in (catalogue_dir(model_copy) / "shards").iterdir()} == shards_before
    # Once committing, a gate cannot be abandoned: the caller waits for the change.
    committing = store_module.CommitGate()
    assert committing.commit()
    assert not committing.abandon()
    assert index.upsert(["kept"], images, gate=committing).written == 1


def test_writers_queue_on_the_lock_and_lose_nothing(model_copy, digits):
    index = rebuild(model_copy, digits, 1000)
    images = digits.X_train[:40].reshape(40, 8, 8).tolist()
    errors = []

    def write(part: int) -> None:
        try:
            for j in range(part, 40, 4):
                index.upsert([f"w-{j}"], [images[j]])
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=write, args=(p,)) for p in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    catalogue = read_catalogue(catalogue_dir(model_copy), search_dir(model_copy))
    assert catalogue.version == 41
    assert (catalogue.lookup([f"w-{j}" for j in range(40)]) >= 0).all()


def test_a_writer_killed_before_its_manifest_leaves_the_old_version(
    model_copy, digits, monkeypatch
):
    index = rebuild(model_copy, digits, 1000)
    image = digits.X_train[:1].reshape(1, 8, 8).tolist()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # stands for SIGKILL between the new shard and its manifest

    monkeypatch.setattr(versions_module, "replace_manifest", killed)
    with pytest.raises(KeyboardInterrupt):
        index.upsert(["lost"], image)
    monkeypatch.undo()
    shards = catalogue_dir(model_copy) / "shards"
    assert len(list(shards.iterdir())) == 2  # the one served and the orphan
    catalogue = read_catalogue(catalogue_dir(model_copy), search_dir(model_copy))
    assert catalogue.version == 1
    assert catalogue.lookup(["lost"]).tolist() == [-1]
    index.upsert(["kept"], image)  # the next writer removes what the killed one left
    assert len(list(shards.iterdir())) == 2
    catalogue = read_catalogue(catalogue_dir(model_copy), search_dir(model_copy))
    assert catalogue.version == 2
    assert catalogue.lookup(["kept", "lost"]).tolist() == [797, -1]


@pytest.mark.parametrize(
    ("ids", "instances", "message"),
    [
        (["a", ""], 2, r"ids\[1\] is empty"),
        (["a", "a"], 2, "'a' is given twice"),
        (["a"], 2, "1 ids but 2 instances"),
        (["x" * 600], 1, "longer than 512"),
    ],
)
def test_bad_upserts_say_what_is_wrong(model_copy, digits, ids, instances, message):
    index = SearchIndex.load(model_copy, Predictor.load(model_copy))
    images = digits.X_train[:instances].reshape(instances, 8, 8).tolist()
    with pytest.raises(InvalidInputError, match=message):
        index.upsert(ids, images)


def test_bad_upsert_instances_and_attributes(model_copy, digits):
    index = rebuild(model_copy, digits, 1000, attributes_of(797))
    image = digits.X_train[0].reshape(8, 8).tolist()
    with pytest.raises(InvalidInputError, match=r"instances\[1\]"):
        index.upsert(["a", "b"], [image, [[1.0, 2.0]]])
    with pytest.raises(InvalidInputError, match="'year' holds numbers"):
        index.upsert(["a"], [image], [{"year": "1999"}])
    with pytest.raises(InvalidInputError, match="strings or numbers"):
        index.upsert(["a"], [image], [{"tags": ["x"]}])
    with pytest.raises(InvalidInputError, match="must be finite"):
        index.upsert(["a"], [image], [{"weight": float("inf")}])
    assert read_catalogue(catalogue_dir(model_copy), search_dir(model_copy)).version == 1


def test_rows_filler_writes_rows_as_columns():
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    block = np.empty((3, 2), dtype=np.float32)
    rows_filler(rows)(block, 1)
    np.testing.assert_array_equal(block, rows[1:3].T)


# -- filters -----------------------------------------------------------------------------------


def _mask(records, predicate) -> np.ndarray:
    return np.array([bool(predicate(r)) for r in records])


FILTERS = [
    (
        {"must": [{"key": "source", "match": {"value": "scan"}}]},
        lambda r: r.get("source") == "scan",
    ),
    (
        {"must_not": [{"key": "source", "match": {"value": "scan"}}]},
        lambda r: r.get("source") != "scan",
    ),
    (
        {
            "should": [
                {"key": "source", "match": {"any": ["photo", "sketch"]}},
                {"key": "year", "range": {"gte": 2025}},
            ]
        },
        lambda r: r.get("source") in ("photo", "sketch") or r["year"] >= 2025,
    ),
    (
        {
            "must": [
                {"key": "year", "range": {"gt": 1995, "lte": 2000}},
                {"key": "weight", "range": {"lt": 0.5}},
            ]
        },
        lambda r: 1995 < r["year"] <= 2000 and r["weight"] < 0.5,
    ),
    (
        {
            "must": [
                {"must_not": [{"key": "source", "match": {"value": "photo"}}]},
                {"key": "year", "match": {"any": [1999, 2004, 2011]}},
            ]
        },
        lambda r: r.get("source") != "photo" and r["year"] in (1999, 2004, 2011),
    ),
    # Matches 2 items: top_k 20 still returns both, never a post-filtered remainder.
    ({"must": [{"key": "weight", "range": {"gt": 2.6}}]}, lambda r: r["weight"] > 2.6),
    ({"must": [{"key": "source", "match": {"value": "none-such"}}]}, lambda r: False),
]


@pytest.mark.parametrize(("query_filter", "predicate"), FILTERS)
@pytest.mark.parametrize("shard_items", [1000, 128])
def test_filters_are_exact_against_numpy(model_copy, digits, query_filter, predicate, shard_items):
    records = attributes_of(797, seed=1)
    index = rebuild(model_copy, digits, shard_items, records)
    index.delete(["test-10", "test-11"])
    index = SearchIndex.load(model_copy, index.predictor, reuse=index)
    mask = _mask(records, predicate)
    mask[[10, 11]] = False  # deleted
    for code_query in ({"class_label": "6"}, {"code": ([5, 17, 33], [1.0, -2.0, 0.5])}):
        for k in (1, 20, 797):
            result = index.run(SearchQuery(**code_query, top_k=k, filter=query_filter))
            expected, scores = reference(index, result.code, mask, k)
            assert len(result.items) == min(k, int(mask.sum()))
            assert [i for i, _ in result.items] == expected
            positions = index.catalogue.positions(expected)
            np.testing.assert_allclose([s for _, s in result.items], scores[positions],
                                       rtol=1e-12, atol=1e-12)  # fmt: skip


@pytest.mark.parametrize(
    ("query_filter", "message"),
    [
        ({"must": [{"key": "colour", "match": {"value": "red"}}]}, "unknown attribute 'colour'"),
        ({"must": [{"key": "year", "match": {"value": "1999"}}]}, "holds numbers, not '1999'"),
        ({"must": [{"key": "source", "range": {"gt": 1}}]}, "range needs a number attribute"),
        ({"must": [{"key": "source", "match": {"any": ["scan", 3]}}]}, "mixes strings and numbers"),
        ({"must": [{"key": "year"}]}, "one of match or range"),
        ({"must": [{"key": "year", "range": {"above": 3}}]}, "gt, gte, lt and lte"),
        ({"must": [{"key": "year", "match": {"value": True}}]}, "strings or numbers"),
        ({"filter": []}, "unknown field(s) 'filter'"),
        ({"must": "year"}, "must be a list of conditions"),
        ({"must": [{"must": [{"must": [{"must": [{"must": []}]}]}]}]}, "nest at most 4 deep"),
        ({"should": [{"key": "year", "range": {"gt": j}} for j in range(65)]}, "the limit is 64"),
    ],
)
def test_bad_filters_say_what_is_wrong(model_copy, digits, query_filter, message):
    index = rebuild(model_copy, digits, 1000, attributes_of(797))
    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        index.run(SearchQuery(class_label="1", filter=query_filter))


# -- pages -------------------------------------------------------------------------------------


@pytest.mark.parametrize("shard_items", [1000, 90])
def test_pages_cover_the_ranking_without_gaps_or_repeats(model_copy, digits, shard_items):
    index = rebuild(model_copy, digits, shard_items, attributes_of(797))
    query = {
        "code": ([2, 8], [1.0, 1.0]),
        "filter": {"must_not": [{"key": "year", "range": {"lt": 1993}}]},
    }
    full = ranked(index, **query, top_k=797)
    by_cursor, cursor = [], None
    while True:
        result = index.run(SearchQuery(**query, top_k=50, cursor=cursor))
        by_cursor += result.items
        cursor = result.next_cursor
        if cursor is None:
            break
    assert by_cursor == full
    by_offset = []
    for offset in range(0, 800, 64):
        by_offset += ranked(index, **query, top_k=64, offset=offset)
    assert by_offset == full


def test_a_cursor_of_a_replaced_version_is_a_conflict(model_copy, digits):
    index = rebuild(model_copy, digits, 1000)
    first = index.run(SearchQuery(class_label="2", top_k=5))
    assert first.next_cursor is not None
    index.upsert(["late"], digits.X_train[:1].reshape(1, 8, 8).tolist())
    updated = SearchIndex.load(model_copy, index.predictor, reuse=index)
    with pytest.raises(
        VersionConflictError, match="version 1, which is no longer served: version 2"
    ):
        updated.run(SearchQuery(class_label="2", top_k=5, cursor=first.next_cursor))
    with pytest.raises(InvalidInputError, match="belongs to another query"):
        index.run(SearchQuery(class_label="3", top_k=5, cursor=first.next_cursor))
    for bad in ("nonsense", "e30", "x" * 2000):
        with pytest.raises(InvalidInputError, match="not a cursor of this service"):
            SearchQuery(class_label="2", cursor=bad)
