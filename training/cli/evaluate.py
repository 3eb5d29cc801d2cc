"""``python -m training evaluate``: a model's held-out accuracy beside baselines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from service.model import Predictor
from training.cli.common import add_model_arguments, model_dataset, status
from training.data.datasets import as_test_set
from training.data.readers import DatasetError
from training.evaluation.held_out import SVC_GRIDS, evaluate

HELP = "held-out accuracy of a model beside LinearSVC and SVC(RBF) baselines"
DESCRIPTION = (
    "Accuracy, per-class report, training and prediction times of a trained "
    "model on the held-out split, side by side with baselines trained on the same inputs "
    "(and, with --tuned-svc, an SVC tuned by grid search on the raw training split). The "
    "model's training time includes its selection."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    parser.add_argument(
        "--repeats", type=int, default=5, help="timing runs, the median is shown (default: 5)"
    )
    parser.add_argument(
        "--tuned-svc",
        nargs="?",
        const="full",
        choices=tuple(SVC_GRIDS),
        help="also Pipeline([scaling, SVC(RBF)]) on the raw training split, the scaling (none or "
        "StandardScaler), C and gamma tuned by 5-fold GridSearchCV: 'full' (48 settings, C in "
        "0.1-100, gamma 'scale' or 1e-4 to 1; the default when the flag has no value) or "
        "'small' (12 settings, for large sets); its training time is the whole grid search",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="processes of the tuned SVC's grid search (default: one per core)",
    )


def run(args: argparse.Namespace) -> int:
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
        status(args, f"no training split in {dataset.name}: no baselines, the model alone")
    status(args, f"evaluating {predictor.name} on {len(dataset.y_test):,} held-out items ...")
    if args.tuned_svc:
        status(args, f"tuning SVC(RBF) by grid search ({args.tuned_svc} grid) ...")
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


def _evaluation_dataset(args: argparse.Namespace, predictor: Predictor):
    """What ``evaluate`` scores on: the test split of --data (the model's data by default) or
    --test-data; with --data and --test-fraction 0, every item of --data, without baselines."""
    dataset = model_dataset(args, predictor)
    if len(dataset.y_test):
        return dataset
    if args.data is not None:
        return as_test_set(dataset)
    raise DatasetError(
        f"{args.model} was trained on every item of its data set (no test split): score it on "
        "other data with --test-data FILE, or on a whole data set with --data FILE "
        "--test-fraction 0"
    )
