"""What the selection's budget counts when fold fits share a Dask worker.

A worker of several threads runs several fold fits at once. The budget should count each fit's
own CPU time, so that their sum is at most what the worker process spent (the rest is the
worker's own: receiving tasks, sending results). This script runs the same uncut selection
``--runs`` times on a ``LocalCluster`` of one worker with ``--threads`` threads and prints, for
each, the CPU seconds the selection counted beside the worker's process CPU time over it.

    .venv/bin/python benchmarks/bench_cluster_budget.py --threads 2 --runs 2
"""

from __future__ import annotations

import argparse
import logging
import time

from sklearn.datasets import load_wine

from training import BasisExpandingSVC, ForwardSelectionCV


def _process_cpu() -> float:
    return time.process_time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="the worker's threads (default 2)")
    parser.add_argument("--runs", type=int, default=2, help="selections to run (default 2)")
    args = parser.parse_args()

    from distributed import Client, LocalCluster

    X, y = load_wine(return_X_y=True)
    with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=args.threads,
            processes=True,
            dashboard_address="127.0.0.1:0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):

        def worker_cpu() -> float:
            return sum(client.run(_process_cpu).values())

        for run in range(args.runs):
            before = worker_cpu()
            search = ForwardSelectionCV(
                BasisExpandingSVC(cluster=cluster.scheduler_address),
                budget=600,  # never reached on wine: every stage runs
                repeats=1,
                refit=False,
            ).fit(X, y)
            spent = worker_cpu() - before
            print(
                f"run {run}: {search.n_fits_} fold fits ({search.stopped_}); the selection counted "
                f"{search.cpu_seconds_:.2f} CPU s, the worker process spent {spent:.2f}"
            )


if __name__ == "__main__":
    main()
