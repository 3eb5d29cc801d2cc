"""The solver's Newton steps on large-basis candidates: which converge and which stall.

    .venv/bin/python benchmarks/bench_solver_steps.py --set spambase --seed 0 \\
        --similarity "rbf(gamma=1); rbf(gamma=16); rbf(gamma=1) + rbf(gamma=16)" \\
        --input-normalization per-feature --C 100,10

For each similarity of ``--similarity`` (separated by ``;``), a
:class:`~training.BasisExpandingSVC` under ``--normalization`` (``besvm``, as the large-basis
search fits) is expanded once on the set's training split (as ``bench_defaults.py`` splits it,
every item a basis item by default) and fitted at every C of ``--C`` on that expansion. Printed
for each fit: the most Newton steps of any class's problem (``n_iter_``), the solver's CPU
seconds, and the test accuracy. The large-basis search's step cap
(``training.selection.basis_ladder.LARGE_BASIS_MAX_ITER``) sits between the fits that converge
and the ones that stall (docs/measurements/model-selection.md, "Stalled candidates").
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from training import BasisExpandingSVC
from training.data.datasets import load_dataset
from training.selection.basis_ladder import LARGE_BASIS_MAX_ITER


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="spambase")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--similarity",
        default="rbf(gamma=1); rbf(gamma=16); rbf(gamma=1) + rbf(gamma=16)",
        help="similarities separated by ';'",
    )
    parser.add_argument("--input-normalization", default="per-feature")
    parser.add_argument("--normalization", default="besvm")
    parser.add_argument("--C", default="100,10", help="comma separated")
    parser.add_argument("--basis-per-class", type=int, default=100_000)
    parser.add_argument("--max-iter", type=int, default=10_000)
    parser.add_argument("--n-jobs", type=int, default=1)
    args = parser.parse_args()
    dataset = load_dataset(args.set, test_fraction=0.25, seed=args.seed)
    print(
        f"{args.set} seed {args.seed}: {len(dataset.y_train)} training items, "
        f"{args.normalization}, {args.input_normalization} inputs; "
        f"the search's step cap: {LARGE_BASIS_MAX_ITER}"
    )
    print(f"{'similarity':<32} {'C':>6} {'steps':>6} {'solve s':>8} {'test %':>7}")
    for similarity in (part.strip() for part in args.similarity.split(";")):
        estimator = BasisExpandingSVC(
            similarity=similarity,
            normalization=args.normalization,
            input_normalization=args.input_normalization,
            basis_per_class=args.basis_per_class,
            max_iter=args.max_iter,
            n_jobs=args.n_jobs,
        )
        expanded = estimator.expand(dataset.X_train, dataset.y_train)
        for C in (float(value) for value in args.C.split(",")):
            started = time.process_time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                model = estimator.set_params(C=C).fit_expanded(expanded)
            seconds = time.process_time() - started
            accuracy = float(np.mean(model.predict(dataset.X_test) == dataset.y_test))
            print(
                f"{similarity:<32} {C:>6g} {model.n_iter_:>6d} {seconds:>8.1f} "
                f"{100 * accuracy:>7.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
