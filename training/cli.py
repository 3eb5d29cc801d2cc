"""Command line of the trainer: ``python -m training {fit,evaluate,report} --help``."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from service.model import ModelError, Predictor
from service.model.basis import BASIS_STRATEGIES
from service.model.expansion import (
    AUTO_NORMALIZATION_INDEFINITE,
    AUTO_NORMALIZATION_KERNELS,
    NORMALIZATIONS,
)
from service.model.similarity import SIMILARITY_KINDS
from service.model.transforms import TRANSFORMS
from training.datasets import DIGITS, FORTUNES, DatasetError, load_dataset
from training.diagnostics import format_ratio
from training.evaluate import evaluate
from training.fit import FitConfig, fit_besvm
from training.report import (
    DEFAULT_BASIS_SIZES,
    DEFAULT_CONFIGURATIONS,
    DEFAULT_NORMALIZATIONS,
    DEFAULT_STRATEGIES,
    TEXT_CONFIGURATIONS,
    build_grid,
    run_report,
    write_report,
)

_DEFAULTS = FitConfig()


def _add_data_arguments(parser: argparse.ArgumentParser, default: str | None) -> None:
    group = parser.add_argument_group("data")
    group.add_argument(
        "--data",
        default=default,
        help=f"'{DIGITS}' (embedded: 8x8 digit images, first 1,000 train / 797 test), "
        f"'{FORTUNES}' (text: Debian's fortunes and fortunes-min quotes, categories with at "
        "least 100 quotes), a .npz file (X, y, optional ids, optional X_test/y_test), a .csv "
        "file with a header (a label column, an optional id column, numeric feature columns), "
        'a .jsonl file of {"text": ..., "label": ...} lines, or a folder with one '
        "sub-folder of text files per class"
        + (f" (default: {default})" if default else " (default: the model's training data)"),
    )
    group.add_argument(
        "--test-fraction",
        type=float,
        default=0.25,
        help="held-out fraction for files without X_test, stratified (default: 0.25)",
    )
    group.add_argument("--seed", type=int, default=0, help="seed of splits and random bases")
    group.add_argument(
        "--input-shape",
        help="read file rows as grids, e.g. 'grid(28, 28, 1)' (default: from the array shape)",
    )
    group.add_argument(
        "--label-column", default="label", help="CSV column holding the class (default: label)"
    )


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Train and evaluate Basis Expanding SVMs offline; the artifacts they write "
        "are served by 'python -m service.api'.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    fit = commands.add_parser(
        "fit",
        help="train a model and write its artifact directory",
        description="Choose a class-balanced basis, expand the training set on it under one or "
        "more similarity measures, fit a one-vs-rest linear SVM, and write the artifact.",
    )
    _add_data_arguments(fit, default=DIGITS)
    model = fit.add_argument_group("model")
    kinds = "; ".join(f"{k.name}: {k.description}" for k in SIMILARITY_KINDS.values())
    model.add_argument(
        "--similarity",
        default=_DEFAULTS.similarities,
        help=f"similarity measure(s) joined with '+', sharing one basis, e.g. "
        f"'rbf(gamma=0.5) + rigid(1)'; known: {kinds} (default: {_DEFAULTS.similarities})",
    )
    model.add_argument(
        "--transform",
        default=_DEFAULTS.transform,
        help=f"input transform the service applies to raw instances: {', '.join(TRANSFORMS)}; "
        "'hog(cell_size, orientations)' turns images into a grid of HOG cells, e.g. 'hog(2, 9)' "
        "(default: pixels for images, none otherwise)",
    )
    model.add_argument(
        "--basis-per-class",
        type=int,
        default=_DEFAULTS.basis_per_class,
        help=f"basis items per class (default: {_DEFAULTS.basis_per_class})",
    )
    model.add_argument(
        "--basis-strategy",
        choices=BASIS_STRATEGIES,
        default=_DEFAULTS.basis_strategy,
        help=f"how basis items are chosen within a class (default: {_DEFAULTS.basis_strategy})",
    )
    model.add_argument(
        "--normalization",
        default=_DEFAULTS.normalization,
        help=f"normalisation of the similarities: {', '.join(NORMALIZATIONS)}, or auto: "
        f"{AUTO_NORMALIZATION_KERNELS} when every measure is a kernel (linear, rbf), "
        f"{AUTO_NORMALIZATION_INDEFINITE} when one is indefinite (rigid, deformable, sensing) "
        f"(default: {_DEFAULTS.normalization})",
    )
    model.add_argument(
        "-C",
        "--C",
        dest="C",
        type=float,
        default=_DEFAULTS.C,
        help=f"SVM regularisation constant (default: {_DEFAULTS.C:g})",
    )
    model.add_argument(
        "--max-iter",
        type=int,
        default=_DEFAULTS.max_iter,
        help=f"LinearSVC iteration limit (default: {_DEFAULTS.max_iter})",
    )
    text = fit.add_argument_group("text data sets")
    text.add_argument(
        "--min-df",
        type=int,
        default=_DEFAULTS.min_df,
        help="vocabulary: leave out words found in fewer training texts than this "
        f"(default: {_DEFAULTS.min_df})",
    )
    text.add_argument(
        "--stop-words",
        choices=("english", "none"),
        default=_DEFAULTS.stop_words,
        help="vocabulary: leave out scikit-learn's English stop words, or keep every word "
        f"(default: {_DEFAULTS.stop_words})",
    )
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

    ev = commands.add_parser(
        "evaluate",
        help="held-out accuracy of a model beside LinearSVC and SVC(RBF) baselines",
        description="Accuracy, per-class report, training and prediction times of a trained "
        "model on the held-out split, side by side with baselines trained on the same inputs.",
    )
    ev.add_argument("--model", type=Path, required=True, help="artifact directory")
    _add_data_arguments(ev, default=None)
    ev.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    ev.add_argument(
        "--repeats", type=int, default=5, help="timing runs, the median is shown (default: 5)"
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
    rep.set_defaults(handler=_run_report)
    return parser


def _status(args: argparse.Namespace, message: str) -> None:
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr, flush=True)


def _load_data(args: argparse.Namespace, default_source=None):
    if args.data is None and default_source is not None:
        return load_dataset(default_source)
    return load_dataset(
        args.data,
        test_fraction=args.test_fraction,
        seed=args.seed,
        input_shape=args.input_shape,
        label_column=args.label_column,
    )


def _run_fit(args: argparse.Namespace) -> int:
    name = args.name or (DIGITS if args.data == DIGITS else Path(args.data).stem)
    out = args.out or Path("models") / name
    if args.if_missing and out.exists():
        existing = Predictor.load(out)  # a broken artifact is an error, not "present"
        _status(args, f"{out} already holds model {existing.name!r}: nothing to do")
        return 0
    _status(args, f"loading data set {args.data} ...")
    dataset = _load_data(args)
    if out.exists() and not args.force:
        raise DatasetError(f"{out} already exists: pass --force to replace it, or choose --out")
    config = FitConfig(
        similarities=args.similarity,
        transform=args.transform,
        basis_per_class=args.basis_per_class,
        basis_strategy=args.basis_strategy,
        normalization=args.normalization,
        C=args.C,
        max_iter=args.max_iter,
        seed=args.seed,
        min_df=args.min_df,
        stop_words=None if args.stop_words == "none" else args.stop_words,
    )
    _status(args, f"fitting BE-SVM on {len(dataset.y_train):,} training items ...")
    result = fit_besvm(dataset, config, name=name, verbose=not args.quiet)
    predictor = result.predictor
    started = time.perf_counter()
    test_accuracy = float((predictor.predict(dataset.X_test) == dataset.y_test).mean())
    predict_seconds = time.perf_counter() - started
    predictor.metadata["training"]["test_accuracy"] = test_accuracy
    predictor.metadata["training"]["n_test"] = len(dataset.y_test)
    predictor.save(out, overwrite=args.force)
    timings = result.timings
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
                f"transform        {predictor.transform}",
                f"similarities     {' + '.join(predictor.similarity_names)}",
                f"normalization    {predictor.normalization}",
                f"basis            {predictor.n_basis} items ({config.basis_strategy}, "
                f"{config.basis_per_class} per class), {predictor.coef.shape[1]} features",
                f"train accuracy   {result.train_accuracy:.2%}",
                f"test accuracy    {test_accuracy:.2%}",
                f"train time       {timings['train_seconds']:.2f} s (expansion "
                f"{timings['expand_seconds']:.2f} s, SVM {timings['svm_seconds']:.2f} s)",
                f"test prediction  {1e6 * predict_seconds / max(len(dataset.y_test), 1):.1f} "
                "µs per item",
            ]
            + [
                f"eigenvalues      {name}: NgRat {format_ratio(d['ngrat'])}, "
                f"NgEng {format_ratio(d['ngeng'])}"
                for name, d in predictor.metadata["diagnostics"].items()
            ]
            + [f"warning          {note}" for note in result.warnings]
        )
    )
    return 0


def _run_evaluate(args: argparse.Namespace) -> int:
    predictor = Predictor.load(args.model)
    recorded = predictor.metadata.get("training", {}).get("dataset")
    if args.data is None and recorded is None:
        raise DatasetError(f"{args.model} records no training data set: pass --data")
    dataset = _load_data(args, default_source=recorded)
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
    _status(args, f"evaluating {predictor.name} on {len(dataset.y_test):,} held-out items ...")
    evaluation = evaluate(predictor, dataset, repeats=args.repeats)
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
    report = run_report(dataset, grid, verbose=not args.quiet)
    command = "python -m training report " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if args.argv is None else args.argv)[1:]
    )
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
    parser = _build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    try:
        return args.handler(args)
    except (DatasetError, ModelError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
