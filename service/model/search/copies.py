"""Copies of whole catalogue versions, file by file, each file checked against its sha256 as it
is read, and a version restored from such a copy under the writer lock: what snapshots
(:mod:`service.model.search.snapshots`) are made of.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from service.model.artifact import (
    MANIFEST_NAME,
    manifest_fields,
    open_regular,
    read_manifest,
    read_typed_artifact,
)
from service.model.artifact_writing import fsync_directory, install_directory, locked_staging
from service.model.errors import ArtifactError, ArtifactIntegrityError
from service.model.search.catalogue import (
    CATALOGUE_TYPE,
    DEFAULT_NEGATIVES,
    SHARDED_LAYOUT,
    SHARDS_DIR,
)
from service.model.search.versions import (
    UpdateResult,
    catalogue_lock,
    remove_unreferenced,
    write_version,
)

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
    tombstones, negatives and manifest written (see :func:`write_version`), so that servers
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
            manifest = write_version(
                path, search_path, int(current["version"]) + 1, int(wanted["n_atoms"]), shards,
                artifact.arrays["tombstones"].astype(np.int64), dict(wanted["attributes"]),
                int(wanted.get("n_negatives", DEFAULT_NEGATIVES)),
                int(wanted.get("negatives_seed", 0)), wanted,
                negatives=artifact.arrays["negatives"].astype(np.int64),
            )  # fmt: skip
        remove_unreferenced(path, [current, manifest])
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
