"""Where the fold fits run: in joblib processes on this machine (:class:`ThisMachine`, each
limiting its threads through :func:`service.model.threads.limit_threads` so that together they
use the cores once), or as tasks on a Dask cluster's workers (:class:`OnCluster`, joblib's Dask
backend, the items scattered once).
"""

from __future__ import annotations

from joblib import Parallel, parallel_config

from service.model.inputs.spec import InputSpec
from service.model.threads import available_cpus
from training.cluster.connection import cluster_workers

# Selections of fewer numbers than this (items cross-validated times features) run their fold
# fits in the calling process by default: starting worker processes (importing numpy,
# scikit-learn, numba) costs more than their fits save, and on a loaded machine it can take a
# small set's whole budget (docs/measurements/model-selection.md#the-selections-constants-measured).
PROCESSES_FROM_NUMBERS = 100_000


def fold_jobs(n_jobs: int | None, numbers: int, spec: InputSpec) -> tuple[int, int]:
    """Processes for the fold fits and numba threads for each: ``n_jobs`` as given sharing
    the cores, or by default one process per core, except for selections of fewer than
    :data:`PROCESSES_FROM_NUMBERS` numbers (documents never count as few), which run in the
    calling process on one thread (their fits are too small for a parallel region to pay)."""
    cpus = available_cpus()
    if n_jobs is not None and n_jobs > 0:
        return int(n_jobs), max(1, cpus // int(n_jobs))
    if not spec.is_documents and numbers < PROCESSES_FROM_NUMBERS:
        return 1, 1
    return cpus, 1


def fit_cores(n_jobs: int | None) -> int:
    """Cores an estimator fit with ``n_jobs`` uses: the budget's count of them."""
    return int(n_jobs) if n_jobs is not None and n_jobs > 0 else available_cpus()


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
