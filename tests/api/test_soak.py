"""Soak (issues 22 and 36): four hostile clients of each kind beside a normal /classify client
and a normal gRPC client (benchmarks/soak.py), against a real server at its default limits
with gRPC and catalogue updates on, with one worker and with two: for :data:`SECONDS` each,
the issue's 15 s in ``make test`` and ``make soak`` (``SOAK_SECONDS=n`` sets any other length).

Every hostile kind has been answered or has sent what gets no answer (but for trickled bodies
and idle connections, which may still be open at the end: their memory and /readyz are what
they test); the normal clients get only answers (REST 200s, its 99th percentile under 0.5 s;
gRPC OKs); no hostile client gets a 5xx other than the 503 of a limit; /readyz answers 200
throughout; and every server process stays under the memory bound
of docs/operating/limits.md (:func:`service.api.machinery.limits.memory_bound`, gRPC's term
included), from its memory once
its models are loaded. And the issue's heavy valid load, with the probes timed beside it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest

from benchmarks.bench_probes import PROBES, measure
from benchmarks.serving import free_port
from benchmarks.soak import KINDS, SoakResult, rss_bytes, soak
from service.api import Settings
from service.api.machinery.limits import memory_bound
from tests.api.conftest import server_process, worker_pids
from tests.api.test_crash import wait_for

pytestmark = pytest.mark.slow

# Long enough for the hostile kinds to be answered dozens of times, for a trickled body to hold
# half its bytes, and for the normal client's 99th percentile to rest on thousands of requests.
SECONDS = float(os.environ.get("SOAK_SECONDS", "15"))
CLIENTS = 4
P99_S = 0.5
ADMIN_TOKEN = "soak-admin-token"
# The digits model's working memory (the bound's ``work`` term): its batches are small.
DIGITS_WORK = 32 * 2**20


@pytest.mark.parametrize("workers", [1, 2])
def test_hostile_clients_beside_a_normal_one(search_model_dir, tmp_path, workers):
    repository = tmp_path / "models"
    shutil.copytree(search_model_dir, repository / "digits")
    # The defaults but for the batch size the test servers use (50: small answers), with gRPC
    # and catalogue updates (issue 36: the memory bound holds with them).
    grpc_port = free_port()
    with server_process(
        MODEL_REPOSITORY=str(repository),
        DEFAULT_MODEL="digits",
        WORKERS=str(workers),
        GRPC_PORT=str(grpc_port),
        ADMIN_TOKEN=ADMIN_TOKEN,
    ) as server:
        supervisor = server.process.pid
        pids = (
            [supervisor]
            if workers == 1
            else wait_for(lambda: len(w := worker_pids(supervisor)) == workers and w, "workers")
        )
        loaded = {pid: rss_bytes(pid) for pid in pids}
        host, port = server.url.removeprefix("http://").split(":")
        result = soak(host, int(port), pids, SECONDS, CLIENTS, grpc_port, ADMIN_TOKEN)
        log = server.log()
    print(result.summary())  # the figures, for -s
    _check(result, loaded, log, grpc_port)


def _check(result: SoakResult, loaded: dict[int, int], log: str, grpc_port: int) -> None:
    summary = result.summary()
    normal = result.normal
    assert not normal.errors, summary
    assert len(normal.latencies_ns) > 100, summary
    assert normal.percentile_ms(99) < P99_S * 1000, summary
    assert result.grpc is not None, summary
    assert not result.grpc.errors, summary
    assert len(result.grpc.latencies_ns) > 100, summary
    # The hostile clients did their work: each kind got answers, or sent what never gets one.
    # A trickled body (10 s to send) may still be under way at the end of a short soak, and an
    # idle connection still open (it is closed at the cap, or HEADER_TIMEOUT_S after it opened):
    # what those test is the memory and /readyz, checked below.
    for kind in set(KINDS) - {"slow-bodies", "idle"}:
        assert sum(result.hostile.get(kind, {}).values()) > 0, (kind, summary)
    for kind, statuses in result.hostile.items():
        server_errors = {s for s in statuses if s.isdigit() and s.startswith("5") and s != "503"}
        assert not server_errors, (kind, summary)
    assert set(result.readiness) == {"200"}, summary
    settings = Settings(_env_file=None, grpc_port=grpc_port)
    for pid, peak in result.peak_rss.items():
        bound = memory_bound(settings, loaded[pid], DIGITS_WORK)
        assert peak <= bound, (pid, peak / 2**20, bound / 2**20, summary)
    assert "Traceback" not in log


def _threads(pid: int) -> dict[int, int]:
    """The nice value of each thread of process ``pid``, by thread id."""
    nice = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            nice[int(tid)] = int(fields[16])
    return nice


def test_probes_under_the_issues_load(digits_model_dir):
    """Issue 36, defect 6: 150 clients each posting 1,000 digits (0.24 MB) to /classify;
    /healthz took up to 3.3 s (p90 186 ms), and an orchestrator kills a pod whose liveness
    probe takes over a second. What this asserts is how the server spends its threads, which
    does not depend on how busy the machine is: bodies decoded on a few threads (they hold
    the interpreter's lock: 128 of them kept the event loop waiting for it), and the work
    threads at a lower priority than the event loop's thread. The probes' times are printed
    (benchmarks/bench_probes.py measures them against another version)."""
    with server_process(digits_model_dir, MAX_BATCH_SIZE="1000") as server:
        pid = server.process.pid
        idle = _threads(pid)
        result = measure(server.port, 150, 1000, SECONDS, 0.05, pid)
        busy = _threads(pid)
    print(result)
    for path in PROBES:
        assert set(result[path]["statuses"]) == {"200"}, result
    assert result["load"]["answers_per_s"] > 0, result
    assert busy[pid] == 0  # the event loop's thread
    lowered = [tid for tid, nice in busy.items() if nice > 0]
    assert lowered, "no work thread runs below the event loop's priority"
    # The decoding threads, the compute thread and numba's: not one thread per request.
    assert len(busy) - len(idle) <= 8, (len(idle), len(busy))
