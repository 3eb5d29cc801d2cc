"""Writing artifacts (see :mod:`service.model.artifact` for the format): a whole directory staged
beside its path and renamed into place, an array file or a manifest added to one that grows in
place, and the staging, swapping and syncing of directories under them.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import platform
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from service.model.artifact import FORMAT, HASH_BLOCK, MANIFEST_NAME, SCHEMA_VERSION, sha256_of
from service.model.errors import ArtifactError

_ARRAY_NAME = re.compile(r"^[A-Za-z0-9_]+$")

# What staging and retired directories of an artifact at ``path`` are named (dot names: a
# repository scan skips them).
_STAGING = ".{name}.tmp-"
_RETIRED = ".{name}.old-"


@dataclass(frozen=True)
class StreamedArray:
    """An array too large to hold in memory: written straight into its file.

    ``fill`` receives the file as a writable memory map of ``shape`` and ``dtype`` and fills it,
    typically chunk by chunk, so memory stays bounded whatever the array's size.
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    fill: Callable[[np.ndarray], None]


def library_versions() -> dict[str, str]:
    """Versions of the libraries that shape an artifact's numbers."""
    versions = {"python": platform.python_version()}
    for package in ("besvm", "numpy", "scikit-learn", "numba"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "unknown"
    return versions


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return sha256_of(handle)


def write_artifact(
    path: str | os.PathLike,
    manifest: dict[str, Any],
    arrays: dict[str, np.ndarray | StreamedArray],
    overwrite: bool = False,
) -> Path:
    """Write an artifact directory atomically.

    Parameters
    ----------
    path : path-like
        The directory to create.
    manifest : dict
        JSON-serialisable fields; ``schema_version``, ``format``, ``created``, ``versions`` and
        ``arrays`` are filled in here.
    arrays : dict of str to ndarray or StreamedArray
        Names must be identifiers; object arrays are refused.
    overwrite : bool, default=False
        Replace an existing directory (only after the new one is complete).

    Returns
    -------
    Path
        The written directory.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise ArtifactError(f"{path} already exists; choose another path or allow overwriting")
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked_staging(path) as staging:
            entries = {}
            for name, array in arrays.items():
                if not _ARRAY_NAME.match(name):
                    raise ArtifactError(f"array name {name!r} must be letters, digits and _")
                file = staging / f"{name}.npy"
                shape, dtype = _save_array(file, name, array)
                entries[name] = {
                    "file": file.name,
                    "sha256": _sha256(file),
                    "shape": list(shape),
                    "dtype": dtype.str,
                }
            full = complete_manifest(manifest, entries)
            (staging / MANIFEST_NAME).write_text(json.dumps(full, indent=2) + "\n")
            _fsync_tree(staging)
            install_directory(staging, path)
    return path


@contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Inside the block, an OSError of a write (a full disk, a file system gone read-only) is
    the ArtifactError that says why, naming ``path`` and the room left beside it."""
    try:
        yield
    except OSError as error:
        raise _write_error(Path(path), error) from None


def _write_error(path: Path, error: OSError) -> ArtifactError:
    """An artifact that could not be written, saying why (and how much room is left)."""
    # numpy reports a short write without an errno: "62500 requested and 16368 written"
    reason = error.strerror or f"{error} (is the disk full?)"
    try:
        free = f"; {shutil.disk_usage(path.parent).free:,} bytes free on its file system"
    except OSError:
        free = ""
    return ArtifactError(f"cannot write {path}: {reason}{free}")


@contextmanager
def locked_staging(path: Path) -> Iterator[Path]:
    """A new, empty staging directory beside ``path`` for a writer of the artifact there, after
    removing what dead writers left (:func:`remove_stale_staging`). It stays locked while the
    block runs, so that no other writer removes it, and is removed if the block raises; the
    block installs it (:func:`install_directory`)."""
    remove_stale_staging(path)
    staging = path.parent / f"{_STAGING.format(name=path.name)}{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    lock = os.open(staging, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        os.close(lock)


def remove_stale_staging(path: Path) -> list[Path]:
    """Remove what writers of the artifact at ``path`` that died left beside it: staging and
    retired directories that no live writer holds locked. Returns those removed."""
    removed = []
    prefixes = (_STAGING.format(name=path.name), _RETIRED.format(name=path.name))
    try:
        siblings = list(path.parent.iterdir())
    except OSError:
        return removed
    for sibling in siblings:
        if not sibling.name.startswith(prefixes) or sibling.is_symlink() or not sibling.is_dir():
            continue
        try:
            descriptor = os.open(sibling, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a writer at work
        else:
            shutil.rmtree(sibling, ignore_errors=True)
            removed.append(sibling)
        finally:
            os.close(descriptor)
    return removed


def complete_manifest(manifest: dict[str, Any], entries: dict[str, dict]) -> dict[str, Any]:
    """``manifest`` with the format's fields: schema version, format, created, library versions
    and the array ``entries`` (see :func:`write_array_file`)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "format": FORMAT,
        **manifest,
        "created": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "versions": library_versions(),
        "arrays": entries,
    }


def write_array_file(directory: str | os.PathLike, file_name: str, array) -> dict[str, Any]:
    """Save one array of an artifact that grows in place (a new file beside the others, synced
    to disk) and return its manifest entry (file, sha256, shape, dtype).

    Parameters
    ----------
    directory : path-like
    file_name : str
        A plain ``.npy`` name that is not in use.
    array : ndarray or StreamedArray
    """
    file = Path(directory) / file_name
    shape, dtype = _save_array(file, file.stem, array)
    with file.open("rb") as handle:
        os.fsync(handle.fileno())
    return {"file": file.name, "sha256": _sha256(file), "shape": list(shape), "dtype": dtype.str}


def replace_manifest(directory: str | os.PathLike, manifest: dict[str, Any]) -> None:
    """Replace an artifact's manifest atomically: written beside, synced, renamed over the old
    one, and the directory synced. A crash at any point leaves the old manifest or the new one,
    never a mix; once this returns, the new one survives a crash."""
    directory = Path(directory)
    staging = directory / f".{MANIFEST_NAME}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with staging.open("w") as handle:
            handle.write(json.dumps(manifest, indent=2) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, directory / MANIFEST_NAME)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    fsync_directory(directory)


def fsync_directory(directory: str | os.PathLike) -> None:
    """Make the names in ``directory`` (files created, renamed, removed) survive a crash."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def install_directory(staging: Path, path: Path) -> None:
    """Put the complete directory ``staging`` at ``path``: renamed there, or swapped with the
    directory there (see :func:`_replace_directory`), and the parent directory synced."""
    if path.exists():
        _replace_directory(staging, path)
    else:
        staging.rename(path)
    fsync_directory(path.parent)


def _replace_directory(new: Path, old: Path) -> None:
    """Put directory ``new`` at ``old``'s path, and remove the old one.

    Where the kernel can (Linux's ``renameat2`` with ``RENAME_EXCHANGE``) the two are swapped in
    one atomic step, so a reader (a server rescanning its repository) never finds the path
    missing; elsewhere the old one is renamed away first, leaving it missing for an instant.
    Readers that memory-mapped the old files keep them: they are unlinked, never rewritten.
    """
    if exchange_paths(new, old):
        shutil.rmtree(new, ignore_errors=True)
        return
    retired = old.parent / f"{_RETIRED.format(name=old.name)}{uuid.uuid4().hex[:8]}"
    old.rename(retired)
    new.rename(old)
    shutil.rmtree(retired, ignore_errors=True)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange_paths(a: Path, b: Path) -> bool:
    """Atomically swap two paths (``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    result = renameat2(
        _AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), ctypes.c_uint(_RENAME_EXCHANGE)
    )
    if result == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(error, os.strerror(error), str(b))


def _save_array(file: Path, name: str, array) -> tuple[tuple[int, ...], np.dtype]:
    if isinstance(array, StreamedArray):
        dtype = np.dtype(array.dtype)
        if dtype.hasobject:
            raise ArtifactError(f"array {name!r} holds Python objects; artifacts hold no pickles")
        mapped = np.lib.format.open_memmap(file, mode="w+", dtype=dtype, shape=array.shape)
        try:
            _reserve_space(file)
            array.fill(mapped)
            mapped.flush()
        finally:
            del mapped
        return tuple(array.shape), dtype
    array = np.asarray(array, order="C")
    if array.dtype.hasobject:
        raise ArtifactError(f"array {name!r} holds Python objects; artifacts hold no pickles")
    np.save(file, array, allow_pickle=False)
    return array.shape, array.dtype


def _reserve_space(file: Path) -> None:
    """Give every byte of ``file`` (created sparse) its disk blocks now: a memory map writing
    to a sparse file on a full disk kills the process with SIGBUS; this raises OSError
    (ENOSPC) instead. Where the file system cannot reserve space, zeros are written."""
    with file.open("r+b") as handle:
        size = os.fstat(handle.fileno()).st_size
        try:
            os.posix_fallocate(handle.fileno(), 0, size)
            return
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
        block = bytes(HASH_BLOCK)
        for start in range(0, size, len(block)):
            handle.write(block[: size - start])
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_tree(directory: Path) -> None:
    for file in directory.iterdir():
        if not file.is_file():
            continue
        with file.open("rb") as handle:
            os.fsync(handle.fileno())
