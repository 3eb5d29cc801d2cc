"""Does storing the training features as float32 change a model's accuracy (issue 34 item 2:
"float32 features wherever the solver's accuracy allows")?

    .venv/bin/python benchmarks/bench_float32_features.py --sets digits,spambase,phoneme \\
        --similarity "rbf(gamma=1)" --normalization auto,besvm --C 1,100 --sizes 50,200

For every combination, a :class:`~training.BasisExpandingSVC` is fitted on the set's training
split (as ``bench_defaults.py`` splits it: 25% test, stratified, the seed given) on one thread.
Its training features (the expansion's output, as the model computes them) are then solved again
by the estimator's own solver (:func:`~training.estimator.solver.fit_one_vs_rest`) twice: as
float64 (the reference), and rounded to float32 and read back as float64 (what float32 storage
loses, with the solver still accumulating in float64). Both are scored on the test split's
float64 features; the line says both test accuracies, how many test predictions differ, the
largest coefficient difference relative to the largest coefficient, and the Newton steps each
took. A third solve on the float32 array itself says whether the solver reads float32 as it is
(the dtype of what its products return) and its seconds beside the float64 solve's.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from bench_basis_path import grid_models
from sklearn.exceptions import ConvergenceWarning

from training.data.datasets import load_dataset
from training.estimator.solver import fit_one_vs_rest


def _solve(features: np.ndarray, codes: np.ndarray, n_classes: int, C: float):
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        coef, intercept, n_iter, _ = fit_one_vs_rest(
            features.copy(), codes, n_classes, C=C, max_iter=10_000, n_jobs=1
        )
    return coef, intercept, n_iter, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="digits,spambase,phoneme", help="comma separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--similarity", default="rbf(gamma=1)")
    parser.add_argument("--input-normalization", default="global")
    parser.add_argument("--normalization", default="auto,besvm", help="comma separated")
    parser.add_argument("--C", default="1,100", help="comma separated")
    parser.add_argument("--sizes", default="50,200", help="basis per class, comma separated")
    args = parser.parse_args()
    for name in args.sets.split(","):
        data = load_dataset(name, seed=args.seed)
        print(f"# {name} seed {args.seed}: {len(data.y_train)} train, {len(data.y_test)} test")
        for normalization, C, size, model in grid_models(args):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)
                model.fit(data.X_train, data.y_train)
            predictor = model.predictor_
            classes = np.asarray(predictor.classes)
            codes = np.searchsorted(classes, np.asarray(data.y_train).astype(str))
            train = predictor.features(data.X_train)
            test = predictor.features(data.X_test)
            rounded = train.astype(np.float32).astype(np.float64)
            coef64, b64, steps64, seconds64 = _solve(train, codes, len(classes), C)
            coef32, b32, steps32, _ = _solve(rounded, codes, len(classes), C)
            coef_raw, _, _, seconds_raw = _solve(train.astype(np.float32), codes, len(classes), C)
            predicted64 = classes[(test @ coef64.T + b64).argmax(axis=1)]
            predicted32 = classes[(test @ coef32.T + b32).argmax(axis=1)]
            accuracy64 = float(np.mean(predicted64 == data.y_test))
            accuracy32 = float(np.mean(predicted32 == data.y_test))
            relative = float(np.abs(coef32 - coef64).max() / np.abs(coef64).max())
            print(
                f"{name} {args.similarity} {normalization} C={C:g} per class {size} "
                f"(B = {train.shape[1]}): test float64 {100 * accuracy64:.2f}%, "
                f"float32 {100 * accuracy32:.2f}%, "
                f"{int(np.sum(predicted64 != predicted32))} of {len(test)} predictions "
                f"differ; coef max diff {relative:.1e} of the largest; Newton steps "
                f"{steps64} / {steps32}; solver on a float32 array: coef "
                f"{coef_raw.dtype}, {seconds_raw:.2f} s against {seconds64:.2f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
