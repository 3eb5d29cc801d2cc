"""The probe port (PROBE_PORT, :mod:`service.probes`): health probes answered by a process of
their own from the workers' heartbeats, at once whatever the workers are doing (issue 36,
defect 6: under heavy valid load the service port's probes waited seconds behind the work)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.serving import free_port
from service.api import Settings
from service.probes import Heartbeat, judge, read_beats
from tests.api.conftest import REPO, refused_start, server_process, worker_pids

# -- the heartbeats and what they say ------------------------------------------------------------


def test_a_server_whose_workers_have_not_beaten_is_starting(tmp_path):
    assert judge("/healthz", read_beats(tmp_path), 10.0) == (
        200,
        {"status": "ok", "detail": "starting"},
    )
    status, body = judge("/readyz", read_beats(tmp_path), 10.0)
    assert status == 503
    assert "starting" in body["detail"]
    heartbeat = Heartbeat(tmp_path)  # created, not beaten yet: still starting
    assert read_beats(tmp_path) == []
    heartbeat.close()


def test_ready_as_the_worker_says_and_never_once_draining(tmp_path):
    heartbeat = Heartbeat(tmp_path)
    heartbeat.beat(False)
    [beat] = read_beats(tmp_path)
    assert beat.pid == os.getpid()
    assert not beat.ready
    status, body = judge("/v2/health/ready", [beat], 10.0)
    assert status == 503
    assert str(os.getpid()) in body["detail"]
    assert judge("/v2/health/live", [beat], 10.0)[0] == 200
    heartbeat.beat(True)
    assert judge("/readyz", read_beats(tmp_path), 10.0) == (
        200,
        {"status": "ready", "detail": None},
    )
    heartbeat.drain()
    heartbeat.beat(True)
    assert judge("/readyz", read_beats(tmp_path), 10.0)[0] == 503
    heartbeat.close()
    assert list(tmp_path.iterdir()) == []


def test_a_stale_heartbeat_is_neither_live_nor_ready(tmp_path):
    heartbeat = Heartbeat(tmp_path)
    heartbeat.beat(True)
    time.sleep(0.3)
    beats = read_beats(tmp_path)
    assert beats[0].age_s >= 0.3
    for path in ("/healthz", "/readyz"):
        status, body = judge(path, beats, 0.1)
        assert status == 503
        assert "PROBE_STALE_S" in body["detail"], body
    assert judge("/healthz", beats, 5.0)[0] == 200
    assert judge("/metrics", beats, 5.0)[0] == 404
    heartbeat.close()


def test_the_file_of_a_worker_that_died_is_dropped(tmp_path):
    # A worker that beat ready, then died without removing its file (SIGKILL, a crash).
    code = (
        "import os, sys; from service.probes import Heartbeat; "
        "Heartbeat(sys.argv[1]).beat(True); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, check=True)
    assert len(list(tmp_path.glob("*.beat"))) == 1
    assert read_beats(tmp_path) == []
    assert list(tmp_path.glob("*.beat")) == []


def test_the_probe_port_differs_from_the_others():
    with pytest.raises(ValueError, match="PROBE_PORT must differ"):
        Settings(_env_file=None, port=8000, probe_port=8000)
    with pytest.raises(ValueError, match="PROBE_PORT must differ"):
        Settings(_env_file=None, grpc_port=8081, probe_port=8081)


def test_a_probe_port_in_use_stops_the_start(digits_model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        run = refused_start(digits_model_dir, PROBE_PORT=str(port))
    assert f"cannot start: PROBE_PORT 127.0.0.1:{port}" in run.stderr, run.stderr


# -- a real server ---------------------------------------------------------------------------------


def _get(port: int, path: str, timeout: float = 2.0) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=timeout)


def _until(condition, seconds: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds:g} s: {what}")
        time.sleep(0.1)


def _status(port: int, path: str) -> int | None:
    try:
        return _get(port, path).status_code
    except httpx.HTTPError:
        return None


@pytest.mark.slow
def test_the_probe_port_answers_for_a_stopped_event_loop_until_it_is_stale(digits_model_dir):
    """SIGSTOP freezes the server as a loop starved of the interpreter's lock would be: the
    service port's probe waits, the probe port answers at once, live until PROBE_STALE_S has
    passed, then 503 (stuck, not busy); SIGCONT and it is ready again."""
    probe_port = free_port()
    with server_process(digits_model_dir, PROBE_PORT=str(probe_port), PROBE_STALE_S="2") as server:
        _until(lambda: _status(probe_port, "/readyz") == 200, what="probe port ready")
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            with pytest.raises(httpx.TimeoutException):
                httpx.get(f"{server.url}/healthz", timeout=0.5)
            started = time.perf_counter()
            live = _get(probe_port, "/healthz")
            took = time.perf_counter() - started
            if time.monotonic() - stopped < 1.5:  # (a slow machine may take longer to get here)
                assert live.status_code == 200, live.text
                assert took < 1.0
            time.sleep(max(0.0, stopped + 2.5 - time.monotonic()))
            for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"):
                answer = _get(probe_port, path)
                assert answer.status_code == 503, (path, answer.text)
                assert str(server.process.pid) in answer.json()["detail"]
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        _until(lambda: _status(probe_port, "/readyz") == 200, 10, "ready again after SIGCONT")
        assert _get(probe_port, "/healthz").json() == {"status": "ok", "detail": None}
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(60) == 0
    # The probe process went with the server.
    assert _status(probe_port, "/healthz") is None


@pytest.mark.slow
def test_unfinished_requests_never_lock_a_prober_out(digits_model_dir):
    """Sockets that send half a request line hold the probe port's slots only until a new
    connection needs one: the oldest unfinished one is closed."""
    probe_port = free_port()
    with server_process(digits_model_dir, PROBE_PORT=str(probe_port)):
        _until(lambda: _status(probe_port, "/readyz") == 200, what="probe port ready")
        hostile = []
        try:
            for _ in range(400):
                sock = socket.create_connection(("127.0.0.1", probe_port), timeout=5)
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHo")
                hostile.append(sock)
            for _ in range(5):
                assert _get(probe_port, "/healthz", timeout=1.0).status_code == 200
            assert _get(probe_port, "/readyz", timeout=1.0).status_code == 200
            head = _get(probe_port, "/readyz").headers
            assert head["content-type"] == "application/json"
            assert httpx.post(f"http://127.0.0.1:{probe_port}/readyz").status_code == 405
        finally:
            for sock in hostile:
                sock.close()


@pytest.mark.slow
def test_every_worker_beats(digits_model_dir):
    """With WORKERS=2 both workers write heartbeats, and one that stops makes the server not
    live on the probe port, naming it."""
    probe_port = free_port()
    with server_process(
        digits_model_dir, WORKERS="2", PROBE_PORT=str(probe_port), PROBE_STALE_S="2"
    ) as server:
        _until(lambda: _status(probe_port, "/readyz") == 200, 60, "probe port ready")
        workers = worker_pids(server.process.pid)
        assert len(workers) == 2, workers
        directory = Path(tempfile.gettempdir())
        beats = [p for p in directory.glob("besvm-probes-*/*.beat") if int(p.stem) in workers]
        assert sorted(int(p.stem) for p in beats) == sorted(workers)
        os.kill(workers[0], signal.SIGSTOP)
        try:
            time.sleep(2.5)
            answer = _get(probe_port, "/healthz")
            assert answer.status_code == 503
            assert str(workers[0]) in answer.json()["detail"]
        finally:
            os.kill(workers[0], signal.SIGCONT)
        _until(lambda: _status(probe_port, "/healthz") == 200, 10, "live again after SIGCONT")
