"""What the commands share: the data options and how they load a data set, the output
options and the --force / --if-missing checks, progress lines on stderr."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from service.model import Predictor
from service.model.search import FEATURE_SPACES
from training.data.datasets import (
    DIGITS,
    FORTUNES,
    load_dataset,
    load_test_set,
    with_test_data,
)
from training.data.packaged import PACKAGED_SETS
from training.data.readers import DatasetError

DEFAULT_TEST_FRACTION = 0.25


def add_data_arguments(parser: argparse.ArgumentParser, default: str | None) -> None:
    group = parser.add_argument_group("data")
    group.add_argument(
        "--data",
        default=default,
        help=f"'{DIGITS}' (embedded: 8x8 digit images, first 1,000 train / 797 test), "
        f"'{FORTUNES}' (text: Debian's fortunes and fortunes-min quotes, categories with at "
        "least 100 quotes), "
        + ", ".join(f"'{name}' ({s.description})" for name, s in PACKAGED_SETS.items())
        + ", a .npz file (X, y, optional ids, optional X_test/y_test), a .csv "
        "file with a header (a label column, an optional id column, numeric feature columns), "
        'a .jsonl file of {"text": ..., "label": ...} lines, or a folder with one '
        "sub-folder of text files per class"
        + (f" (default: {default})" if default else " (default: the model's training data)"),
    )
    group.add_argument(
        "--test-fraction",
        type=float,
        default=None,
        help="held-out fraction for files without X_test, stratified; 0 trains on every item "
        f"(digits too: all 1,797) (default: {DEFAULT_TEST_FRACTION}, or 0 with --test-data)",
    )
    group.add_argument(
        "--test-data",
        help="a separate test set, every item of it, in any format --data takes (its inputs "
        "must match); --data then trains on every item",
    )
    group.add_argument("--seed", type=int, default=0, help="seed of splits and random bases")
    group.add_argument(
        "--input-shape",
        help="read file rows as grids, e.g. 'grid(28, 28, 1)' (default: from the array shape)",
    )
    group.add_argument(
        "--label-column", default="label", help="CSV column holding the class (default: label)"
    )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a command that works on a trained model: ``--model``, its artifact
    directory, and the data options, whose default is the data set it was trained on."""
    parser.add_argument("--model", type=Path, required=True, help="artifact directory")
    add_data_arguments(parser, default=None)


def add_feature_space_argument(group) -> None:
    """``--feature-space``: what a model's search classifiers read (``dictionary``, and
    ``evaluate-search`` as it)."""
    group.add_argument(
        "--feature-space",
        choices=("auto", *FEATURE_SPACES),
        default="auto",
        help="what the classifiers read: the model's normalised inputs, or its basis-expanded "
        "(BE-SVM) features; auto: inputs, or besvm for text models (default: auto)",
    )


def add_output_flags(parser: argparse.ArgumentParser, artifact: str) -> None:
    output = parser.add_argument_group("output")
    output.add_argument("--force", action="store_true", help=f"replace an existing {artifact}")
    output.add_argument(
        "--if-missing", action="store_true", help=f"do nothing if a valid {artifact} exists"
    )
    output.add_argument("--quiet", action="store_true", help="no progress output")


def already_there(args: argparse.Namespace, out: Path, load, artifact: str, hint: str = "") -> bool:
    """Whether to stop because ``out`` exists: with --if-missing after checking it loads
    (a broken artifact is an error, not "present"); without --force it is an error, whose
    message ends with ``hint``."""
    if not out.exists():
        return False
    if args.if_missing:
        load()
        status(args, f"{out} already holds {artifact}: nothing to do")
        return True
    if not args.force:
        raise DatasetError(f"{out} already exists: pass --force to replace it{hint}")
    return False


def status(args: argparse.Namespace, message: str) -> None:
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr, flush=True)


def _test_fraction(args: argparse.Namespace) -> float:
    """--test-fraction, whose default depends on --test-data (which replaces the split)."""
    if args.test_fraction is None:
        return 0.0 if args.test_data else DEFAULT_TEST_FRACTION
    if args.test_data and args.test_fraction != 0:
        raise DatasetError(
            "--test-data replaces the held-out split: leave out --test-fraction (or give 0)"
        )
    return args.test_fraction


def load_data(args: argparse.Namespace, default_source=None):
    test_fraction = _test_fraction(args)
    if args.data is None and default_source is not None:
        dataset = load_dataset(default_source)
    else:
        dataset = load_dataset(
            args.data,
            test_fraction=test_fraction,
            seed=args.seed,
            input_shape=args.input_shape,
            label_column=args.label_column,
        )
    if args.test_data is not None:
        dataset = with_test_data(
            dataset, args.test_data, input_shape=args.input_shape, label_column=args.label_column
        )
    return dataset


def model_dataset(args: argparse.Namespace, predictor: Predictor):
    """The data set of ``--data``, else the one the model records (with ``--test-data`` as its
    test split); a model trained on shards, which are never loaded whole, takes ``--test-data``
    alone as a test set (no training split)."""
    recorded = predictor.metadata.get("training", {}).get("dataset")
    if args.data is None and recorded is None:
        raise DatasetError(f"{args.model} records no training data set: pass --data")
    if args.data is None and "shards" in recorded:
        if args.test_data is None:
            raise DatasetError(
                f"{args.model} was trained on the shards at {recorded['path']}, which are never "
                "loaded whole: pass --test-data FILE (or --data FILE)"
            )
        return load_test_set(
            args.test_data, input_shape=args.input_shape, label_column=args.label_column
        )
    return load_data(args, default_source=recorded)


def command_line(args: argparse.Namespace) -> str:
    """The command that is running, as a report records it."""
    argv = sys.argv[1:] if args.argv is None else args.argv
    return "python -m training " + " ".join(shlex.quote(a) for a in argv)


def split_list(text: str, separator: str) -> list[str]:
    return [part.strip() for part in text.split(separator) if part.strip()]
