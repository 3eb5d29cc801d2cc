"""``python -m training index``: build, update or compact a model's search catalogue."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from service.model import Predictor
from service.model.search import (
    DEFAULT_SHARD_ITEMS,
    CatalogueUpdate,
    UnionOfSubspacesModel,
    catalogue_dir,
    read_catalogue,
    search_dir,
)
from service.model.search.snapshots import RESTORE_HELP, SNAPSHOT_HELP, snapshot_command
from training.cli.common import (
    add_model_arguments,
    add_output_flags,
    already_there,
    model_dataset,
    status,
)
from training.cli.snapshot_progress import ProgressBars
from training.cluster.connection import add_cluster_argument, connect
from training.data.readers import DatasetError
from training.retrieval.catalogue import (
    DEFAULT_CHUNK_SIZE,
    build_catalogue,
    dataset_items,
    projector,
)

HELP = "build, update or compact the search catalogue X' = D^T X of a model"
DESCRIPTION = (
    "Compute the features and D^T x of every catalogue item in chunks (bounded "
    "memory, with a progress bar) and write them atom-major, float32, in shards of "
    "--shard-items items with their ids and attributes, to <model>/search/catalogue, which "
    "the service memory-maps. Items come from a data set split (ids '<split>-<position>', "
    "labels kept for evaluation) or from a .npy array file read through a memory map "
    "(catalogues larger than memory). --append adds items to the catalogue as a new shard "
    "(an id already there is replaced), --delete removes ids, --compact merges small shards "
    "and drops removed items: each a new version, written beside the one served and put "
    "in place once complete (a server serves it at its next rescan)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    items = parser.add_argument_group("items")
    items.add_argument(
        "--split",
        choices=("test", "train", "all"),
        default="test",
        help="data set split to index (default: test)",
    )
    items.add_argument(
        "--items",
        type=Path,
        help="a .npy array of N instances in the model's input shape, read chunk by chunk "
        "through a memory map (instead of --data)",
    )
    items.add_argument(
        "--ids",
        type=Path,
        help="with --items: a .npy array or a text file (one per line) of N unique ids "
        "(default: 0..N-1); with --delete: the ids to remove",
    )
    items.add_argument(
        "--attributes",
        type=Path,
        help="each item's attributes, in item order, which /search filters match: a .jsonl "
        "file (one JSON object of strings and numbers per line, null or {} for none) or a .csv "
        "file (a header of keys, one row per item; a column of numbers only is numeric, an "
        "empty cell is no value)",
    )
    items.add_argument(
        "--shard-items",
        type=int,
        default=DEFAULT_SHARD_ITEMS,
        help="items per shard of a build, and what --compact merges small shards into "
        "(default: %(default)s)",
    )
    items.add_argument(
        "--chunk-size",
        type=int,
        default=DEFAULT_CHUNK_SIZE,
        help="items computed at a time (default: %(default)s)",
    )
    items.add_argument(
        "--negatives",
        type=int,
        default=1000,
        help="size of the fixed random sample of items used as negatives when /search learns "
        "a code from positives (default: %(default)s)",
    )
    change = parser.add_argument_group("changes to an existing catalogue (instead of a build)")
    which = change.add_mutually_exclusive_group()
    which.add_argument(
        "--append",
        action="store_true",
        help="add the items (--data or --items) as a new shard; ids already there are replaced",
    )
    which.add_argument("--delete", action="store_true", help="remove the items of --ids")
    which.add_argument(
        "--compact",
        action="store_true",
        help="merge runs of small shards into shards of up to --shard-items and drop removed "
        "items (the ranking is unchanged)",
    )
    which.add_argument("--snapshot", type=Path, metavar="OUT", help=SNAPSHOT_HELP)
    which.add_argument("--restore", type=Path, metavar="SNAPSHOT", help=RESTORE_HELP)
    add_cluster_argument(parser)
    add_output_flags(parser, "catalogue")


def run(args: argparse.Namespace) -> int:
    predictor = Predictor.load(args.model)
    model = UnionOfSubspacesModel.load(search_dir(args.model), args.model)
    out = catalogue_dir(args.model)
    if args.snapshot or args.restore:
        with ProgressBars(not args.quiet) as bars:
            done = snapshot_command(args.model, args.snapshot, args.restore, bars)
        print(done)
        return 0
    if args.delete or args.compact:
        return _change_index(args, model, out)
    if not args.append and already_there(
        args, out, lambda: read_catalogue(out, search_dir(args.model)), "a catalogue"
    ):
        return 0
    labels = None
    if args.items is not None:
        if args.data is not None:
            raise DatasetError("give --items or --data, not both")
        items, ids = _read_items(args.items, args.ids)
        source = {"items": str(args.items)}
    else:
        if args.ids is not None:
            raise DatasetError("--ids goes with --items (or --delete)")
        dataset = model_dataset(args, predictor)
        items, ids, labels = dataset_items(dataset, args.split)
        source = {"dataset": dataset.source, "split": args.split}
    attributes = None if args.attributes is None else read_attributes(args.attributes, len(ids))
    if args.append:
        status(args, f"adding {len(ids):,} items to {out} ...")
        fill = projector(predictor, model, items, ids, args.chunk_size)
        with CatalogueUpdate(out, search_dir(args.model), model.n_atoms) as update:
            result = update.upsert(ids, fill, attributes, labels)
        print(
            f"catalogue        {out}: version {result.version}, {result.n_items:,} items in "
            f"{result.n_shards} shards ({result.written:,} written, {result.replaced:,} replaced)"
        )
        return 0
    status(args, f"indexing {len(ids):,} items into {out} ...")
    with connect(args.cluster, worker_memory=args.worker_memory) as client:
        build_catalogue(
            args.model,
            predictor,
            model,
            items,
            ids,
            labels=labels,
            chunk_size=args.chunk_size,
            n_negatives=args.negatives,
            seed=args.seed,
            source=source,
            progress=not args.quiet,
            overwrite=args.force,
            attributes=attributes,
            shard_items=args.shard_items,
            client=client,
        )
    shards = -(-len(ids) // args.shard_items)
    print(
        f"catalogue        {out}: {len(ids):,} items x {model.n_atoms} atoms (float32) in "
        f"{shards} shard(s)"
    )
    return 0


def _change_index(args: argparse.Namespace, model, out: Path) -> int:
    """``index --delete`` and ``index --compact``."""
    if args.delete and args.ids is None:
        raise DatasetError("--delete needs --ids: a text file (one id per line) or a .npy array")
    with CatalogueUpdate(out, search_dir(args.model), model.n_atoms) as update:
        if args.delete:
            result = update.delete(_read_ids(args.ids).tolist())
            done = f"{result.deleted:,} removed"
            if result.missing:
                done += f", {len(result.missing):,} not there (e.g. {result.missing[0]!r})"
        else:
            result = update.compact(args.shard_items)
            done = "compacted"
    print(
        f"catalogue        {out}: version {result.version}, {result.n_items:,} items in "
        f"{result.n_shards} shards ({done})"
    )
    return 0


def _read_items(items_path: Path, ids_path: Path | None):
    if items_path.suffix != ".npy" or not items_path.is_file():
        raise DatasetError(f"{items_path}: --items must be an existing .npy file")
    try:
        items = np.load(items_path, mmap_mode="r", allow_pickle=False)
    except ValueError as error:
        raise DatasetError(f"{items_path}: cannot read: {error}") from None
    if items.ndim < 2 or items.dtype.kind not in "iuf":
        raise DatasetError(f"{items_path}: expected numbers, one row per item; got {items.shape}")
    if ids_path is None:
        return items, np.arange(len(items))
    ids = _read_ids(ids_path)
    if ids.shape != (len(items),):
        raise DatasetError(f"{ids_path}: {ids.shape[0]} ids for {len(items)} items")
    return items, ids


def _read_ids(ids_path: Path) -> np.ndarray:
    """Ids from a .npy array or a text file, one per line."""
    if not ids_path.is_file():
        raise DatasetError(f"{ids_path}: no such file of ids")
    if ids_path.suffix == ".npy":
        return np.load(ids_path, allow_pickle=False)
    return np.asarray(ids_path.read_text().splitlines())


def read_attributes(path: Path, n_items: int) -> list[dict[str, Any] | None]:
    """Each item's attributes from a .jsonl or .csv file (see ``index --attributes``).

    Raises
    ------
    DatasetError
        Another kind of file, a line that is not a JSON object, or not ``n_items`` records.
    """
    if not path.is_file():
        raise DatasetError(f"{path}: no such attributes file")
    records: list[dict[str, Any] | None] = []
    if path.suffix == ".jsonl":
        for number, line in enumerate(path.read_text().splitlines(), 1):
            try:
                record = json.loads(line) if line.strip() else None
            except json.JSONDecodeError as error:
                raise DatasetError(f"{path}:{number}: not JSON: {error}") from None
            if record is not None and not isinstance(record, dict):
                raise DatasetError(f"{path}:{number}: each line is a JSON object (or null)")
            records.append(record)
    elif path.suffix == ".csv":
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        keys = list(rows[0]) if rows else []
        numeric = {key: all(_is_number(r[key]) for r in rows if r[key]) for key in keys}
        for row in rows:
            records.append({
                key: float(value) if numeric[key] else value
                for key, value in row.items() if value
            })  # fmt: skip
    else:
        raise DatasetError(f"{path}: --attributes reads a .jsonl or a .csv file")
    if len(records) != n_items:
        raise DatasetError(f"{path}: {len(records):,} records for {n_items:,} items")
    return records


def _is_number(text: str) -> bool:
    try:
        return np.isfinite(float(text))
    except ValueError:
        return False
