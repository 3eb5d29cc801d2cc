"""The artifact format: a self-describing directory of plain arrays.

::

    model-dir/
        manifest.json   schema version, name, created time, input kind, classes, similarity
                        specs, library versions, and for every array: file, sha256, shape, dtype
        *.npy           arrays, loaded with allow_pickle=False

Reading verifies every checksum, shape and dtype before anything is used, and refuses artifacts
of a newer schema. Every file is checked before it is read: a regular file (never a FIFO, a
device or a directory, which could block or never end), of a bounded size (a manifest, or the
size its array's manifest entry gives). Writing goes to a temporary sibling directory first and
is renamed into place, so a crash never leaves half an artifact where a server would look for
one; the next writer removes what a crashed one left. Space for an array written through a
memory map is reserved before it is written: a full disk is an error, not a SIGBUS.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import threading
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from service.model.errors import (
    ArtifactChangedError,
    ArtifactError,
    ArtifactIntegrityError,
    ArtifactVersionError,
    ModelError,
)

SCHEMA_VERSION = 1
FORMAT = "besvm-artifact"
MANIFEST_NAME = "manifest.json"
HASH_BLOCK = 1 << 20
# A manifest names arrays and settings: kilobytes. A larger file is not read.
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
# Room for an .npy file's header beyond the data its manifest entry describes.
MAX_NPY_HEADER_BYTES = 64 * 1024

# Manifest keys of the format itself: never part of an artifact's metadata.
FORMAT_KEYS = frozenset({"model_type", "schema_version", "format", "arrays"})


@dataclass
class Artifact:
    """A loaded artifact: its manifest and verified arrays (``mapped``: the files of those
    memory-mapped, by array name)."""

    path: Path
    manifest: dict[str, Any]
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    mapped: dict[str, MappedFile] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class MappedFile:
    """An array file memory-mapped read-only, and the open file the map reads.

    The map reads the file's pages as they are on disk now: a file cut short in place (not
    replaced by rename) kills the process with SIGBUS at the next read past its new end, and a
    file rewritten in place changes the numbers under a verified checksum. :meth:`check`, called
    before each use of the map, tells either from the open file's size and modification time:
    the same file the map reads, whatever now lies at its path.

    Parameters
    ----------
    path : Path
    array : np.memmap
        The array, read-only.
    file : binary file
        Open on the mapped file, kept for its status.
    needed : int
        Bytes the map reads: the header and the data.
    modified_ns : int
        The file's modification time when it was verified and mapped.
    """

    path: Path
    array: np.ndarray
    file: BinaryIO
    needed: int
    modified_ns: int

    def __post_init__(self) -> None:
        # Closed with the last reference (the map holds a descriptor of its own).
        weakref.finalize(self, self.file.close)

    def check(self) -> None:
        """Raise ArtifactChangedError if the file was cut short or rewritten since mapped."""
        status = os.fstat(self.file.fileno())
        if status.st_size >= self.needed and status.st_mtime_ns == self.modified_ns:
            return
        what = (
            f"was cut to {status.st_size:,} bytes (the map needs {self.needed:,})"
            if status.st_size < self.needed
            else "was rewritten"
        )
        raise ArtifactChangedError(
            f"{self.path} {what} in place while it was served: artifacts must be replaced by "
            "rename (write a new directory, then rename it over the old one), never rewritten "
            "in place"
        )


_FILE_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def open_regular(path: Path, max_bytes: int) -> BinaryIO:
    """Open an artifact's file for reading once the open file is known to be a regular file of
    at most ``max_bytes``: opened without blocking (a FIFO would wait for a writer), then
    checked (a device or a FIFO could be read for ever, a sparse file of a terabyte too).

    Raises
    ------
    ArtifactIntegrityError
        Not a regular file, or larger than ``max_bytes``.
    OSError
        It cannot be opened.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            kind = _FILE_KINDS.get(stat.S_IFMT(status.st_mode), "not a regular file")
            raise ArtifactIntegrityError(f"{path} is {kind}, not a regular file: refused")
        if status.st_size > max_bytes:
            raise ArtifactIntegrityError(
                f"{path} holds {status.st_size:,} bytes, more than the {max_bytes:,} it may: "
                "refused"
            )
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def sha256_of(handle: BinaryIO) -> str:
    digest = hashlib.sha256()
    while block := handle.read(HASH_BLOCK):
        digest.update(block)
    return digest.hexdigest()


def manifest_digest(path: str | os.PathLike) -> str:
    """sha256 of an artifact's manifest: it names every array by checksum, so it identifies the
    whole artifact (artifacts derived from it record it to detect a replaced parent)."""
    with open_regular(Path(path) / MANIFEST_NAME, MAX_MANIFEST_BYTES) as handle:
        return sha256_of(handle)


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check the manifest of an artifact, without touching its arrays.

    Raises
    ------
    ArtifactError
        If there is no artifact at ``path``.
    ArtifactIntegrityError
        If the manifest is not valid JSON or lacks required fields.
    ArtifactVersionError
        If the artifact's schema is newer than this library's.
    """
    path = Path(path)
    manifest_path = path / MANIFEST_NAME
    if not path.is_dir():
        raise ArtifactError(f"no model artifact at {path}: directory does not exist")
    if not os.path.lexists(manifest_path):
        raise ArtifactError(f"no model artifact at {path}: {MANIFEST_NAME} is missing")
    try:
        with open_regular(manifest_path, MAX_MANIFEST_BYTES) as handle:
            manifest = json.loads(handle.read())
    except OSError as error:
        raise ArtifactError(f"cannot read {manifest_path}: {error.strerror or error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ArtifactIntegrityError(f"{manifest_path} is not valid JSON: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactIntegrityError(f"{manifest_path} is not a {FORMAT} manifest")
    schema = manifest.get("schema_version")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise ArtifactIntegrityError(f"{manifest_path}: schema_version must be an integer")
    if schema > SCHEMA_VERSION:
        raise ArtifactVersionError(
            f"{path} was written with artifact schema {schema}; this version reads schema "
            f"{SCHEMA_VERSION} and older: upgrade the service to load it"
        )
    if not isinstance(manifest.get("arrays"), dict):
        raise ArtifactIntegrityError(f"{manifest_path}: 'arrays' must be an object")
    return manifest


def read_artifact(path: str | os.PathLike, mmap: frozenset[str] = frozenset()) -> Artifact:
    """Load an artifact, verifying every array against its manifest entry.

    Parameters
    ----------
    path : path-like
    mmap : set of str
        Arrays to memory-map read-only instead of reading into memory.

    Returns
    -------
    Artifact

    Raises
    ------
    ArtifactError, ArtifactIntegrityError, ArtifactVersionError
    """
    path = Path(path)
    manifest = read_manifest(path)
    arrays, mapped = _load_arrays(path, manifest, mmap)
    return Artifact(path=path, manifest=manifest, arrays=arrays, mapped=mapped)


@dataclass
class TypedArtifact(Artifact):
    """A loaded artifact of a known model type (see :func:`read_typed_artifact`).

    ``metadata`` is the manifest less the format's keys (:data:`FORMAT_KEYS`) and the keys the
    reader reserved: what the model keeps and writes back as it is.
    """

    metadata: dict[str, Any] = field(default_factory=dict)


def read_typed_artifact(
    path: str | os.PathLike,
    model_type: str,
    required_arrays: Iterable[str] | Callable[[dict[str, Any]], Iterable[str]] = (),
    reserved_keys: Iterable[str] = (),
    *,
    mmap: Collection[str] = frozenset(),
) -> TypedArtifact:
    """Load an artifact of one model type: the one reader of every artifact kind.

    Checks, in order: the manifest (see :func:`read_manifest`), its ``model_type``, that it
    names every required array, then every array against its manifest entry (checksum, shape,
    dtype; see :func:`read_artifact`). Checks that belong to one kind (a parent's checksum, the
    arrays' consistency) stay with the caller.

    Parameters
    ----------
    path : path-like
        The artifact directory.
    model_type : str
        The ``model_type`` the manifest must record.
    required_arrays : iterable of str, or callable
        Arrays the manifest must name; or a function of the manifest giving them, for kinds
        whose arrays depend on the manifest (a model's input kind). Errors the function raises
        reading the manifest (KeyError, TypeError, ValueError, ModelError) become
        :class:`ArtifactIntegrityError`.
    reserved_keys : iterable of str
        Manifest keys the caller reads itself, left out of ``metadata`` (with
        :data:`FORMAT_KEYS`).
    mmap : collection of str, keyword-only
        Arrays to memory-map read-only instead of reading into memory.

    Returns
    -------
    TypedArtifact
        ``manifest``, verified ``arrays`` (every array the manifest names, required or not)
        and ``metadata``.

    Raises
    ------
    ArtifactError
        No artifact at ``path``, or one of another model type.
    ArtifactIntegrityError
        Malformed manifest, a required array missing, an array file missing, tampered with or
        inconsistent with its entry. Messages name the file.
    ArtifactVersionError
        The artifact's schema is newer than this library's.

    Examples
    --------
    >>> artifact = read_typed_artifact(  # doctest: +SKIP
    ...     path, "catalogue", {"projected", "ids", "negatives"}, mmap={"projected"}
    ... )
    """
    path = Path(path)
    manifest_path = path / MANIFEST_NAME
    manifest = read_manifest(path)
    found = manifest.get("model_type")
    if found != model_type:
        raise ArtifactError(f"{manifest_path}: model_type {found!r} is not {model_type!r}")
    if callable(required_arrays):
        with manifest_fields(path):
            required = set(required_arrays(manifest))
    else:
        required = set(required_arrays)
    missing = sorted(required - manifest["arrays"].keys())
    if missing:
        raise ArtifactIntegrityError(f"{manifest_path}: arrays missing from manifest: {missing}")
    arrays, mapped = _load_arrays(path, manifest, mmap)
    reserved = FORMAT_KEYS | frozenset(reserved_keys)
    metadata = {k: v for k, v in manifest.items() if k not in reserved}
    return TypedArtifact(
        path=path, manifest=manifest, arrays=arrays, mapped=mapped, metadata=metadata
    )


@contextmanager
def manifest_fields(path: str | os.PathLike) -> Iterator[None]:
    """Read manifest fields inside this block: a missing or mistyped field (KeyError,
    TypeError, ValueError, or a ModelError such as a bad spec) becomes an
    :class:`ArtifactIntegrityError` naming the manifest; ArtifactErrors pass unchanged.

    Examples
    --------
    >>> with manifest_fields(path):  # doctest: +SKIP
    ...     classes = tuple(str(c) for c in manifest["classes"])
    """
    try:
        yield
    except ArtifactError:
        raise
    except (KeyError, TypeError, ValueError, ModelError) as error:
        raise ArtifactIntegrityError(
            f"{Path(path) / MANIFEST_NAME}: malformed manifest: {error!r}"
        ) from None


def _load_arrays(
    path: Path, manifest: dict[str, Any], mmap: Collection[str]
) -> tuple[dict[str, np.ndarray], dict[str, MappedFile]]:
    arrays, mapped = {}, {}
    for name, entry in manifest["arrays"].items():
        if name in mmap:
            mapped[name] = _map_array(path, name, entry)
            arrays[name] = mapped[name].array
        else:
            arrays[name] = _load_array(path, name, entry)
    return arrays, mapped


def _array_file(root: Path, name: str, entry: Any) -> tuple[Path, BinaryIO, str]:
    """The array's file, open once checked (see :func:`open_regular`): at most the size of
    the data its manifest entry describes and a header."""
    where = f"{root}: array {name!r}"
    if not isinstance(entry, dict) or not {"file", "sha256", "shape", "dtype"} <= entry.keys():
        raise ArtifactIntegrityError(f"{where}: manifest entry needs file, sha256, shape, dtype")
    file_name = entry["file"]
    if not isinstance(file_name, str) or Path(file_name).name != file_name:
        raise ArtifactIntegrityError(f"{where}: file must be a plain name, got {file_name!r}")
    try:
        dtype = np.dtype(entry["dtype"])
        data_bytes = math.prod(int(n) for n in entry["shape"]) * dtype.itemsize
    except (TypeError, ValueError):
        raise ArtifactIntegrityError(
            f"{where}: manifest entry has a malformed shape or dtype"
        ) from None
    file = root / file_name
    try:
        handle = open_regular(file, data_bytes + MAX_NPY_HEADER_BYTES)
    except FileNotFoundError:
        raise ArtifactIntegrityError(f"{where}: file {file_name} is missing") from None
    except OSError as error:
        raise ArtifactIntegrityError(f"{where}: cannot open {file_name}: {error}") from None
    return file, handle, where


def _check_checksum(handle: BinaryIO, file: Path, entry: dict, where: str) -> None:
    if sha256_of(handle) != entry["sha256"]:
        raise ArtifactIntegrityError(
            f"{where}: checksum of {file.name} does not match the manifest "
            "(the file was modified, truncated or replaced)"
        )


def _check_layout(array: np.ndarray, file: Path, entry: dict, where: str) -> None:
    if list(array.shape) != list(entry["shape"]) or array.dtype.str != entry["dtype"]:
        raise ArtifactIntegrityError(
            f"{where}: {file.name} holds {array.dtype.str}{list(array.shape)}, manifest says "
            f"{entry['dtype']}{list(entry['shape'])}"
        )


def _load_array(root: Path, name: str, entry: Any) -> np.ndarray:
    file, handle, where = _array_file(root, name, entry)
    with handle:
        _check_checksum(handle, file, entry, where)
        handle.seek(0)
        try:
            array = _read_npy(handle)
        except ValueError as error:
            raise ArtifactIntegrityError(f"{where}: cannot read {file.name}: {error}") from None
    _check_layout(array, file, entry, where)
    return array


def _read_npy(handle: BinaryIO) -> np.ndarray:
    """The array of the .npy file at ``handle`` (a file on disk), as ``np.load`` reads it
    without pickles, its header parsed by :func:`read_npy_header`."""
    shape, fortran_order, dtype = read_npy_header(handle)
    if dtype.hasobject:
        raise ValueError("it holds Python objects; artifacts hold no pickles")
    count = math.prod(shape)
    array = np.fromfile(handle, dtype=dtype, count=count)
    if array.size != count:
        raise ValueError(f"{count} numbers expected, {array.size} found")
    return array.reshape(shape, order="F" if fortran_order else "C")


# numpy parses an .npy header with ast.literal_eval, and CPython 3.11's conversion of a parse
# tree to ast objects keeps its recursion depth in state the interpreter's threads share: two
# threads parsing at once (a model loading beside a catalogue snapshot) can fail with
# "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905). The service
# parses every header it reads under this lock.
_HEADER_PARSING = threading.Lock()


def read_npy_header(handle: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype from the header of the .npy file at ``handle``'s
    position, which is left where the data begins (nothing of the data is read). One thread at
    a time parses a header.

    Raises
    ------
    ValueError
        Not an .npy header, or a format version other than 1.0 and 2.0.
    """
    version = np.lib.format.read_magic(handle)
    read_header = {
        (1, 0): np.lib.format.read_array_header_1_0,
        (2, 0): np.lib.format.read_array_header_2_0,
    }.get(version)
    if read_header is None:
        raise ValueError(f"format version {version} is not read here")
    with _HEADER_PARSING:
        return read_header(handle)


def _map_array(root: Path, name: str, entry: Any) -> MappedFile:
    """Verify and memory-map one array file through one open file, kept open: the checksum,
    the map and the later checks (:meth:`MappedFile.check`) all read the same file, whatever
    is renamed to its path meanwhile."""
    file, handle, where = _array_file(root, name, entry)
    try:
        _check_checksum(handle, file, entry, where)
        modified_ns = os.fstat(handle.fileno()).st_mtime_ns
        handle.seek(0)
        try:
            shape, fortran_order, dtype = read_npy_header(handle)
            if dtype.hasobject:
                raise ValueError("it holds Python objects; artifacts hold no pickles")
            offset = handle.tell()
            array = np.memmap(
                handle,
                dtype=dtype,
                mode="r",
                shape=shape,
                order="F" if fortran_order else "C",
                offset=offset,
            )
        except ValueError as error:
            raise ArtifactIntegrityError(f"{where}: cannot read {file.name}: {error}") from None
        _check_layout(array, file, entry, where)
    except BaseException:
        handle.close()
        raise
    return MappedFile(file, array, handle, offset + array.nbytes, modified_ns)
