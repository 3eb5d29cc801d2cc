"""Training data in shards: a directory that the driver never loads whole.

Three layouts, each a directory (docs/using/cluster.md shows how to write them):

- **npy stacks**, as ``dask.array.to_npy_stack`` writes them: ``DIR/X/0.npy, 1.npy, ...`` (the
  items' rows, in chunks along the first axis) and ``DIR/y/0.npy, ...`` (their labels, chunked
  alike). Dask's ``info`` file beside the chunks is a pickle: it is never read (reading it could
  run code), the ``.npy`` headers say everything it does.
- **npz shards**: ``DIR/*.npz``, each with ``X`` (n_i, d) and ``y`` (n_i,), as
  ``numpy.savez`` writes them (no pickled arrays).
- **Parquet**: ``DIR/*.parquet``, one numeric column per feature and a label column (``label``
  unless told), the same columns in every file.

Shards are taken in the order of their names (numbers as numbers: ``2.npy`` before ``10.npy``).
:func:`open_shards` reads only the files' headers on the driver and refuses a shard whose row
length or label type disagrees with the first one's; :func:`read_shard` loads one shard, where
it is called (on a Dask worker, by the distributed fit). :func:`write_shards` makes any layout
from arrays in memory (``python -m training shard`` from one ``.npz``).
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.data.readers import DatasetError

__all__ = [
    "SHARD_FORMATS",
    "Shard",
    "ShardError",
    "ShardedData",
    "is_sharded",
    "open_shards",
    "read_shard",
    "write_shards",
]

NPY_STACK, NPZ, PARQUET = "npy-stack", "npz", "parquet"
SHARD_FORMATS = (NPY_STACK, NPZ, PARQUET)
DEFAULT_LABEL_COLUMN = "label"


class ShardError(DatasetError):
    """A sharded data set cannot be used; the message names the shard and the problem."""


@dataclass(frozen=True)
class Shard:
    """One shard: where it is and what its header says.

    Attributes
    ----------
    path : str
        The shard's file (for npy stacks, the ``X`` chunk; ``labels`` is the ``y`` chunk).
    format : str
        One of :data:`SHARD_FORMATS`.
    n_rows : int
    labels : str or None
        npy stacks: the labels' chunk.
    label_column : str or None
        Parquet: the label column.
    """

    path: str
    format: str
    n_rows: int
    labels: str | None = None
    label_column: str | None = None


@dataclass(frozen=True)
class ShardedData:
    """A sharded training set, described by its headers only.

    Attributes
    ----------
    root : Path
    format : str
    shards : tuple of Shard
    n_features : int
        Numbers in one item's row.
    """

    root: Path
    format: str
    shards: tuple[Shard, ...]
    n_features: int

    @property
    def n_samples(self) -> int:
        return sum(shard.n_rows for shard in self.shards)

    def __str__(self) -> str:
        return (
            f"{self.root} ({self.format}: {len(self.shards)} shards, {self.n_samples} items of "
            f"{self.n_features} numbers)"
        )


def _natural_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def _files(directory: Path, suffix: str) -> list[Path]:
    return sorted(
        (p for p in directory.iterdir() if p.suffix == suffix and not p.name.startswith(".")),
        key=_natural_key,
    )


def _layout(root: Path) -> str | None:
    if not root.is_dir():
        return None
    if (root / "X").is_dir() and (root / "y").is_dir() and _files(root / "X", ".npy"):
        return NPY_STACK
    if _files(root, ".npz"):
        return NPZ
    if _files(root, ".parquet"):
        return PARQUET
    return None


def is_sharded(path: str | Path) -> bool:
    """Whether ``path`` is a directory in one of the shard layouts."""
    return _layout(Path(path)) is not None


def _npy_header(handle, where: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
    except (ValueError, OSError, EOFError) as error:
        raise ShardError(f"{where}: not a readable .npy array ({error})") from None
    if dtype.hasobject:
        raise ShardError(f"{where}: holds objects, which need pickle: refused")
    return shape, dtype


def _npz_header(path: Path, name: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        with zipfile.ZipFile(path) as archive, archive.open(f"{name}.npy") as handle:
            return _npy_header(handle, f"{path}:{name}")
    except KeyError:
        raise ShardError(f"{path}: no array {name!r} (a shard holds X and y)") from None
    except (zipfile.BadZipFile, OSError) as error:
        raise ShardError(f"{path}: not a readable .npz archive ({error})") from None


def _label_kind(dtype: np.dtype) -> str:
    """What labels of this type are, for comparing shards: text, integers, or booleans."""
    if dtype.kind in "US":
        return "text"
    if dtype.kind in "iu":
        return "integers"
    if dtype.kind == "b":
        return "booleans"
    raise DatasetError(f"labels of type {dtype}")


def _check_dense(where: str, x_shape, x_dtype, y_shape, y_dtype) -> tuple[int, int, str]:
    if x_dtype.kind not in "iuf":
        raise ShardError(f"{where}: X must be numeric, got dtype {x_dtype}")
    if len(x_shape) != 2:
        raise ShardError(f"{where}: X must be 2-d (items x numbers), got shape {x_shape}")
    if len(y_shape) != 1 or y_shape[0] != x_shape[0]:
        raise ShardError(f"{where}: y must have shape ({x_shape[0]},) to match X, got {y_shape}")
    try:
        kind = _label_kind(y_dtype)
    except DatasetError:
        raise ShardError(
            f"{where}: labels must be text, integers or booleans, got {y_dtype}"
        ) from None
    return x_shape[0], x_shape[1], kind


def _parquet_header(path: Path, label_column: str) -> tuple[int, int, str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
        n_rows = pq.ParquetFile(path).metadata.num_rows
    except (OSError, pa.ArrowException) as error:
        raise ShardError(f"{path}: not a readable Parquet file ({error})") from None
    if label_column not in schema.names:
        raise ShardError(f"{path}: no label column {label_column!r} (columns: {schema.names[:8]})")
    features = [field for field in schema if field.name != label_column]
    bad = [
        f.name
        for f in features
        if not (pa.types.is_integer(f.type) or pa.types.is_floating(f.type))
    ]
    if bad:
        raise ShardError(f"{path}: feature columns must be numeric, {bad[:3]} are not")
    label = schema.field(label_column).type
    if pa.types.is_string(label) or pa.types.is_large_string(label):
        kind = "text"
    elif pa.types.is_integer(label):
        kind = "integers"
    elif pa.types.is_boolean(label):
        kind = "booleans"
    else:
        raise ShardError(f"{path}: labels must be text, integers or booleans, got {label}")
    return n_rows, len(features), kind


def open_shards(path: str | Path, label_column: str = DEFAULT_LABEL_COLUMN) -> ShardedData:
    """Describe a sharded data set from its files' headers, checking that the shards agree.

    Parameters
    ----------
    path : str or Path
        A directory in one of the layouts of this module.
    label_column : str, default="label"
        Parquet: the column holding the class.

    Returns
    -------
    ShardedData

    Raises
    ------
    ShardError
        No layout recognised, an unreadable shard, or one whose row length, label type or (for
        Parquet) columns differ from the first shard's, or whose X and y disagree; the message
        names the shard.
    """
    root = Path(path)
    layout = _layout(root)
    if layout is None:
        raise ShardError(
            f"{root}: not a sharded data set: expected X/ and y/ of .npy chunks "
            "(dask.array.to_npy_stack), .npz shards (X, y), or .parquet files"
        )
    shards: list[Shard] = []
    first: tuple[str, int, str, list[str] | None] | None = None
    if layout == NPY_STACK:
        chunks, labels = _files(root / "X", ".npy"), _files(root / "y", ".npy")
        if [c.name for c in chunks] != [c.name for c in labels]:
            raise ShardError(
                f"{root}: X/ and y/ hold different chunks ({len(chunks)} and {len(labels)} "
                ".npy files, or other names)"
            )
    else:
        chunks = _files(root, ".npz" if layout == NPZ else ".parquet")
        labels = [None] * len(chunks)
    for chunk, label_chunk in zip(chunks, labels, strict=True):
        columns = None
        if layout == NPY_STACK:
            with chunk.open("rb") as handle:
                x_shape, x_dtype = _npy_header(handle, str(chunk))
            with label_chunk.open("rb") as handle:
                y_shape, y_dtype = _npy_header(handle, str(label_chunk))
            n_rows, width, kind = _check_dense(str(chunk), x_shape, x_dtype, y_shape, y_dtype)
        elif layout == NPZ:
            x_shape, x_dtype = _npz_header(chunk, "X")
            y_shape, y_dtype = _npz_header(chunk, "y")
            n_rows, width, kind = _check_dense(str(chunk), x_shape, x_dtype, y_shape, y_dtype)
        else:
            import pyarrow.parquet as pq

            n_rows, width, kind = _parquet_header(chunk, label_column)
            columns = pq.read_schema(chunk).names
        if first is None:
            first = (str(chunk), width, kind, columns)
        elif width != first[1]:
            raise ShardError(
                f"{chunk}: rows of {width} numbers, but {first[0]} has {first[1]}: every shard "
                "must have the same features"
            )
        elif kind != first[2]:
            raise ShardError(f"{chunk}: labels are {kind}, but {first[0]}'s are {first[2]}")
        elif columns != first[3]:
            raise ShardError(f"{chunk}: columns differ from those of {first[0]}")
        if n_rows == 0:
            raise ShardError(f"{chunk}: an empty shard")
        shards.append(
            Shard(
                str(chunk),
                layout,
                int(n_rows),
                labels=None if label_chunk is None else str(label_chunk),
                label_column=label_column if layout == PARQUET else None,
            )
        )
    return ShardedData(root, layout, tuple(shards), int(first[1]))


def read_shard(
    shard: Shard, start: int = 0, stop: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Load one shard's rows ``start`` to ``stop`` (default: all of them) as float64, and their
    labels as text. An npy stack's rows are read alone (memory-mapped); the other layouts are
    read whole, then sliced.

    Returns
    -------
    X : ndarray of shape (stop - start, n_features), float64, C-contiguous
    y : ndarray of shape (stop - start,), str

    Raises
    ------
    ShardError
        The shard changed since its header was read, or holds NaN or infinity.
    ValueError
        Not ``0 <= start <= stop <= n_rows``.
    """
    stop = shard.n_rows if stop is None else stop
    if not 0 <= start <= stop <= shard.n_rows:
        raise ValueError(f"{shard.path}: rows {start} to {stop} of {shard.n_rows}")
    if shard.format == PARQUET:
        import pyarrow.parquet as pq

        table = pq.read_table(shard.path)
        _check_rows(shard, table.num_rows, table.num_rows)
        table = table.slice(start, stop - start)
        y = table.column(shard.label_column).to_numpy(zero_copy_only=False)
        features = table.drop_columns([shard.label_column])
        X = np.column_stack([c.to_numpy(zero_copy_only=False) for c in features.columns])
    else:
        if shard.format == NPY_STACK:
            X = np.load(shard.path, mmap_mode="r", allow_pickle=False)
            y = np.load(shard.labels, mmap_mode="r", allow_pickle=False)
        else:
            with np.load(shard.path, allow_pickle=False) as archive:
                X, y = archive["X"], archive["y"]
        _check_rows(shard, len(X), len(y))
        # A copy: the rows outlive the file's mapping.
        X, y = np.array(X[start:stop], dtype=np.float64, order="C"), np.array(y[start:stop])
    X = np.ascontiguousarray(X, dtype=np.float64)
    if not np.isfinite(X).all():
        row = start + int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])
        raise ShardError(f"{shard.path}: row {row} contains NaN or infinity")
    return X, np.asarray(y).astype(str)


def _check_rows(shard: Shard, n_x: int, n_y: int) -> None:
    if n_x != shard.n_rows or n_y != shard.n_rows:
        raise ShardError(f"{shard.path}: {n_x} rows, its header said {shard.n_rows}")


def write_shards(
    X: np.ndarray,
    y: np.ndarray,
    out: str | Path,
    *,
    format: str = NPZ,
    rows_per_shard: int = 100_000,
    label_column: str = DEFAULT_LABEL_COLUMN,
) -> ShardedData:
    """Write ``(X, y)`` as a sharded data set in one of the layouts.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)
    out : str or Path
        A directory that does not exist yet, or is empty.
    format : {"npy-stack", "npz", "parquet"}, default="npz"
    rows_per_shard : int, default=100000
    label_column : str, default="label"
        Parquet: the label column's name.

    Returns
    -------
    ShardedData
        The shards written, as :func:`open_shards` reads them back.

    Raises
    ------
    ShardError
        ``out`` holds files, an unknown format, or mismatched X and y.
    """
    if format not in SHARD_FORMATS:
        raise ShardError(f"unknown shard format {format!r}: one of {', '.join(SHARD_FORMATS)}")
    X = np.asarray(X)
    y = np.asarray(y)
    if X.ndim != 2 or y.shape != (len(X),):
        raise ShardError(f"X must be 2-d and y match its rows, got {X.shape} and {y.shape}")
    if rows_per_shard < 1:
        raise ShardError(f"rows_per_shard must be positive, got {rows_per_shard}")
    root = Path(out)
    if root.exists() and any(root.iterdir()):
        raise ShardError(f"{root}: exists and is not empty")
    root.mkdir(parents=True, exist_ok=True)
    starts = range(0, len(X), rows_per_shard)
    if format == NPY_STACK:
        import dask.array as da

        da.to_npy_stack(root / "X", da.from_array(X, chunks=(rows_per_shard, X.shape[1])))
        da.to_npy_stack(root / "y", da.from_array(y, chunks=(rows_per_shard,)))
    elif format == NPZ:
        for index, start in enumerate(starts):
            stop = start + rows_per_shard
            np.savez(root / f"{index}.npz", X=X[start:stop], y=y[start:stop])
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        names = [f"x{j}" for j in range(X.shape[1])]
        if label_column in names:
            raise ShardError(f"label column {label_column!r} is also a feature's name")
        for index, start in enumerate(starts):
            stop = start + rows_per_shard
            columns = [pa.array(X[start:stop, j]) for j in range(X.shape[1])]
            table = pa.table([*columns, pa.array(y[start:stop])], names=[*names, label_column])
            pq.write_table(table, root / f"{index}.parquet")
    return open_shards(root, label_column)


def shard_sizes(data: ShardedData) -> Sequence[int]:
    """Rows of each shard, in order."""
    return [shard.n_rows for shard in data.shards]
