"""Writing catalogue versions: a whole build, upserts, deletions and compaction.

Every change is a new version, written beside the one served: new shards in directories of
their own (staged, then renamed into ``shards/``), the version's tombstones and negatives in
files of their own, then the manifest, written beside and renamed over the old one (see
:func:`service.model.artifact_writing.replace_manifest`). A change returns, and is acknowledged,
only once all of it is on disk. A process killed at any point leaves the old version or the new one
in place, never a mix, and loses no change it acknowledged; what a killed writer left half
done (staged files, shards no manifest names) is removed by the next writer.

One writer at a time, across processes: every change holds an exclusive lock on a file beside
the catalogue (``<search>/.catalogue.lock``, ``flock``), reads the newest version on disk, and
builds on it. Files of the two newest versions are kept (a reader may be loading the previous
one); older ones are removed, which readers that mapped them do not notice (their maps hold the
files until they let go).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from service.model.artifact import MANIFEST_NAME, manifest_digest, read_manifest
from service.model.artifact_writing import (
    fsync_directory,
    install_directory,
    locked_staging,
    writing,
)
from service.model.errors import ArtifactError, InvalidInputError, ModelError
from service.model.search.catalogue import (
    DEFAULT_NEGATIVES,
    SHARDED_LAYOUT,
    SHARDS_DIR,
    Catalogue,
    read_catalogue,
)
from service.model.search.filters import AttributeLimits, columns_from_records, merged_schema
from service.model.search.shards import Shard
from service.model.search.versions import (
    ShardItems,
    ShardWriter,
    UpdateResult,
    catalogue_lock,
    check_ids,
    merged_items,
    remove_unreferenced,
    write_one_shard,
    write_shards_here,
    write_version,
)

# Items per shard of a build, and what compaction merges small shards into.
DEFAULT_SHARD_ITEMS = 1_000_000


class ChangeAbandonedError(ModelError):
    """A change reached its commit after its :class:`CommitGate` was abandoned: nothing of it
    was applied."""


class CommitGate:
    """Settles, once, whether a change commits or is abandoned: whichever is asked first wins.

    The change asks :meth:`commit` just before its point of no return (the manifest's
    rename); a caller that stops waiting for it (its time is up) asks :meth:`abandon`. So a
    caller told that the change was abandoned knows it will never be applied, and one told
    that it is committing knows it will be (it waits for it: the rest is a rename).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._settled: str | None = None

    def _settle(self, outcome: str) -> bool:
        with self._lock:
            if self._settled is None:
                self._settled = outcome
            return self._settled == outcome

    def commit(self) -> bool:
        """Whether the change may commit (False: it was abandoned)."""
        return self._settle("commit")

    def abandon(self) -> bool:
        """Whether the change is abandoned (False: it is committing)."""
        return self._settle("abandon")


def build_catalogue(
    path: str | os.PathLike,
    search_path: str | os.PathLike,
    n_atoms: int,
    shards: Sequence[ShardItems],
    n_negatives: int = DEFAULT_NEGATIVES,
    seed: int = 0,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
    write_shards: ShardWriter | None = None,
) -> int:
    """Write a whole catalogue of ``shards`` as version 1 (staged beside, then renamed into
    place: a served catalogue keeps serving until then); return its live items.

    Parameters
    ----------
    path : path-like
        The catalogue's directory.
    search_path : path-like
        The search model's directory (its manifest's checksum is recorded; the lock is there).
    n_atoms : int
    shards : sequence of ShardItems
        In order; ids unique across all of them.
    n_negatives, seed : int
        The fixed sample of negatives for learned codes.
    metadata : dict, optional
        Recorded in the manifest (where the items came from).
    overwrite : bool
        Replace an existing catalogue.
    write_shards : callable, optional
        ``write_shards(directory, shards, n_atoms)`` writes the shards into ``directory`` and
        returns (name, manifest sha256, items) of each, in order: elsewhere, say on a
        cluster's workers. Default: :func:`write_shards_here`.

    Raises
    ------
    InvalidInputError
        No items, an id repeated, an attribute of two kinds.
    ArtifactError
        ``path`` exists and ``overwrite`` is false.
    """
    path = Path(path)
    with catalogue_lock(search_path):
        if path.exists() and not overwrite:
            raise ArtifactError(f"{path} already exists; choose another path or allow overwriting")
        return _build_locked(
            path, search_path, n_atoms, shards, n_negatives, seed, metadata or {},
            write_shards or write_shards_here,
        )  # fmt: skip


def _build_locked(
    path: Path,
    search_path: str | os.PathLike,
    n_atoms: int,
    shards: Sequence[ShardItems],
    n_negatives: int,
    seed: int,
    metadata: Mapping[str, Any],
    write_shards: ShardWriter,
    commit: Callable[[], None] | None = None,
) -> int:
    if not sum(len(items.ids) for items in shards):
        raise InvalidInputError("the catalogue is empty")
    check_ids(np.concatenate([np.asarray(items.ids).astype(str) for items in shards]))
    schema: dict[str, str] = {}
    for items in shards:
        schema = merged_schema(schema, {k: c.kind for k, c in items.columns.items()})
    with locked_staging(path) as staging:
        (staging / SHARDS_DIR).mkdir()
        written = write_shards(staging / SHARDS_DIR, shards, n_atoms)
        fsync_directory(staging / SHARDS_DIR)
        manifest = write_version(
            staging, search_path, 1, n_atoms, written, np.zeros(0, dtype=np.int64), schema,
            n_negatives, seed, metadata,
        )  # fmt: skip
        if commit is not None:
            commit()
        install_directory(staging, path)
    return int(manifest["n_items"])


def _writes(change: Callable[..., UpdateResult]) -> Callable[..., UpdateResult]:
    """A change of :class:`CatalogueUpdate` whose failed writes (a full disk) are the
    ArtifactError that says why, whichever file they hit."""

    @functools.wraps(change)
    def guarded(update: CatalogueUpdate, *args: Any, **kwargs: Any) -> UpdateResult:
        with writing(update.path):
            return change(update, *args, **kwargs)

    return guarded


class CatalogueUpdate:
    """Changes to a catalogue, each written as a new version: a context manager holding the
    writer lock (see the module docstring), reading the newest version on disk as it enters.

    Parameters
    ----------
    path : path-like
        The catalogue's directory (it need not exist: the first upsert writes it).
    search_path : path-like
        The search model's directory.
    n_atoms : int
    reuse : Catalogue, optional
        A version already loaded (the one served): its shards are not read again.
    gate : CommitGate, optional
        Asked before each change commits: an abandoned change raises ChangeAbandonedError and
        leaves nothing of itself (the version before stays the newest).

    Examples
    --------
    >>> with CatalogueUpdate(path, search_path, 64, served) as update:  # doctest: +SKIP
    ...     result = update.upsert(ids, rows_filler(rows))
    """

    def __init__(
        self,
        path: str | os.PathLike,
        search_path: str | os.PathLike,
        n_atoms: int,
        reuse: Catalogue | None = None,
        gate: CommitGate | None = None,
    ) -> None:
        self.path = Path(path)
        self.search_path = Path(search_path)
        self.n_atoms = n_atoms
        self.current = reuse
        self.gate = gate
        self.manifest: dict[str, Any] | None = None
        self._stack = contextlib.ExitStack()
        self._stale = False

    def __enter__(self) -> CatalogueUpdate:
        self._stack.enter_context(catalogue_lock(self.search_path))
        try:
            self._read()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    def _fresh(self) -> None:
        """The version on disk, if a change of this update came after the one read."""
        if self._stale:
            self._read()
            self._stale = False

    def _read(self) -> None:
        if not (self.path / MANIFEST_NAME).is_file():
            self.current, self.manifest = None, None
            return
        self.manifest = read_manifest(self.path)
        served = self.current
        if served is None or served.digest != manifest_digest(self.path):
            # A newer version than the one served (another process wrote it): read it here.
            local = served if isinstance(served, Catalogue) else None
            self.current = read_catalogue(self.path, self.search_path, reuse=local)
        if self.current.n_atoms != self.n_atoms:
            raise ArtifactError(
                f"{self.path}: {self.current.n_atoms} atoms, the dictionary has {self.n_atoms}"
            )

    def _committing(self) -> None:
        """The point of no return of a change: ChangeAbandonedError if its gate was
        abandoned."""
        if self.gate is not None and not self.gate.commit():
            raise ChangeAbandonedError(f"{self.path}: the change was abandoned before its commit")

    # -- the changes ---------------------------------------------------------------------------

    @_writes
    def upsert(
        self,
        ids: Sequence[Any],
        fill: Callable[[np.ndarray, int], None],
        records: Sequence[Mapping[str, Any] | None] | None = None,
        labels: np.ndarray | None = None,
        limits: AttributeLimits | None = None,
    ) -> UpdateResult:
        """Add items as a new shard; live items of the same ids are removed (tombstoned) in
        the same version. Without a catalogue, this writes its first version.

        Parameters
        ----------
        ids : sequence of str
            Distinct and non-empty (see :func:`check_ids`).
        fill : callable
            See :attr:`ShardItems.fill` (:func:`rows_filler` for rows in memory).
        records : sequence of mapping or None, optional
            Each item's attributes.
        labels : ndarray, optional
        limits : AttributeLimits, optional
            On the records' keys, against the catalogue's (the newest version's).

        Raises
        ------
        InvalidInputError
            No items, bad ids, attributes of the wrong kind, keys beyond ``limits``.
        ArtifactError
            The version cannot be written (a full disk): the one before stays.
        """
        self._fresh()
        ids = check_ids(ids)
        if not ids.size:
            raise InvalidInputError("ids is empty: give at least one item")
        if records is not None and len(records) != len(ids):
            raise InvalidInputError(f"{len(records)} attributes for {len(ids)} ids")
        schema = {} if self.current is None else self.current.attributes
        kinds, columns = columns_from_records(records or [None] * len(ids), schema, limits=limits)
        items = ShardItems(ids, fill, columns, labels)
        if self.current is None:
            n_items = _build_locked(
                self.path, self.search_path, self.n_atoms, [items], DEFAULT_NEGATIVES, 0, {},
                write_shards_here, self._committing,
            )  # fmt: skip
            self._stale = True
            return UpdateResult(version=1, n_items=n_items, written=len(ids), n_shards=1)
        shards = self._shard_entries()
        replaced = self.current.lookup(ids.tolist())
        replaced = replaced[replaced >= 0]
        shards.append(write_one_shard(self.path / SHARDS_DIR, items, self.n_atoms))
        fsync_directory(self.path / SHARDS_DIR)
        tombstones = np.union1d(self.current.tombstones, replaced).astype(np.int64)
        try:
            manifest = self._commit(shards, tombstones, merged_schema(schema, kinds))
        except ChangeAbandonedError:
            # Nothing names the new shard: gone now (after other failures, the next writer
            # removes what no version names).
            shutil.rmtree(self.path / SHARDS_DIR / shards[-1][0], ignore_errors=True)
            raise
        return UpdateResult(
            version=manifest["version"],
            n_items=manifest["n_items"],
            written=len(ids),
            replaced=int(replaced.size),
            n_shards=len(shards),
        )

    @_writes
    def delete(self, ids: Sequence[Any]) -> UpdateResult:
        """Remove the live items of ``ids`` (tombstones, applied in the kernel); ids no live
        item has are reported, not refused. Nothing to remove writes no version."""
        self._fresh()
        texts = [str(i) for i in ids]
        if not texts or not all(texts):
            raise InvalidInputError("ids must be non-empty strings, at least one")
        if self.current is None:
            raise InvalidInputError(f"{self.path} holds no catalogue to delete from")
        found = self.current.lookup(texts)
        missing = [t for t, p in zip(texts, found.tolist(), strict=True) if p < 0]
        removed = np.unique(found[found >= 0])
        if not removed.size:
            return UpdateResult(
                version=self.current.version, n_items=self.current.n_items, missing=missing,
                n_shards=len(self.current.shards),
            )  # fmt: skip
        tombstones = np.union1d(self.current.tombstones, removed).astype(np.int64)
        shards = self._shard_entries()
        manifest = self._commit(shards, tombstones, self.current.attributes)
        return UpdateResult(
            version=manifest["version"], n_items=manifest["n_items"],
            deleted=int(removed.size), missing=missing, n_shards=len(shards),
        )  # fmt: skip

    @_writes
    def compact(self, shard_items: int = DEFAULT_SHARD_ITEMS) -> UpdateResult:
        """Merge runs of small shards (fewer than ``shard_items / 2`` live items) into shards
        of up to ``shard_items``, and rewrite every shard with removed items without them: a
        version with no tombstones, its live items in the same order, and only the attribute
        keys some live item has."""
        self._fresh()
        if self.current is None:
            raise InvalidInputError(f"{self.path} holds no catalogue to compact")
        if shard_items < 1:
            raise InvalidInputError(f"shard items must be at least 1, got {shard_items}")
        current = self.current
        kept = self._shard_entries()
        live = [
            np.flatnonzero(current.is_live(np.arange(lo, hi)))
            for lo, hi in zip(current.offsets[:-1], current.offsets[1:], strict=True)
        ]
        shards: list[tuple[str, str, int]] = []
        pending: list[tuple[Shard, np.ndarray]] = []
        # The attributes some live item has: keys no item holds any more leave the catalogue.
        schema: dict[str, str] = {}

        def flush() -> None:
            if sum(len(p) for _, p in pending):
                items = merged_items(pending, current.attributes)
                schema.update((key, column.kind) for key, column in items.columns.items())
                shards.append(write_one_shard(self.path / SHARDS_DIR, items, self.n_atoms))
            pending.clear()

        for s, shard in enumerate(current.shards):
            clean = len(live[s]) == shard.n_items
            if clean and shard.n_items >= shard_items / 2:
                flush()
                shards.append(kept[s])
                schema.update((key, column.kind) for key, column in shard.columns.items())
                continue
            if pending and sum(len(p) for _, p in pending) + len(live[s]) > shard_items:
                flush()
            pending.append((shard, live[s]))
        flush()
        fsync_directory(self.path / SHARDS_DIR)
        manifest = self._commit(shards, np.zeros(0, dtype=np.int64), schema)
        return UpdateResult(
            version=manifest["version"], n_items=manifest["n_items"], n_shards=len(shards)
        )

    # -- versions ------------------------------------------------------------------------------

    def _shard_entries(self) -> list[tuple[str, str, int]]:
        """The current version's shards as a manifest names them; a catalogue written before
        shards is copied into one first."""
        assert self.current is not None
        assert self.manifest is not None
        if self.manifest.get("layout") == SHARDED_LAYOUT:
            return [
                (str(e["name"]), str(e["manifest_sha256"]), int(e["n_items"]))
                for e in self.manifest["shards"]
            ]
        (shard,) = self.current.shards
        items = merged_items([(shard, np.arange(shard.n_items))], {})
        (self.path / SHARDS_DIR).mkdir(exist_ok=True)
        entry = write_one_shard(self.path / SHARDS_DIR, items, self.n_atoms)
        fsync_directory(self.path / SHARDS_DIR)
        return [entry]

    def _commit(
        self, shards: list[tuple[str, str, int]], tombstones: np.ndarray, schema: Mapping[str, str]
    ) -> dict[str, Any]:
        assert self.current is not None
        assert self.manifest is not None
        previous = self.manifest
        manifest = write_version(
            self.path, self.search_path, self.current.version + 1, self.n_atoms, shards,
            tombstones, schema, int(previous.get("n_negatives", DEFAULT_NEGATIVES)),
            int(previous.get("negatives_seed", 0)), previous, self._committing,
        )  # fmt: skip
        remove_unreferenced(self.path, [previous, manifest])
        self._stale = True  # read again only if this update goes on (the CLI's several changes)
        return manifest
