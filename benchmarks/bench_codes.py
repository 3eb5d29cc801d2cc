"""Queries by examples before and after the numba path solver, in one run: time and top-20
precision on the digits model of ``make run``.

    .venv/bin/python benchmarks/bench_codes.py [--model models/digits] [--requests 40]
        [--draws 5] [--no-http]

A query by examples learns a sparse code (an l1 squared-hinge SVM along its regularisation
path) on the catalogue rows of the positives and of the catalogue's negatives sample, then ranks
the catalogue with it. "before" is the path as it was solved until issue 21, scikit-learn's
``LinearSVC(penalty="l1")`` refitted at every point (:func:`scikit_learn_path_code`, kept here as
the baseline); "after" is :func:`service.model.search.codes.sparse_svm_code`.

1. In process, interleaved round by round (medians of --requests): ``SearchIndex.run`` of a
   class query, and of 5 and of 1 positive given as ids, with either solver.
2. Top-20 precision: for every class, --draws random sets of 5 (and of 1) of its catalogue
   items as positives; the fraction of the 20 items returned (positives excluded) of that
   class, averaged, with either solver.
3. Over HTTP (unless --no-http): two servers of the same model, the service as it is and the
   same service with the baseline solver swapped in (``--serve-before``, one process), each
   asked in turn: p50 of --requests sequential keep-alive requests of each kind.

The machine may be shared: compare within a run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from service.model import Predictor
from service.model.search import SearchIndex, SearchQuery, SparseCode
from service.model.search import index as index_module

LEARN_C_FACTOR, LEARN_C_STEPS = 2.0, 24


def scikit_learn_path_code(X: np.ndarray, y: np.ndarray, n_nonzero: int) -> SparseCode:
    """The code as /search learned it until issue 21: ``LinearSVC(penalty="l1", dual=False,
    class_weight="balanced")`` fitted from scratch at every point of C = l1_min_c * 2^t,
    keeping the last with at most ``n_nonzero`` non-zeros."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.svm import LinearSVC, l1_min_c

    chosen = None
    try:
        C = l1_min_c(X, y, loss="squared_hinge") if np.any(X) else 1.0
    except ValueError:
        C = 1.0
    for _ in range(LEARN_C_STEPS):
        svm = LinearSVC(
            penalty="l1", dual=False, C=C, class_weight="balanced", random_state=0, max_iter=2000
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            svm.fit(X, y)
        nonzeros = np.count_nonzero(svm.coef_)
        if nonzeros > n_nonzero:
            if chosen is None:
                chosen = svm
            break
        if nonzeros:
            chosen = svm
        C *= LEARN_C_FACTOR
    if chosen is None:
        gap = X[y > 0].mean(axis=0) - X[y < 0].mean(axis=0)
        best = int(np.argmax(np.abs(gap)))
        return SparseCode(np.array([best], dtype=np.int64), np.array([np.sign(gap[best])]), 0.0)
    return SparseCode.from_dense(chosen.coef_[0], float(chosen.intercept_[0]), n_nonzero)


SOLVERS = {"after": index_module.sparse_svm_code, "before": scikit_learn_path_code}


def with_solver(name: str):
    """Make ``SearchIndex`` learn codes with the named solver."""
    index_module.sparse_svm_code = SOLVERS[name]


def positives_of(index: SearchIndex, label: str, n: int, rng) -> list[str]:
    catalogue = index.catalogue
    members = np.flatnonzero(catalogue.labels == label)
    return catalogue.ids[rng.choice(members, n, replace=False)].tolist()


def in_process(index: SearchIndex, requests: int) -> dict[str, float]:
    """Median ms of each kind of query, interleaved round by round."""
    label = index.model.classes[7]
    rng = np.random.default_rng(0)
    five, one = positives_of(index, label, 5, rng), positives_of(index, label, 1, rng)
    queries = {
        "class": (None, SearchQuery(class_label=label, top_k=20)),
        "5 positives, after": ("after", SearchQuery(positives=five, top_k=20)),
        "5 positives, before": ("before", SearchQuery(positives=five, top_k=20)),
        "1 positive, after": ("after", SearchQuery(positives=one, top_k=20)),
        "1 positive, before": ("before", SearchQuery(positives=one, top_k=20)),
    }
    times: dict[str, list[float]] = {name: [] for name in queries}
    for round_ in range(requests + 1):
        for name, (solver, query) in queries.items():
            if solver:
                with_solver(solver)
            started = time.perf_counter()
            index.run(query)
            if round_:  # the first round warms up
                times[name].append(time.perf_counter() - started)
    with_solver("after")
    return {name: 1e3 * statistics.median(values) for name, values in times.items()}


def precision(index: SearchIndex, draws: int) -> dict[tuple[str, int], float]:
    """Mean top-20 precision of either solver, 5 and 1 positives, every class, ``draws`` each."""
    labels = index.catalogue.labels
    found: dict[tuple[str, int], list[float]] = {}
    for n_positives in (5, 1):
        rng = np.random.default_rng(n_positives)
        for label in index.model.classes:
            for _ in range(draws):
                positives = positives_of(index, label, n_positives, rng)
                for solver in SOLVERS:
                    with_solver(solver)
                    result = index.run(SearchQuery(positives=positives, top_k=20))
                    positions = index.catalogue.positions([i for i, _ in result.items])
                    hits = float((labels[positions] == label).mean())
                    found.setdefault((solver, n_positives), []).append(hits)
    with_solver("after")
    return {key: float(np.mean(values)) for key, values in found.items()}


def over_http(model: Path, index: SearchIndex, requests: int) -> dict[str, float]:
    """p50 ms of each kind of query on two servers, the service and the baseline, in turn."""
    import httpx
    from serving import HOST, service_env, serving

    label = index.model.classes[7]
    rng = np.random.default_rng(0)
    bodies = {
        "class": {"class": label, "top_k": 20},
        "5 positives": {"positives": positives_of(index, label, 5, rng), "top_k": 20},
        "1 positive": {"positives": positives_of(index, label, 1, rng), "top_k": 20},
    }
    commands = {
        "after": [sys.executable, "-m", "service.api"],
        "before": [sys.executable, str(Path(__file__).resolve()), "--serve-before"],
    }
    times: dict[str, list[float]] = {}
    with (
        serving(commands["after"], service_env(model)) as after_port,
        serving(commands["before"], service_env(model)) as before_port,
        httpx.Client(base_url=f"http://{HOST}:{after_port}") as after,
        httpx.Client(base_url=f"http://{HOST}:{before_port}") as before,
    ):
        clients = {"after": after, "before": before}
        for round_ in range(requests + 3):
            for kind, body in bodies.items():
                for solver, client in clients.items():
                    started = time.perf_counter()
                    response = client.post("/search", json=body)
                    elapsed = time.perf_counter() - started
                    response.raise_for_status()
                    if round_ >= 3:
                        times.setdefault(f"{kind}, {solver}", []).append(elapsed)
    return {name: 1e3 * statistics.median(values) for name, values in times.items()}


def serve_before() -> None:
    """``python -m service.api`` with the baseline solver (one process: the swap is in it)."""
    with_solver("before")
    from service.api.__main__ import main

    main()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/digits"))
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--draws", type=int, default=5)
    parser.add_argument("--no-http", action="store_true")
    parser.add_argument("--serve-before", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_before:
        serve_before()
        return
    index = SearchIndex.load(args.model, Predictor.load(args.model))
    index.warm_up()
    with threadpool_limits(1, user_api="blas"):  # as the server runs
        timed = in_process(index, args.requests)
        print(f"in process, medians of {args.requests} (ms):")
        for name, ms in timed.items():
            print(f"  {name:22s} {ms:9.3f}   {ms / timed['class']:7.1f}x the class query")
        hits = precision(index, args.draws)
    print(f"top-20 precision ({args.draws} draws per class, positives excluded):")
    for n_positives in (5, 1):
        print(
            f"  {n_positives} positive(s): before {hits[('before', n_positives)]:.3f}, "
            f"after {hits[('after', n_positives)]:.3f}"
        )
    if not args.no_http:
        timed = over_http(args.model, index, args.requests)
        print(f"over HTTP, p50 of {args.requests} (ms):")
        for name, ms in timed.items():
            print(f"  {name:22s} {ms:9.3f}")
        for kind in ("5 positives", "1 positive"):
            ratio = timed[f"{kind}, after"] / timed["class, after"]
            print(f"  {kind}: after / class {ratio:.2f} (target: 3 or less)")


if __name__ == "__main__":
    main()
