"""Training time and peak memory of BasisExpandingSVC against the one-LinearSVC baseline.

The baseline is the trainer as it was before the one-vs-rest SVMs trained side by side: the same
input normalisation and basis expansion, then one scikit-learn ``LinearSVC`` (liblinear trains
the classes one after the other). Each method runs in its own process (so each has its own peak
resident memory), ``--repeats`` times; printed: the median training time, its ratio to the
baseline's, and the peak memory added by training (peak RSS minus the RSS before training)
as a multiple of the expanded feature matrix.

Data: ``make_classification``, ``--n`` items of ``--dim`` features in ``--classes`` classes,
``--basis`` basis items per class (feature matrix n x classes * basis, float64).

``--jobs 1,2,4,8,16`` times the trainer at each of those ``n_jobs`` (default ``1,-1``), for
measuring how training scales with cores on a bigger machine. ``--selection`` times
:class:`training.ForwardSelectionCV` on digits instead (every stage, no time budget) at each
``n_jobs``: the fold fits of its candidates are what runs side by side there.

Run: ``.venv/bin/python benchmarks/bench_training.py [--n 20000 --basis 50] [--jobs 1,-1]
[--selection]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

from memory import peak_rss_bytes


def _current_rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize()


def _data(n: int, dim: int, classes: int):
    from sklearn.datasets import make_classification

    return make_classification(
        n_samples=n,
        n_features=dim,
        n_informative=dim // 2,
        n_classes=classes,
        n_clusters_per_class=2,
        random_state=0,
    )


def _run_one(method: str, n: int, dim: int, classes: int, basis: int) -> dict:
    """Train once in this process; the numbers as a dict."""
    import numpy as np
    from sklearn.svm import LinearSVC

    from training import BasisExpandingSVC
    from training.estimator.expansion import BasisExpansion
    from training.estimator.preprocessing import InputNormalizer

    if method.startswith("selection"):
        return _run_selection(int(method.split("=")[1]))
    X, y = _data(n, dim, classes)
    # Compile the kernels and load every library before the memory baseline is read.
    BasisExpandingSVC(basis_per_class=2, n_jobs=1).fit(X[:200], y[:200])
    before = _current_rss_bytes()
    started = time.perf_counter()
    if method == "one LinearSVC":
        X_hat = InputNormalizer().fit_transform(X)
        expansion = BasisExpansion(
            "rbf(gamma=1)", n_basis_per_class=basis, normalization="nystroem(square)"
        )
        features = expansion.fit_transform(X_hat, y)
        svm = LinearSVC(dual="auto", max_iter=10_000, random_state=0).fit(features, y)
        accuracy = float((svm.predict(features) == y).mean())
    else:
        n_jobs = int(method.split("=")[1])
        model = BasisExpandingSVC(basis_per_class=basis, n_jobs=n_jobs).fit(X, y)
        accuracy = model.train_accuracy_
    seconds = time.perf_counter() - started
    n_features = classes * basis
    return {
        "method": method,
        "seconds": seconds,
        "train_accuracy": accuracy,
        "added_bytes": peak_rss_bytes() - before,
        "feature_bytes": n * n_features * np.dtype(np.float64).itemsize,
    }


def _run_selection(n_jobs: int) -> dict:
    from training import BasisExpandingSVC, ForwardSelectionCV
    from training.data.datasets import load_digits_dataset

    dataset = load_digits_dataset()
    X, y = dataset.X_train, dataset.y_train
    estimator = BasisExpandingSVC(input_shape=str(dataset.input_spec))

    def selection(jobs: int, max_items: int = 3000) -> ForwardSelectionCV:
        search = ForwardSelectionCV(
            estimator, budget=1e9, n_jobs=jobs, max_items=max_items, refit=False
        )
        return search.fit(X, y)

    selection(1, max_items=150)  # compile first
    started = time.perf_counter()
    search = selection(n_jobs)
    return {
        "method": f"selection n_jobs={n_jobs}",
        "seconds": time.perf_counter() - started,
        "train_accuracy": search.path_[-1]["cv_accuracy"],
        "added_bytes": 0,
        "feature_bytes": 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--basis", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", default="1,-1", help="n_jobs values to time, comma-separated")
    parser.add_argument("--selection", action="store_true", help="time the selection on digits")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: run this method
    args = parser.parse_args()
    shape = [str(args.n), str(args.dim), str(args.classes), str(args.basis)]
    if args.one:
        print(json.dumps(_run_one(args.one, args.n, args.dim, args.classes, args.basis)))
        return
    jobs = [f"n_jobs={j}" for j in args.jobs.split(",")]
    methods = [f"selection {j}" for j in jobs] if args.selection else ["one LinearSVC", *jobs]
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    for _ in range(args.repeats):
        for method in methods:  # interleaved, so that noise falls on every method alike
            command = [sys.executable, __file__, "--one", method, "--n", shape[0]]
            command += ["--dim", shape[1], "--classes", shape[2], "--basis", shape[3]]
            output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            runs[method].append(json.loads(output.strip().splitlines()[-1]))
    feature_mb = runs[methods[0]][0]["feature_bytes"] / 2**20
    if args.selection:
        print(f"selection on digits, every stage (no budget); median of {args.repeats}")
    else:
        print(
            f"n={args.n} d={args.dim} classes={args.classes} basis/class={args.basis}: features "
            f"{feature_mb:.0f} MiB; median of {args.repeats}"
        )
    base = statistics.median(r["seconds"] for r in runs[methods[0]])
    # For the selection: its seconds, and the CV accuracy of its choice (no memory column).
    accuracy_name = "CV acc" if args.selection else "train acc"
    width = 23 if args.selection else 15
    print(
        f"{'method':<{width}} {'train s':>8} {'vs base':>8} {'peak added':>11} {accuracy_name:>9}"
    )
    for method in methods:
        seconds = statistics.median(r["seconds"] for r in runs[method])
        added = statistics.median(r["added_bytes"] / r["feature_bytes"] for r in runs[method])
        accuracy = runs[method][0]["train_accuracy"]
        peak = f"{'-':>11}" if args.selection else f"{added:>10.2f}x"
        print(f"{method:<{width}} {seconds:>8.2f} {seconds / base:>7.2f}x {peak} {accuracy:>9.2%}")


if __name__ == "__main__":
    main()
