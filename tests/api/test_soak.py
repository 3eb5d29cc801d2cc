"""Soak (issue 22): four hostile clients of each kind of the issue beside a normal /classify
client (benchmarks/soak.py), against a real server at its default limits, with one worker and
with two: for :data:`SECONDS` each, the issue's 15 s in ``make test`` and ``make soak``
(``SOAK_SECONDS=n`` sets any other length).

Every hostile kind has been answered or has sent what gets no answer (but for trickled bodies
and idle connections, which may still be open at the end: their memory and /readyz are what
they test); the normal client gets only 200s, its 99th percentile under 0.5 s; no hostile client
gets a 5xx other than the 503 of a limit; /readyz answers 200 throughout; and every server process
stays
under the memory bound of docs/operating/limits.md
(:func:`service.api.machinery.limits.memory_bound`), from its memory once its models are loaded.
"""

from __future__ import annotations

import os
import shutil

import pytest

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
# The digits model's working memory (the bound's ``work`` term): its batches are small.
DIGITS_WORK = 32 * 2**20


@pytest.mark.parametrize("workers", [1, 2])
def test_hostile_clients_beside_a_normal_one(search_model_dir, tmp_path, workers):
    repository = tmp_path / "models"
    shutil.copytree(search_model_dir, repository / "digits")
    # The defaults but for the batch size the test servers use (50: small answers).
    with server_process(
        MODEL_REPOSITORY=str(repository), DEFAULT_MODEL="digits", WORKERS=str(workers)
    ) as server:
        supervisor = server.process.pid
        pids = (
            [supervisor]
            if workers == 1
            else wait_for(lambda: len(w := worker_pids(supervisor)) == workers and w, "workers")
        )
        loaded = {pid: rss_bytes(pid) for pid in pids}
        host, port = server.url.removeprefix("http://").split(":")
        result = soak(host, int(port), pids, SECONDS, CLIENTS)
        log = server.log()
    print(result.summary())  # the figures, for -s
    _check(result, loaded, log)


def _check(result: SoakResult, loaded: dict[int, int], log: str) -> None:
    summary = result.summary()
    normal = result.normal
    assert not normal.errors, summary
    assert len(normal.latencies_ns) > 100, summary
    assert normal.percentile_ms(99) < P99_S * 1000, summary
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
    settings = Settings(_env_file=None)
    for pid, peak in result.peak_rss.items():
        bound = memory_bound(settings, loaded[pid], DIGITS_WORK)
        assert peak <= bound, (pid, peak / 2**20, bound / 2**20, summary)
    assert "Traceback" not in log
