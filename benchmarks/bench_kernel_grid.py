"""The kernel SVM's grid after the basis ladder (training/selection/kernel_grid.py): what it chooses
on the sets it runs on, and the test accuracy of its choice beside the ladder's.

    .venv/bin/python benchmarks/bench_kernel_grid.py [--sets spambase,phoneme] [--seeds 0,1,2]
        [--n-jobs 1] [--processes 1] [--out results.jsonl] [--refit-from results.jsonl]

For each set and seed (25% test, as ``bench_defaults.py`` splits them): the default fit
(``fit_dataset(dataset, similarity="auto", n_jobs=N)``, what ``python -m training fit --jobs N``
does; ``--n-jobs 1``, the default here, as ``bench_defaults.py --n-jobs 1`` measured the default's
figures before this stage: one process, its fold fits on every core's threads; -1 is the command
line's default, a process per core where the fits are large), its test accuracy, and, where the
kernel grid took a candidate, the ladder's choice (the grid's ``compared_with``) fitted on the same
split and its test accuracy: the default as it was without the stage, from the same run. Each
model's prediction is timed too: µs an item at batch 1,000 on one thread, median of 5 (as
``bench_defaults.py`` times it). ``--processes`` runs that many fits side by side (give each its
cores, with ``taskset``, or the budgets, counted in CPU time, cover less). One JSON line per fit is
printed and appended to ``--out``; then a table. ``--refit-from`` skips the selections: it fits the
two configurations each line of an earlier ``--out`` recorded (the default's choice and the
ladder's) on the same split and times their prediction, on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np
from sklearn.base import clone

from training import BasisExpandingSVC
from training.data.datasets import load_dataset
from training.evaluation.held_out import prediction_batch, seconds_per_item
from training.fitting import fit_dataset

TEST_FRACTION = 0.25
BATCH = 1000


def per_item_us(predictor, X) -> float:
    """µs an item of ``predictor.decision_function`` at batch 1,000, one thread, median of 5."""
    batch = prediction_batch(X, BATCH)
    return 1e6 * seconds_per_item(lambda: predictor.decision_function(batch), BATCH, 5)


def run_one(name: str, seed: int, n_jobs: int) -> dict:
    """The default on one split, and the ladder's choice beside it where the grid changed it."""
    dataset = load_dataset(name, test_fraction=TEST_FRACTION, seed=seed)
    started = time.monotonic()
    fitted = fit_dataset(dataset, "default", similarity="auto", n_jobs=n_jobs, diagnostics=False)
    seconds = time.monotonic() - started
    selection = fitted.selection
    accuracy = float(np.mean(fitted.predictor.predict(dataset.X_test) == dataset.y_test))
    grid = selection.kernel_grid_
    line = {
        "set": name,
        "seed": seed,
        "n_jobs": n_jobs,
        "accuracy": accuracy,
        "seconds": round(seconds, 1),
        "predict_us": per_item_us(fitted.predictor, dataset.X_test),
        "chosen": selection.best_params_,
        "kernel_grid": grid,
        "ladder_accuracy": accuracy,
    }
    line["ladder_predict_us"] = line["predict_us"]
    if grid and grid["chosen"]:
        # the final fit's estimator, its other parameters kept, with the ladder's choice
        ladder = clone(selection.best_estimator_).set_params(**grid["compared_with"])
        ladder.fit(dataset.X_train, dataset.y_train)
        line["ladder_accuracy"] = float(np.mean(ladder.predict(dataset.X_test) == dataset.y_test))
        predictor = ladder.to_predictor(diagnostics=False)
        line["ladder_predict_us"] = per_item_us(predictor, dataset.X_test)
    return line


def refit_one(recorded: dict) -> dict:
    """The two configurations ``recorded`` (a line of ``--out``) names, fitted again on its split,
    their accuracy and prediction timed here."""
    dataset = load_dataset(recorded["set"], test_fraction=TEST_FRACTION, seed=recorded["seed"])
    line = {**recorded}
    grid = recorded["kernel_grid"] or {}
    ladder_params = grid.get("compared_with") or recorded["chosen"]
    for key, params in (("", recorded["chosen"]), ("ladder_", ladder_params)):
        model = BasisExpandingSVC(**params, input_shape=str(dataset.input_spec), n_jobs=1)
        model.fit(dataset.X_train, dataset.y_train)
        line[f"{key}accuracy"] = float(np.mean(model.predict(dataset.X_test) == dataset.y_test))
        predictor = model.to_predictor(diagnostics=False)
        line[f"{key}predict_us"] = per_item_us(predictor, dataset.X_test)
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="spambase,phoneme", help="comma separated")
    parser.add_argument("--seeds", default="0,1,2", help="comma separated")
    parser.add_argument("--n-jobs", type=int, default=1, help="the fit's n_jobs (-1: fit's)")
    parser.add_argument("--processes", type=int, default=1, help="fits side by side")
    parser.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    parser.add_argument(
        "--refit-from", type=Path, default=None, help="refit and time an earlier --out's choices"
    )
    args = parser.parse_args()
    if args.refit_from is not None:
        recorded = [json.loads(text) for text in args.refit_from.read_text().splitlines()]
        runs = [(refit_one, (line,)) for line in recorded]
    else:
        runs = [
            (run_one, (name, int(seed), args.n_jobs))
            for name in args.sets.split(",")
            for seed in args.seeds.split(",")
        ]
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    lines = []
    with ProcessPoolExecutor(max_workers=args.processes) as pool:
        futures = [pool.submit(function, *arguments) for function, arguments in runs]
        for future in as_completed(futures):
            line = future.result()
            lines.append(line)
            text = json.dumps(line, default=str)
            print(text, flush=True)
            if args.out is not None:
                with args.out.open("a", encoding="utf-8") as handle:
                    handle.write(text + "\n")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    print(
        f"\n{'set':<10} {'seed':>4} {'default %':>9} {'ladder %':>9} {'µs':>6} {'ladder µs':>9} "
        f"{'s':>6}  kernel grid"
    )
    for line in sorted(lines, key=lambda entry: (entry["set"], entry["seed"])):
        grid = line["kernel_grid"]
        what = "did not run" if not grid else (grid["stopped"] if not grid["chosen"] else "")
        if grid and grid["chosen"]:
            chosen = grid["chosen"]
            what = f"took {chosen['similarity']}, {chosen['input_normalization']}"
            what += f", C = {chosen['C']:g}"
        print(
            f"{line['set']:<10} {line['seed']:>4} {100 * line['accuracy']:>9.2f} "
            f"{100 * line['ladder_accuracy']:>9.2f} {line['predict_us']:>6.1f} "
            f"{line['ladder_predict_us']:>9.1f} {line['seconds']:>6.0f}  {what}"
        )
    for name in dict.fromkeys(line["set"] for line in lines):
        mine = [line for line in lines if line["set"] == name]
        print(
            f"{name}: mean {100 * np.mean([m['accuracy'] for m in mine]):.2f}% "
            f"(the ladder's choice {100 * np.mean([m['ladder_accuracy'] for m in mine]):.2f}%), "
            f"prediction {np.mean([m['predict_us'] for m in mine]):.1f} µs an item "
            f"({np.mean([m['ladder_predict_us'] for m in mine]):.1f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
