"""``python -m training fit``: train a model on a data set (or on shards) and write its artifact."""

from __future__ import annotations

import argparse
import inspect
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from service.model import Predictor
from service.model.features import (
    AUTO_NORMALIZATION_INDEFINITE,
    AUTO_NORMALIZATION_KERNELS,
    NORMALIZATIONS,
)
from service.model.inputs.transforms import TRANSFORMS
from service.model.search import search_dir
from service.model.similarity import SIMILARITY_KINDS
from training.cli.common import add_data_arguments, already_there, load_data, status
from training.cli.options import add_estimator_arguments, estimator_params
from training.cluster.connection import cluster_named
from training.cluster.shards import is_sharded, open_shards
from training.data.datasets import DIGITS, FORTUNES
from training.data.readers import DatasetError
from training.estimator.diagnostics import format_ratio
from training.estimator.estimator import AUTO_SIMILARITY, BasisExpandingSVC
from training.fitting import FitResult, fit_dataset, fit_shards
from training.selection.forward_selection import ForwardSelectionCV
from training.selection.memory import DEFAULT_BUDGET_RULE, default_allowance, parse_bytes
from training.selection.space import SELECTED_PARAMETERS

# How `fit` derives its model options from BasisExpandingSVC's parameters: the ones other options
# set, older option names kept for scripts, and the one default of the command line's own (it
# selects the configuration unless told the measures).
FIT_OPTIONS = {
    "skip": ("input_shape", "random_state", "verbose"),
    "aliases": {
        "C": ("--C",),
        "input_transform": ("--transform",),
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
    "help_text": {
        "cluster": "train on a Dask cluster (docs/using/cluster.md): 'local:N' starts N worker "
        "processes for the fit, an address such as tcp://host:8786 uses a running scheduler; "
        "each worker expands its own rows, and the model is the one-process fit's",
    },
}


# The selection's own options: its budget and what wins within the noise (the others follow the
# model's options).
SELECTION_PARAMETERS = ("budget", "prefer", "memory_budget")
SELECTION_OPTIONS = {
    "cls": ForwardSelectionCV,
    "skip": tuple(
        set(inspect.signature(ForwardSelectionCV).parameters) - set(SELECTION_PARAMETERS)
    ),
    "aliases": {"budget": ("--selection-budget",)},
    "types": {"memory_budget": parse_bytes},
    "help_text": {
        "memory_budget": "Bytes the final fit's training features may take (n x F float64 "
        "numbers, the basis Gram matrix, and under nystroem its eigenvectors and projection), e.g. "
        "8GiB, 500MiB, 8GB or "
        "plain bytes: it bounds the basis grown for the whole training split, the basis "
        "ladder and the kernel grid's fits at every item; beyond one machine's memory, train on "
        "a cluster (--cluster)",
    },
}


def _memory_budget_help() -> dict[str, dict[str, str]]:
    """What the help says of --memory-budget's default: the rule, and what it allows on this
    machine now (:func:`~training.selection.memory.default_allowance`)."""
    return {
        "default_help": {
            "memory_budget": f"{DEFAULT_BUDGET_RULE}: on this machine now {default_allowance()}"
        }
    }


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


HELP = "train a model and write its artifact directory"
DESCRIPTION = textwrap.fill(
    "Choose a class-balanced basis, expand the training set on it under one or more "
    "similarity measures, fit a one-vs-rest linear SVM, and write the artifact. With "
    "--similarity auto (the default) the configuration is chosen by cross-validation "
    "first.",
    width=88,
)
PARSER_OPTIONS = {"epilog": _fit_epilog(), "formatter_class": argparse.RawDescriptionHelpFormatter}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser, default=DIGITS)
    model = parser.add_argument_group(
        "model", "the estimator's parameters (training.BasisExpandingSVC; --seed sets random_state)"
    )
    parser.set_defaults(
        model_options=add_estimator_arguments(model, BasisExpandingSVC, **FIT_OPTIONS)
    )
    selection = parser.add_argument_group(
        "selection", "with --similarity auto (training.ForwardSelectionCV, which wraps the model)"
    )
    parser.set_defaults(
        selection_options=add_estimator_arguments(
            selection, **SELECTION_OPTIONS, **_memory_budget_help()
        )
    )
    output = parser.add_argument_group("output")
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


def run(args: argparse.Namespace) -> int:
    params = _model_params(args)
    name = args.name or (DIGITS if args.data == DIGITS else Path(args.data).stem)
    out = args.out or Path("models") / name
    # A broken artifact is an error, not "present".
    if already_there(args, out, lambda: Predictor.load(out), "a model", hint=", or choose --out"):
        return 0
    if args.data not in (DIGITS, FORTUNES) and is_sharded(args.data):
        trained = _fit_shards(args, params, name)
    else:
        trained = _fit_split(args, params, name)
    retired_search = search_dir(out).exists()
    trained.result.predictor.save(out, overwrite=args.force)
    if retired_search:
        print(
            f"note: the search model and catalogue of the old {out} were built on it and went "
            f"with it: rebuild them (python -m training dictionary --model {out}, then "
            "python -m training index) before a server takes the new version",
            file=sys.stderr,
        )
    selection = trained.result.selection
    if selection is not None:
        print(f"selection path (CV accuracy on {trained.selected_on}):\n{selection.describe()}")
    print("\n".join(_summary(trained, name, out)))
    return 0


def _model_params(args: argparse.Namespace) -> dict:
    """The parameters of :func:`training.fitting.model_for` the command line gives, with its
    own defaults; refused before anything is loaded: options that the selection would silently
    override."""
    params = estimator_params(args, args.model_options, FIT_OPTIONS["defaults"])
    selection = estimator_params(args, args.selection_options)
    argv = sys.argv[1:] if args.argv is None else args.argv
    fixed = [
        option.as_written(argv)
        for option in args.model_options
        if option.parameter in SELECTED_PARAMETERS
        and option.parameter != "similarity"
        and option.given(args)
    ]
    if params["similarity"].strip().lower() == AUTO_SIMILARITY and fixed:
        raise ValueError(
            f"with --similarity auto the selection chooses {', '.join(fixed)}: give the measures "
            f"too (e.g. --similarity '{BasisExpandingSVC().similarity}') to fix them yourself"
        )
    params["cluster"] = cluster_named(params.get("cluster"))
    seed_and_progress = {"random_state": args.seed, "verbose": not args.quiet}
    chosen = {f"selection_{name}": value for name, value in selection.items()}
    return {**params, **seed_and_progress, **chosen}


@dataclass
class _Trained:
    """A fitted model, with what the summary says of its data."""

    result: FitResult
    data: str  # the data, in words
    selected_on: str  # what the selection cross-validated on
    test_accuracy: float | None = None
    no_test: str = ""  # why there is no test accuracy
    predict_seconds: float | None = None
    n_test: int = 0
    cluster: str | None = None  # where it trained, when not in this process alone


def _fit_split(args: argparse.Namespace, params: dict, name: str) -> _Trained:
    """fit --data FILE (or a data set's name): trained on the training split in this process
    (or on the cluster named), scored on the test split."""
    status(args, f"loading data set {args.data} ...")
    dataset = load_data(args)
    status(args, f"fitting BE-SVM on {len(dataset.y_train):,} training items ...")
    result = fit_dataset(dataset, name, **params)
    trained = _Trained(
        result,
        cluster=params["cluster"],
        data=f"{dataset.name}: {len(dataset.y_train):,} train, {len(dataset.y_test):,} test, "
        f"input {dataset.input_spec}",
        selected_on="the training split",
        no_test="no test split, trained on every item (--test-fraction 0)",
        n_test=len(dataset.y_test),
    )
    if trained.n_test:
        started = time.perf_counter()
        predicted = result.predictor.predict(dataset.X_test)
        trained.predict_seconds = time.perf_counter() - started
        trained.test_accuracy = float((predicted == dataset.y_test).mean())
    result.predictor.metadata["training"]["test_accuracy"] = trained.test_accuracy
    result.predictor.metadata["training"]["n_test"] = trained.n_test
    return trained


def _fit_shards(args: argparse.Namespace, params: dict, name: str) -> _Trained:
    """fit --data DIR of shards (docs/using/cluster.md): trained on every item, on the cluster
    named (or, without one, in worker threads of this process)."""
    if args.test_data or args.test_fraction:
        raise DatasetError("sharded data trains on every item: no --test-data or --test-fraction")
    data = open_shards(args.data, args.label_column)
    status(args, f"fitting BE-SVM on {data} ...")
    result = fit_shards(data, name, input_shape=args.input_shape, **params)
    return _Trained(
        result,
        cluster=params["cluster"] or "this process (worker threads reading the shards)",
        data=str(data),
        selected_on="a stratified sample of the shards",
        no_test="sharded data trains on every item",
    )


def _summary(trained: _Trained, name: str, out: Path) -> list[str]:
    """The lines ``fit`` prints: the model, its data, what it is and how it did."""
    result, predictor = trained.result, trained.result.predictor
    timings = result.timings
    basis = predictor.metadata["basis"]
    return (
        [
            f"model            {name}",
            f"artifact         {out}",
            f"data             {trained.data}",
        ]
        + ([f"cluster          {trained.cluster}"] if trained.cluster else [])
        + [
            f"classes          {len(predictor.classes)}",
            f"inputs           {predictor.input_spec}"
            + ("" if predictor.vocabulary is None else " (a vocabulary reads raw text)"),
            f"transform        {predictor.transform}"
            + _other_transforms(predictor.measure_transforms, str(predictor.transform)),
            f"similarities     {' + '.join(predictor.similarity_names)}",
            f"normalization    {predictor.normalization}",
            f"basis            {predictor.n_basis} items ({basis['strategy']}, "
            f"{basis['per_class']} per class), {predictor.coef.shape[1]} features",
            f"train accuracy   {result.train_accuracy:.2%}",
            f"test accuracy    none: {trained.no_test}"
            if trained.test_accuracy is None
            else f"test accuracy    {trained.test_accuracy:.2%}",
            f"train time       {timings['train_seconds']:.2f} s (expansion "
            f"{timings['expand_seconds']:.2f} s, SVM {timings['svm_seconds']:.2f} s)",
        ]
        + (
            []
            if trained.predict_seconds is None
            else [
                f"test prediction  {1e6 * trained.predict_seconds / trained.n_test:.1f} µs per item"
            ]
        )
        + [
            f"eigenvalues      {measure}: NgRat {format_ratio(d['ngrat'])}, "
            f"NgEng {format_ratio(d['ngeng'])}"
            for measure, d in predictor.metadata["diagnostics"].items()
        ]
        + [f"warning          {note}" for note in result.warnings]
    )


def _other_transforms(measure_transforms: list[str], model_transform: str) -> str:
    """What the summary adds to the model's transform for measures that read others."""
    others = list(dict.fromkeys(t for t in measure_transforms if t != model_transform))
    return f" (measures also read {', '.join(others)})" if others else ""
