"""Cross-validated and test accuracy of fixed configurations on a small set's split (issue 34:
why the search keeps ``linear`` on wine where a tuned SVC scores 100% on the test split).

Each configuration of a grid (normalisation x input normalisation x measure x C, every
training item a basis item) is scored by repeated stratified k-fold cross-validation on the
training split, as the search would see it, and on the test split, which the search never sees.

    .venv/bin/python benchmarks/bench_cv_configs.py --seed 1 --folds 3
"""

from __future__ import annotations

import argparse
import itertools
import warnings

import numpy as np
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.model_selection import RepeatedStratifiedKFold, cross_val_score, train_test_split

from training import BasisExpandingSVC

SETS = {"wine": load_wine, "breast_cancer": load_breast_cancer}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="wine", choices=sorted(SETS))
    parser.add_argument("--seed", type=int, default=1, help="the 25%% test split's seed")
    parser.add_argument("--folds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--normalizations", default="besvm,auto")
    parser.add_argument("--input-normalizations", default="global,per-feature")
    parser.add_argument(
        "--similarities",
        default="linear,rbf(gamma=0.0625),rbf(gamma=0.25),rbf(gamma=1),rbf(gamma=4),rbf(gamma=16)",
        help="';' separated",
    )
    parser.add_argument("--C", default="1,10,100")
    parser.add_argument("--top", type=int, default=15, help="rows printed, best CV first")
    args = parser.parse_args()
    X, y = SETS[args.set](return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y.astype(str), test_size=0.25, random_state=args.seed, stratify=y
    )
    folds = RepeatedStratifiedKFold(n_splits=args.folds, n_repeats=args.repeats, random_state=0)
    similarities = args.similarities.split(";" if ";" in args.similarities else ",")
    similarities = [s for s in similarities if s]
    rows = []
    grid = itertools.product(
        args.normalizations.split(","),
        args.input_normalizations.split(","),
        similarities,
        [float(c) for c in args.C.split(",")],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for normalization, inputs, similarity, C in grid:
            model = BasisExpandingSVC(
                n_jobs=1,
                similarity=similarity,
                normalization=normalization,
                input_normalization=inputs,
                basis_per_class=len(y_train),
                C=C,
            )
            cv = cross_val_score(model, X_train, y_train, cv=folds).mean()
            test = np.mean(model.fit(X_train, y_train).predict(X_test) == y_test)
            rows.append((cv, test, normalization, inputs, similarity, C))
    rows.sort(key=lambda row: -row[0])
    print(f"# {args.set} seed {args.seed}: {args.folds}-fold x {args.repeats} CV, training split")
    print(f"{'CV':>8} {'test':>8}  configuration (every training item a basis item)")
    for cv, test, normalization, inputs, similarity, C in rows[: args.top]:
        where = f"{similarity}, {inputs}, {normalization}, C = {C:g}"
        print(f"{100 * cv:7.2f}% {100 * test:7.2f}%  {where}")


if __name__ == "__main__":
    main()
