"""One way to name a Dask cluster, for the commands that do heavy work.

``--cluster local:N`` starts a ``LocalCluster`` of N worker processes for the command and stops
it afterwards; ``--cluster tcp://host:8786`` (or ``DASK_SCHEDULER_ADDRESS``) connects to a
scheduler that is already running. Without either, commands run in this process, and nothing
imports Dask: this module imports it only inside :func:`connect`.

The API is three names (the ones issue 20's fuller module offers; this is the part ``index
--cluster`` needs)::

    from training.cluster import ClusterError, add_cluster_argument, connect

    add_cluster_argument(parser)             # --cluster, with its help text
    with connect(args.cluster) as client:    # None: no cluster (client is None)
        ...                                  # client: a distributed.Client
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# How long connecting to a scheduler (and its first answer) may take before the command gives up.
CONNECT_TIMEOUT_S = 10.0
# The environment variable Dask's own tools read for the scheduler's address.
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"

_LOCAL = re.compile(r"^local(?::(\d+))?$")
_REMOTE = re.compile(r"^(tcp|tls|inproc|ucx)://[^\s/]+$")


class ClusterError(RuntimeError):
    """The cluster cannot be used: the message is one line for the user (exit status 2)."""


@dataclass(frozen=True)
class ClusterSpec:
    """A parsed ``--cluster`` value: a scheduler's address, or None and the worker processes of
    a local cluster."""

    address: str | None
    n_workers: int = 0

    @property
    def is_local(self) -> bool:
        return self.address is None

    def __str__(self) -> str:
        return f"local:{self.n_workers}" if self.is_local else str(self.address)


def parse_cluster(value: str | None, environ: dict[str, str] | None = None) -> ClusterSpec | None:
    """The cluster named by ``--cluster`` (or, without it, ``DASK_SCHEDULER_ADDRESS``); None: no
    cluster.

    Raises
    ------
    ClusterError
        A value that names no cluster.
    """
    if value is None:
        value = (os.environ if environ is None else environ).get(SCHEDULER_ENV) or None
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
    """Add ``--cluster`` to an argparse parser (or argument group)."""
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="local:N|tcp://HOST:PORT",
        help="run the heavy work on a Dask cluster: local:N starts N worker processes on this "
        "machine for this command, tcp://host:8786 uses a running scheduler (its workers must "
        f"read the same files); default: the address in {SCHEDULER_ENV} if set, else no "
        "cluster (this process only)",
    )


@contextmanager
def connect(
    cluster: str | ClusterSpec | None, *, timeout_s: float = CONNECT_TIMEOUT_S
) -> Iterator[Any]:
    """A ``distributed.Client`` on the cluster named, for the ``with`` block (None: no cluster).

    A local cluster is started here (one thread per worker) and closed at the end of the block;
    a remote one is only disconnected from.

    Raises
    ------
    ClusterError
        Dask is not installed, the scheduler does not answer within ``timeout_s``, or it or a
        worker runs other versions of dask and distributed.
    """
    spec = cluster if isinstance(cluster, ClusterSpec) else parse_cluster(cluster)
    if spec is None:
        yield None
        return
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ClusterError(
            "--cluster needs dask and distributed: install the cluster extra"
        ) from None
    local = None
    try:
        if spec.is_local:
            local = LocalCluster(
                n_workers=spec.n_workers, threads_per_worker=1, processes=True,
                dashboard_address=None,
            )  # fmt: skip
            address = local.scheduler_address
        else:
            address = spec.address
        try:
            client = Client(address, timeout=timeout_s)
        except OSError as error:
            raise ClusterError(f"no Dask scheduler answers at {address}: {error}") from None
        try:
            try:
                client.get_versions(check=True)
            except ValueError as error:
                raise ClusterError(
                    f"the cluster at {address} runs other versions: {error}"
                ) from None
            yield client
        finally:
            client.close()
    finally:
        if local is not None:
            local.close()
