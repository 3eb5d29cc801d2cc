"""The one-process SVM solver (:func:`training.estimator.solver.fit_one_vs_rest`) against
scikit-learn's ``LinearSVC`` on the same features, in the same run (issue 20).

For each shape, the features are made once (by the parent process), split 75/25 (stratified,
seeded), and each method trains on the training part in a child process of its own (so that
each has its own peak memory), ``--repeats`` times. Printed per method: the median seconds, their
ratio to ``LinearSVC``'s primal solver (below 1: faster than it; numba's one-time loading of the
kernels from its cache, 0.1-0.2 s a process, is left out like the imports), Newton steps (liblinear:
``n_iter_``), test accuracy, and the largest difference of its test scores from those of our
solver at its default tolerance (the optimum, within 1e-8).

Methods:

- ``ours``: ``fit_one_vs_rest(n_jobs=1)`` at its default ``tol`` (1e-8, liblinear's rule);
- ``ours-tol1e-4``: the same at LinearSVC's default ``tol``, like for like;
- ``ours-2``: ``n_jobs=2`` (classes in groups side by side), default ``tol``;
- ``ours-cg``: the same with trust-region Newton-CG on every design (the exact Newton method's
  baseline where ``ours`` picks that; the same as ``ours`` elsewhere);
- ``ours-exact``: the same with the exact Newton method on every dense design, however wide
  (to place ``EXACT_NEWTON_MAX_COLUMNS``);
- ``ours-ladder``: Newton-CG along C / 100, C / 10, C, each rung warm-started from the one
  before (against cold starts: the Newton steps a warm start saves);
- ``linearsvc``: ``LinearSVC(C=1, dual=False)`` (liblinear's primal trust-region Newton, the
  same problem; scikit-learn's ``dual="auto"`` picks it where items outnumber features);
- ``linearsvc-dual``: ``LinearSVC(C=1, dual=True)`` (dual coordinate descent), only on shapes
  where features outnumber items, or everywhere with ``--dual``.

Shapes (``--shapes``, comma-separated):

- ``rbf-6000``: the issue's reproduction: ``make_classification(6000, 16 features, 12
  informative, 26 classes, 1 cluster a class)``, rbf similarities to 1,200 random items (gamma
  from the median squared distance), standardised per column;
- ``rbf-15000``: the same at 15,000 items and 2,990 bases (the shape the default chose on a
  public 15,000-item, 16-feature, 26-class set);
- ``curve-N``: the cost curves' synthetic set: ``make_classification(N, 64 features, 10
  classes)``, rbf features to 100 random items a class (B = 1,000), standardised;
- ``digits``: the embedded set (first 1,000 train), the default measure rbf(gamma=1) on 25
  bases a class;
- ``text-sensing1``, ``text-sensing2``: fortunes (Debian's packages), ``sensing1(n=150)`` and
  ``sensing2(n_words=150)`` on 250 bases a class, the text settings of
  docs/measurements/results.md (sparse designs).
- ``shuttle-like``: issue 34's solver stall: 43,500 items of 9 numbers on scales 1 to 100, 7
  classes of 34,108, 37, 132, 6,748, 2,458, 6 and 11 items (one 78% of them, two under 20),
  each class a few tight clusters, separable (1-NN: 100% in 3-fold CV); features as
  ``BasisExpandingSVC(rbf(gamma=1), per-feature inputs, 400 a class, nystroem(square))``
  computes them (1,343 basis items). Run it with ``--C 100`` as well as the default 1.

``--default-fit`` measures issue 34's acceptance instead: the default model (``model_for("auto",
n_jobs=1)``, the command line's ``--similarity auto``) fitted on the shuttle-like set's training
split (75%, stratified, seed 0), once with the solver's own choice of Newton method (``chosen``)
and once with trust-region Newton-CG on every design (``newton-cg``, the solver before the exact
method), each in a child process, the two interleaved ``--repeats`` times. Printed: the whole
fit's seconds, the search's, the final refit's solver seconds and Newton steps, the configuration
chosen and the test accuracy.

Run: ``.venv/bin/python benchmarks/bench_solver.py [--shapes rbf-6000,digits] [--repeats 1]
[--methods ours,linearsvc] [--C 1] [--timeout 1800] [--json out.json]``, or
``.venv/bin/python benchmarks/bench_solver.py --default-fit [--repeats 1]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from memory import peak_rss_bytes

METHODS = (
    "ours",
    "ours-cg",
    "ours-exact",
    "ours-tol1e-4",
    "ours-2",
    "ours-ladder",
    "linearsvc",
    "linearsvc-dual",
)
DEFAULT_FIT_METHODS = ("chosen", "newton-cg")
DEFAULT_SHAPES = "digits,rbf-6000,curve-1000,curve-10000,text-sensing1"


def _rbf_features(n: int, n_features: int, n_classes: int, n_basis: int, informative: int):
    from sklearn.datasets import make_classification

    X, y = make_classification(
        n_samples=n,
        n_features=n_features,
        n_informative=informative,
        n_classes=n_classes,
        n_clusters_per_class=1,
        random_state=0,
    )
    rng = np.random.default_rng(0)
    basis = X[rng.choice(n, n_basis, replace=False)]
    features = np.empty((n, n_basis))
    gamma = None
    for start in range(0, n, 10_000):  # blocks: no n x B temporaries beside the output
        block = X[start : start + 10_000]
        d2 = (block**2).sum(1)[:, None] + (basis**2).sum(1)[None] - 2 * block @ basis.T
        np.maximum(d2, 0, out=d2)
        if gamma is None:
            gamma = 1.0 / np.median(d2)
        features[start : start + 10_000] = np.exp(-gamma * d2)
    features -= features.mean(axis=0)
    features /= features.std(axis=0) + 1e-12
    return features, y


# The shuttle-like set's class sizes: issue 34's stalled set (43,500 items, one class 78%).
SHUTTLE_LIKE_COUNTS = (34_108, 37, 132, 6_748, 2_458, 6, 11)


def shuttle_like(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Issue 34's stalled set's shape: 9 features on scales 1 to 100 (whole numbers), the
    classes of :data:`SHUTTLE_LIKE_COUNTS`, each three tight clusters, separable."""
    rng = np.random.default_rng(seed)
    n_features = 9
    scales = np.geomspace(1, 100, n_features)
    centres = rng.normal(size=(len(SHUTTLE_LIKE_COUNTS), n_features)) * 6
    X, y = [], []
    for label, count in enumerate(SHUTTLE_LIKE_COUNTS):
        clusters = centres[label] + rng.normal(size=(3, n_features)) * 1.5
        X.append(clusters[rng.integers(0, 3, count)] + rng.normal(size=(count, n_features)) * 0.5)
        y += [str(label + 1)] * count
    order = rng.permutation(sum(SHUTTLE_LIKE_COUNTS))
    return np.round(np.vstack(X) * scales)[order], np.asarray(y)[order]


def _features_of(X, y, **params):
    """The training features a BasisExpandingSVC with ``params`` computes on (X, y)."""
    from sklearn.exceptions import ConvergenceWarning

    from training import BasisExpandingSVC

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = BasisExpandingSVC(max_iter=1, **params).fit(X, y)
    return model.predictor_.features(X), y


def _model_features(data: str, similarity: str, per_class: int):
    """The training features a BasisExpandingSVC computes on a shipped data set (documents read
    with the vocabulary the figures were measured with, ``FREQUENT_WORDS``)."""
    from training.data.datasets import load_dataset
    from training.estimator.preparation import FREQUENT_WORDS

    dataset = load_dataset(data, test_fraction=0)
    return _features_of(
        dataset.X_train,
        dataset.y_train,
        similarity=similarity,
        basis_per_class=per_class,
        **FREQUENT_WORDS,
    )


def make_shape(name: str):
    """The features and labels of a named shape."""
    if name == "rbf-6000":
        return _rbf_features(6000, 16, 26, 1200, 12)
    if name == "rbf-15000":
        return _rbf_features(15_000, 16, 26, 2990, 12)
    if name.startswith("curve-"):
        return _rbf_features(int(name.split("-", 1)[1]), 64, 10, 1000, 32)
    if name == "digits":
        return _model_features("digits", "rbf(gamma=1)", 25)
    if name == "text-sensing1":
        return _model_features("fortunes", "sensing1(n=150)", 250)
    if name == "text-sensing2":
        return _model_features("fortunes", "sensing2(n_words=150)", 250)
    if name == "shuttle-like":
        return _features_of(
            *shuttle_like(),
            similarity="rbf(gamma=1)",
            basis_per_class=400,
            input_normalization="per-feature",
            normalization="nystroem(square)",
        )
    raise SystemExit(f"unknown shape {name!r}")


def _c_ladder(features: np.ndarray, codes: np.ndarray, n_classes: int, C: float):
    """``ours`` reached along C / 100, C / 10, C, each solve warm-started from the one before
    (one thread, the default tolerance): the coefficients, intercepts and the most Newton steps
    of a problem, summed over the rungs."""
    from service.model.threads import limit_threads
    from training.estimator.newton_cg import TOLERANCE, liblinear_tolerance, minimize_squared_hinge
    from training.estimator.solver import (
        feature_weights,
        one_vs_rest_problems,
        one_vs_rest_weights,
        problem_signs,
        training_design,
    )
    from training.estimator.squared_hinge import InMemorySquaredHinge

    design, shift, columns = training_design(features)
    signs = problem_signs(codes, one_vs_rest_problems(n_classes))
    tolerance = liblinear_tolerance((signs > 0).sum(axis=0), len(signs), TOLERANCE)
    start, steps = None, 0
    with limit_threads(blas_threads=1):
        for rung in (C / 100, C / 10, C):
            loss = InMemorySquaredHinge(design, signs, rung)
            solution = minimize_squared_hinge(loss, 10_000, tolerance, start)
            start, steps = solution.W, steps + solution.n_iter
    coef, intercept = one_vs_rest_weights(start, n_classes)
    coef = feature_weights(coef, columns, len(shift))
    intercept -= coef @ shift
    return coef, intercept, int(steps.max())


def exact_newton_up_to(columns: int) -> None:
    """Make this process's solver use the exact Newton method on dense designs of fewer than
    ``columns`` columns, however many items (0: trust-region Newton-CG on every design, the
    exact method's baseline), to measure either in the same run."""
    from training.estimator import solver

    solver.EXACT_NEWTON_MAX_COLUMNS = columns
    solver.EXACT_NEWTON_ROWS_PER_COLUMN = sys.maxsize


def _default_fit(method: str, out: str) -> None:
    """The default model fitted once in this process on the shuttle-like training split; the
    numbers written to ``out``."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import train_test_split

    from training.fitting import model_for

    if method == "newton-cg":
        exact_newton_up_to(0)
    X, y = shuttle_like()
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.25, random_state=0, stratify=y
    )
    model = model_for("auto", n_jobs=1)
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        model.fit(X_train, y_train)
    seconds = time.perf_counter() - started
    best, chosen = model.best_estimator_, model.best_params_
    Path(out + ".json").write_text(
        json.dumps(
            {
                "seconds": seconds,
                "search_seconds": model.seconds_,
                "refit_solver_seconds": best.timings_["svm_seconds"],
                "refit_expand_seconds": best.timings_["expand_seconds"],
                "n_iter": int(best.n_iter_),
                "accuracy": float(model.score(X_test, y_test)),
                "warnings": sorted({str(w.message)[:120] for w in caught}),
                "chosen": ", ".join(
                    [
                        chosen["similarity"],
                        chosen["input_normalization"],
                        f"{chosen['basis_per_class']} a class",
                        chosen["normalization"],
                        f"C {chosen['C']:g}",
                    ]
                ),
            }
        )
    )


def _default_fits(repeats: int, timeout: float) -> list[dict]:
    """:func:`_default_fit` for each of :data:`DEFAULT_FIT_METHODS`, interleaved, in children."""
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(repeats):
            for method in DEFAULT_FIT_METHODS:
                out = str(Path(scratch) / f"{method}-{repeat}")
                command = [sys.executable, __file__, "--default-fit-one", method, out]
                try:
                    subprocess.run(command, check=True, timeout=timeout)
                except subprocess.TimeoutExpired:
                    print(f"{method:<10} repeat {repeat}: not done in {timeout:g} s", flush=True)
                    continue
                row = {
                    "method": method,
                    "repeat": repeat,
                    **json.loads(Path(out + ".json").read_text()),
                }
                rows.append(row)
                print(
                    f"{method:<10} fit {row['seconds']:7.1f} s, search "
                    f"{row['search_seconds']:6.1f} s, refit solver "
                    f"{row['refit_solver_seconds']:6.1f} s ({row['n_iter']} Newton steps), "
                    f"expansion {row['refit_expand_seconds']:5.1f} s, test accuracy "
                    f"{100 * row['accuracy']:.2f}%; {row['chosen']}; warnings: {row['warnings']}",
                    flush=True,
                )
    return rows


def _run_one(method: str, path: str, out: str, C: float) -> None:
    """Train once in this process on the features saved at ``path``; write the numbers and the
    test scores to ``out``."""
    from sklearn.svm import LinearSVC

    from training.estimator.newton_cg import TOLERANCE
    from training.estimator.solver import fit_one_vs_rest

    if method in ("ours-cg", "ours-exact"):
        exact_newton_up_to(0 if method == "ours-cg" else sys.maxsize)

    with np.load(path, allow_pickle=False) as saved:
        F_train, y_train = saved["F_train"], saved["y_train"]
        F_test, y_test = saved["F_test"], saved["y_test"]
    classes, codes = np.unique(y_train, return_inverse=True)
    if method.startswith("ours"):
        # numba loads the compiled kernels from its cache on their first call in a process
        # (0.1-0.2 s, once per process, like the imports): not the solver's time.
        fit_one_vs_rest(F_train[:50].copy(), codes[:50], len(classes), C=1.0, max_iter=2, n_jobs=1)
    before = peak_rss_bytes()
    started = time.perf_counter()
    if method == "ours-ladder":
        coef, intercept, n_iter = _c_ladder(F_train.copy(), codes, len(classes), C)
        seconds = time.perf_counter() - started
        scores = F_test @ coef.T + intercept
    elif method.startswith("ours"):
        tol = 1e-4 if method == "ours-tol1e-4" else TOLERANCE
        n_jobs = 2 if method == "ours-2" else 1
        coef, intercept, n_iter, _ = fit_one_vs_rest(
            F_train.copy(), codes, len(classes), C=C, max_iter=10_000, n_jobs=n_jobs, tol=tol
        )
        seconds = time.perf_counter() - started
        scores = F_test @ coef.T + intercept
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = LinearSVC(C=C, dual=method == "linearsvc-dual").fit(F_train, codes)
        seconds = time.perf_counter() - started
        n_iter = int(model.n_iter_)
        scores = model.decision_function(F_test)
        if len(classes) == 2:
            scores = np.column_stack([-scores, scores])
    accuracy = float((classes[scores.argmax(axis=1)] == y_test).mean())
    np.save(out + ".npy", scores)
    Path(out + ".json").write_text(
        json.dumps(
            {
                "seconds": seconds,
                "n_iter": int(n_iter),
                "accuracy": accuracy,
                "peak_added_mb": (peak_rss_bytes() - before) / 2**20,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--dual", action="store_true", help="also LinearSVC's dual solver")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per training run")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--C", type=float, default=1.0, help="the SVM's C for every method")
    parser.add_argument(
        "--default-fit",
        action="store_true",
        help="the default model on the shuttle-like set, each Newton method (issue 34)",
    )
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # child: method, data, out
    parser.add_argument("--default-fit-one", nargs=2, help=argparse.SUPPRESS)  # method, out
    args = parser.parse_args()
    if args.one:
        _run_one(*args.one, args.C)
        return
    if args.default_fit_one:
        _default_fit(*args.default_fit_one)
        return
    if args.default_fit:
        rows = _default_fits(args.repeats, args.timeout)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=2))
        return
    from sklearn.model_selection import train_test_split

    methods = args.methods.split(",")
    rows = []
    print(
        f"{'shape':<15} {'n x B (classes)':>22} {'method':<15} {'seconds':>9} {'vs lsvc':>8} "
        f"{'steps':>6} {'test acc':>9} {'max |ds|':>9} {'peak MB':>8}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as scratch:
        for shape in args.shapes.split(","):
            F, y = make_shape(shape)
            F_train, F_test, y_train, y_test = train_test_split(
                F, y, test_size=0.25, random_state=0, stratify=y
            )
            del F
            data = str(Path(scratch) / f"{shape}.npz")
            np.savez(data, F_train=F_train, F_test=F_test, y_train=y_train, y_test=y_test)
            size = f"{len(F_train)} x {F_train.shape[1]} ({len(np.unique(y))})"
            dual = args.dual or F_train.shape[1] > len(F_train)
            del F_train, F_test
            shape_methods = [m for m in methods if m != "linearsvc-dual" or dual]
            results: dict[str, dict] = {}
            scores: dict[str, np.ndarray] = {}
            for method in shape_methods:
                runs = []
                for repeat in range(args.repeats):
                    out = str(Path(scratch) / f"{shape}-{method}-{repeat}")
                    command = [sys.executable, __file__, "--one", method, data, out]
                    command += ["--C", str(args.C)]
                    try:
                        subprocess.run(command, check=True, timeout=args.timeout)
                    except subprocess.TimeoutExpired:
                        runs.append({"seconds": float("inf"), "timed_out": True})
                        break
                    runs.append(json.loads(Path(out + ".json").read_text()))
                    scores[method] = np.load(out + ".npy")
                finished = [r for r in runs if not r.get("timed_out")]
                results[method] = {
                    "seconds": statistics.median(r["seconds"] for r in runs),
                    "n_iter": finished[-1]["n_iter"] if finished else None,
                    "accuracy": finished[-1]["accuracy"] if finished else None,
                    "peak_added_mb": finished[-1]["peak_added_mb"] if finished else None,
                }
            baseline = results.get("linearsvc", {}).get("seconds")
            reference = scores.get("ours")
            for method, result in results.items():
                ratio = result["seconds"] / baseline if baseline else float("nan")
                gap = (
                    float(np.abs(scores[method] - reference).max())
                    if reference is not None and method in scores
                    else float("nan")
                )
                row = {"shape": shape, "size": size, "method": method, **result}
                row |= {"ratio_to_linearsvc": ratio, "max_score_gap": gap}
                rows.append(row)
                accuracy = "-" if result["accuracy"] is None else f"{result['accuracy']:.4f}"
                peak = "-" if result["peak_added_mb"] is None else f"{result['peak_added_mb']:.0f}"
                print(
                    f"{shape:<15} {size:>22} {method:<15} {result['seconds']:>9.2f} "
                    f"{ratio:>8.2f} {result['n_iter'] or '-':>6} {accuracy:>9} {gap:>9.1e} "
                    f"{peak:>8}",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
