"""``python -m training shard``: one .npz written as a directory of shards."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from training.cluster.shards import SHARD_FORMATS, write_shards
from training.data.readers import DatasetError

HELP = "write one .npz (X, y) as a directory of shards that fit --cluster reads"
DESCRIPTION = (
    "Split a .npz file's X and y into shards of --rows items, in one of the "
    "layouts a sharded --data takes (docs/using/cluster.md): npz (DIR/0.npz, ...: X and y), "
    "npy-stack (DIR/X/ and DIR/y/ as dask.array.to_npy_stack writes them) or parquet "
    "(DIR/0.parquet, ...: columns x0, x1, ... and the label column)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, required=True, help="a .npz file with X and y")
    parser.add_argument("--out", type=Path, required=True, help="a new (or empty) directory")
    parser.add_argument(
        "--format", choices=SHARD_FORMATS, default="npz", help="layout (default: %(default)s)"
    )
    parser.add_argument(
        "--rows", type=int, default=100_000, help="items per shard (default: %(default)s)"
    )
    parser.add_argument(
        "--label-column", default="label", help="parquet: the label column (default: label)"
    )


def run(args: argparse.Namespace) -> int:
    with np.load(args.data, allow_pickle=False) as archive:
        if "X" not in archive.files or "y" not in archive.files:
            raise DatasetError(f"{args.data}: expected arrays X and y, found {archive.files}")
        X, y = archive["X"], archive["y"]
    written = write_shards(
        X.reshape(len(X), -1),
        y,
        args.out,
        format=args.format,
        rows_per_shard=args.rows,
        label_column=args.label_column,
    )
    print(f"wrote {written}")
    return 0
