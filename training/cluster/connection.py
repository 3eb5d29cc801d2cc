"""One way to name a Dask cluster, for every command that does heavy work.

``--cluster local:N`` starts a ``LocalCluster`` of N worker processes for the command and stops
it afterwards; ``--cluster tcp://host:8786`` (or ``DASK_SCHEDULER_ADDRESS``) connects to a
scheduler that is already running. Without either, commands run in this process as they always
did, and nothing imports Dask: this module imports it only inside :func:`connect`.

The API is three names::

    from training.cluster.connection import ClusterError, add_cluster_argument, connect

    add_cluster_argument(parser)             # --cluster, with its help text
    with connect(args.cluster) as client:    # None: no cluster (client is None)
        ...                                  # client: a distributed.Client

:func:`connect` checks what a user cannot see from outside before any work is sent: that the
scheduler answers within :data:`CONNECT_TIMEOUT_S` and has a worker within as long again, and
that the scheduler and every worker run
the same ``dask``, ``distributed`` and ``besvm`` as this process (tasks are pickled by module
path: a worker with another version runs other code, or none). Each failure is a
:class:`ClusterError` whose message is one line naming the address or both versions; the
command line prints it and exits with status 2.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHECKED_PACKAGES",
    "CONNECT_TIMEOUT_S",
    "SCHEDULER_ENV",
    "WORKER_PRELOAD",
    "ClusterError",
    "ClusterSpec",
    "add_cluster_argument",
    "check_versions",
    "client_for",
    "cluster_named",
    "cluster_workers",
    "connect",
    "enclosing_client",
    "in_process_client",
    "parse_cluster",
]

# How long connecting to a scheduler (and its first answer) may take before the command gives up.
CONNECT_TIMEOUT_S = 10.0
# How long a started LocalCluster may take to bring its workers up.
LOCAL_START_TIMEOUT_S = 60.0
# The module every local worker imports as it starts (Dask's worker preload): the fitting code
# and what it imports. A remote cluster's workers take the same with ``--preload``.
WORKER_PRELOAD = "training.estimator.cluster_fit"
# The environment variable Dask's own tools read for the scheduler's address.
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
# Packages whose versions must be the same on the client, the scheduler and the workers.
CHECKED_PACKAGES = ("dask", "distributed", "besvm")
# Each worker process of a LocalCluster gets this share of the memory this process may use (the
# rest is the driver's and the system's), unless --worker-memory says otherwise.
LOCAL_MEMORY_SHARE = 0.6

_LOCAL = re.compile(r"^local(?::(\d+))?$")
_REMOTE = re.compile(r"^(tcp|tls|inproc|ucx)://[^\s/]+$")


class ClusterError(RuntimeError):
    """The cluster cannot be used: the message is one line for the user (exit status 2)."""


@dataclass(frozen=True)
class ClusterSpec:
    """A parsed ``--cluster`` value.

    Attributes
    ----------
    address : str or None
        The scheduler's address, or None for a local cluster.
    n_workers : int
        Worker processes of a local cluster (0 for a remote one).
    """

    address: str | None
    n_workers: int = 0

    @property
    def is_local(self) -> bool:
        return self.address is None

    def __str__(self) -> str:
        return f"local:{self.n_workers}" if self.is_local else str(self.address)


def cluster_named(value: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The cluster a command names: ``--cluster``'s value, else ``DASK_SCHEDULER_ADDRESS``
    (Dask's own variable, as its tools read it; the one place it is read), else None.

    Parameters
    ----------
    value : str or None
    environ : dict, optional
        The environment (default: ``os.environ``).
    """
    if value is not None:
        return value
    return (os.environ if environ is None else environ).get(SCHEDULER_ENV) or None


def parse_cluster(value: str | None, environ: dict[str, str] | None = None) -> ClusterSpec | None:
    """The cluster named by ``--cluster`` (or, without it, ``DASK_SCHEDULER_ADDRESS``).

    Parameters
    ----------
    value : str or None
        ``local:N``, ``local`` (one worker per core), or a scheduler address such as
        ``tcp://host:8786``.
    environ : dict, optional
        The environment to read ``DASK_SCHEDULER_ADDRESS`` from (default: ``os.environ``).

    Returns
    -------
    ClusterSpec or None
        None: no cluster, run in this process.

    Raises
    ------
    ClusterError
        A value that names no cluster.
    """
    value = cluster_named(value, environ)
    if value is None:
        return None
    value = value.strip()
    local = _LOCAL.match(value)
    if local:
        n_workers = int(local.group(1)) if local.group(1) else (os.cpu_count() or 1)
        if n_workers < 1:
            raise ClusterError(f"--cluster {value}: a local cluster needs at least one worker")
        return ClusterSpec(None, n_workers)
    if _REMOTE.match(value):
        return ClusterSpec(value)
    raise ClusterError(
        f"--cluster {value!r} names no cluster: use local:N (N worker processes here) or a "
        "scheduler address such as tcp://host:8786"
    )


def add_cluster_argument(parser) -> None:
    """Add ``--cluster`` and ``--worker-memory`` to an argparse parser (or argument group)."""
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="local:N|tcp://HOST:PORT",
        help="run the heavy work on a Dask cluster: local:N starts N worker processes on this "
        "machine for this command (one thread each, memory shared out unless --worker-memory), "
        "tcp://host:8786 uses a running scheduler; default: the address in "
        f"{SCHEDULER_ENV} if set, else no cluster (this process only). The scheduler must "
        f"answer within {CONNECT_TIMEOUT_S:g} s, have a worker within {CONNECT_TIMEOUT_S:g} s "
        "more, and run the same dask, distributed and besvm",
    )
    parser.add_argument(
        "--worker-memory",
        default=None,
        metavar="BYTES",
        help="memory limit of each local:N worker, e.g. 2GiB (Dask spills persisted data to "
        "disk past 60%% of it, and restarts a worker at 95%%); default: "
        f"{LOCAL_MEMORY_SHARE:.0%}% of this machine's memory shared among the workers",
    )


def _local_memory_limit(n_workers: int) -> int:
    import psutil  # a runtime dependency (joblib kills its workers with it)

    return int(psutil.virtual_memory().total * LOCAL_MEMORY_SHARE / n_workers)


# Worker processes run one task per thread; the kernels inside a task stay on that thread, so
# that threads x BLAS threads x numba threads fit the cores (SCALE.md, "thread
# oversubscription").
_ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
}


@contextmanager
def connect(
    cluster: str | ClusterSpec | None,
    *,
    worker_memory: str | int | None = None,
    timeout_s: float = CONNECT_TIMEOUT_S,
) -> Iterator[Any]:
    """A ``distributed.Client`` on the cluster named, for the ``with`` block.

    A local cluster is started here and closed at the end of the block; a remote one is only
    disconnected from.

    Parameters
    ----------
    cluster : str, ClusterSpec or None
        As ``--cluster`` takes it (see :func:`parse_cluster`); None and no
        ``DASK_SCHEDULER_ADDRESS``: yields None and imports nothing.
    worker_memory : str or int, optional
        Memory limit of each local worker (``"2GiB"``, bytes); default: a share of this
        machine's (:data:`LOCAL_MEMORY_SHARE`). Ignored for a remote cluster (its workers were
        started with their own).
    timeout_s : float
        Seconds to wait for the scheduler's first answer, and as many more for a first worker
        where it has none.

    Yields
    ------
    distributed.Client or None

    Raises
    ------
    ClusterError
        The scheduler does not answer in time, has no worker within ``timeout_s`` more, or it or
        a worker runs other versions (see :data:`CHECKED_PACKAGES`).
    """
    spec = cluster if isinstance(cluster, ClusterSpec) else parse_cluster(cluster)
    if spec is None:
        yield None
        return
    try:
        from distributed import Client, LocalCluster
        from distributed.exceptions import WorkerStartTimeoutError
        from distributed.versions import VersionMismatchWarning
    except ImportError:
        raise ClusterError(
            "--cluster needs Dask, which is not installed: pip install 'besvm[cluster]' "
            "(or the pins of requirements-cluster.lock)"
        ) from None
    if spec.is_local:
        memory = worker_memory if worker_memory is not None else _local_memory_limit(spec.n_workers)
        try:
            local = LocalCluster(
                n_workers=spec.n_workers,
                threads_per_worker=1,
                processes=True,
                memory_limit=memory,
                # The scheduler serves /health and /metrics on this port (and the dashboard where
                # bokeh is installed): any free one, rather than a warning that 8787 is taken.
                dashboard_address="127.0.0.1:0",
                env=_ONE_THREAD,
                # Each worker imports the fitting code as it starts, in parallel with the
                # others, rather than inside the fit's first tasks (seconds on a small machine).
                preload=[WORKER_PRELOAD],
                timeout=LOCAL_START_TIMEOUT_S,
            )
        except (OSError, TimeoutError, ValueError) as error:
            raise ClusterError(f"could not start the local cluster {spec}: {error}") from None
        with local, Client(local, timeout=timeout_s) as client:
            yield client
        return
    try:
        with warnings.catch_warnings():
            # distributed's own table of mismatched versions: check_versions says it in a line.
            warnings.simplefilter("ignore", VersionMismatchWarning)
            client = Client(spec.address, timeout=timeout_s)
    except (OSError, TimeoutError) as error:
        raise ClusterError(
            f"no Dask scheduler answered at {spec.address} within {timeout_s:g} s ({error})"
        ) from None
    with client:
        if not check_versions(client, str(spec)):
            # None yet (one may be starting beside the scheduler): work sent to a scheduler
            # without workers waits for one forever (index --cluster did).
            with suppress(WorkerStartTimeoutError):
                client.wait_for_workers(1, timeout=timeout_s)
            cluster_workers(client)  # still none: refused by name
            check_versions(client, str(spec))
        yield client


def enclosing_client():
    """The ``distributed.Client`` of an enclosing ``with Client(...)`` block, or None.

    Only a client entered as a context counts (not one merely created somewhere in the
    process), and Dask is not imported to find out: without it there is none.
    """
    if "distributed" not in sys.modules:
        return None
    from distributed import Client

    try:
        return Client.current(allow_global=False)
    except ValueError:
        return None


@contextmanager
def client_for(cluster: str | None, *, worker_memory=None) -> Iterator[Any]:
    """The client an estimator trains on: its ``cluster`` parameter's (started or connected to
    for the block, :func:`connect`), else an enclosing ``with Client(...)``'s, else None."""
    if cluster is None and enclosing_client() is not None:
        yield enclosing_client()
        return
    with connect(cluster, worker_memory=worker_memory) as client:
        yield client


def cluster_workers(client) -> dict[str, dict]:
    """The workers of ``client``'s scheduler, fetched from it, as ``Client.scheduler_info()``
    describes them (a synchronous client: the fitting code's).

    Work sent to a scheduler without workers fails only after a timeout, with Dask's own
    message, or waits for one; and a client that has lost its scheduler answers with empty or
    cancelled results. Both are refused here, by name: as a fit or a selection on a cluster
    starts, and where the solver chooses the worker to run on.

    Returns
    -------
    dict
        Each worker's address to its description (``host``, ``nthreads``, ``memory_limit``).

    Raises
    ------
    ClusterError
        The client is not connected to its scheduler, or the scheduler has no worker.
    """
    if client.status != "running":
        # A closed client no longer knows its scheduler's address.
        raise ClusterError(
            f"the Dask client is not connected to its scheduler (its status: {client.status}): "
            "the connection was closed or lost and the work on the cluster stopped; see the "
            "scheduler's log, and fit again once it answers"
        )
    # Not Client.scheduler_info(): it fetches the identity and then returns the client's cached
    # copy, which the client's periodic refresh (every two seconds, totals only) can overwrite
    # without the workers in between (up to half the calls under a 1 ms refresh, measured).
    workers = client.sync(client.scheduler.identity, n_workers=-1)["workers"]
    if not workers:
        where = client.scheduler.address
        raise ClusterError(
            f"the Dask scheduler at {where} has no workers: start some (dask worker {where}), "
            "or name a cluster that has them"
        )
    return workers


def check_versions(client, where: str) -> list[str]:
    """Refuse a cluster whose scheduler or workers run another version of a checked package.

    Returns
    -------
    list of str
        The addresses of the workers checked (none: the scheduler has no worker yet).

    Raises
    ------
    ClusterError
        Naming the package, this process's version and the other's.
    """
    versions = client.get_versions(packages=[p for p in CHECKED_PACKAGES if p != "dask"])
    ours = versions["client"]["packages"]
    others = [("the scheduler", versions["scheduler"])]
    others += [(f"worker {name}", info) for name, info in sorted(versions["workers"].items())]
    for who, info in others:
        theirs = (info or {}).get("packages", {})
        for package in CHECKED_PACKAGES:
            if theirs.get(package) != ours.get(package):
                raise ClusterError(
                    f"version mismatch on {where}: this process runs {package} "
                    f"{ours.get(package)}, {who} runs {package} {theirs.get(package)} "
                    "(install the same pins everywhere: requirements-cluster.lock)"
                )
    return sorted(versions["workers"])


@contextmanager
def in_process_client() -> Iterator[Any]:
    """A client of a cluster of one worker in this process's threads, for the block: how
    sharded data that names no cluster is read, shard by shard."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, processes=False) as local, Client(local) as client:
        yield client
