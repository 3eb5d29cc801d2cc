"""The catalogue as a store people operate, in process: batches of searches answered as each
query alone, counts and facets against a brute-force count of the live items, snapshots and
their restore (a damaged, partial or foreign snapshot refused, naming the file)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from service.model import InvalidInputError, Predictor
from service.model.errors import (
    ArtifactError,
    ArtifactIntegrityError,
    NotFoundError,
    SnapshotRefusedError,
    VersionConflictError,
)
from service.model.search import SearchIndex, SearchQuery, catalogue_dir, search_dir
from service.model.search.copies import Progress
from service.model.search.snapshots import (
    SNAPSHOT_MANIFEST,
    list_snapshots,
    read_snapshot,
    remove_unfinished,
    restore_model_catalogue,
    snapshot_in,
    snapshot_model_catalogue,
)
from tests.catalogues import SOURCES, attributes_of, rebuild_catalogue
from training.cli.main import main

SCANS = {"must": [{"key": "source", "match": {"value": "scan"}}]}
RECENT = {"must": [{"key": "year", "range": {"gte": 2015}}], "must_not": [SCANS]}


@pytest.fixture(scope="module")
def built(search_model_dir, digits, tmp_path_factory) -> Path:
    """The digits model with a catalogue of 3 shards (300, 300, 197) with attributes, then an
    upsert (new-0, new-1, test-5 replaced) and a deletion (test-1, test-400): tombstones."""
    path = tmp_path_factory.mktemp("operations") / "digits"
    shutil.copytree(search_model_dir, path)
    rebuild_catalogue(path, digits, 300, attributes_of(797))
    index = SearchIndex.load(path, Predictor.load(path))
    images = digits.X_train[:3].reshape(3, 8, 8).tolist()
    fresh = [{"source": "scan", "year": 2024}, {"year": 1999}, {"source": "photo"}]
    index.upsert(["new-0", "new-1", "test-5"], images, fresh)
    index.delete(["test-1", "test-400"])
    return path


@pytest.fixture
def model(built, tmp_path) -> Path:
    path = tmp_path / "digits"
    shutil.copytree(built, path)
    return path


def load(path: Path) -> SearchIndex:
    return SearchIndex.load(path, Predictor.load(path))


def live_records() -> dict[str, dict]:
    """Each live item's attributes, as ``built`` left them."""
    records = {f"test-{j}": record for j, record in enumerate(attributes_of(797))}
    records["new-0"] = {"source": "scan", "year": 2024}
    records["new-1"] = {"year": 1999}
    records["test-5"] = {"source": "photo"}
    for gone in ("test-1", "test-400"):
        del records[gone]
    return records


def live_ids(index: SearchIndex) -> list[str]:
    catalogue = index.catalogue
    alive = catalogue.is_live(np.arange(catalogue.n_positions))
    return sorted(np.asarray(catalogue.ids)[alive].tolist())


# -- batches -----------------------------------------------------------------------------------


def queries_of_every_kind(index: SearchIndex) -> list[SearchQuery]:
    cursor = index.run(SearchQuery(class_label="3", top_k=40, filter=RECENT)).next_cursor
    return [
        SearchQuery(class_label="7", top_k=20),
        SearchQuery(code=([3, 11, 50], [1.0, -0.5, 0.25]), bias=0.5, top_k=800),
        SearchQuery(positives=["test-3", "test-40"], top_k=25),
        SearchQuery(class_label="1", top_k=30, exclude=["test-0", "test-301", "new-1"]),
        SearchQuery(class_label="9", top_k=15, filter=SCANS),
        SearchQuery(class_label="2", top_k=10, offset=290),
        SearchQuery(class_label="3", top_k=40, filter=RECENT, cursor=cursor),
        SearchQuery(class_label="4", top_k=5, strongest_atoms=2, sparsity=3),
        SearchQuery(code=([7], [1.0]), top_k=10, filter=SCANS),
    ]


def test_a_batch_answers_each_query_as_it_does_alone(built):
    index = load(built)
    queries = queries_of_every_kind(index)
    alone = [index.run(query) for query in queries]
    batch = index.run_many(queries)
    assert len(batch) == len(queries)
    for query, got, expected in zip(queries, batch, alone, strict=True):
        assert got.items == expected.items, query  # ids and scores, exactly
        assert got.next_cursor == expected.next_cursor
        assert got.strongest_atoms == expected.strongest_atoms
        assert (got.kind, got.catalogue_version) == (expected.kind, expected.catalogue_version)
        np.testing.assert_array_equal(got.code.atoms, expected.code.atoms)
    # The code query of every item ranks every live item once, the removed ones never.
    assert sorted(i for i, _ in batch[1].items) == live_ids(index)


def test_one_bad_query_fails_the_batch_naming_it(built, model):
    index = load(built)
    good = SearchQuery(class_label="7", top_k=5)
    cases = [
        (SearchQuery(class_label="nope"), InvalidInputError, "searches[1]: unknown class"),
        (SearchQuery(code=([999], [1.0])), InvalidInputError, "searches[1]: code index 999"),
        (SearchQuery(class_label="7", filter={"must": [{"key": "colour", "match": {"value": 1}}]}),
         InvalidInputError, "searches[1]: filter.must[0]: unknown attribute 'colour'"),
        (SearchQuery(class_label="7", exclude=["missing"]), InvalidInputError, "searches[1]"),
    ]  # fmt: skip
    for bad, error, message in cases:
        with pytest.raises(error, match=message.replace("[", r"\[").replace("]", r"\]")):
            index.run_many([good, bad, good])
    # A cursor of a version no longer served: the whole batch is a conflict, named.
    older = load(model)
    cursor = older.run(SearchQuery(class_label="7", top_k=3)).next_cursor
    older.delete(["test-2"])
    newer = load(model)
    with pytest.raises(VersionConflictError, match=r"searches\[0\]: the cursor is for"):
        newer.run_many([SearchQuery(class_label="7", top_k=3, cursor=cursor), good])


# -- counts and facets -------------------------------------------------------------------------


def holds(record: dict, query_filter: dict | None) -> bool:
    """Brute force of the filters used here: must / must_not of value and range conditions."""
    if query_filter is None:
        return True

    def condition(clause: dict) -> bool:
        if "must" in clause or "must_not" in clause:
            return holds(record, clause)
        value = record.get(clause["key"])
        if value is None:
            return False
        if "match" in clause:
            return value == clause["match"]["value"]
        bounds = clause["range"]
        return all(
            {"gt": value > b, "gte": value >= b, "lt": value < b, "lte": value <= b}[name]
            for name, b in bounds.items()
        )

    return all(map(condition, query_filter.get("must", []))) and not any(
        map(condition, query_filter.get("must_not", []))
    )


FILTERS = [None, SCANS, RECENT, {"must": [{"key": "year", "range": {"lt": 1991}}]},
           {"must": [{"key": "source", "match": {"value": "nothing"}}]}]  # fmt: skip


def brute_facet(records: dict[str, dict], key: str, query_filter) -> dict:
    counts: dict = {}
    for record in records.values():
        if holds(record, query_filter) and record.get(key) is not None:
            value = record[key]
            value = float(value) if isinstance(value, int | float) else value
            counts[value] = counts.get(value, 0) + 1
    return counts


def test_count_and_facet_equal_a_brute_force_count_of_the_live_items(built):
    from service.model.search import Filter

    catalogue = load(built).catalogue
    records = live_records()
    assert catalogue.n_items == len(records)
    for document in FILTERS:
        query_filter = None if document is None else Filter.parse(document)
        expected = sum(holds(record, document) for record in records.values())
        assert catalogue.count(query_filter) == expected, document
        for key in ("source", "year"):
            counts = brute_facet(records, key, document)
            ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
            for limit in (1, 3, 1000):
                facet = catalogue.facet(key, query_filter, limit)
                assert list(zip(facet.values, facet.counts, strict=True)) == ranked[:limit]
                assert facet.n_values == len(counts)
    assert set(catalogue.facet("source").values) == set(SOURCES)
    with pytest.raises(InvalidInputError, match="unknown attribute 'colour'"):
        catalogue.facet("colour")
    with pytest.raises(InvalidInputError, match="limit must be at least 1"):
        catalogue.facet("year", None, 0)


# -- snapshots ---------------------------------------------------------------------------------


def test_a_snapshot_restores_exactly_its_version(model, tmp_path):
    index = load(model)
    before, version = live_ids(index), index.catalogue.version
    ranking = index.run(SearchQuery(class_label="6", top_k=50)).items
    taken = snapshot_model_catalogue(model, tmp_path / "snap")
    assert (taken.catalogue_version, taken.n_items, taken.n_shards) == (version, len(before), 4)
    document = json.loads((tmp_path / "snap" / SNAPSHOT_MANIFEST).read_text())
    assert len(document["files"]) == len(taken.checksums)
    # The catalogue moves on: an item deleted, one added, then compacted (shards rewritten).
    index.delete(["test-7"])
    load(model).upsert(["later"], [np.zeros((8, 8)).tolist()])
    main(["index", "--model", str(model), "--compact", "--quiet"])
    assert live_ids(load(model)) != before
    snapshot, result = restore_model_catalogue(tmp_path / "snap", model)
    assert snapshot.catalogue_version == version
    assert result.version > version + 2  # a new version: servers see an ordinary change
    restored = load(model)
    assert live_ids(restored) == before
    assert restored.run(SearchQuery(class_label="6", top_k=50)).items == ranking


def test_a_restore_keeps_intact_shards_and_replaces_damaged_ones(model, tmp_path):
    snapshot_model_catalogue(model, tmp_path / "snap")
    shards = sorted((catalogue_dir(model) / "shards").iterdir())
    inodes = {shard.name: shard.stat().st_ino for shard in shards}
    damaged = shards[1] / "projected.npy"
    data = bytearray(damaged.read_bytes())
    data[-3] ^= 0xFF
    os.chmod(damaged, 0o644)
    damaged.write_bytes(bytes(data))  # rewritten in place: the version can no longer load
    with pytest.raises(ArtifactIntegrityError, match="projected"):
        load(model)
    _, result = restore_model_catalogue(tmp_path / "snap", model)
    restored = load(model)  # every checksum verified as it loads
    assert restored.catalogue.version == result.version
    kept = {
        shard.name: shard.stat().st_ino for shard in (catalogue_dir(model) / "shards").iterdir()
    }
    assert kept[shards[0].name] == inodes[shards[0].name]  # intact: not copied again
    assert kept[shards[1].name] != inodes[shards[1].name]  # damaged: replaced by the copy


def test_a_restore_into_a_model_without_a_catalogue_keeps_the_version_number(model, tmp_path):
    version = load(model).catalogue.version
    snapshot_model_catalogue(model, tmp_path / "snap")
    fresh = tmp_path / "fresh"
    shutil.copytree(model, fresh, ignore=shutil.ignore_patterns("catalogue"))
    assert main(["index", "--model", str(fresh), "--restore", str(tmp_path / "snap")]) == 0
    restored = load(fresh)
    assert restored.catalogue.version == version
    assert live_ids(restored) == live_ids(load(model))


def _flip_one_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0x01
    os.chmod(file, 0o644)
    file.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("projected", "projected.npy does not match its checksum"),
        ("tombstones", "does not match its checksum"),
        ("document", "snapshot.json does not match its checksum"),
        ("missing", "partial: "),
        ("unlisted", "is not listed in snapshot.json"),
        ("shorter", "holds "),
    ],
)
def test_a_damaged_or_partial_snapshot_is_refused_naming_the_file(model, tmp_path, damage, named):
    snapshot_model_catalogue(model, tmp_path / "snap")
    snap = tmp_path / "snap"
    version = snap / "catalogue"
    target = {
        "projected": sorted(version.glob("shards/*/projected.npy"))[1],
        "tombstones": next(version.glob("tombstones-*.npy")),
        "document": snap / SNAPSHOT_MANIFEST,
        "missing": sorted(version.glob("shards/*/ids.npy"))[0],
        "shorter": sorted(version.glob("shards/*/projected.npy"))[0],
    }.get(damage)
    if damage in ("projected", "tombstones", "document"):
        _flip_one_byte(target)
    elif damage == "missing":
        target.unlink()
    elif damage == "shorter":
        os.chmod(target, 0o644)
        os.truncate(target, target.stat().st_size - 100)
    else:  # the document rewritten without one file (and its own checksum recomputed)
        from service.model.search.snapshots import _document_digest

        document = json.loads((snap / SNAPSHOT_MANIFEST).read_text())
        document["files"] = [f for f in document["files"] if not f["path"].endswith("ids.npy")]
        document["sha256"] = _document_digest(document)
        os.chmod(snap / SNAPSHOT_MANIFEST, 0o644)
        (snap / SNAPSHOT_MANIFEST).write_text(json.dumps(document))
    version_before = load(model).catalogue.version
    listing = sorted((catalogue_dir(model)).rglob("*"))
    with pytest.raises(SnapshotRefusedError, match=named) as refused:
        restore_model_catalogue(snap, model)
    if target is not None and damage != "document":
        assert str(target) in str(refused.value)  # the file is named
    assert load(model).catalogue.version == version_before  # nothing written
    assert sorted(catalogue_dir(model).rglob("*")) == listing
    # The command line says the same and fails.
    assert main(["index", "--model", str(model), "--restore", str(snap)]) != 0


def test_a_snapshot_of_another_search_model_is_refused(model, search_model_dir, tmp_path):
    snapshot_model_catalogue(model, tmp_path / "snap")
    other = tmp_path / "other"
    shutil.copytree(search_model_dir, other, ignore=shutil.ignore_patterns("catalogue"))
    manifest = search_dir(other) / "manifest.json"
    manifest.write_text(manifest.read_text() + "\n")  # another version of the search model
    with pytest.raises(SnapshotRefusedError, match="built for another search model"):
        restore_model_catalogue(tmp_path / "snap", other)


def test_a_snapshot_pins_its_version_while_the_catalogue_changes(model, tmp_path, monkeypatch):
    """A version's files are pinned (linked) under the writer lock, then copied: versions
    written and older files removed meanwhile (two updates remove the pinned version's files
    from the catalogue) do not change the copy."""
    from service.model.search import snapshots

    index = load(model)
    before = live_ids(index)
    copy = snapshots.copy_files

    def copy_while_updating(*args, **kwargs):
        for j in range(3):
            load(model).delete([f"test-{100 + j}"])
        return copy(*args, **kwargs)

    monkeypatch.setattr(snapshots, "copy_files", copy_while_updating)
    taken = snapshot_model_catalogue(model, tmp_path / "snap")
    assert taken.catalogue_version == index.catalogue.version
    assert not list(search_dir(model).glob(".catalogue-snapshot*"))  # the pins are gone
    fresh = tmp_path / "fresh"
    shutil.copytree(model, fresh, ignore=shutil.ignore_patterns("catalogue"))
    restore_model_catalogue(tmp_path / "snap", fresh)
    assert live_ids(load(fresh)) == before


def test_snapshots_are_listed_and_named_safely(model, tmp_path):
    root = tmp_path / "kept"
    first = snapshot_model_catalogue(model, root / "a-first")
    (root / "junk").mkdir()
    found, unreadable = list_snapshots(root)
    assert [s.path for s in found] == [first.path]
    assert [line.split(":")[0] for line in unreadable] == ["junk"]
    assert read_snapshot(first.path).checksums == first.checksums
    for name in ("..", "../a-first", ".hidden", "missing"):
        with pytest.raises(NotFoundError):
            snapshot_in(root, name)
    with pytest.raises(Exception, match="already exists"):
        snapshot_model_catalogue(model, root / "a-first")


def test_a_catalogue_written_before_shards_is_snapshotted_and_restored_whole(tmp_path):
    previous = Path(__file__).resolve().parents[1] / "fixtures" / "previous-layout" / "digits-v1"
    path = tmp_path / "digits-v1"
    shutil.copytree(previous, path)
    index = load(path)
    ranking = index.run(SearchQuery(class_label="7", top_k=10)).items
    taken = snapshot_model_catalogue(path, tmp_path / "snap")
    assert (taken.catalogue_version, taken.n_shards) == (0, 1)
    index.upsert(["added-0"], [np.zeros((8, 8)).tolist()])  # now sharded, version 1
    _, result = restore_model_catalogue(tmp_path / "snap", path)
    assert result.version == 0  # copied whole: the layout before shards has no versions
    restored = load(path)
    assert restored.catalogue.version == 0
    assert restored.run(SearchQuery(class_label="7", top_k=10)).items == ranking
    assert "added-0" not in restored.catalogue.ids.tolist()


def test_a_snapshot_that_cannot_be_written_says_why(model, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the snapshots' directory should be")
    with pytest.raises(ArtifactError, match="cannot write the snapshot"):
        snapshot_model_catalogue(model, blocked / "snap")
    assert not list(search_dir(model).glob(".catalogue-snapshot*"))  # the pins are gone


class Recorded(Progress):
    """What a snapshot or a restore reports, stage by stage: (stage, files, bytes) as begun and
    the files and bytes then told done."""

    def __init__(self) -> None:
        self.stages: list[list] = []

    def begin(self, stage: str, n_files: int, n_bytes: int) -> None:
        self.stages.append([stage, n_files, n_bytes, 0, 0])

    def advance(self, n_bytes: int = 0, n_files: int = 0) -> None:
        self.stages[-1][3] += n_files
        self.stages[-1][4] += n_bytes


def test_snapshots_and_restores_report_every_file_and_byte_of_each_stage(model, tmp_path):
    taking = Recorded()
    taken = snapshot_model_catalogue(model, tmp_path / "snap", taking)
    files, size = len(taken.checksums), sum(taken.sizes.values())
    assert size == sum(f.stat().st_size for f in (tmp_path / "snap" / "catalogue").rglob("*")
                       if f.is_file())  # fmt: skip
    assert taking.stages == [["copying", files, size, files, size]]
    # Into the catalogue it was taken of (its shards intact: kept), and into a fresh one.
    restoring = Recorded()
    restore_model_catalogue(tmp_path / "snap", model, restoring)
    done = [["verifying", files, size, files, size], ["restoring", files, size, files, size]]
    assert restoring.stages == done
    fresh = tmp_path / "fresh"
    shutil.copytree(model, fresh, ignore=shutil.ignore_patterns("catalogue"))
    restoring = Recorded()
    restore_model_catalogue(tmp_path / "snap", fresh, restoring)
    assert restoring.stages == done


@pytest.fixture
def read_only_model(model, tmp_path):
    """``model`` as a server in a container sees it: a read-only (bind) mount."""
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    bind = subprocess.run(["mount", "--bind", str(model), str(mounted)], capture_output=True)
    if bind.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bind.stderr.decode().strip()}")
    try:
        remount = subprocess.run(["mount", "-o", "remount,bind,ro", str(mounted)])
        assert remount.returncode == 0
        assert not os.access(mounted, os.W_OK)
        yield mounted
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


def test_a_read_only_catalogue_is_snapshotted_under_the_writers_lock(
    model, read_only_model, tmp_path
):
    """No link can be made beside a read-only catalogue (the compose file mounts the models
    read-only): the version is copied under the writer lock instead, the same files."""
    from service.model.search.versions import catalogue_lock

    taken = snapshot_model_catalogue(read_only_model, tmp_path / "snap")
    assert taken.checksums == snapshot_model_catalogue(model, tmp_path / "rw").checksums
    assert read_snapshot(tmp_path / "snap").catalogue_version == load(model).catalogue.version
    # A writer elsewhere holds the lock: the snapshot waits for it, then copies.
    started, finished = threading.Event(), threading.Event()

    def snapshot() -> None:
        started.set()
        snapshot_model_catalogue(read_only_model, tmp_path / "waited")
        finished.set()

    with catalogue_lock(search_dir(model)):
        worker = threading.Thread(target=snapshot)
        worker.start()
        assert started.wait(10)
        assert not finished.wait(1.0)
    worker.join(30)
    assert finished.is_set()
    # A restore must write the catalogue: refused, saying why, never a 500.
    with pytest.raises(ArtifactError, match="Read-only file system"):
        restore_model_catalogue(tmp_path / "snap", read_only_model)


def test_what_an_interrupted_snapshot_left_is_removed_and_never_listed(model, tmp_path):
    root = tmp_path / "kept"
    first = snapshot_model_catalogue(model, root / "a-first")
    # A writer that died (no lock on its staging directory), and one at work (locked).
    dead = root / ".b-dead.tmp-0123abcd"
    shutil.copytree(first.path, dead)
    alive = root / ".c-alive.tmp-89abcdef"
    alive.mkdir()
    holder = os.open(alive, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        assert [s.path for s in list_snapshots(root)[0]] == [first.path]  # neither is listed
        assert remove_unfinished(root) == [dead]
        assert alive.is_dir()
    finally:
        os.close(holder)
    assert remove_unfinished(root) == [alive]
    assert sorted(p.name for p in root.iterdir()) == ["a-first"]
