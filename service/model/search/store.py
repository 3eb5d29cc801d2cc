"""Writing catalogue versions: a whole build, upserts, deletions and compaction.

Every change is a new version, written beside the one served: new shards in directories of
their own (staged, then renamed into ``shards/``), the version's tombstones and negatives in
files of their own, then the manifest, written beside and renamed over the old one (see
:func:`service.model.artifact.replace_manifest`). A change returns, and is acknowledged, only
once all of it is on disk. A process killed at any point leaves the old version or the new one
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
import fcntl
import functools
import hashlib
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.model.artifact import (
    FORMAT_KEYS,
    MANIFEST_NAME,
    complete_manifest,
    fsync_directory,
    install_directory,
    locked_staging,
    manifest_digest,
    manifest_fields,
    open_regular,
    read_manifest,
    read_typed_artifact,
    replace_manifest,
    write_array_file,
    writing,
)
from service.model.errors import (
    ArtifactError,
    ArtifactIntegrityError,
    InvalidInputError,
    ModelError,
    brief,
)
from service.model.search.catalogue import (
    CATALOGUE_TYPE,
    DEFAULT_NEGATIVES,
    SHARDED_LAYOUT,
    SHARDS_DIR,
    Catalogue,
    read_catalogue,
    sample_live_positions,
)
from service.model.search.filters import (
    NUL,
    AttributeLimits,
    Column,
    NumberColumn,
    StringColumn,
    columns_from_records,
    merged_schema,
)
from service.model.search.shards import Shard, narrow_strings, write_shard

LOCK_NAME = ".catalogue.lock"
# Items per shard of a build, and what compaction merges small shards into.
DEFAULT_SHARD_ITEMS = 1_000_000
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


ShardWriter = Callable[[Path, Sequence[ShardItems], int], list[tuple[str, str, int]]]


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
        manifest = _write_version(
            staging, search_path, 1, n_atoms, written, np.zeros(0, dtype=np.int64), schema,
            n_negatives, seed, metadata,
        )  # fmt: skip
        if commit is not None:
            commit()
        install_directory(staging, path)
    return int(manifest["n_items"])


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


def _write_version(
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
        manifest = _write_version(
            self.path, self.search_path, self.current.version + 1, self.n_atoms, shards,
            tombstones, schema, int(previous.get("n_negatives", DEFAULT_NEGATIVES)),
            int(previous.get("negatives_seed", 0)), previous, self._committing,
        )  # fmt: skip
        _remove_unreferenced(self.path, [previous, manifest])
        self._stale = True  # read again only if this update goes on (the CLI's several changes)
        return manifest


def _remove_unreferenced(path: Path, manifests: Sequence[Mapping[str, Any]]) -> None:
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


# -- copies of whole versions (snapshots, see service.model.search.snapshots) -------------------

# Bytes read at a time when a file is copied and hashed.
COPY_BLOCK = 1 << 20
# Largest file a copy reads (a bound on what a damaged copy could make it read, not a limit of
# catalogues: a shard of 10,000,000 items of 1,024 atoms is 41 GB).
MAX_COPIED_BYTES = 1 << 40


class Progress:
    """What long work on a version's files (a snapshot, its verification, a restore) reports as
    it goes: each stage as it begins, with its files and bytes, then the bytes and files done.
    This one reports nothing; a progress bar or a job's record overrides both methods. Called
    from the thread that does the work."""

    def begin(self, stage: str, n_files: int, n_bytes: int) -> None:
        """A stage begins: ``stage`` (a word: copying, verifying, restoring) will read
        ``n_files`` files of ``n_bytes`` bytes in all."""

    def advance(self, n_bytes: int = 0, n_files: int = 0) -> None:
        """``n_bytes`` more bytes read, ``n_files`` more files done."""


NO_PROGRESS = Progress()


def file_sha256(
    path: Path, max_bytes: int = MAX_COPIED_BYTES, progress: Progress = NO_PROGRESS
) -> str:
    """sha256 of a regular file's content, of at most ``max_bytes`` (see
    :func:`service.model.artifact.open_regular`); the bytes read are told to ``progress``."""
    digest = hashlib.sha256()
    with open_regular(path, max_bytes) as handle:
        while block := handle.read(COPY_BLOCK):
            digest.update(block)
            progress.advance(len(block))
    return digest.hexdigest()


def copy_checked(
    source: Path,
    target: Path,
    expected: str | None = None,
    named: Path | None = None,
    progress: Progress = NO_PROGRESS,
) -> tuple[str, int]:
    """Copy one regular file to ``target`` (which must not exist), synced to disk; return the
    sha256 and size of what was copied (the bytes read are told to ``progress``).

    Raises
    ------
    ArtifactIntegrityError
        ``expected`` is given and what was read does not hash to it (the message names
        ``named``, default ``source``; the target is removed).
    """
    digest, size = hashlib.sha256(), 0
    with open_regular(source, MAX_COPIED_BYTES) as reader, open(target, "xb") as writer:
        while block := reader.read(COPY_BLOCK):
            digest.update(block)
            writer.write(block)
            size += len(block)
            progress.advance(len(block))
        writer.flush()
        os.fsync(writer.fileno())
    if expected is not None and digest.hexdigest() != expected:
        target.unlink()
        raise ArtifactIntegrityError(
            f"{named or source} does not match its checksum (the file was modified, truncated "
            "or replaced): refused"
        )
    return digest.hexdigest(), size


def version_files(path: Path) -> dict[str, str | None]:
    """Every file of the catalogue version at ``path`` (its manifest, its arrays, each shard's
    manifest and arrays), by path relative to ``path`` with ``/``, the manifest first; each
    with the sha256 the manifests record for it (None for the catalogue's manifest itself).

    Raises
    ------
    ArtifactError, ArtifactIntegrityError
        No catalogue there, or a malformed manifest.
    """
    manifest = read_manifest(path)
    files: dict[str, str | None] = {MANIFEST_NAME: None}
    with manifest_fields(path):
        files.update(_array_checksums(manifest, ""))
        shards = manifest.get("shards", []) if manifest.get("layout") == SHARDED_LAYOUT else []
        named = [(_plain_name(entry["name"]), str(entry["manifest_sha256"])) for entry in shards]
    for name, digest in named:
        prefix = f"{SHARDS_DIR}/{name}/"
        files[prefix + MANIFEST_NAME] = digest
        shard = read_manifest(path / SHARDS_DIR / name)
        with manifest_fields(path / SHARDS_DIR / name):
            files.update(_array_checksums(shard, prefix))
    return files


def _array_checksums(manifest: Mapping[str, Any], prefix: str) -> dict[str, str]:
    return {
        prefix + _plain_name(entry["file"]): str(entry["sha256"])
        for entry in manifest["arrays"].values()
    }


def _plain_name(name: Any) -> str:
    """A file or directory name of a manifest: plain, never a path or a hidden name."""
    if not isinstance(name, str) or not name or Path(name).name != name or name.startswith("."):
        raise ValueError(f"{name!r} is not a plain name")
    return name


def _readable_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of the catalogue at ``path``, or None where there is none or it cannot be
    read (a restore replaces such a catalogue whole)."""
    try:
        return read_manifest(path)
    except ArtifactError:
        return None


def restore_version(
    path: str | os.PathLike,
    search_path: str | os.PathLike,
    source: Path,
    checksums: Mapping[str, str],
    progress: Progress = NO_PROGRESS,
) -> UpdateResult:
    """Make the catalogue version in ``source`` (a whole version's files, each to hash to its
    entry of ``checksums``) the catalogue at ``path``, under the writer lock; its files, copied
    or found intact, are told to ``progress`` (stage ``restoring``).

    Over a sharded catalogue it is a new version (the next number): the shards it names that
    are there and intact are kept, the others copied into ``shards/``, then the version's
    tombstones, negatives and manifest written (see :func:`_write_version`), so that servers
    see an ordinary new version and the previous one stays on disk. Where there is no
    catalogue, one that cannot be read, or either is of the layout before shards, the version
    is copied whole (staged, then renamed into place) with its own number.

    Parameters
    ----------
    path : path-like
        The catalogue's directory.
    search_path : path-like
        The search model's directory (the caller checked the version was built for it).
    source : Path
        The version's directory.
    checksums : mapping of str to str
        sha256 of each file, by path relative to ``source`` (see :func:`version_files`).

    Raises
    ------
    ArtifactIntegrityError
        A file that does not hash to its checksum (named; nothing is put in place).
    """
    path = Path(path)
    wanted = read_manifest(source)
    sizes = {rel: os.stat(source / rel).st_size for rel in checksums}
    progress.begin("restoring", len(sizes), sum(sizes.values()))
    with catalogue_lock(search_path):
        current = _readable_manifest(path)
        sharded = wanted.get("layout") == SHARDED_LAYOUT
        if current is None or current.get("layout") != SHARDED_LAYOUT or not sharded:
            path.parent.mkdir(parents=True, exist_ok=True)
            with locked_staging(path) as staging:
                copy_files(source, staging, checksums, progress=progress)
                install_directory(staging, path)
            return UpdateResult(
                version=int(wanted.get("version", 0)), n_items=int(wanted.get("n_items", 0)),
                n_shards=len(wanted.get("shards", [])) or 1,
            )  # fmt: skip
        (path / SHARDS_DIR).mkdir(exist_ok=True)
        shards = []
        with manifest_fields(source):
            entries = [(_plain_name(e["name"]), str(e["manifest_sha256"]), int(e["n_items"]))
                       for e in wanted["shards"]]  # fmt: skip
        for name, digest, n_items in entries:
            prefix = f"{SHARDS_DIR}/{name}/"
            files = {
                rel[len(prefix) :]: sha for rel, sha in checksums.items() if rel.startswith(prefix)
            }
            target = path / SHARDS_DIR / name
            if all(_holds(target / file, sha) for file, sha in files.items()):
                progress.advance(sum(sizes[prefix + file] for file in files), len(files))
            else:
                with locked_staging(target) as staging:
                    copy_files(source / SHARDS_DIR / name, staging, files, progress=progress)
                    install_directory(staging, target)
            shards.append((name, digest, n_items))
        fsync_directory(path / SHARDS_DIR)
        artifact = read_typed_artifact(
            source, CATALOGUE_TYPE, {"negatives", "tombstones"}, {"shards", "attributes"}
        )
        with manifest_fields(source):
            manifest = _write_version(
                path, search_path, int(current["version"]) + 1, int(wanted["n_atoms"]), shards,
                artifact.arrays["tombstones"].astype(np.int64), dict(wanted["attributes"]),
                int(wanted.get("n_negatives", DEFAULT_NEGATIVES)),
                int(wanted.get("negatives_seed", 0)), wanted,
                negatives=artifact.arrays["negatives"].astype(np.int64),
            )  # fmt: skip
        _remove_unreferenced(path, [current, manifest])
    # The version's own files (manifest, tombstones, negatives), written rather than copied.
    written = [rel for rel in sizes if not rel.startswith(f"{SHARDS_DIR}/")]
    progress.advance(sum(sizes[rel] for rel in written), len(written))
    return UpdateResult(
        version=manifest["version"], n_items=manifest["n_items"], n_shards=len(shards)
    )


def _holds(file: Path, sha256: str) -> bool:
    """Whether ``file`` is there, a regular file whose content hashes to ``sha256``."""
    try:
        return file_sha256(file) == sha256
    except (OSError, ArtifactError):
        return False


def copy_files(
    source: Path,
    target: Path,
    checksums: Mapping[str, str | None],
    named: Path | None = None,
    progress: Progress = NO_PROGRESS,
) -> dict[str, tuple[str, int]]:
    """Copy the files of ``checksums`` (paths relative to ``source``) into ``target``, each
    checked against its sha256 (where not None) as it is read (see :func:`copy_checked`; a
    mismatch names the file under ``named``, default ``source``), then sync the directories;
    return each file's sha256 and size (the bytes and files told to ``progress``)."""
    copied = {}
    directories = {target}
    for rel, sha256 in checksums.items():
        destination = target / rel
        destination.parent.mkdir(parents=True, exist_ok=True)
        directories.add(destination.parent)
        named_as = (named or source) / rel
        copied[rel] = copy_checked(source / rel, destination, sha256, named_as, progress)
        progress.advance(n_files=1)
    for directory in sorted(directories, key=lambda d: len(d.parts), reverse=True):
        fsync_directory(directory)
    return copied


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
