"""Scores of a large batch: from the basis items in use, in blocks of rows (one thread).

    .venv/bin/python benchmarks/bench_score_blocks.py [--repeats 30] [--batch 1000]

:class:`service.model.scoring.Scorer` leaves out of the scores the basis items whose folded
weights are negligible (:data:`service.model.scoring.NEGLIGIBLE_WEIGHT`: a kernel map on every
training item reads its support vectors only), and scores a batch larger than a block
(:data:`service.model.threads.SCORES_BLOCK_ROWS` rows, where their similarities fit
:data:`service.model.threads.SCORES_BLOCK_MAX_BYTES`) block by block, so that each block's
similarities are exponentiated and scored while they are in the core's cache. For each model
below, fitted on real data with a fixed configuration (shapes the default chose on these sets),
``decision_function`` of a batch of test items (tiled to ``--batch``) is timed as configured,
reading every basis item in blocks, and reading every item in one block, alternately, on one
numba and one BLAS thread; the line gives the medians in µs an item and the ratios to the last,
and, reading every item, a few block sizes by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings

import numpy as np
from sklearn.datasets import load_breast_cancer, load_digits
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split

from service.model import scoring
from service.model.threads import limit_threads
from training import BasisExpandingSVC

MODELS = {
    # breast cancer's seeds 0 and 2 took every training item as the basis, rbf, per-feature
    "breast_cancer, rbf(gamma=0.25), every item (B = 426)": (
        load_breast_cancer,
        dict(similarity="rbf(gamma=0.25)", input_normalization="per-feature",
             normalization="nystroem(clip)", C=10.0, basis_per_class=267),
    ),
    # digits' default: rbf(gamma=1), 25 a class (B = 250)
    "digits, rbf(gamma=1), 25 a class (B = 250)": (
        load_digits,
        dict(similarity="rbf(gamma=1)", basis_per_class=25),
    ),
    "digits, rbf(gamma=1) + linear, 100 a class (B = 1,000; linear folded on the input)": (
        load_digits,
        dict(similarity="rbf(gamma=1) + linear", basis_per_class=100),
    ),
}  # fmt: skip


def _median_us(predictor, X, repeats: int, rows: int | None) -> float:
    saved = scoring.SCORES_BLOCK_ROWS, scoring.SCORES_BLOCK_MAX_BYTES
    if rows is not None:  # blocks of exactly `rows` rows, whatever their bytes
        scoring.SCORES_BLOCK_ROWS, scoring.SCORES_BLOCK_MAX_BYTES = rows, sys.maxsize
    try:
        predictor.decision_function(X)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            predictor.decision_function(X)
            times.append(time.perf_counter() - started)
    finally:
        scoring.SCORES_BLOCK_ROWS, scoring.SCORES_BLOCK_MAX_BYTES = saved
    return float(np.median(times)) / len(X) * 1e6


def computed_width(predictor) -> int:
    """Similarities computed an item, every basis item read (a dense `linear` is folded into
    weights on the input, so it computes none)."""
    basis, n_basis = predictor.inputs.basis_items, predictor.n_basis
    measures = predictor.inputs.bind(predictor.specs)
    zeros = np.zeros((n_basis, 1))
    return n_basis * sum(1 for m in measures if m.input_weights(basis, zeros) is None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--rows", default="128,256,512", help="block sizes tried by hand")
    args = parser.parse_args()
    for name, (loader, params) in MODELS.items():
        X, y = loader(return_X_y=True)
        X_train, X_test, y_train, _ = train_test_split(
            X, y, test_size=0.25, stratify=y, random_state=0
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = BasisExpandingSVC(**params, n_jobs=1).fit(X_train, y_train)
        predictor = model.predictor_
        saved = scoring.NEGLIGIBLE_WEIGHT
        scoring.NEGLIGIBLE_WEIGHT = -1.0  # rebuilt reading every basis item
        try:
            every_item = dataclasses.replace(predictor)
        finally:
            scoring.NEGLIGIBLE_WEIGHT = saved
        batch = np.resize(X_test, (args.batch, X_test.shape[1]))
        arms = {
            "as configured": (predictor, None),
            "every item, in blocks": (every_item, None),
            "every item, one block": (every_item, args.batch),
        }
        for rows in args.rows.split(","):
            arms[f"{rows} rows"] = (every_item, int(rows))
        times = {arm: [] for arm in arms}
        with limit_threads(numba_threads=1, blas_threads=1):
            for _ in range(3):  # alternately, so that the machine's drift hits every arm
                for arm, (scored_by, rows) in arms.items():
                    times[arm].append(_median_us(scored_by, batch, args.repeats, rows))
        medians = {arm: float(np.median(t)) for arm, t in times.items()}
        whole = medians["every item, one block"]
        print(
            f"{name}: {computed_width(predictor)} similarities computed an item; "
            + ", ".join(f"{arm} {us:.3f} µs ({us / whole:.2f})" for arm, us in medians.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()
