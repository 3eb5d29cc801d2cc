"""Where the fold fits run: in joblib processes on this machine (:class:`ThisMachine`, each
limiting its threads through :func:`service.model.threads.limit_threads` so that together they
use the cores once), or as tasks on a Dask cluster's workers (:class:`OnCluster`, joblib's Dask
backend, the items scattered once).
"""

from __future__ import annotations

from joblib import Parallel, parallel_config

from service.model.threads import available_cpus
from training.cluster.connection import cluster_workers


def fold_jobs(n_jobs: int | None) -> tuple[int, int]:
    """Processes for the fold fits and numba threads for each: ``n_jobs`` as given sharing
    the cores, or by default one process of one thread per core.

    Small selections too: the budget counts CPU seconds per core the fits use, so fits on
    fewer cores than the machine has get a smaller share of it. In the calling process on one
    thread, a small set's selection had half the CPU of two processes on 2 cores and stopped
    before its large-basis stage (segment's seed 0: 96.19% against 98.10%,
    docs/measurements/model-selection.md, "A small set under the command line's default").
    Starting the workers costs wall time (the backstop's), not the CPU budget."""
    cpus = available_cpus()
    if n_jobs is not None and n_jobs > 0:
        return int(n_jobs), max(1, cpus // int(n_jobs))
    return cpus, 1


class ThisMachine:
    """Fold fits in ``n_jobs`` joblib processes on this machine (one: in this process), each
    with its share of the cores."""

    def parallel(self, X, n_jobs: int) -> Parallel:
        return Parallel(n_jobs=n_jobs, return_as="generator_unordered")

    def threads(self, threads: int) -> int:
        return threads

    def cores(self, n_jobs: int, threads: int) -> int:
        return n_jobs * threads


class OnCluster:
    """Fold fits as tasks on a Dask cluster's workers, through joblib's Dask backend: the
    items cross-validated ``X`` are scattered to every worker once (each task carries a fold's
    positions and labels, which the backend swaps for the scattered copy), and each fit runs
    on one worker thread, with one numba thread (workers run a task per core)."""

    def __init__(self, client):
        cluster_workers(client)  # a scheduler without workers, refused by name before any work
        self.client = client

    def parallel(self, X, n_jobs: int) -> Parallel:
        with parallel_config(backend="dask", client=self.client, scatter=[X]):
            return Parallel(n_jobs=-1, return_as="generator_unordered")

    def threads(self, threads: int) -> int:
        return 1

    def cores(self, n_jobs: int, threads: int) -> int:
        return sum(self.client.nthreads().values())
