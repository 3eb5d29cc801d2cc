"""Test accuracy of fixed configurations against the basis size (issue 34: can the model gain
from a larger basis, and under which normalisation, width and C?).

    .venv/bin/python benchmarks/bench_basis_path.py --set phoneme --seed 0 \\
        --similarity "rbf(gamma=1)" --input-normalization global --C 1,10 \\
        --normalization auto,besvm --sizes 200,400,800,1600,4000
    .venv/bin/python benchmarks/bench_basis_path.py --set fortunes --similarity linear \\
        --normalization besvm --sizes 200,1000 --min-df 2 --stop-words english

For every combination of the listed normalisations, C and basis sizes (per class; a size past a
class takes every item of it), its items chosen by ``--basis-strategy``, a
:class:`~training.BasisExpandingSVC` is fitted on the set's
training split (as ``bench_defaults.py`` splits it: 25% test, stratified, the seed given) on one
thread (documents with the vocabulary of ``--min-df`` and ``--stop-words``, by default
``fit``'s: every word), and its test and
training accuracy, fit seconds and basis size are printed, one line each. The estimator's own
``max_iter`` (10,000) is kept, so a fit that stalls shows its time.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Iterator

import numpy as np
from bench_defaults import synthetic_dataset
from bench_solver import exact_newton_up_to
from sklearn.exceptions import ConvergenceWarning

from training import BasisExpandingSVC
from training.data.datasets import load_dataset
from training.estimator.preparation import DEFAULT_MIN_DF, DEFAULT_STOP_WORDS


def _floats(text: str) -> list[float]:
    return [float(value) for value in text.split(",")]


def grid_models(args: argparse.Namespace) -> Iterator[tuple[str, float, int, BasisExpandingSVC]]:
    """Every combination of ``args``' comma-separated normalisations, C and basis sizes per
    class, with the model of it (``args.similarity``, ``args.input_normalization``, one
    ``args.n_jobs`` threads)."""
    for normalization in args.normalization.split(","):
        for C in _floats(args.C):
            for size in [int(s) for s in args.sizes.split(",")]:
                yield (
                    normalization,
                    C,
                    size,
                    BasisExpandingSVC(
                        similarity=args.similarity,
                        input_normalization=args.input_normalization,
                        normalization=normalization,
                        C=C,
                        basis_per_class=size,
                        basis_strategy=args.basis_strategy,
                        min_df=args.min_df,
                        stop_words=None if args.stop_words == "none" else args.stop_words,
                        n_jobs=args.n_jobs,
                    ),
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="phoneme", help="a data set load_dataset knows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--test-fraction", type=float, default=0.25)
    parser.add_argument("--similarity", default="rbf(gamma=1)")
    parser.add_argument(
        "--input-normalization", default="global", choices=("global", "per-feature")
    )
    parser.add_argument("--normalization", default="auto", help="comma separated")
    parser.add_argument("--C", default="1", help="comma separated")
    parser.add_argument("--sizes", default="200,400,800,1600", help="basis per class, comma sep.")
    parser.add_argument(
        "--basis-strategy",
        default="index",
        choices=("index", "random", "kmedoids"),
        help="how each class's basis items are chosen",
    )
    parser.add_argument(
        "--min-df",
        type=int,
        default=DEFAULT_MIN_DF,
        help="documents: the vocabulary's least quote count (default fit's: %(default)s)",
    )
    parser.add_argument(
        "--stop-words",
        default="none" if DEFAULT_STOP_WORDS is None else DEFAULT_STOP_WORDS,
        choices=("english", "none"),
        help="documents (default fit's: %(default)s)",
    )
    parser.add_argument(
        "--synthetic",
        type=int,
        default=0,
        metavar="N",
        help="instead of --set: bench_defaults.py's synthetic set (make_classification, 64 "
        "features, 10 classes) with N training items and its 2,000 test items",
    )
    parser.add_argument("--n-jobs", type=int, default=1, help="the model's threads")
    parser.add_argument(
        "--solver",
        default="auto",
        choices=("auto", "exact", "newton-cg"),
        help="the Newton method on dense designs: the one newton_method_for chooses, or this "
        "one whatever the design's width",
    )
    args = parser.parse_args()
    if args.solver != "auto":  # one method on every dense design, to measure both
        exact_newton_up_to(sys.maxsize if args.solver == "exact" else 0)
    if args.synthetic:
        data = synthetic_dataset(args.synthetic)
        args.set = f"synthetic ({args.synthetic:,})"
    else:
        data = load_dataset(args.set, test_fraction=args.test_fraction, seed=args.seed)
    counts = np.unique(data.y_train, return_counts=True)[1]
    print(f"# {args.set} seed {args.seed}: {len(data.y_train)} training items, classes {counts}")
    for normalization, C, size, model in grid_models(args):
        started = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            model.fit(data.X_train, data.y_train)
        seconds = time.perf_counter() - started
        accuracy = float(np.mean(model.predict(data.X_test) == data.y_test))
        stalled = any(issubclass(w.category, ConvergenceWarning) for w in caught)
        print(
            f"{args.similarity} {args.input_normalization} {normalization} C={C:g} "
            f"{args.basis_strategy} "
            f"per class {size}: B = {model.expansion_.basis_.shape[0]}, "
            f"test {100 * accuracy:.2f}%, train {100 * model.train_accuracy_:.2f}%, "
            f"{seconds:.1f} s (solver {model.timings_['svm_seconds']:.1f} s, "
            f"{model.n_iter_} Newton steps)" + (" (stopped at max_iter)" if stalled else ""),
            flush=True,
        )


if __name__ == "__main__":
    main()
