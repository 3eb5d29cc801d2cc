"""Command line of the trainer: ``python -m training COMMAND --help``, COMMAND one of fit,
dictionary, index, evaluate, evaluate-search, report and shard."""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from service.model import ModelError, Predictor
from service.model.features import (
    AUTO_NORMALIZATION_INDEFINITE,
    AUTO_NORMALIZATION_KERNELS,
    NORMALIZATIONS,
)
from service.model.inputs.transforms import TRANSFORMS
from service.model.search import (
    DEFAULT_SHARD_ITEMS,
    CatalogueUpdate,
    UnionOfSubspacesModel,
    read_catalogue,
)
from service.model.search.snapshots import RESTORE_HELP, SNAPSHOT_HELP, snapshot_command
from service.model.similarity import SIMILARITY_KINDS
from training.cluster import SCHEDULER_ENV, ClusterError, add_cluster_argument, connect
from training.datasets import (
    DIGITS,
    FORTUNES,
    DatasetError,
    as_test_set,
    load_dataset,
    with_test_data,
)
from training.diagnostics import format_ratio
from training.dictionary import UnionOfSubspacesSVM
from training.estimator import AUTO_SIMILARITY, BasisExpandingSVC, fit_dataset
from training.evaluate import SVC_GRIDS, evaluate
from training.glyphs import FONTS_DIR, build_glyphs
from training.options import add_estimator_arguments, estimator_params
from training.packaged import PACKAGED_SETS
from training.report import (
    DEFAULT_CONFIGURATIONS,
    TEXT_CONFIGURATIONS,
    build_grid,
    run_report,
    write_report,
)
from training.report_data import DEFAULT_BASIS_SIZES, DEFAULT_NORMALIZATIONS, DEFAULT_STRATEGIES
from training.retrieval import DEFAULT_SPARSITIES
from training.search import (
    DEFAULT_CHUNK_SIZE,
    DEFAULT_SPARSITY,
    DEFAULT_VARIANT,
    VARIANTS,
    build_catalogue,
    catalogue_dir,
    dataset_items,
    estimator_for,
    evaluate_search,
    fit_search_model,
    projector,
    search_dir,
    write_search_report,
)
from training.selection import SEARCHED_PARAMETERS
from training.shards import SHARD_FORMATS, is_sharded, open_shards, write_shards
from training.snapshot_progress import ProgressBars

# How `fit` derives its model options from BasisExpandingSVC's parameters: the ones other options
# set, older option names kept for scripts, and the one default of the command line's own (it
# selects the configuration unless told the measures).
FIT_OPTIONS = {
    "skip": ("input_shape", "random_state", "verbose"),
    "aliases": {
        "C": ("--C",),
        "input_transform": ("--transform",),
        "selection_budget": ("--budget",),
        "n_jobs": ("--jobs",),
    },
    "defaults": {"similarity": AUTO_SIMILARITY},
    "default_help": {
        "input_transform": "pixels for images, none otherwise",
        "n_jobs": "-1, every core",
    },
    "extra_help": {
        "similarity": "the options that fix what 'auto' chooses need a fixed --similarity",
    },
}
DEFAULT_TEST_FRACTION = 0.25


def _add_data_arguments(parser: argparse.ArgumentParser, default: str | None) -> None:
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


def _fit_epilog() -> str:
    """The measures, transforms and normalisations that --similarity, --transform and
    --normalization take, from the tables that define them."""
    kinds = [f"  {k.name}: {k.description}" for k in SIMILARITY_KINDS.values()]
    return "\n".join(
        [
            "similarity measures:",
            *kinds,
            f"input transforms: {', '.join(TRANSFORMS)} (hog(cell_size, orientations), "
            "bof(patch, step, words, levels, single))",
            f"normalizations: {', '.join(NORMALIZATIONS)},",
            f"  or auto: {AUTO_NORMALIZATION_KERNELS} when every measure is a kernel, "
            f"{AUTO_NORMALIZATION_INDEFINITE} when one is indefinite",
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Train and evaluate Basis Expanding SVMs offline; the artifacts they write "
        "are served by 'python -m service.api'.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    fit = commands.add_parser(
        "fit",
        help="train a model and write its artifact directory",
        description=textwrap.fill(
            "Choose a class-balanced basis, expand the training set on it under one or more "
            "similarity measures, fit a one-vs-rest linear SVM, and write the artifact. With "
            "--similarity auto (the default) the configuration is chosen by cross-validation "
            "first.",
            width=88,
        ),
        epilog=_fit_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_data_arguments(fit, default=DIGITS)
    model = fit.add_argument_group(
        "model", "the estimator's parameters (training.BasisExpandingSVC; --seed sets random_state)"
    )
    fit.set_defaults(model_options=add_estimator_arguments(model, BasisExpandingSVC, **FIT_OPTIONS))
    output = fit.add_argument_group("output")
    output.add_argument(
        "--out", type=Path, help="artifact directory to write (default: models/<name>)"
    )
    output.add_argument("--name", help="model name (default: the data set's name)")
    output.add_argument(
        "--force", action="store_true", help="replace an existing artifact directory"
    )
    output.add_argument(
        "--if-missing",
        action="store_true",
        help="do nothing if a valid artifact already exists at --out (exit 0)",
    )
    output.add_argument("--quiet", action="store_true", help="no progress output")
    fit.set_defaults(handler=_run_fit)

    _add_dictionary_parser(commands)
    _add_index_parser(commands)
    _add_evaluate_search_parser(commands)
    _add_shard_parser(commands)
    _add_build_glyphs_parser(commands)

    ev = commands.add_parser(
        "evaluate",
        help="held-out accuracy of a model beside LinearSVC and SVC(RBF) baselines",
        description="Accuracy, per-class report, training and prediction times of a trained "
        "model on the held-out split, side by side with baselines trained on the same inputs "
        "(and, with --tuned-svc, an SVC tuned by grid search on the raw training split). The "
        "model's training time includes its selection's search.",
    )
    ev.add_argument("--model", type=Path, required=True, help="artifact directory")
    _add_data_arguments(ev, default=None)
    ev.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    ev.add_argument(
        "--repeats", type=int, default=5, help="timing runs, the median is shown (default: 5)"
    )
    ev.add_argument(
        "--tuned-svc",
        nargs="?",
        const="full",
        choices=tuple(SVC_GRIDS),
        help="also Pipeline([scaling, SVC(RBF)]) on the raw training split, the scaling (none or "
        "StandardScaler), C and gamma tuned by 5-fold GridSearchCV: 'full' (48 settings, C in "
        "0.1-100, gamma 'scale' or 1e-4 to 1; the default when the flag has no value) or "
        "'small' (12 settings, for large sets); its training time is the whole grid search",
    )
    ev.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="processes of the tuned SVC's grid search (default: one per core)",
    )
    ev.set_defaults(handler=_run_evaluate)

    rep = commands.add_parser(
        "report",
        help="train a grid of configurations and write a Markdown report with plots",
        description="Fit BE-SVM over configurations (transform and similarity measures) x basis "
        "sizes, x basis strategies and x normalisations at a reference size; score each on a "
        "validation part of the training split (which picks the best) and on the test split; "
        "train LinearSVC, SVC(RBF) and Nystroem + LinearSVC on the same inputs (on text: tf-idf "
        "+ LinearSVC, multinomial naive Bayes, SVC(RBF) on tf-idf); write README.md, PNG plots "
        "and results.json.",
    )
    _add_data_arguments(rep, default=DIGITS)
    axes = rep.add_argument_group("grid")
    axes.add_argument(
        "--configurations",
        help="configurations separated by ';', each 'similarities' or 'transform: similarities',"
        " optionally followed by the SVM's C as '[C=3]' (default 1), e.g. "
        "'rbf + rigid(1); hog(2, 9): rigid(1); sensing1 [C=3]' (default: "
        f"{'; '.join(DEFAULT_CONFIGURATIONS)}; on text: {'; '.join(TEXT_CONFIGURATIONS)})",
    )
    axes.add_argument(
        "--basis-sizes",
        default=",".join(str(s) for s in DEFAULT_BASIS_SIZES),
        help="basis items per class, comma separated (default: %(default)s)",
    )
    axes.add_argument(
        "--strategies",
        default=",".join(DEFAULT_STRATEGIES),
        help="basis strategies, the first is used in the other sweeps (default: %(default)s)",
    )
    axes.add_argument(
        "--normalizations",
        default=";".join(DEFAULT_NORMALIZATIONS),
        help="normalisations separated by ';', the first is used in the other sweeps "
        "(default: %(default)s)",
    )
    axes.add_argument(
        "--reference-size",
        type=int,
        default=25,
        help="basis items per class in the strategy and normalisation sweeps (default: 25)",
    )
    axes.add_argument(
        "--folds",
        type=int,
        default=3,
        help="cross-validation folds within the training split, which choose the best (default: 3)",
    )
    axes.add_argument(
        "--repeats", type=int, default=5, help="timing runs, the median is shown (default: 5)"
    )
    rep.add_argument(
        "--out", type=Path, default=Path("report"), help="output directory (default: report)"
    )
    rep.add_argument("--quiet", action="store_true", help="no progress bar")
    add_cluster_argument(rep.add_argument_group("cluster (the cross-validation's fits)"))
    rep.set_defaults(handler=_run_report)
    return parser


# Command-line flag -> UnionOfSubspacesSVM parameter, with the help text's description.
_DICTIONARY_FLAGS = {
    "atoms": ("n_atoms", int, "A, the dictionary's atoms"),
    "alpha": ("alpha", float, "weight of ||Dz||^2/2; 0 is the fast case"),
    "beta": ("beta", float, "weight of the codes' l1 / elastic-net penalty"),
    "l1-ratio": ("l1_ratio", float, "r: 1 is l1, below 1 the elastic net (default: the variant's)"),
    "lambda-z": ("lambda_z", float, "codes' learning rate numerator: lambda / (t + t0)"),
    "lambda-d": ("lambda_d", float, "dictionary's learning rate numerator; 0 keeps D fixed"),
    "t0-z": ("t0_z", float, "codes' learning rate offset"),
    "t0-d": ("t0_d", float, "dictionary's learning rate offset"),
    "bias-multiplier": ("bias_multiplier", float, "the bias's learning rate multiplier"),
    "epochs": ("n_epochs", int, "passes over the training set"),
    "block-size": ("block_size", int, "samples per block of code, then dictionary, steps"),
}


def _add_output_flags(parser: argparse.ArgumentParser, artifact: str) -> None:
    output = parser.add_argument_group("output")
    output.add_argument("--force", action="store_true", help=f"replace an existing {artifact}")
    output.add_argument(
        "--if-missing", action="store_true", help=f"do nothing if a valid {artifact} exists"
    )
    output.add_argument("--quiet", action="store_true", help="no progress output")


def _already_there(args: argparse.Namespace, out: Path, load, artifact: str) -> bool:
    """Whether to stop because ``out`` exists: with --if-missing after checking it loads
    (a broken artifact is an error, not "present"); without --force it is an error."""
    if not out.exists():
        return False
    if args.if_missing:
        load()
        _status(args, f"{out} already holds a {artifact}: nothing to do")
        return True
    if not args.force:
        raise DatasetError(f"{out} already exists: pass --force to replace it")
    return False


def _add_dictionary_parser(commands) -> None:
    parser = commands.add_parser(
        "dictionary",
        help="learn a US-SVM dictionary and sparse class codes for a model's search",
        description="Learn the Union-of-Subspaces SVM of a trained model (Algorithm 1 of the "
        "US-SVM paper: SGD on a dictionary D and sparse codes z_k, w_k = D z_k) on the model's "
        "features of its training split, prune every code to --sparsity non-zeros, and write it "
        "to <model>/search. A catalogue built with an older dictionary is removed: run "
        "'python -m training index' afterwards.",
    )
    parser.add_argument("--model", type=Path, required=True, help="artifact directory")
    _add_data_arguments(parser, default=None)
    learn = parser.add_argument_group("US-SVM")
    learn.add_argument(
        "--variant",
        choices=tuple(VARIANTS),
        default=DEFAULT_VARIANT,
        help="us-svm (l1 codes), us-svm-e (elastic net, r = 0.5), us-svm-n (non-negative "
        "codes), us-svm-ne (both) (default: %(default)s)",
    )
    learn.add_argument(
        "--feature-space",
        choices=("auto", "inputs", "besvm"),
        default="auto",
        help="what the classifiers read: the model's normalised inputs, or its basis-expanded "
        "(BE-SVM) features; auto: inputs, or besvm for text models (default: auto)",
    )
    learn.add_argument(
        "--sparsity",
        type=int,
        default=DEFAULT_SPARSITY,
        help="non-zeros kept in every class code (default: %(default)s)",
    )
    defaults = UnionOfSubspacesSVM().get_params()
    for flag, (param, kind, text) in _DICTIONARY_FLAGS.items():
        shown = "the variant's" if param == "l1_ratio" else f"{defaults[param]:g}"
        learn.add_argument(
            f"--{flag}", dest=param, type=kind, default=None, help=f"{text} (default: {shown})"
        )
    _add_output_flags(parser, "search model")
    parser.set_defaults(handler=_run_dictionary)


def _add_index_parser(commands) -> None:
    parser = commands.add_parser(
        "index",
        help="build, update or compact the search catalogue X' = D^T X of a model",
        description="Compute the features and D^T x of every catalogue item in chunks (bounded "
        "memory, with a progress bar) and write them atom-major, float32, in shards of "
        "--shard-items items with their ids and attributes, to <model>/search/catalogue, which "
        "the service memory-maps. Items come from a data set split (ids '<split>-<position>', "
        "labels kept for evaluation) or from a .npy array file read through a memory map "
        "(catalogues larger than memory). --append adds items to the catalogue as a new shard "
        "(an id already there is replaced), --delete removes ids, --compact merges small shards "
        "and drops removed items: each a new version, written beside the one served and put "
        "in place once complete (a server serves it at its next rescan).",
    )
    parser.add_argument("--model", type=Path, required=True, help="artifact directory")
    _add_data_arguments(parser, default=None)
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
    _add_output_flags(parser, "catalogue")
    parser.set_defaults(handler=_run_index)


def _add_evaluate_search_parser(commands) -> None:
    parser = commands.add_parser(
        "evaluate-search",
        help="mAP against sparsity of US-SVM variants and pruned l2/l1-SVMs, with a plot",
        description="Train the four US-SVM variants, an l2-SVM and an l1-SVM on a model's "
        "features of its training split; prune every class's code or weights to each sparsity; "
        "rank the test split for every class; write README.md (table), map_sparsity.png and "
        "results.json.",
    )
    parser.add_argument("--model", type=Path, required=True, help="artifact directory")
    _add_data_arguments(parser, default=None)
    parser.add_argument(
        "--feature-space",
        choices=("auto", "inputs", "besvm"),
        default="auto",
        help="features the classifiers read (default: auto, as in 'dictionary')",
    )
    parser.add_argument(
        "--sparsities",
        default=",".join(str(s) for s in DEFAULT_SPARSITIES),
        help="non-zeros per class, comma separated (default: %(default)s)",
    )
    parser.add_argument(
        "--atoms", type=int, help="dictionary size (default: the estimator's default)"
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.set_defaults(handler=_run_evaluate_search)


def _add_shard_parser(commands) -> None:
    parser = commands.add_parser(
        "shard",
        help="write one .npz (X, y) as a directory of shards that fit --cluster reads",
        description="Split a .npz file's X and y into shards of --rows items, in one of the "
        "layouts a sharded --data takes (docs/using/cluster.md): npz (DIR/0.npz, ...: X and y), "
        "npy-stack (DIR/X/ and DIR/y/ as dask.array.to_npy_stack writes them) or parquet "
        "(DIR/0.parquet, ...: columns x0, x1, ... and the label column).",
    )
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
    parser.set_defaults(handler=_run_shard)


def _run_shard(args: argparse.Namespace) -> int:
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


def _add_build_glyphs_parser(commands) -> None:
    parser = commands.add_parser(
        "build-glyphs",
        help="render a notMNIST-like image set (letters A-J) from the installed fonts",
        description=textwrap.fill(
            "Render the letters A to J of every installed font (Debian's font packages: make "
            "glyph-fonts) as size x size grey images, split by font into training and test "
            "fonts, and write a .npz that --data reads as grid(size, size, 1): real images "
            "large enough for the bof transform's 16 x 16 patches.",
            width=88,
        ),
    )
    parser.add_argument("--out", type=Path, required=True, help="the .npz file to write")
    parser.add_argument(
        "--fonts-dir", type=Path, default=FONTS_DIR, help="where fonts are (default: %(default)s)"
    )
    parser.add_argument(
        "--train-per-class",
        type=int,
        default=100,
        help="training fonts, i.e. images per letter (default: %(default)s, as the paper's 100 "
        "images per class)",
    )
    parser.add_argument(
        "--test-per-class",
        type=int,
        default=200,
        help="test fonts at most (default: %(default)s)",
    )
    parser.add_argument("--size", type=int, default=64, help="image side (default: 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split (default: 0)")
    parser.add_argument("--force", action="store_true", help="replace an existing file")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.set_defaults(handler=_run_build_glyphs)


def _run_build_glyphs(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.force:
        raise DatasetError(f"{args.out} already exists: pass --force to replace it")
    for name in ("train_per_class", "test_per_class", "size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.size < 16:
        raise ValueError("--size must be at least 16 (a 16 x 16 patch)")
    counts = build_glyphs(
        args.out,
        root=args.fonts_dir,
        train_per_class=args.train_per_class,
        test_per_class=args.test_per_class,
        size=args.size,
        seed=args.seed,
        progress=not args.quiet,
    )
    _status(
        args,
        f"wrote {args.out}: {counts['train']} training and {counts['test']} test images from "
        f"{counts['fonts']} fonts ({counts['skipped']} font files left out)",
    )
    return 0


def _status(args: argparse.Namespace, message: str) -> None:
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


def _load_data(args: argparse.Namespace, default_source=None):
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


def _run_fit(args: argparse.Namespace) -> int:
    params = estimator_params(args, args.model_options, FIT_OPTIONS["defaults"])
    # Refused before anything is loaded: the selection would silently override them.
    argv = sys.argv[1:] if args.argv is None else args.argv
    fixed = [
        option.as_written(argv)
        for option in args.model_options
        if option.parameter in SEARCHED_PARAMETERS
        and option.parameter != "similarity"
        and option.given(args)
    ]
    if params["similarity"].strip().lower() == AUTO_SIMILARITY and fixed:
        raise ValueError(
            f"with --similarity auto the selection chooses {', '.join(fixed)}: give the measures "
            f"too (e.g. --similarity '{BasisExpandingSVC().similarity}') to fix them yourself"
        )

    if params.get("cluster") is None and os.environ.get(SCHEDULER_ENV):
        params["cluster"] = os.environ[SCHEDULER_ENV]  # Dask's own variable, as its tools read it
    name = args.name or (DIGITS if args.data == DIGITS else Path(args.data).stem)
    out = args.out or Path("models") / name
    if args.data not in (DIGITS, FORTUNES) and is_sharded(args.data):
        return _run_fit_sharded(args, params, name, out)
    if args.if_missing and out.exists():
        existing = Predictor.load(out)  # a broken artifact is an error, not "present"
        _status(args, f"{out} already holds model {existing.name!r}: nothing to do")
        return 0
    _status(args, f"loading data set {args.data} ...")
    dataset = _load_data(args)
    if out.exists() and not args.force:
        raise DatasetError(f"{out} already exists: pass --force to replace it, or choose --out")

    _status(args, f"fitting BE-SVM on {len(dataset.y_train):,} training items ...")
    result = fit_dataset(dataset, name, random_state=args.seed, verbose=not args.quiet, **params)
    predictor = result.predictor
    n_test = len(dataset.y_test)
    test_accuracy = predict_seconds = None
    if n_test:
        started = time.perf_counter()
        test_accuracy = float((predictor.predict(dataset.X_test) == dataset.y_test).mean())
        predict_seconds = time.perf_counter() - started
    predictor.metadata["training"]["test_accuracy"] = test_accuracy
    predictor.metadata["training"]["n_test"] = n_test
    retired_search = search_dir(out).exists()
    predictor.save(out, overwrite=args.force)
    if retired_search:
        print(
            f"note: the search model and catalogue of the old {out} were built on it and went "
            f"with it: rebuild them (python -m training dictionary --model {out}, then "
            "python -m training index) before a server takes the new version",
            file=sys.stderr,
        )
    timings = result.timings
    selection = getattr(result.estimator, "selection_", None)
    if selection is not None:
        print(f"selection path (CV accuracy on the training split):\n{selection.describe()}")
    print(
        "\n".join(
            [
                f"model            {name}",
                f"artifact         {out}",
                f"data             {dataset.name}: {len(dataset.y_train):,} train, "
                f"{len(dataset.y_test):,} test, input {dataset.input_spec}",
                f"classes          {len(predictor.classes)}",
                f"inputs           {predictor.input_spec}"
                + ("" if predictor.vocabulary is None else " (a vocabulary reads raw text)"),
                f"transform        {predictor.transform}"
                + _other_transforms(predictor.measure_transforms, str(predictor.transform)),
                f"similarities     {' + '.join(predictor.similarity_names)}",
                f"normalization    {predictor.normalization}",
                f"basis            {predictor.n_basis} items "
                f"({predictor.metadata['basis']['strategy']}, "
                f"{predictor.metadata['basis']['per_class']} per class), "
                f"{predictor.coef.shape[1]} features",
                f"train accuracy   {result.train_accuracy:.2%}",
                "test accuracy    none: no test split, trained on every item (--test-fraction 0)"
                if test_accuracy is None
                else f"test accuracy    {test_accuracy:.2%}",
                f"train time       {timings['train_seconds']:.2f} s (expansion "
                f"{timings['expand_seconds']:.2f} s, SVM {timings['svm_seconds']:.2f} s)",
            ]
            + (
                []
                if predict_seconds is None
                else [f"test prediction  {1e6 * predict_seconds / n_test:.1f} µs per item"]
            )
            + [
                f"eigenvalues      {name}: NgRat {format_ratio(d['ngrat'])}, "
                f"NgEng {format_ratio(d['ngeng'])}"
                for name, d in predictor.metadata["diagnostics"].items()
            ]
            + [f"warning          {note}" for note in result.warnings]
        )
    )
    return 0


def _run_fit_sharded(args: argparse.Namespace, params: dict, name: str, out: Path) -> int:
    """fit --data DIR of shards (docs/using/cluster.md): trained on every item, on the cluster named
    (or, without one, in worker threads of this process)."""
    if args.if_missing and out.exists():
        existing = Predictor.load(out)
        _status(args, f"{out} already holds model {existing.name!r}: nothing to do")
        return 0
    if out.exists() and not args.force:
        raise DatasetError(f"{out} already exists: pass --force to replace it, or choose --out")
    if args.test_data or args.test_fraction:
        raise DatasetError("sharded data trains on every item: no --test-data or --test-fraction")
    data = open_shards(args.data, args.label_column)
    _status(args, f"fitting BE-SVM on {data} ...")
    estimator = BasisExpandingSVC(
        **params, input_shape=args.input_shape, random_state=args.seed, verbose=not args.quiet
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        estimator.fit(data)
    record = {"dataset": {"path": str(args.data), "shards": data.format}}
    predictor = estimator.to_predictor(name, record=record)
    predictor.save(out, overwrite=args.force)
    timings = estimator.timings_
    selection = getattr(estimator, "selection_", None)
    if selection is not None:
        print(
            "selection path (CV accuracy on a stratified sample of the shards):\n"
            f"{selection.describe()}"
        )
    print(
        "\n".join(
            [
                f"model            {name}",
                f"artifact         {out}",
                f"data             {data}",
                f"cluster          {params.get('cluster') or 'this process'}",
                f"classes          {len(predictor.classes)}",
                f"basis            {predictor.n_basis} items, {predictor.coef.shape[1]} features",
                f"train accuracy   {estimator.train_accuracy_:.2%}",
                f"train time       {timings['train_seconds']:.2f} s (expansion "
                f"{timings['expand_seconds']:.2f} s, SVM {timings['svm_seconds']:.2f} s)",
            ]
            + [f"warning          {w.message}" for w in caught]
        )
    )
    return 0


def _run_evaluate(args: argparse.Namespace) -> int:
    predictor = Predictor.load(args.model)
    dataset = _evaluation_dataset(args, predictor)
    text_model = predictor.vocabulary is not None
    if (dataset.input_spec.kind == "text") != text_model or (
        not text_model and dataset.input_spec.n_features != predictor.input_spec.n_features
    ):
        raise DatasetError(
            f"data set {dataset.name} has input {dataset.input_spec}, "
            f"model {predictor.name} expects {predictor.input_spec}"
        )
    unknown = sorted(set(np.unique(dataset.y_test).tolist()) - set(predictor.classes))
    if unknown:
        raise DatasetError(f"test labels unknown to the model: {unknown[:10]}")
    if not len(dataset.y_train):
        _status(args, f"no training split in {dataset.name}: no baselines, the model alone")
    _status(args, f"evaluating {predictor.name} on {len(dataset.y_test):,} held-out items ...")
    if args.tuned_svc:
        _status(args, f"tuning SVC(RBF) by grid search ({args.tuned_svc} grid) ...")
    evaluation = evaluate(
        predictor,
        dataset,
        repeats=args.repeats,
        tuned_svc_grid=args.tuned_svc,
        n_jobs=args.jobs,
    )
    print(
        f"{evaluation.model} on {evaluation.dataset}: "
        f"{evaluation.n_train:,} train / {evaluation.n_test:,} test\n"
    )
    print(evaluation.table())
    print("\nper-class recall:\n")
    print(evaluation.per_class_table())
    print(f"\nper-class report ({evaluation.results[0].method}):\n")
    print(evaluation.per_class_report)
    if args.json:
        args.json.write_text(json.dumps(evaluation.to_dict(), indent=2) + "\n")
    return 0


def _model_dataset(args: argparse.Namespace, predictor: Predictor):
    recorded = predictor.metadata.get("training", {}).get("dataset")
    if args.data is None and recorded is None:
        raise DatasetError(f"{args.model} records no training data set: pass --data")
    return _load_data(args, default_source=recorded)


def _evaluation_dataset(args: argparse.Namespace, predictor: Predictor):
    """What ``evaluate`` scores on: the test split of --data (the model's data by default) or
    --test-data; with --data and --test-fraction 0, every item of --data, without baselines."""
    dataset = _model_dataset(args, predictor)
    if len(dataset.y_test):
        return dataset
    if args.data is not None:
        return as_test_set(dataset)
    raise DatasetError(
        f"{args.model} was trained on every item of its data set (no test split): score it on "
        "other data with --test-data FILE, or on a whole data set with --data FILE "
        "--test-fraction 0"
    )


def _run_dictionary(args: argparse.Namespace) -> int:
    predictor = Predictor.load(args.model)
    out = search_dir(args.model)
    if _already_there(
        args, out, lambda: UnionOfSubspacesModel.load(out, args.model), "search model"
    ):
        return 0
    dataset = _model_dataset(args, predictor)
    estimator = estimator_for(
        args.variant,
        random_state=args.seed,
        **{param: getattr(args, param) for param, _, _ in _DICTIONARY_FLAGS.values()},
    )
    _status(
        args,
        f"learning a {estimator.n_atoms}-atom dictionary ({args.variant}) on "
        f"{len(dataset.y_train):,} training items ...",
    )
    model = fit_search_model(
        predictor, dataset, estimator, feature_space=args.feature_space, sparsity=args.sparsity
    )
    model.save(out, args.model, overwrite=args.force)
    t = model.metadata["training"]
    print(
        "\n".join(
            [
                f"search model     {out}",
                f"variant          {args.variant}",
                f"feature space    {model.feature_space} ({model.n_features} features)",
                f"dictionary       {model.n_atoms} atoms",
                f"codes            {args.sparsity} non-zeros kept per class "
                f"(mean {model.metadata['mean_nonzeros']:.1f})",
                f"test accuracy    {t['test_accuracy']:.2%} "
                f"(unpruned {t['test_accuracy_unpruned']:.2%})",
                f"test mAP         {t['test_map']:.4f} (unpruned {t['test_map_unpruned']:.4f})",
                f"train time       {t['fit_seconds']:.2f} s",
                "next             python -m training index --model " + shlex.quote(str(args.model)),
            ]
        )
    )
    return 0


def _run_index(args: argparse.Namespace) -> int:
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
    if not args.append and _already_there(
        args, out, lambda: read_catalogue(out, search_dir(args.model)), "catalogue"
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
        dataset = _model_dataset(args, predictor)
        items, ids, labels = dataset_items(dataset, args.split)
        source = {"dataset": dataset.source, "split": args.split}
    attributes = None if args.attributes is None else read_attributes(args.attributes, len(ids))
    if args.append:
        _status(args, f"adding {len(ids):,} items to {out} ...")
        fill = projector(predictor, model, items, ids, args.chunk_size)
        with CatalogueUpdate(out, search_dir(args.model), model.n_atoms) as update:
            result = update.upsert(ids, fill, attributes, labels)
        print(
            f"catalogue        {out}: version {result.version}, {result.n_items:,} items in "
            f"{result.n_shards} shards ({result.written:,} written, {result.replaced:,} replaced)"
        )
        return 0
    _status(args, f"indexing {len(ids):,} items into {out} ...")
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


def _run_evaluate_search(args: argparse.Namespace) -> int:
    predictor = Predictor.load(args.model)
    dataset = _model_dataset(args, predictor)
    try:
        sparsities = [int(v) for v in _split(args.sparsities, ",")]
    except ValueError:
        raise ValueError(f"--sparsities must be integers, got {args.sparsities!r}") from None
    _status(args, f"evaluating search on {dataset.name} ...")
    evaluation = evaluate_search(
        predictor,
        dataset,
        feature_space=args.feature_space,
        sparsities=sparsities,
        n_atoms=args.atoms,
        progress=not args.quiet,
    )
    command = _command_line(args)
    path = write_search_report(evaluation, args.out, command)
    cells = {(r["method"], r["sparsity"]): r["map"] for r in evaluation["rows"]}
    for method in dict.fromkeys(r["method"] for r in evaluation["rows"]):
        line = "  ".join(f"{s}: {100 * cells[(method, s)]:6.2f}" for s in sparsities)
        print(f"{method:10s} mAP% at nnz  {line}")
    print(f"report           {path}")
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


def _command_line(args: argparse.Namespace) -> str:
    """The command that is running, as a report records it."""
    argv = sys.argv[1:] if args.argv is None else args.argv
    return "python -m training " + " ".join(shlex.quote(a) for a in argv)


def _split(text: str, separator: str) -> list[str]:
    return [part.strip() for part in text.split(separator) if part.strip()]


def _run_report(args: argparse.Namespace) -> int:
    _status(args, f"loading data set {args.data} ...")
    dataset = _load_data(args)
    try:
        sizes = [int(s) for s in _split(args.basis_sizes, ",")]
    except ValueError:
        raise ValueError(f"--basis-sizes must be integers, got {args.basis_sizes!r}") from None
    grid = build_grid(
        dataset,
        configurations=_split(args.configurations, ";")
        if args.configurations
        else list(
            TEXT_CONFIGURATIONS if dataset.input_spec.kind == "text" else DEFAULT_CONFIGURATIONS
        ),
        basis_sizes=sizes,
        strategies=_split(args.strategies, ","),
        normalizations=_split(args.normalizations, ";"),
        reference_size=args.reference_size,
        seed=args.seed,
        repeats=args.repeats,
        folds=args.folds,
    )
    _status(
        args,
        f"training {len(grid.fits())} settings ({grid.folds} folds + 1 fit each) on "
        f"{dataset.name} ...",
    )
    report = run_report(dataset, grid, not args.quiet, args.cluster, args.worker_memory)
    command = _command_line(args)
    markdown = write_report(report, args.out, command)
    best = report.best()
    print(f"report           {markdown}")
    print(
        f"best             {best.configuration.label}, {best.basis_per_class} per class, "
        f"{best.basis_strategy}, {best.normalization}: cross-validated "
        f"{best.validation_accuracy:.2%}, test {best.test_accuracy:.2%}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        return args.handler(args)
    except (DatasetError, ModelError, ValueError, ClusterError) as error:
        print(f"error: {error}", file=sys.stderr)
    except OSError as error:  # a file that cannot be read or written, a full disk
        where = f"{error.filename}: " if error.filename else ""
        print(f"error: {where}{error.strerror or error}", file=sys.stderr)
    except MemoryError:
        print("error: out of memory: the data is too large for this machine", file=sys.stderr)
    return 2


def _other_transforms(measure_transforms: list[str], model_transform: str) -> str:
    """What the summary adds to the model's transform for measures that read others."""
    others = list(dict.fromkeys(t for t in measure_transforms if t != model_transform))
    return f" (measures also read {', '.join(others)})" if others else ""
