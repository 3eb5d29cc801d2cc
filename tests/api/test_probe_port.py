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

from benchmarks.serving import child_pids, free_port
from service.api import Settings
from service.probes import Beat, Heartbeat, ProbeListener, judge, read_beats
from tests.api.conftest import REPO, refused_start, server_process, worker_pids

# -- the heartbeats and what they say ------------------------------------------------------------


def test_a_server_whose_workers_have_not_beaten_is_starting(tmp_path):
    assert judge("/healthz", read_beats(tmp_path), 10.0) == (
        200,
        {"status": "ok", "detail": "starting"},
    )
    status, body = judge("/readyz", read_beats(tmp_path), 10.0)
    assert status == 503
    assert body["detail"] == "starting"
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


def test_a_worker_still_loading_beside_a_ready_one_keeps_the_server_ready():
    """A worker replacing one that died loads its models while the other serves: uvicorn gives
    it no connection before its lifespan has run, so the server stays ready."""
    beats = [Beat(1, 0.1, True), Beat(2, 0.1, False)]
    assert judge("/readyz", beats, 10.0)[0] == 200
    assert judge("/readyz", [Beat(1, 0.1, True), Beat(2, 11.0, True)], 10.0)[0] == 503


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


def test_once_workers_have_beaten_none_for_long_is_not_live():
    """Every worker gone (crash-looping, or the heartbeats removed) is not a server starting."""
    assert judge("/healthz", [], 10.0, silent_s=3.0) == (200, {"status": "ok", "detail": None})
    assert judge("/readyz", [], 10.0, silent_s=3.0)[1]["detail"] == "no worker is running"
    status, body = judge("/healthz", [], 10.0, silent_s=11.0)
    assert status == 503
    assert "no worker has written a heartbeat for 11 s" in body["detail"]


def _beat_and_exit(directory: Path) -> subprocess.Popen:
    """A process that writes a ready heartbeat into ``directory`` and ends without removing it
    (as SIGKILL or a crash would leave it), not yet reaped: a zombie."""
    code = (
        "import os, sys; from service.probes import Heartbeat; "
        "Heartbeat(sys.argv[1]).beat(True); os._exit(0)"
    )
    process = subprocess.Popen([sys.executable, "-c", code, str(directory)], cwd=REPO)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the process did not end"
        time.sleep(0.05)
    return process


def test_the_file_of_a_worker_that_died_is_dropped(tmp_path):
    zombie = _beat_and_exit(tmp_path)
    assert len(list(tmp_path.glob("*.beat"))) == 1
    assert read_beats(tmp_path) == []  # its pid still exists (a zombie), its process does not
    assert list(tmp_path.glob("*.beat")) == []
    zombie.wait()
    (tmp_path / "notes.beat").write_bytes(b"\0" * 8)  # not a worker's: ignored
    assert read_beats(tmp_path) == []


def test_what_is_not_an_http_request_gets_400(tmp_path):
    listener = ProbeListener(tmp_path, 10.0)
    assert listener.answer(b"HELLO\r\n").startswith(b"HTTP/1.1 400 ")
    assert listener.answer(b"GET /healthz SPDY/3\r\n").startswith(b"HTTP/1.1 400 ")
    assert listener.answer(b"DELETE /healthz HTTP/1.1\r\n").startswith(b"HTTP/1.1 405 ")
    assert listener.answer(b"GET /healthz?verbose=1 HTTP/1.0\n").startswith(b"HTTP/1.1 200 ")


def test_the_probe_port_differs_from_the_others_and_staleness_spans_beats():
    with pytest.raises(ValueError, match="PROBE_PORT must differ"):
        Settings(_env_file=None, port=8000, probe_port=8000)
    with pytest.raises(ValueError, match="PROBE_PORT must differ"):
        Settings(_env_file=None, grpc_port=8081, probe_port=8081)
    with pytest.raises(ValueError, match="probe_stale_s"):
        Settings(_env_file=None, probe_stale_s=0.2)


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


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def _probe_pid(server_pid: int) -> int:
    pids = child_pids(server_pid, b"service.probes")
    assert len(pids) == 1, pids
    return pids[0]


def _heartbeat_dirs() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("besvm-probes-*"))


@pytest.mark.slow
def test_the_probe_port_answers_for_a_stopped_event_loop_until_it_is_stale(digits_model_dir):
    """SIGSTOP freezes the server as a loop starved of the interpreter's lock would be: the
    service port's probe waits, the probe port answers at once, live until PROBE_STALE_S has
    passed, then 503 (stuck, not busy); SIGCONT and it is ready again."""
    probe_port = free_port()
    with server_process(digits_model_dir, PROBE_PORT=str(probe_port), PROBE_STALE_S="3") as server:
        _until(lambda: _status(probe_port, "/readyz") == 200, what="probe port ready")
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            started = time.perf_counter()
            live, ready = _get(probe_port, "/healthz"), _get(probe_port, "/readyz")
            assert time.perf_counter() - started < 2.0
            assert (live.status_code, ready.status_code) == (200, 200), (live.text, ready.text)
            with pytest.raises(httpx.TimeoutException):
                httpx.get(f"{server.url}/healthz", timeout=0.5)
            time.sleep(max(0.0, stopped + 3.5 - time.monotonic()))
            for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"):
                answer = _get(probe_port, path)
                assert answer.status_code == 503, (path, answer.text)
                assert str(server.process.pid) in answer.json()["detail"]
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        _until(lambda: _status(probe_port, "/readyz") == 200, 10, "ready again after SIGCONT")
        assert _get(probe_port, "/healthz").json() == {"status": "ok", "detail": None}


@pytest.mark.slow
def test_a_drain_is_not_ready_and_the_probe_process_goes_with_the_server(digits_model_dir):
    """From SIGTERM on, while a request is still under way, the probe port says not ready;
    once the server has exited the port is closed and the heartbeats are gone."""
    probe_port = free_port()
    before = _heartbeat_dirs()
    with server_process(digits_model_dir, PROBE_PORT=str(probe_port)) as server:
        _until(lambda: _status(probe_port, "/readyz") == 200, what="probe port ready")
        [directory] = _heartbeat_dirs() - before
        host, port = server.url.removeprefix("http://").split(":")
        held = socket.create_connection((host, int(port)), timeout=30)
        held.sendall(
            b"POST /classify HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: 20\r\n\r\n"
        )
        assert held.recv(1024).startswith(b"HTTP/1.1 100 ")  # the request is under way
        server.process.send_signal(signal.SIGTERM)
        _until(lambda: _status(probe_port, "/readyz") == 503, 10, "not ready in the drain")
        assert _get(probe_port, "/healthz").status_code == 200  # draining is alive
        held.sendall(b'{"instances": [[0]]}')
        assert held.recv(1024).startswith(b"HTTP/1.1 ")  # answered (a 422: one number)
        held.close()
        assert server.process.wait(60) == 0
    assert _status(probe_port, "/healthz") is None
    assert not directory.exists()


@pytest.mark.slow
def test_the_probe_process_is_started_again_and_cleans_up_after_a_killed_server(
    digits_model_dir,
):
    probe_port = free_port()
    before = _heartbeat_dirs()
    with server_process(digits_model_dir, PROBE_PORT=str(probe_port)) as server:
        _until(lambda: _status(probe_port, "/readyz") == 200, what="probe port ready")
        [directory] = _heartbeat_dirs() - before
        first = _probe_pid(server.process.pid)
        os.kill(first, signal.SIGKILL)
        _until(lambda: _status(probe_port, "/readyz") == 200, 15, "a new probe process")
        assert _probe_pid(server.process.pid) != first
        assert "starting it again" in server.log()
        second = _probe_pid(server.process.pid)
        server.process.kill()  # no drain, nothing removed by the server
        server.process.wait(10)
        _until(lambda: not directory.exists(), 10, "the heartbeat directory removed")
        _until(lambda: not Path(f"/proc/{second}").exists(), 10, "the probe process gone")


@pytest.mark.slow
def test_odd_and_unfinished_requests_never_lock_a_prober_out(digits_model_dir):
    """Sockets that send half a request line hold the probe port's slots only until a new
    connection needs one: the oldest unfinished one is closed. Heads ended by bare LFs are
    read, HEAD is answered without a body, an oversized head gets 431."""
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
        finally:
            for sock in hostile:
                sock.close()
        lf = _raw(probe_port, b"GET /readyz HTTP/1.1\nHost: p\n\n")
        assert lf.startswith(b"HTTP/1.1 200 ")
        head = _raw(probe_port, b"HEAD /readyz HTTP/1.1\r\nHost: p\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert head.endswith(b"\r\n\r\n")  # no body
        assert b"content-type: application/json" in head
        large = _raw(probe_port, b"GET /readyz HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n")
        assert large.startswith(b"HTTP/1.1 431 ")
        assert httpx.post(f"http://127.0.0.1:{probe_port}/readyz").status_code == 405


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
        _until(
            lambda: (
                {int(p.stem) for p in Path(tempfile.gettempdir()).glob("besvm-probes-*/*.beat")}
                >= set(workers)
            ),
            30,
            "both workers beating",
        )
        os.kill(workers[0], signal.SIGSTOP)
        try:
            time.sleep(2.5)
            answer = _get(probe_port, "/healthz")
            assert answer.status_code == 503
            assert str(workers[0]) in answer.json()["detail"]
        finally:
            os.kill(workers[0], signal.SIGCONT)
        _until(lambda: _status(probe_port, "/healthz") == 200, 10, "live again after SIGCONT")
