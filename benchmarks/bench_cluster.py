"""Cost curves (issue 20): fit time and peak memory against the number of items, one process
against ``--cluster local:N``, on the same data and configuration, in the same run.

Data: ``make_classification(n, 64 features, 10 classes)``, written as npz shards of
``--rows`` items; the model: ``rbf(gamma=1)`` on ``--basis-per-class`` items a class (B = 10 x
that). Each fit runs in a child process of its own:

- ``one``: ``BasisExpandingSVC(n_jobs=--jobs).fit(X, y)`` on the arrays loaded whole;
- ``cluster``: the same estimator fitted on the shards (``fit(open_shards(dir))``) inside a
  ``local:N`` cluster (one thread a worker, ``--worker-memory`` each); the driver never loads
  the data.

Printed per size and method: seconds (the fit, after the cluster is up), the ratio of the
cluster's to one process's, a second fit on the same cluster (its workers warm, as a
long-lived remote cluster's are: ``--again-under``) and its ratio, peak resident memory of the
driver (the process that fits) and of each worker (the most of them), and the features' size.
A size a method cannot run (its process killed, or past ``--one-max``) shows ``-``.

Run: ``.venv/bin/python benchmarks/bench_cluster.py [--sizes 1000,10000,100000]
[--workers 2] [--worker-memory 3GiB] [--one-max 300000] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from memory import peak_rss_bytes


class _DriverPhases(logging.Handler):
    """The driver's peak resident memory in each step of the cluster fit (the steps its log
    names), sampled every 50 ms."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.phase, self.peaks = "connected", {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("cluster fit: "):
            self._sample_once()
            with self._lock:
                self.phase = message.removeprefix("cluster fit: ")

    def _sample_once(self):
        import psutil

        rss = psutil.Process().memory_info().rss
        with self._lock:
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), rss)

    def _sample(self):
        while not self._stop.wait(0.05):
            self._sample_once()

    def __enter__(self):
        logger = logging.getLogger("training")
        self._level = logger.level
        logger.addHandler(self)
        logger.setLevel(logging.INFO)
        self._sampler.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._sampler.join()
        logger = logging.getLogger("training")
        logger.removeHandler(self)
        logger.setLevel(self._level)


def _data(n: int):
    from sklearn.datasets import make_classification

    return make_classification(
        n_samples=n,
        n_features=64,
        n_informative=32,
        n_classes=10,
        n_clusters_per_class=2,
        random_state=0,
    )


def _run_one(
    method: str, shards: str, basis: int, jobs: int, workers: int, memory: str, again_under: float
) -> dict:
    from training import BasisExpandingSVC
    from training.cluster.shards import open_shards, read_shard

    params = {"similarity": "rbf(gamma=1)", "basis_per_class": basis}
    data = open_shards(shards)
    if method == "one":
        parts = [read_shard(shard) for shard in data.shards]
        X, y = np.vstack([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        del parts
        started = time.perf_counter()
        BasisExpandingSVC(**params, n_jobs=jobs).fit(X, y)
        return {"seconds": time.perf_counter() - started, "driver_peak": peak_rss_bytes()}
    from training.cluster.connection import connect

    with connect(f"local:{workers}", worker_memory=memory) as client, _DriverPhases() as phases:
        started = time.perf_counter()
        BasisExpandingSVC(**params).fit(data)
        seconds = time.perf_counter() - started
        peaks = client.run(peak_rss_bytes)
        driver_peak = peak_rss_bytes()
        again = None
        if again_under and seconds < again_under:
            started = time.perf_counter()
            BasisExpandingSVC(**params).fit(data)
            again = time.perf_counter() - started
    return {
        "seconds": seconds,
        "driver_phases": phases.peaks,
        "again_seconds": again,
        "driver_peak": driver_peak,
        "worker_peak": max(peaks.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--basis-per-class", type=int, default=100)
    parser.add_argument("--rows", type=int, default=50_000, help="items per shard")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker-memory", default="3GiB")
    parser.add_argument("--jobs", type=int, default=2, help="cores of the one-process fit")
    parser.add_argument("--one-max", type=int, default=300_000, help="largest one-process size")
    parser.add_argument("--timeout", type=float, default=7200)
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument(
        "--again-under",
        type=float,
        default=60.0,
        help="fit again on the same cluster, its workers warm, when the first fit took less "
        "(seconds; 0: never)",
    )
    parser.add_argument("--one", nargs=7, help=argparse.SUPPRESS)  # child
    args = parser.parse_args()
    if args.one:
        method, shards, basis, jobs, workers, memory, again_under = args.one
        result = _run_one(
            method, shards, int(basis), int(jobs), int(workers), memory, float(again_under)
        )
        print("RESULT " + json.dumps(result))
        return
    from training.cluster.shards import write_shards

    rows = []
    print(
        f"{'items':>9} {'features MB':>12} {'method':<10} {'seconds':>9} {'cluster/one':>12} "
        f"{'again':>7} {'again/one':>10} {'driver MB':>10} {'worker MB':>10}",
        flush=True,
    )
    for n in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as scratch:
            X, y = _data(n)
            write_shards(X, y, Path(scratch) / "shards", rows_per_shard=args.rows)
            del X, y
            features_mb = n * 10 * args.basis_per_class * 8 / 2**20
            results = {}
            for method in ("one", "cluster"):
                if method == "one" and n > args.one_max:
                    continue
                command = [
                    sys.executable,
                    __file__,
                    "--one",
                    method,
                    str(Path(scratch) / "shards"),
                    str(args.basis_per_class),
                    str(args.jobs),
                    str(args.workers),
                    args.worker_memory,
                    str(args.again_under),
                ]
                try:
                    done = subprocess.run(
                        command, capture_output=True, text=True, timeout=args.timeout
                    )
                except subprocess.TimeoutExpired:
                    print(f"{n:>9} {method}: past --timeout {args.timeout:g} s", flush=True)
                    continue
                lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
                if done.returncode == 0 and lines:
                    results[method] = json.loads(lines[-1][len("RESULT ") :])
                else:
                    why = (done.stderr.strip().splitlines() or ["no output"])[-1]
                    print(f"{n:>9} {method}: exit {done.returncode}: {why}", flush=True)
            for method, result in results.items():
                ratio = (
                    result["seconds"] / results["one"]["seconds"]
                    if method == "cluster" and "one" in results
                    else float("nan")
                )
                worker = result.get("worker_peak")
                again = result.get("again_seconds")
                again_ratio = (
                    again / results["one"]["seconds"] if again and "one" in results else None
                )
                print(
                    f"{n:>9} {features_mb:>12.0f} {method:<10} {result['seconds']:>9.1f} "
                    f"{ratio:>12.2f} {'-' if again is None else f'{again:.1f}':>7} "
                    f"{'-' if again_ratio is None else f'{again_ratio:.2f}':>10} "
                    f"{result['driver_peak'] / 2**20:>10.0f} "
                    f"{'-' if worker is None else f'{worker / 2**20:.0f}':>10}",
                    flush=True,
                )
                if result.get("driver_phases"):
                    steps = ", ".join(
                        f"{step}: {rss / 2**20:.0f}"
                        for step, rss in result["driver_phases"].items()
                    )
                    print(f"{'':>9} driver MB by step of the first fit: {steps}", flush=True)
                rows.append(
                    {"items": n, "method": method, **result, "ratio": ratio,
                     "again_ratio": again_ratio}
                )  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
