"""``python -m training evaluate-search``: mAP against sparsity of the US-SVM variants and
pruned SVMs."""

from __future__ import annotations

import argparse
from pathlib import Path

from service.model import Predictor
from training.cli.common import (
    add_feature_space_argument,
    add_model_arguments,
    command_line,
    model_dataset,
    split_list,
    status,
)
from training.retrieval.evaluation import DEFAULT_SPARSITIES, evaluate_search, write_search_report

HELP = "mAP against sparsity of US-SVM variants and pruned l2/l1-SVMs, with a plot"
DESCRIPTION = (
    "Train the four US-SVM variants, an l2-SVM and an l1-SVM on a model's "
    "features of its training split; prune every class's code or weights to each sparsity; "
    "rank the test split for every class; write README.md (table), map_sparsity.png and "
    "results.json."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_feature_space_argument(parser)
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


def run(args: argparse.Namespace) -> int:
    predictor = Predictor.load(args.model)
    dataset = model_dataset(args, predictor)
    try:
        sparsities = [int(v) for v in split_list(args.sparsities, ",")]
    except ValueError:
        raise ValueError(f"--sparsities must be integers, got {args.sparsities!r}") from None
    status(args, f"evaluating search on {dataset.name} ...")
    evaluation = evaluate_search(
        predictor,
        dataset,
        feature_space=args.feature_space,
        sparsities=sparsities,
        n_atoms=args.atoms,
        progress=not args.quiet,
    )
    command = command_line(args)
    path = write_search_report(evaluation, args.out, command)
    cells = {(r["method"], r["sparsity"]): r["map"] for r in evaluation["rows"]}
    for method in dict.fromkeys(r["method"] for r in evaluation["rows"]):
        line = "  ".join(f"{s}: {100 * cells[(method, s)]:6.2f}" for s in sparsities)
        print(f"{method:10s} mAP% at nnz  {line}")
    print(f"report           {path}")
    return 0
