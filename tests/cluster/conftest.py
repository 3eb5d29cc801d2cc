"""A real Dask cluster for the tests: a LocalCluster of two worker processes, ours (Dask calls
distributed.utils_test internal), started once for the session."""

from __future__ import annotations

import pytest

pytest.importorskip("distributed")


def start_local_cluster(**options):
    """Two worker processes of one thread each, no dashboard, quiet logs."""
    import logging

    from distributed import LocalCluster

    settings = {
        "n_workers": 2,
        "threads_per_worker": 1,
        "processes": True,
        "memory_limit": "1GiB",
        "dashboard_address": "127.0.0.1:0",
        "silence_logs": logging.ERROR,
    }
    return LocalCluster(**(settings | options))


@pytest.fixture(scope="session")
def dask_cluster():
    cluster = start_local_cluster()
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def dask_client(dask_cluster):
    """A client that is not entered as a context (nor the default): a fit in a later test must
    not find it and train on the cluster (BasisExpandingSVC uses an enclosing client)."""
    from distributed import Client

    client = Client(dask_cluster, set_as_default=False)
    yield client
    client.close()
