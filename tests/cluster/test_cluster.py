"""Naming a cluster: --cluster and DASK_SCHEDULER_ADDRESS, and the failures a user must see as
one line (exit status 2) within a stated time: no scheduler, other versions."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.cluster.conftest import start_local_cluster
from training.cluster.connection import (
    WORKER_PRELOAD,
    ClusterError,
    check_versions,
    cluster_workers,
    connect,
    parse_cluster,
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_cluster_names_are_parsed_and_the_environment_read_without_the_flag():
    assert parse_cluster("local:3").n_workers == 3
    assert parse_cluster("local:3").is_local
    assert parse_cluster("tcp://scheduler:8786").address == "tcp://scheduler:8786"
    assert parse_cluster(None, environ={}) is None
    from_env = parse_cluster(None, environ={"DASK_SCHEDULER_ADDRESS": "tcp://10.0.0.2:8786"})
    assert from_env.address == "tcp://10.0.0.2:8786"
    for bad in ("local:0", "scheduler", "http://x:8786", "local:two"):
        with pytest.raises(ClusterError, match="--cluster"):
            parse_cluster(bad)


def test_without_a_cluster_nothing_imports_dask():
    code = (
        "import sys, training.cli.main, training.cluster.connection, training.cluster.shards\n"
        "from training.cluster.connection import connect\n"
        "with connect(None) as client: assert client is None\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')]"
    )
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_an_unreachable_scheduler_fails_in_the_stated_time_naming_the_address():
    address = f"tcp://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    expected = rf"no Dask scheduler answered at {address} within 2 s"
    with pytest.raises(ClusterError, match=expected), connect(address, timeout_s=2):
        pass
    assert time.monotonic() - started < 2 + 10


def test_the_command_line_exits_2_with_one_line_for_an_unreachable_scheduler(tmp_path):
    """fit reads DASK_SCHEDULER_ADDRESS without --cluster, as Dask's own tools do."""
    address = f"tcp://127.0.0.1:{_free_port()}"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "training",
            "fit",
            "--similarity",
            "rbf(gamma=1)",
            "--out",
            str(tmp_path / "m"),
        ],
        env=os.environ | {"DASK_SCHEDULER_ADDRESS": address},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("loading")]
    (line,) = [line for line in lines if line.startswith("error:")]
    assert address in line
    assert "within 10 s" in line


def test_a_local_cluster_is_started_and_stopped_with_the_versions_checked(dask_client):
    check_versions(dask_client, "the test cluster")  # the same installation: no error
    with connect("local:1", worker_memory="512MiB") as client:
        (memory,) = [w["memory_limit"] for w in cluster_workers(client).values()]
        assert memory == 512 * 2**20
        # The fitting code was imported as the worker started, before any task of ours.
        (preloaded,) = client.run(lambda: WORKER_PRELOAD in sys.modules).values()
        assert preloaded
        assert client.submit(sum, [1, 2]).result() == 3
        cluster = client.cluster
    assert cluster.status.name == "closed"


def test_a_scheduler_of_another_distributed_version_is_refused_naming_both(tmp_path):
    """A real scheduler whose installation reports distributed 2000.1.0 (a distribution's
    metadata earlier on its path): connecting fails with both versions named."""
    import distributed

    fake = tmp_path / "site" / "distributed-2000.1.0.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: distributed\nVersion: 2000.1.0\n")
    port = _free_port()
    env = os.environ | {"PYTHONPATH": str(tmp_path / "site")}
    scheduler = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distributed.cli.dask_scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-dashboard",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        address = f"tcp://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with connect(address, timeout_s=5):
                    pass
            except ClusterError as error:
                if "no Dask scheduler answered" in str(error) and time.monotonic() < deadline:
                    continue
                message = str(error)
                break
        assert f"this process runs distributed {distributed.__version__}" in message
        assert "the scheduler runs distributed 2000.1.0" in message
    finally:
        scheduler.terminate()
        scheduler.wait(timeout=30)


@pytest.mark.parametrize("selection", [False, True], ids=["fit", "selection"])
def test_a_scheduler_without_workers_is_refused_naming_it_before_work_is_sent(selection):
    """Not Dask's "No valid workers found" after a scatter's timeout, nor a selection's fold
    fits waiting for a worker."""
    from sklearn.datasets import load_iris

    from training import BasisExpandingSVC, ForwardSelectionCV

    X, y = load_iris(return_X_y=True)
    with start_local_cluster(n_workers=0) as empty:
        model = BasisExpandingSVC(basis_per_class=4, cluster=empty.scheduler_address)
        if selection:
            model = ForwardSelectionCV(model, budget=5)
        with pytest.raises(ClusterError, match=f"{empty.scheduler_address} has no workers"):
            model.fit(X, y)


@pytest.mark.timeout(120)
def test_index_on_a_scheduler_without_workers_exits_naming_it_instead_of_waiting(
    search_model_dir, tmp_path, capsys
):
    """``index --cluster`` sent its chunks to a scheduler without workers and waited for one
    forever; every command that connects now waits for a first worker as long as for the
    scheduler's answer, then stops with the fit's message."""
    import shutil

    from training.cli.main import main

    model = tmp_path / "model"
    shutil.copytree(search_model_dir, model)
    with start_local_cluster(n_workers=0) as empty:
        started = time.monotonic()
        argv = ["index", "--model", str(model), "--force", "--quiet"]
        assert main([*argv, "--cluster", empty.scheduler_address]) == 2
        waited = time.monotonic() - started
    assert f"{empty.scheduler_address} has no workers" in capsys.readouterr().err
    assert waited < 60


def test_a_worker_that_joins_while_the_command_connects_is_taken():
    """A scheduler started beside its workers (compose) has none for a moment: the command
    waits for the first, then checks its versions and goes on."""
    import threading

    with start_local_cluster(n_workers=0) as starting:
        joins = threading.Timer(2.0, starting.scale, args=(1,))
        joins.start()
        try:
            with connect(starting.scheduler_address, timeout_s=30) as client:
                workers = cluster_workers(client)
        finally:
            joins.join()
    assert len(workers) == 1


def test_a_client_that_lost_its_scheduler_stops_the_fit_with_a_clear_error(dask_cluster):
    """A ClusterError that says so, not an AttributeError from inside Dask's client."""
    from distributed import Client
    from sklearn.datasets import load_iris

    from training import BasisExpandingSVC

    X, y = load_iris(return_X_y=True)
    client = Client(dask_cluster, set_as_default=False)
    client.close()
    with client.as_current(), pytest.raises(ClusterError, match="status: closed"):
        BasisExpandingSVC(basis_per_class=4).fit(X, y)


def test_the_workers_are_listed_every_time_while_the_client_refreshes_its_cache(dask_cluster):
    """The one-task solver once found no workers (and raised StopIteration) because
    Client.scheduler_info() returned the client's cached identity, which its periodic refresh
    writes without workers: here the refresh runs every millisecond."""
    import dask
    from distributed import Client

    expected = {nanny.worker_address for nanny in dask_cluster.workers.values()}
    with (
        dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}),
        Client(dask_cluster, set_as_default=False) as client,
    ):
        listed = [set(cluster_workers(client)) for _ in range(100)]
    assert len(expected) == 2
    assert all(workers == expected for workers in listed)
