"""``python -m training report``: a grid of configurations trained and written up as Markdown."""

from __future__ import annotations

import argparse
from pathlib import Path

from training.cli.common import add_data_arguments, command_line, load_data, split_list, status
from training.cli.options import add_estimator_arguments, estimator_params
from training.cluster.connection import add_cluster_argument
from training.data.datasets import DIGITS
from training.estimator.estimator import BasisExpandingSVC
from training.evaluation.report import (
    DEFAULT_CONFIGURATIONS,
    TEXT_CONFIGURATIONS,
    build_grid,
    run_report,
    write_report,
)
from training.evaluation.report_data import (
    DEFAULT_BASIS_SIZES,
    DEFAULT_NORMALIZATIONS,
    DEFAULT_STRATEGIES,
)

# The estimator's parameters that the report takes from its command line (the grid sets the rest).
VOCABULARY = {"min_df", "stop_words"}

HELP = "train a grid of configurations and write a Markdown report with plots"
DESCRIPTION = (
    "Fit BE-SVM over configurations (transform and similarity measures) x basis "
    "sizes, x basis strategies and x normalisations at a reference size; score each on a "
    "validation part of the training split (which picks the best) and on the test split; "
    "train LinearSVC, SVC(RBF) and Nystroem + LinearSVC on the same inputs (on text: tf-idf "
    "+ LinearSVC, multinomial naive Bayes, SVC(RBF) on tf-idf); write README.md, PNG plots "
    "and results.json."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser, default=DIGITS)
    axes = parser.add_argument_group("grid")
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
    text = parser.add_argument_group("documents", "the vocabulary of every fit and baseline")
    parser.set_defaults(
        vocabulary_options=add_estimator_arguments(
            text, BasisExpandingSVC, skip=set(BasisExpandingSVC().get_params()) - VOCABULARY
        )
    )
    parser.add_argument(
        "--out", type=Path, default=Path("report"), help="output directory (default: report)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_cluster_argument(parser.add_argument_group("cluster (the cross-validation's fits)"))


def run(args: argparse.Namespace) -> int:
    status(args, f"loading data set {args.data} ...")
    dataset = load_data(args)
    try:
        sizes = [int(s) for s in split_list(args.basis_sizes, ",")]
    except ValueError:
        raise ValueError(f"--basis-sizes must be integers, got {args.basis_sizes!r}") from None
    grid = build_grid(
        dataset,
        configurations=split_list(args.configurations, ";")
        if args.configurations
        else list(
            TEXT_CONFIGURATIONS if dataset.input_spec.kind == "text" else DEFAULT_CONFIGURATIONS
        ),
        basis_sizes=sizes,
        strategies=split_list(args.strategies, ","),
        normalizations=split_list(args.normalizations, ";"),
        reference_size=args.reference_size,
        seed=args.seed,
        repeats=args.repeats,
        folds=args.folds,
        **estimator_params(args, args.vocabulary_options),
    )
    status(
        args,
        f"training {len(grid.fits())} settings ({grid.folds} folds + 1 fit each) on "
        f"{dataset.name} ...",
    )
    report = run_report(dataset, grid, not args.quiet, args.cluster, args.worker_memory)
    command = command_line(args)
    markdown = write_report(report, args.out, command)
    best = report.best()
    print(f"report           {markdown}")
    print(
        f"best             {best.configuration.label}, {best.basis_per_class} per class, "
        f"{best.basis_strategy}, {best.normalization}: cross-validated "
        f"{best.validation_accuracy:.2%}, test {best.test_accuracy:.2%}"
    )
    return 0
