"""Crash: a server killed with SIGKILL under load, then restarted, answers as before.

Three faults, each against real processes on loopback:

- WORKERS=1: kill -9 the server while 16 keep-alive connections load it, then start a new
  process on the same model directory: ready again, and /classify and /search answer a fixed
  set of queries as before the crash (same versions, scores within float round-off);
- WORKERS=2: kill -9 one worker under load: the supervisor starts a replacement, the other
  worker keeps answering, and the answers are unchanged;
- a process writing the model (``Predictor.save`` over it, in a loop) killed mid-write: the
  model directory still loads, and a server on its repository answers as the original model
  does in process.

Under load only connection errors may appear (requests in flight on the killed process), never
a wrong answer or a 5xx.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from benchmarks.loadgen import LoadResult, http_request, run_load
from service.model import Predictor
from tests.api.conftest import REPO, server_process, worker_pids

pytestmark = pytest.mark.slow

HOST = "127.0.0.1"
CONCURRENCY = 16
LOAD_SECONDS = 4.0
# Load the server for this long before the kill, once every connection is established.
KILL_AFTER_S = 0.5
# Only to turn a hang into a failure: waits for processes and readiness.
WAIT_S = 60.0
SCORE_TOLERANCE = {"rel_tol": 1e-9, "abs_tol": 1e-12}


@pytest.fixture(scope="module")
def queries(digits) -> dict[str, dict]:
    """The fixed queries: eight digits in one /classify batch, and a /search by class."""
    rows = np.unique(digits.y_test, return_index=True)[1][:8]
    instances = [digits.X_test[i].reshape(8, 8).tolist() for i in rows]
    return {
        "/classify": {"instances": instances, "top_k": 3},
        "/search": {"class": "7", "top_k": 5},
    }


def answers(url: str, queries: dict[str, dict]) -> dict[str, dict]:
    """Each query's answer, which must be a 200."""
    got = {}
    for path, body in queries.items():
        response = httpx.post(f"{url}{path}", json=body, timeout=30)
        assert response.status_code == 200, (path, response.text)
        got[path] = response.json()
    return got


def assert_same_answers(got: dict[str, dict], expected: dict[str, dict]) -> None:
    """The same model versions, labels and ranked ids; scores within float64 round-off."""
    classify, reference = got["/classify"], expected["/classify"]
    assert classify["model_version"] == reference["model_version"]
    for prediction, ref in zip(classify["predictions"], reference["predictions"], strict=True):
        assert prediction["label"] == ref["label"]
        assert [c["label"] for c in prediction["top_k"]] == [c["label"] for c in ref["top_k"]]
        for score, ref_score in zip(prediction["top_k"], ref["top_k"], strict=True):
            assert math.isclose(score["score"], ref_score["score"], **SCORE_TOLERANCE)
    if "/search" in expected:
        search, reference = got["/search"], expected["/search"]
        assert search["model_version"] == reference["model_version"]
        assert search["search_version"] == reference["search_version"]
        assert [hit["id"] for hit in search["results"]] == [h["id"] for h in reference["results"]]
        for hit, ref in zip(search["results"], reference["results"], strict=True):
            assert math.isclose(hit["score"], ref["score"], **SCORE_TOLERANCE)


def established_connections(port: int) -> int:
    """TCP connections established to ``port`` on this machine (server side), from
    /proc/net/tcp: local address ``0100007F:<port hex>``, state ``01``."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "01":
            count += 1
    return count


def wait_for(condition, what: str):
    """Poll ``condition`` until it returns something true (returned), or fail after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {WAIT_S:.0f} s waiting for {what}")
        time.sleep(0.05)
    return value


def kill_under_load(port: int, request: bytes, victim: int) -> LoadResult:
    """Load ``port`` with CONCURRENCY connections for LOAD_SECONDS, SIGKILL process ``victim``
    once they are all established and KILL_AFTER_S has passed; the load's result."""
    with ThreadPoolExecutor(1) as pool:
        load = pool.submit(run_load, HOST, port, request, CONCURRENCY, LOAD_SECONDS, 0.0)
        wait_for(lambda: established_connections(port) >= CONCURRENCY, "the load's connections")
        time.sleep(KILL_AFTER_S)
        os.kill(victim, signal.SIGKILL)
        return load.result()


def assert_served_then_only_connection_errors(result: LoadResult, expected: dict) -> None:
    """Answers before the kill were right; the kill cost connections, never a wrong answer."""
    assert len(result.latencies_ns) > 0, "no request completed before the kill"
    assert all(error.startswith("connection: ") for error in result.errors), (
        dict(result.errors),
        result.samples,
    )
    for body in result.answers[0]:
        assert body is not None
        assert_same_answers({"/classify": json.loads(body)}, {"/classify": expected})


def load_request(port: int, queries: dict[str, dict]) -> bytes:
    return http_request(HOST, port, "/classify", json.dumps(queries["/classify"]).encode())


def test_kill_9_under_load_then_a_new_process_serves_the_same_answers(search_model_dir, queries):
    with server_process(search_model_dir, LOG_LEVEL="warning") as first:
        port = httpx.URL(first.url).port
        before = answers(first.url, queries)
        result = kill_under_load(port, load_request(port, queries), first.process.pid)
        assert first.process.wait(timeout=WAIT_S) == -signal.SIGKILL
    assert_served_then_only_connection_errors(result, before["/classify"])
    assert result.errors, "the kill under load failed no connection: did it happen under load?"

    Predictor.load(search_model_dir)  # no half-written state: the artifact loads as it is
    with server_process(search_model_dir, LOG_LEVEL="warning") as second:
        assert httpx.get(f"{second.url}/readyz", timeout=30).status_code == 200
        assert_same_answers(answers(second.url, queries), before)


def test_kill_9_of_one_worker_under_load_is_replaced_and_answers_stay_the_same(
    search_model_dir, queries
):
    with server_process(search_model_dir, WORKERS="2", LOG_LEVEL="warning") as server:
        supervisor = server.process.pid
        port = httpx.URL(server.url).port
        workers = wait_for(
            lambda: len(w := sorted(worker_pids(supervisor))) == 2 and w, "two workers"
        )
        before = answers(server.url, queries)
        victim = workers[0]
        result = kill_under_load(port, load_request(port, queries), victim)
        # The other worker served on meanwhile: not every request after the kill failed.
        assert_served_then_only_connection_errors(result, before["/classify"])

        replaced = wait_for(
            lambda: len(w := worker_pids(supervisor)) == 2 and victim not in w and w,
            "the supervisor to replace the killed worker",
        )
        assert workers[1] in replaced
        assert server.process.poll() is None, server.log()
        # A fresh connection per round: the kernel spreads them over both workers.
        for _ in range(10):
            assert httpx.get(f"{server.url}/readyz", timeout=30).status_code == 200
            assert_same_answers(answers(server.url, queries), before)
        after = run_load(
            HOST, port, load_request(port, queries), CONCURRENCY, count=2_000, timeout=300
        )
        assert_served_then_only_connection_errors(after, before["/classify"])
        assert after.n_errors == 0


# Loads a model and writes it over the target again and again, saying when each write is done.
SAVE_LOOP = """
import sys
from service.model import Predictor
model = Predictor.load(sys.argv[1])
while True:
    model.save(sys.argv[2], overwrite=True)
    print("saved", flush=True)
"""


def test_a_writer_killed_mid_save_leaves_a_model_that_loads_and_answers_the_same(
    digits_model_dir, digits_predictor, tmp_path, queries
):
    repository = tmp_path / "models"
    target = repository / "digits"
    shutil.copytree(digits_model_dir, target)
    writer = subprocess.Popen(
        [sys.executable, "-c", SAVE_LOOP, str(digits_model_dir), str(target)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        saves = [writer.stdout.readline() for _ in range(3)]
        assert saves == ["saved\n"] * 3, saves
        time.sleep(random.uniform(0, 0.05))  # somewhere inside a later write
        writer.kill()
    finally:
        if writer.poll() is None:
            writer.kill()
        writer.wait(timeout=WAIT_S)

    reloaded = Predictor.load(target)  # complete: one whole version or the other, never half
    assert list(reloaded.classes) == list(digits_predictor.classes)
    # A staging directory the killed writer left is hidden (a dot name): the repository serves
    # exactly one model, so /classify still answers for "digits".
    leftovers = [path.name for path in repository.iterdir() if path.name != "digits"]
    assert all(name.startswith(".") for name in leftovers), leftovers
    with server_process(None, MODEL_REPOSITORY=str(repository), LOG_LEVEL="warning") as server:
        served = answers(server.url, {"/classify": queries["/classify"]})["/classify"]
    assert served["model"] == "digits"
    # The same model's answers as the original's, computed in this process.
    instances = np.array(queries["/classify"]["instances"])
    local = digits_predictor.classify(instances, 3)
    for prediction, reference in zip(served["predictions"], local, strict=True):
        assert prediction["label"] == reference.label
        np.testing.assert_allclose(
            [c["score"] for c in prediction["top_k"]], [s for _, s in reference.ranked], rtol=1e-9
        )
