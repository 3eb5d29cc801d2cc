"""SIGTERM drains a real server process: requests in flight complete, new connections are
refused, then the process exits with status 0 (docs/operating/limits.md, "Shutdown")."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import httpx
import numpy as np
import pytest

from tests.api.conftest import server_process

pytestmark = pytest.mark.slow

BOUND_S = 30.0
IN_FLIGHT = 6


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _wait_all_workers_ready(url: str) -> None:
    """Every worker answers /readyz 200 (each new connection may reach another worker)."""
    deadline = time.monotonic() + 60
    in_a_row = 0
    while in_a_row < 20:
        if time.monotonic() > deadline:
            pytest.fail("the workers did not all become ready within 60 s")
        ok = httpx.get(f"{url}/readyz", timeout=5).status_code == 200
        in_a_row = in_a_row + 1 if ok else 0
        if not ok:
            time.sleep(0.2)


def _start_request(url: str, body: bytes) -> socket.socket:
    """A request the app has started: it asked for the body (100 Continue), which is held back."""
    sock = socket.create_connection(_address(url), timeout=BOUND_S)
    sock.sendall(
        b"POST /classify HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Expect: 100-continue\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(1024)
        assert chunk, "the server closed the connection before asking for the body"
        received += chunk
    assert received.startswith(b"HTTP/1.1 100 "), received
    return sock


def _finish_request(sock: socket.socket, body: bytes) -> tuple[int, dict]:
    sock.sendall(body)
    received = b""
    with sock:
        while chunk := sock.recv(65536):
            received += chunk
    head, _, payload = received.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(payload)


def _refused(url: str) -> bool:
    try:
        socket.create_connection(_address(url), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_completes_requests_in_flight_and_refuses_new_ones(digits_model_dir, workers):
    instances = np.random.default_rng(0).uniform(0, 16, (20, 8, 8)).tolist()
    body = json.dumps({"instances": instances, "top_k": 1}).encode()
    with server_process(digits_model_dir, WORKERS=str(workers)) as server:
        _wait_all_workers_ready(server.url)
        in_flight = [_start_request(server.url, body) for _ in range(IN_FLIGHT)]

        # A burst of ordinary requests, each on a new connection, around the signal.
        outcomes: list[object] = []
        stop = threading.Event()

        def burst() -> None:
            while not stop.is_set():
                try:
                    response = httpx.post(f"{server.url}/classify", content=body, timeout=BOUND_S)
                    outcomes.append(response.status_code)
                except httpx.ConnectError:
                    outcomes.append("refused")
                except httpx.RemoteProtocolError as error:
                    # Reset in the listening queue as the socket closed: never accepted, so no
                    # response begun (a response cut short would read otherwise).
                    unanswered = "without sending a response" in str(error)
                    outcomes.append("not accepted" if unanswered else repr(error))
                except httpx.ReadError:
                    outcomes.append("not accepted")

        threads = [threading.Thread(target=burst) for _ in range(4)]
        for thread in threads:
            thread.start()
        while len(outcomes) < 8:
            time.sleep(0.05)
        server.process.send_signal(signal.SIGTERM)

        # New connections are refused while the requests in flight still wait for their bodies.
        deadline = time.monotonic() + BOUND_S
        while not _refused(server.url):
            assert time.monotonic() < deadline, "connections still accepted after SIGTERM"
            time.sleep(0.05)
        assert server.process.poll() is None, "exited before the requests in flight ended"

        for sock in in_flight:
            status, payload = _finish_request(sock, body)
            assert status == 200, payload
            assert len(payload["predictions"]) == len(instances)

        stop.set()
        for thread in threads:
            thread.join(BOUND_S)
        assert server.process.wait(timeout=BOUND_S) == 0, server.log()
        # Every request the server took was answered 200: none failed, none was cut short.
        assert all(outcome in (200, "refused", "not accepted") for outcome in outcomes), outcomes
        assert outcomes.count(200) >= 8
