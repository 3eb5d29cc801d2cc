"""Snapshots of a catalogue: a consistent, checksummed copy of one version, and its restore.

::

    <snapshot>/
        snapshot.json       format, the catalogue version, its items and shards, the search
                            model's manifest sha256 it was built for, and every file below with
                            its size and sha256; last, the sha256 of this document itself
        catalogue/          the version's files as the catalogue holds them: manifest.json,
                            tombstones-*.npy, negatives-*.npy, shards/<name>/...

A snapshot is taken from the newest version on disk while searches and updates go on: under
the catalogue's writer lock (:func:`service.model.search.versions.catalogue_lock`) the version's
files are hard-linked into a directory beside the catalogue (they are never rewritten in place,
only unlinked once two newer versions exist), which takes milliseconds; the lock is let go and
the files are copied from the links at leisure, each hashed as it is read and checked against
its manifest, into a staging directory beside the snapshot, renamed into place once complete
(:func:`service.model.artifact_writing.locked_staging`). Where the search model's directory cannot
be written (a server's read-only mount of the models), no link can be made beside the catalogue:
the version is then copied while the writer lock is held, so a writer elsewhere (a trainer with
the same files mounted for writing) waits for the copy. Whatever serves the catalogue, this
process's memory maps or a cluster's actors, a snapshot is the same files: it reads the disk
only.

A restore (:func:`restore_snapshot`) first verifies the whole snapshot: the document's own
checksum, every file it lists (present, of its size and sha256), and that it lists every file
the version's manifests name; a damaged or partial snapshot is refused, the file named, and
nothing is written. The version is then made the catalogue's newest (see
:func:`service.model.search.copies.restore_version`). Nothing is pickled: the files are the
catalogue's own ``.npy`` and JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from service.model.artifact import MAX_MANIFEST_BYTES, manifest_digest, open_regular, read_manifest
from service.model.artifact_writing import (
    fsync_directory,
    install_directory,
    locked_staging,
    remove_stale_staging,
)
from service.model.errors import (
    ArtifactError,
    ArtifactIntegrityError,
    NotFoundError,
    SnapshotRefusedError,
    brief,
)
from service.model.search.copies import (
    NO_PROGRESS,
    Progress,
    copy_checked,
    copy_files,
    file_sha256,
    restore_version,
    version_files,
)
from service.model.search.layout import catalogue_dir, search_dir
from service.model.search.versions import UpdateResult, catalogue_lock

SNAPSHOT_MANIFEST = "snapshot.json"
SNAPSHOT_FORMAT = "besvm-catalogue-snapshot"
SNAPSHOT_SCHEMA = 1
# The version's files inside a snapshot.
VERSION_DIR = "catalogue"
# Beside the catalogue (in the search model's directory): the links that pin a version while it
# is copied.
PIN_NAME = "catalogue-snapshot"


@dataclass(frozen=True)
class Snapshot:
    """A snapshot on disk, as its document describes it.

    Parameters
    ----------
    path : Path
        Its directory.
    catalogue_version : int
    n_items : int
        Live items of that version.
    n_shards : int
    created : str
        When it was taken (UTC, ISO 8601).
    search_manifest_sha256 : str
        The search model the version was built for.
    checksums : dict of str to str
        sha256 of each file, by path relative to the version's directory.
    sizes : dict of str to int
        Bytes of each file.
    """

    path: Path
    catalogue_version: int
    n_items: int
    n_shards: int
    created: str
    search_manifest_sha256: str
    checksums: dict[str, str]
    sizes: dict[str, int]

    @property
    def version_path(self) -> Path:
        """The directory of the version's files."""
        return self.path / VERSION_DIR

    def describe(self) -> dict[str, Any]:
        """What clients are told of it."""
        return {
            "name": self.path.name,
            "catalogue_version": self.catalogue_version,
            "n_items": self.n_items,
            "n_shards": self.n_shards,
            "n_files": len(self.checksums),
            "n_bytes": sum(self.sizes.values()),
            "created": self.created,
        }


def _document_digest(document: dict[str, Any]) -> str:
    """sha256 of a snapshot document without its own ``sha256`` field (canonical JSON)."""
    body = {k: v for k, v in document.items() if k != "sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.contextmanager
def _pinned(path: Path, search_path: Path) -> Iterator[tuple[Path, dict[str, str | None]]]:
    """The files of the newest catalogue version at ``path`` (relative paths), linked (or, on a
    file system without hard links, copied) under the writer lock into a directory of their
    own, which is removed after the block; yields it and the files. Where ``search_path``
    cannot be written, yields ``path`` itself with the writer lock held through the block."""
    if not os.access(search_path, os.W_OK):
        with catalogue_lock(search_path, reader=True):
            yield path, version_files(path)
        return
    with locked_staging(search_path / PIN_NAME) as pin:
        try:
            with catalogue_lock(search_path):
                files = version_files(path)
                for rel in files:
                    target = pin / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        os.link(path / rel, target)
                    except OSError:
                        copy_checked(path / rel, target)
            yield pin, files
        finally:
            shutil.rmtree(pin, ignore_errors=True)


def take_snapshot(
    path: str | os.PathLike,
    search_path: str | os.PathLike,
    out: str | os.PathLike,
    progress: Progress = NO_PROGRESS,
) -> Snapshot:
    """Write a snapshot of the newest version of the catalogue at ``path`` to ``out`` (which
    must not exist): see the module docstring.

    Parameters
    ----------
    path : path-like
        The catalogue's directory.
    search_path : path-like
        Its search model's directory (the writer lock is there).
    out : path-like
        The snapshot's directory.
    progress : Progress, optional
        Told of the files and bytes copied (stage ``copying``).

    Returns
    -------
    Snapshot

    Raises
    ------
    ArtifactError
        No catalogue, or ``out`` exists.
    ArtifactIntegrityError
        A file of the version that does not match its manifest (it is not copied as if sound).
    """
    path, search_path, out = Path(path), Path(search_path), Path(out)
    if out.exists():
        raise ArtifactError(f"{out} already exists: a snapshot is written to a new directory")
    try:
        return _take(path, search_path, out, progress)
    except OSError as error:  # a full disk, a directory not writable: said, never a 500
        raise ArtifactError(f"cannot write the snapshot {out}: {error}") from None


def _take(path: Path, search_path: Path, out: Path, progress: Progress) -> Snapshot:
    out.parent.mkdir(parents=True, exist_ok=True)
    with _pinned(path, search_path) as (pin, files), locked_staging(out) as staging:
        progress.begin("copying", len(files), sum(os.stat(pin / rel).st_size for rel in files))
        # Checked against the manifests as they are copied: a version damaged on disk is
        # refused (naming the file), never copied as if sound.
        copied = copy_files(pin, staging / VERSION_DIR, files, named=path, progress=progress)
        manifest = read_manifest(staging / VERSION_DIR)
        document = {
            "format": SNAPSHOT_FORMAT,
            "schema_version": SNAPSHOT_SCHEMA,
            "created": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "catalogue_version": int(manifest.get("version", 0)),
            "n_items": int(manifest.get("n_items", 0)),
            "n_shards": len(manifest.get("shards", [])) or 1,
            "search_manifest_sha256": str(manifest.get("search_manifest_sha256", "")),
            "files": [
                {"path": rel, "bytes": size, "sha256": sha256}
                for rel, (sha256, size) in copied.items()
            ],
        }
        document["sha256"] = _document_digest(document)
        with open(staging / SNAPSHOT_MANIFEST, "x") as handle:
            handle.write(json.dumps(document, indent=2) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        fsync_directory(staging)
        install_directory(staging, out)
    return _described(out, document)


def _refused(path: Path, why: str) -> SnapshotRefusedError:
    return SnapshotRefusedError(f"snapshot {path} refused: {why}")


def read_snapshot(path: str | os.PathLike, progress: Progress = NO_PROGRESS) -> Snapshot:
    """The snapshot at ``path`` once every file it holds is verified: its document (its own
    checksum), each file it lists (present, a regular file of its size and sha256, inside the
    snapshot), and every file the version's manifests name listed with the checksum they
    record. The files and bytes read are told to ``progress`` (stage ``verifying``).

    Raises
    ------
    ArtifactError
        No snapshot at ``path``.
    ArtifactIntegrityError
        A damaged or partial snapshot: the message names the file.
    """
    path = Path(path)
    snapshot = _described(path, _document(path))
    version = snapshot.version_path
    progress.begin("verifying", len(snapshot.sizes), sum(snapshot.sizes.values()))
    for rel, sha256 in snapshot.checksums.items():
        _verify_file(path, version / rel, snapshot.sizes[rel], sha256, progress)
        progress.advance(n_files=1)
    try:
        listed = version_files(version)
    except ArtifactError as error:
        raise _refused(path, f"the version in it cannot be read: {error}") from None
    for rel, recorded in listed.items():
        if rel not in snapshot.checksums:
            raise _refused(path, f"partial: {version / rel} is not listed in {SNAPSHOT_MANIFEST}")
        if recorded is not None and snapshot.checksums[rel] != recorded:
            raise _refused(path, f"damaged: {version / rel} is not the file its manifest names")
    return snapshot


def _document(path: Path) -> dict[str, Any]:
    """The snapshot's document, checked against its own checksum."""
    document_path = path / SNAPSHOT_MANIFEST
    if not path.is_dir():
        raise ArtifactError(f"no snapshot at {path}: no such directory")
    if not os.path.lexists(document_path):
        raise _refused(path, f"partial: {document_path} is missing")
    try:
        with open_regular(document_path, MAX_MANIFEST_BYTES) as handle:
            document = json.loads(handle.read())
    except ArtifactIntegrityError as error:
        raise _refused(path, f"damaged: {error}") from None
    except OSError as error:
        raise _refused(path, f"{document_path} cannot be read: {error.strerror or error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise _refused(path, f"damaged: {document_path} is not JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != SNAPSHOT_FORMAT:
        raise _refused(path, f"{document_path} is not a {SNAPSHOT_FORMAT} document")
    if document.get("sha256") != _document_digest(document):
        raise _refused(path, f"damaged: {document_path} does not match its checksum")
    if document.get("schema_version") != SNAPSHOT_SCHEMA:
        raise _refused(
            path, f"{document_path} is of snapshot schema {document.get('schema_version')!r}; "
            f"this version reads schema {SNAPSHOT_SCHEMA}",
        )  # fmt: skip
    return document


def _described(path: Path, document: dict[str, Any]) -> Snapshot:
    """The snapshot a (checked) document describes; its files are not read."""
    checksums: dict[str, str] = {}
    sizes: dict[str, int] = {}
    try:
        for entry in document["files"]:
            rel = str(entry["path"])
            parts = PurePosixPath(rel).parts
            if not parts or PurePosixPath(rel).is_absolute() or {"..", "."} & set(parts):
                raise _refused(path, f"{SNAPSHOT_MANIFEST} lists {rel!r}, not a path inside it")
            checksums[rel], sizes[rel] = str(entry["sha256"]), int(entry["bytes"])
        return Snapshot(
            path, int(document["catalogue_version"]), int(document["n_items"]),
            int(document["n_shards"]), str(document["created"]),
            str(document["search_manifest_sha256"]), checksums, sizes,
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as error:
        raise _refused(path, f"{SNAPSHOT_MANIFEST} is malformed ({error!r})") from None


def _verify_file(snapshot: Path, file: Path, size: int, sha256: str, progress: Progress) -> None:
    """The file is there, a regular file of ``size`` bytes hashing to ``sha256``."""
    try:
        held = os.lstat(file).st_size
    except FileNotFoundError:
        raise _refused(snapshot, f"partial: {file} is missing") from None
    if held < size:
        raise _refused(snapshot, f"partial: {file} holds {held:,} of its {size:,} bytes")
    try:
        matches = file_sha256(file, size, progress) == sha256
    except ArtifactIntegrityError as error:
        raise _refused(snapshot, f"damaged: {error}") from None
    except OSError as error:
        raise _refused(snapshot, f"{file} cannot be read: {error.strerror or error}") from None
    if not matches:
        raise _refused(snapshot, f"damaged: {file} does not match its checksum")


def described_snapshot(path: str | os.PathLike) -> Snapshot:
    """The snapshot at ``path`` as its document (checked against its own checksum) describes
    it, without reading its files: for listing (:func:`read_snapshot` verifies them).

    Raises
    ------
    ArtifactError, ArtifactIntegrityError
        No snapshot there, or a damaged document.
    """
    path = Path(path)
    return _described(path, _document(path))


# A snapshot's name where a server keeps them (SNAPSHOTS_DIR/<model>/<name>).
SNAPSHOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def new_snapshot_name() -> str:
    """A new snapshot's name: when it is taken (UTC, so names sort by time), and a few random
    characters."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:6]}"


def snapshot_in(directory: str | os.PathLike, name: str) -> Path:
    """The snapshot ``name`` kept in ``directory``; NotFoundError if the name is not one of a
    snapshot's or none is there."""
    path = Path(directory) / name
    if not SNAPSHOT_NAME.fullmatch(name) or not path.is_dir():
        raise NotFoundError(f"no catalogue snapshot {brief(name)} in {directory}")
    return path


# A snapshot being written, or left half-written by a writer that died: hidden, never listed.
_STAGED = re.compile(r"\.(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,127})\.(?:tmp|old)-[0-9a-f]{8}")


def remove_unfinished(directory: str | os.PathLike) -> list[Path]:
    """Remove what snapshot writers that died left in ``directory``: their staging
    directories, which no live writer holds locked (see
    :func:`service.model.artifact_writing.remove_stale_staging`). Returns those removed."""
    directory = Path(directory)
    removed: list[Path] = []
    try:
        names = {m["name"] for e in os.scandir(directory) if (m := _STAGED.fullmatch(e.name))}
    except OSError:
        return removed
    for name in sorted(names):
        removed += remove_stale_staging(directory / name)
    return removed


def list_snapshots(directory: str | os.PathLike) -> tuple[list[Snapshot], list[str]]:
    """The snapshots kept in ``directory``, oldest first, by their documents (see
    :func:`described_snapshot`), and the directories there that hold none readable, each
    with why."""
    directory = Path(directory)
    found, unreadable = [], []
    if not directory.is_dir():
        return found, unreadable
    for entry in sorted(directory.iterdir()):
        if not SNAPSHOT_NAME.fullmatch(entry.name) or not entry.is_dir():
            continue  # a snapshot being written (staged under a hidden name), or not ours
        try:
            found.append(described_snapshot(entry))
        except ArtifactError as error:
            unreadable.append(f"{entry.name}: {error}")
    found.sort(key=lambda snapshot: (snapshot.created, snapshot.path.name))
    return found, unreadable


def restore_snapshot(
    snapshot: str | os.PathLike,
    path: str | os.PathLike,
    search_path: str | os.PathLike,
    progress: Progress = NO_PROGRESS,
) -> tuple[Snapshot, UpdateResult]:
    """Verify the snapshot at ``snapshot`` (see :func:`read_snapshot`), then make its version
    the newest of the catalogue at ``path`` (see
    :func:`service.model.search.copies.restore_version`), telling ``progress`` of both stages.

    Raises
    ------
    ArtifactError, ArtifactIntegrityError
        No snapshot, a damaged or partial one (the file named), or one of a catalogue built for
        another search model. Nothing is written then.
    """
    verified = read_snapshot(snapshot, progress)
    if verified.search_manifest_sha256 != manifest_digest(search_path):
        raise SnapshotRefusedError(
            f"snapshot {verified.path} is of a catalogue built for another search model than "
            f"{search_path}: restore it into the model it was taken from (or a copy of it)"
        )
    try:
        result = restore_version(
            path, search_path, verified.version_path, verified.checksums, progress
        )
    except OSError as error:  # a full disk, a directory not writable: said, never a 500
        raise ArtifactError(f"cannot restore {verified.path} into {path}: {error}") from None
    return verified, result


def snapshot_model_catalogue(
    model_dir: str | os.PathLike, out: str | os.PathLike, progress: Progress = NO_PROGRESS
) -> Snapshot:
    """:func:`take_snapshot` of a model's catalogue."""
    return take_snapshot(catalogue_dir(model_dir), search_dir(model_dir), out, progress)


def restore_model_catalogue(
    snapshot: str | os.PathLike, model_dir: str | os.PathLike, progress: Progress = NO_PROGRESS
) -> tuple[Snapshot, UpdateResult]:
    """:func:`restore_snapshot` into a model's catalogue."""
    return restore_snapshot(snapshot, catalogue_dir(model_dir), search_dir(model_dir), progress)


SNAPSHOT_HELP = (
    "write a consistent copy of the catalogue's newest version to the new directory OUT, with "
    "a sha256 of every file (snapshot.json), while servers search and update it"
)
RESTORE_HELP = (
    "verify every file of the snapshot in SNAPSHOT (a damaged or partial one is refused, the "
    "file named), then make its version the catalogue's newest (servers serve it at their next "
    "rescan)"
)


def snapshot_command(
    model_dir: str | os.PathLike,
    snapshot: str | os.PathLike | None,
    restore: str | os.PathLike | None,
    progress: Progress = NO_PROGRESS,
) -> str:
    """``python -m training index --snapshot OUT`` or ``--restore SNAPSHOT``: what it did, in a
    line (the files and bytes told to ``progress`` as it goes)."""
    if snapshot is not None:
        taken = snapshot_model_catalogue(model_dir, snapshot, progress)
        return (
            f"snapshot         {taken.path}: catalogue version {taken.catalogue_version}, "
            f"{taken.n_items:,} items in {taken.n_shards} shards, {len(taken.checksums)} files "
            f"({sum(taken.sizes.values()):,} bytes) with their sha256"
        )
    verified, result = restore_model_catalogue(restore, model_dir, progress)
    return (
        f"catalogue        {catalogue_dir(model_dir)}: version {result.version}, "
        f"{result.n_items:,} items in {result.n_shards} shards (restored from {verified.path}, "
        f"version {verified.catalogue_version}, every file verified)"
    )
