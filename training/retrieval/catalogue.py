"""The catalogue of a model's /search: ``D^T x`` of every item, computed chunk by chunk (bounded
memory, on a Dask cluster's workers a shard a task where one is given) and written in shards,
atom-major float32, to ``<model>/search/catalogue``, which the service memory-maps
(:mod:`service.model.search` has the layout and the updates).
"""

from __future__ import annotations

import contextlib
import functools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from service.model import InvalidInputError, Predictor
from service.model.search import (
    DEFAULT_NEGATIVES,
    DEFAULT_SHARD_ITEMS,
    ShardItems,
    UnionOfSubspacesModel,
    catalogue_dir,
    search_dir,
    search_features,
)
from service.model.search import build_catalogue as store_build_catalogue
from service.model.search.filters import columns_from_records
from service.model.search.versions import ShardWriter, write_one_shard
from training.data.datasets import Dataset

DEFAULT_CHUNK_SIZE = 4096


def build_catalogue(
    model_dir: str | Path,
    predictor: Predictor,
    model: UnionOfSubspacesModel,
    items,
    ids: np.ndarray,
    labels: np.ndarray | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    n_negatives: int = DEFAULT_NEGATIVES,
    seed: int = 0,
    source: dict[str, Any] | None = None,
    progress: bool = True,
    overwrite: bool = False,
    attributes: Sequence[Mapping[str, Any] | None] | None = None,
    shard_items: int = DEFAULT_SHARD_ITEMS,
    client=None,
) -> Path:
    """Compute ``D^T x`` of every item chunk by chunk and write the catalogue, in shards of
    ``shard_items`` items (see :func:`service.model.search.build_catalogue`).

    Parameters
    ----------
    model_dir : path-like
        The model's artifact directory (with its ``search`` model).
    predictor, model
        The model and its search model, as loaded from ``model_dir``.
    items : array-like of shape (N, input_spec.n_features), or N documents
        May be a read-only memory map: only ``chunk_size`` items are read at a time.
    ids : ndarray of shape (N,)
    labels : ndarray of shape (N,), optional
    chunk_size : int
    n_negatives, seed : int
        The fixed sample of negatives for learned codes.
    source : dict, optional
        Where the items came from (recorded).
    progress : bool
        Show a progress bar.
    overwrite : bool
    attributes : sequence of mapping or None, optional
        Each item's attributes (strings or numbers by key).
    shard_items : int
        Items per shard.
    client : distributed.Client, optional
        Compute and write the shards on this cluster's workers, a task per shard (they read
        the model and the items from the same paths: ``items`` is written to a file beside the
        model first unless it is a memory map of one).
    """
    n_items = len(ids)
    if len(items) != n_items:
        raise InvalidInputError(f"{len(items)} items but {n_items} ids")
    if attributes is not None and len(attributes) != n_items:
        raise InvalidInputError(f"{len(attributes)} attributes but {n_items} ids")
    if chunk_size < 1 or shard_items < 1:
        raise InvalidInputError("chunk size and shard items must be at least 1")
    started = time.perf_counter()
    ranges = [(lo, min(lo + shard_items, n_items)) for lo in range(0, n_items, shard_items)]
    records = [None] * n_items if attributes is None else list(attributes)
    path = catalogue_dir(model_dir)
    with (
        tqdm(total=n_items, desc="indexing", unit="item", disable=not progress) as bar,
        contextlib.ExitStack() as cleanup,
    ):
        shards = []
        for lo, hi in ranges:
            _, columns = columns_from_records(records[lo:hi], {}, "catalogue")
            fill = projector(predictor, model, items, ids[lo:hi], chunk_size, lo, bar)
            shard_labels = None if labels is None else labels[lo:hi]
            shards.append(ShardItems(np.asarray(ids[lo:hi]), fill, columns, shard_labels))
        write_shards = None
        if client is not None:
            items_path = _items_file(items, path.parent, cleanup)
            write_shards = on_workers(client, model_dir, items_path, ranges, ids, labels,
                                      records, chunk_size, bar)  # fmt: skip
        store_build_catalogue(
            path,
            search_dir(model_dir),
            model.n_atoms,
            shards,
            n_negatives=n_negatives,
            seed=seed,
            metadata={"source": source or {}, "chunk_size": chunk_size},
            overwrite=overwrite,
            write_shards=write_shards,
        )
    if progress:
        seconds = time.perf_counter() - started
        print(f"indexed {n_items:,} items in {seconds:.1f} s", flush=True)
    return path


def projector(
    predictor: Predictor,
    model: UnionOfSubspacesModel,
    items,
    ids: np.ndarray,
    chunk_size: int,
    first: int = 0,
    bar: tqdm | None = None,
) -> Callable[[np.ndarray, int], None]:
    """A :attr:`service.model.search.ShardItems.fill` computing ``D^T x`` of ``items[first +
    start ..]`` chunk by chunk (memory stays bounded); non-finite features raise
    InvalidInputError naming the item (``ids`` are the shard's, from ``first``)."""

    def fill(block: np.ndarray, start: int) -> None:
        n = block.shape[1]
        for lo in range(0, n, chunk_size):
            hi = min(lo + chunk_size, n)
            at = first + start + lo
            chunk = _chunk(items, at, at + hi - lo)
            rows = model.project(search_features(predictor, model.feature_space, chunk))
            if not np.isfinite(rows).all():
                bad = at + int(np.flatnonzero(~np.isfinite(rows).all(axis=1))[0])
                raise InvalidInputError(
                    f"item {bad} ({ids[bad - first]!r}) has non-finite features"
                )
            block[:, lo:hi] = rows.T
            if bar is not None:
                bar.update(hi - lo)

    return fill


def on_workers(
    client,
    model_dir: str | Path,
    items_path: Path,
    ranges: Sequence[tuple[int, int]],
    ids: np.ndarray,
    labels: np.ndarray | None,
    records: Sequence[Mapping[str, Any] | None],
    chunk_size: int,
    bar: tqdm,
) -> ShardWriter:
    """A shard writer that computes each shard of ``ranges`` on a worker of ``client``
    (:func:`write_shard_on_worker`), all at once, the model and the items read from their
    paths there."""

    def write(directory: Path, shards: Sequence[ShardItems], n_atoms: int):
        futures = [
            client.submit(
                write_shard_on_worker,
                str(Path(model_dir).resolve()),
                str(items_path),
                lo,
                hi,
                np.asarray(ids[lo:hi]),
                list(records[lo:hi]),
                None if labels is None else np.asarray(labels[lo:hi]),
                str(directory.resolve()),
                chunk_size,
                pure=False,
            )
            for lo, hi in ranges
        ]
        written = []
        for future in futures:
            written.append(future.result())
            bar.update(written[-1][2])
        return written

    return write


@functools.lru_cache(maxsize=4)
def _model_on_worker(model_dir: str) -> tuple[Predictor, UnionOfSubspacesModel]:
    return Predictor.load(model_dir), UnionOfSubspacesModel.load(search_dir(model_dir), model_dir)


def write_shard_on_worker(
    model_dir: str,
    items_path: str,
    lo: int,
    hi: int,
    ids: np.ndarray,
    records: list,
    labels: np.ndarray | None,
    directory: str,
    chunk_size: int,
) -> tuple[str, str, int]:
    """One shard of a catalogue, computed and written by a worker: ``D^T x`` of items ``lo ..
    hi`` of the array file at ``items_path``, with their ids, attributes and labels, into
    ``directory``; (name, manifest sha256, items)."""
    predictor, model = _model_on_worker(model_dir)
    items = np.load(items_path, mmap_mode="r", allow_pickle=False)
    _, columns = columns_from_records(records, {}, "catalogue")
    fill = projector(predictor, model, items, ids, chunk_size, lo)
    return write_one_shard(Path(directory), ShardItems(ids, fill, columns, labels), model.n_atoms)


def _items_file(items, beside: Path, cleanup: contextlib.ExitStack) -> Path:
    """A file the workers read the items from: the one ``items`` maps, or a copy written
    beside the model (removed at the end)."""
    if isinstance(items, np.memmap) and items.filename is not None:
        return Path(items.filename).resolve()
    array = np.asarray(items)
    if array.dtype == object:
        raise InvalidInputError(
            "--cluster builds catalogues of vectors and grids (documents are indexed here)"
        )
    path = beside / f".items-{uuid.uuid4().hex[:8]}.npy"
    np.save(path, array, allow_pickle=False)
    cleanup.callback(path.unlink, missing_ok=True)
    return path.resolve()


def _chunk(items, start: int, stop: int):
    chunk = items[start:stop]
    if isinstance(chunk, np.ndarray) and chunk.dtype != object:
        return np.asarray(chunk, dtype=np.float64).reshape(stop - start, -1)
    return chunk


def dataset_items(dataset: Dataset, split: str) -> tuple[Any, np.ndarray, np.ndarray]:
    """Items, ids and labels of a data set's split (``train``, ``test`` or ``all``); ids are
    ``<split>-<position>``."""
    parts = {"train": [(dataset.X_train, dataset.y_train, "train")],
             "test": [(dataset.X_test, dataset.y_test, "test")]}  # fmt: skip
    parts["all"] = parts["train"] + parts["test"]
    if split not in parts:
        raise InvalidInputError(f"split must be train, test or all, got {split!r}")
    items, ids, labels = [], [], []
    for X, y, name in parts[split]:
        items.append(X)
        ids.append(np.char.add(f"{name}-", np.arange(len(y)).astype(str)))
        labels.append(y)
    if dataset.input_spec.kind == "text":
        joined = np.empty(sum(len(x) for x in items), dtype=object)
        joined[:] = [text for x in items for text in x]
    else:
        joined = np.concatenate(items)
    return joined, np.concatenate(ids), np.concatenate(labels)
