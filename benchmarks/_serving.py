"""Server processes for the benchmarks' HTTP measurements: the real ``python -m service.api``,
or any command configured like it (HOST, PORT, ...), started on a free localhost port."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"


# The process (session) id of each server :func:`serving` runs, by its port.
SESSIONS: dict[int, int] = {}


def session_cpu_seconds(session: int) -> float:
    """CPU seconds (user + system) of the live processes of a session: a server and its
    workers."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # the fields after the command: state, ppid, pgrp, sid
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def service_env(model_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a benchmarked ``python -m service.api``: quiet, no access log."""
    return {"MODEL_DIR": str(model_dir), "ACCESS_LOG": "false", "LOG_LEVEL": "warning", **extra}


@contextlib.contextmanager
def serving(
    command: list[str],
    env: Mapping[str, str],
    ready_path: str = "/readyz",
    ready_timeout: float = 180.0,
) -> Iterator[int]:
    """Run ``command`` with ``env`` (plus HOST and PORT, a free port) until the block ends;
    yields the port once GET ``ready_path`` answers 200.

    The process gets its own session, so uvicorn's worker processes (WORKERS > 1) go with it.
    """
    port = free_port()
    env = {**os.environ, **env, "HOST": HOST, "PORT": str(port)}
    with tempfile.TemporaryFile(mode="w+") as log:
        server = subprocess.Popen(
            command, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            with httpx.Client(base_url=f"http://{HOST}:{port}", timeout=30.0) as client:
                deadline = time.monotonic() + ready_timeout
                while True:
                    if server.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise SystemExit(
                            f"{' '.join(command)} did not become ready "
                            f"(exit code {server.returncode}); its output:\n{log.read()[-3000:]}"
                        )
                    try:
                        if client.get(ready_path).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    time.sleep(0.1)
            SESSIONS[port] = server.pid
            yield port
        finally:
            SESSIONS.pop(port, None)
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            with contextlib.suppress(ProcessLookupError):  # workers left behind, if any
                os.killpg(server.pid, signal.SIGKILL)


@contextlib.contextmanager
def running_server(
    model_dir: Path, ready_timeout: float = 180.0, **env: str
) -> Iterator[httpx.Client]:
    """Serve ``model_dir`` on a free localhost port; yields a keep-alive client once ready.

    Extra keyword arguments are environment variables of the service (e.g. ``WORKERS="2"``).
    """
    with (
        serving(
            [sys.executable, "-m", "service.api"],
            service_env(model_dir, **env),
            ready_timeout=ready_timeout,
        ) as port,
        httpx.Client(base_url=f"http://{HOST}:{port}", timeout=30.0) as client,
    ):
        yield client


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
