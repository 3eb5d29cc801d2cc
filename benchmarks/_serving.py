"""A real ``python -m service.api`` process for the benchmarks' HTTP measurements."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_server(model_dir: Path, ready_timeout: float = 180.0) -> Iterator[httpx.Client]:
    """Serve ``model_dir`` on a free localhost port; yields a keep-alive client once ready."""
    port = _free_port()
    env = {
        **os.environ,
        "MODEL_DIR": str(model_dir),
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "ACCESS_LOG": "false",
        "LOG_LEVEL": "warning",
    }
    with tempfile.TemporaryFile(mode="w+") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "service.api"],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0) as client:
                deadline = time.monotonic() + ready_timeout
                while True:
                    if server.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise SystemExit(
                            "the server did not become ready "
                            f"(exit code {server.returncode}); its output:\n{log.read()[-3000:]}"
                        )
                    try:
                        if client.get("/readyz").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    time.sleep(0.1)
                yield client
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def latencies(call: Callable[[], object], requests: int, warm_up: int = 20) -> np.ndarray:
    """Seconds of ``requests`` sequential calls, after ``warm_up`` untimed ones."""
    for _ in range(warm_up):
        call()
    seconds = np.empty(requests)
    for i in range(requests):
        started = time.perf_counter()
        call()
        seconds[i] = time.perf_counter() - started
    return seconds
