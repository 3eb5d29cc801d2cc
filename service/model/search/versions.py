"""What every writer of catalogue versions shares: the writer lock, checked item ids, a shard's
items (new, or merged from shards on disk), one version's files and manifest written, and what
no version names removed (see :mod:`service.model.search.store`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.model.artifact import FORMAT_KEYS, MANIFEST_NAME, manifest_digest
from service.model.artifact_writing import (
    complete_manifest,
    fsync_directory,
    replace_manifest,
    write_array_file,
)
from service.model.errors import InvalidInputError, brief
from service.model.search.catalogue import (
    CATALOGUE_TYPE,
    SHARDED_LAYOUT,
    SHARDS_DIR,
    sample_live_positions,
)
from service.model.search.filters import NUL, Column, NumberColumn, StringColumn
from service.model.search.shards import Shard, narrow_strings, write_shard

LOCK_NAME = ".catalogue.lock"
# Longest item id.
MAX_ID_LENGTH = 512
# Items copied at a time when shards are merged.
COPY_CHUNK = 65_536
# Manifest keys a version writes itself (the rest, such as where the items came from, carry
# over from version to version).
_VERSION_KEYS = frozenset(
    {"model_type", "layout", "version", "n_items", "n_positions", "n_atoms", "shards",
     "attributes", "search_manifest_sha256", "negatives_seed", "n_negatives", "created",
     "versions"}
)  # fmt: skip


@dataclass(frozen=True)
class ShardItems:
    """Items of a shard to write: their ids, what fills their rows, and optional labels and
    attribute columns.

    Parameters
    ----------
    ids : ndarray of shape (n,)
    fill : callable
        ``fill(block, start)`` writes ``D^T x`` of items ``start .. start + n_s`` (n_s =
        ``block.shape[1]``) into the (A, n_s) float32 block: a shard may be written in parts.
    columns : dict of key to Column
    labels : ndarray of shape (n,), optional
    """

    ids: np.ndarray
    fill: Callable[[np.ndarray, int], None]
    columns: Mapping[str, Column] = field(default_factory=dict)
    labels: np.ndarray | None = None


@dataclass(frozen=True)
class UpdateResult:
    """What a change did.

    Parameters
    ----------
    version : int
        The version written.
    n_items : int
        Live items in it.
    written : int
        Items of the new shard (upserts).
    replaced : int
        Of them, ids that were in the catalogue (their old copies are removed).
    deleted : int
    missing : list of str
        Ids asked to be deleted that no live item has.
    n_shards : int
    """

    version: int
    n_items: int
    written: int = 0
    replaced: int = 0
    deleted: int = 0
    missing: list[str] = field(default_factory=list)
    n_shards: int = 0


def rows_filler(rows: np.ndarray) -> Callable[[np.ndarray, int], None]:
    """A :attr:`ShardItems.fill` for rows already computed, shape (n, A)."""

    def fill(block: np.ndarray, start: int) -> None:
        block[:] = rows[start : start + block.shape[1]].T

    return fill


def check_ids(ids: Sequence[Any], what: str = "ids") -> np.ndarray:
    """Item ids as strings: non-empty, at most :data:`MAX_ID_LENGTH` characters, without NUL
    (see :data:`~service.model.search.filters.NUL`), distinct; InvalidInputError naming the
    first bad one."""
    texts = [i if isinstance(i, str) else str(i) for i in ids]
    for i, text in enumerate(texts):
        if not text:
            raise InvalidInputError(f"{what}[{i}] is empty: an id has at least one character")
        if len(text) > MAX_ID_LENGTH:
            raise InvalidInputError(f"{what}[{i}] is longer than {MAX_ID_LENGTH} characters")
        if NUL in text:
            raise InvalidInputError(f"{what}[{i}] holds a NUL character (U+0000): ids hold none")
    array = narrow_strings(np.asarray(texts, dtype=str)) if texts else np.zeros(0, "<U1")
    order = np.sort(array)
    repeated = np.flatnonzero(order[1:] == order[:-1])
    if repeated.size:
        raise InvalidInputError(f"{what}: {brief(str(order[repeated[0]]))} is given twice")
    return array


@contextlib.contextmanager
def catalogue_lock(search_path: str | os.PathLike, reader: bool = False) -> Iterator[None]:
    """Hold the catalogue's writer lock (exclusive, across processes) inside the block.

    ``reader``: for one that only reads, on a file system it may not write (a server's
    read-only mount of the models): the lock file is opened for reading (a lock needs no more),
    and where there is none (no writer ever took the lock there) the block runs without it.
    """
    lock = Path(search_path) / LOCK_NAME
    try:
        handle = open(lock, "a+b")  # noqa: SIM115
    except OSError:
        if not reader:
            raise
        try:
            handle = open(lock, "rb")  # noqa: SIM115
        except FileNotFoundError:
            yield
            return
    with handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


ShardWriter = Callable[[Path, Sequence[ShardItems], int], list[tuple[str, str, int]]]


def write_shards_here(
    directory: Path, shards: Sequence[ShardItems], n_atoms: int
) -> list[tuple[str, str, int]]:
    """Write ``shards`` into ``directory``, one after the other; (name, manifest sha256,
    items) of each."""
    return [write_one_shard(directory, items, n_atoms) for items in shards]


def write_one_shard(directory: Path, items: ShardItems, n_atoms: int) -> tuple[str, str, int]:
    """Write one shard into ``directory`` under a new name; (name, manifest sha256, items)."""
    name = f"shard-{uuid.uuid4().hex[:12]}"
    digest = write_shard(
        directory / name, n_atoms, items.ids, lambda block: items.fill(block, 0),
        items.columns, items.labels,
    )  # fmt: skip
    return name, digest, len(items.ids)


def write_version(
    directory: Path,
    search_path: str | os.PathLike,
    version: int,
    n_atoms: int,
    shards: Sequence[tuple[str, str, int]],
    tombstones: np.ndarray,
    schema: Mapping[str, str],
    n_negatives: int,
    seed: int,
    metadata: Mapping[str, Any],
    commit: Callable[[], None] | None = None,
    negatives: np.ndarray | None = None,
) -> dict[str, Any]:
    """Write a version's files and, last, its manifest into ``directory`` (``commit()`` just
    before, which may raise to leave the version unwritten); return the manifest. The
    negatives sample is drawn (``n_negatives``, ``seed``) unless given."""
    n_positions = sum(n for _, _, n in shards)
    if negatives is None:
        negatives = sample_live_positions(n_positions, tombstones, n_negatives, seed)
    entries = {
        "tombstones": write_array_file(directory, f"tombstones-{version:06d}.npy", tombstones),
        "negatives": write_array_file(directory, f"negatives-{version:06d}.npy", negatives),
    }
    manifest = complete_manifest(
        {
            "model_type": CATALOGUE_TYPE,
            "layout": SHARDED_LAYOUT,
            "version": version,
            "n_items": n_positions - int(tombstones.size),
            "n_positions": n_positions,
            "n_atoms": n_atoms,
            "search_manifest_sha256": manifest_digest(search_path),
            "negatives_seed": seed,
            "n_negatives": n_negatives,
            "attributes": dict(sorted(schema.items())),
            "shards": [
                {"name": name, "manifest_sha256": digest, "n_items": n}
                for name, digest, n in shards
            ],
            **{k: v for k, v in metadata.items() if k not in _VERSION_KEYS | FORMAT_KEYS},
        },
        entries,
    )
    if commit is not None:
        commit()
    replace_manifest(directory, manifest)
    return manifest


def remove_unreferenced(path: Path, manifests: Sequence[Mapping[str, Any]]) -> None:
    """Remove what none of ``manifests`` names: older versions' files and shards, and what a
    writer killed half-way left (staged files, shards no manifest names)."""
    files = {MANIFEST_NAME} | {
        str(entry["file"]) for m in manifests for entry in m.get("arrays", {}).values()
    }
    shards = {str(entry["name"]) for m in manifests for entry in m.get("shards", [])}
    for entry in os.scandir(path):
        if entry.name == SHARDS_DIR and entry.is_dir():
            continue
        if entry.is_dir(follow_symlinks=False):
            if entry.name.startswith("."):
                shutil.rmtree(entry.path, ignore_errors=True)
        elif entry.name not in files:
            os.unlink(entry.path)
    shards_dir = path / SHARDS_DIR
    if shards_dir.is_dir():
        for entry in os.scandir(shards_dir):
            if entry.name not in shards:
                shutil.rmtree(entry.path, ignore_errors=True)
    fsync_directory(path)


def merged_items(
    parts: Sequence[tuple[Shard, np.ndarray]], schema: Mapping[str, str]
) -> ShardItems:
    """The items at local positions of shards, in order, as one shard's items: rows copied in
    chunks, ids, labels (if every part has them) and attribute columns."""
    ids = np.concatenate([shard.ids[positions] for shard, positions in parts])
    labels = None
    if all(shard.labels is not None for shard, _ in parts):
        labels = np.concatenate([shard.labels[positions] for shard, positions in parts])
    columns: dict[str, Column] = {}
    for key in sorted({key for shard, _ in parts for key in shard.columns}):
        column = _merged_column([(shard.columns.get(key), p) for shard, p in parts],
                                schema.get(key) or _kind(parts, key))  # fmt: skip
        if column.any_held():  # a key none of these items has any more is left out
            columns[key] = column

    def fill(block: np.ndarray, start: int) -> None:
        at = 0
        for shard, positions in parts:
            rows = shard.readable()
            for lo in range(0, len(positions), COPY_CHUNK):
                chunk = positions[lo : lo + COPY_CHUNK]
                block[:, at : at + len(chunk)] = rows[:, chunk]
                at += len(chunk)

    return ShardItems(ids, fill, columns, labels)


def _kind(parts: Sequence[tuple[Shard, np.ndarray]], key: str) -> str:
    return next(shard.columns[key].kind for shard, _ in parts if key in shard.columns)


def _merged_column(parts: Sequence[tuple[Column | None, np.ndarray]], kind: str) -> Column:
    if kind == "number":
        return NumberColumn(
            np.concatenate(
                [np.full(len(p), np.nan) if c is None else c.values[p] for c, p in parts]
            )
        )
    texts, present = [], []
    for column, positions in parts:
        if column is None:
            texts.append(np.full(len(positions), "", dtype="<U1"))
            present.append(np.zeros(len(positions), dtype=bool))
            continue
        codes = column.codes[positions]
        texts.append(np.where(codes >= 0, column.values[np.maximum(codes, 0)], ""))
        present.append(codes >= 0)
    text, held = np.concatenate(texts), np.concatenate(present)
    values, codes = np.unique(text[held], return_inverse=True)
    all_codes = np.full(len(text), -1, dtype=np.int32)
    all_codes[held] = codes
    return StringColumn(all_codes, narrow_strings(values) if values.size else np.zeros(0, "<U1"))
