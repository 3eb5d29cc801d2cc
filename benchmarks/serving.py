"""Server processes for the benchmarks' HTTP measurements and the API tests: the real
``python -m service.api``, or any command configured like it (HOST, PORT, ...), started on a
free localhost port."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import typing
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


def child_pids(parent: int, command_part: bytes) -> list[int]:
    """Processes whose parent is ``parent`` and whose command line holds ``command_part``
    (Linux's /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and command_part in command:
            pids.append(int(entry.name))
    return pids


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def service_env(model_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a benchmarked ``python -m service.api``: quiet, no access log."""
    return {"MODEL_DIR": str(model_dir), "ACCESS_LOG": "false", "LOG_LEVEL": "warning", **extra}


class ServerNotReady(RuntimeError):
    """The server exited, or did not answer its readiness probe in time; the message holds the
    end of its output."""


@dataclasses.dataclass
class ServerProcess:
    """A server process started by :func:`server_process`, and its log so far."""

    process: subprocess.Popen
    port: int
    log_file: typing.IO[str]
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.port}"

    def log(self) -> str:
        self.log_file.flush()
        self.log_file.seek(0)
        return self.log_file.read()

    def stop(self, timeout: float = 30) -> str:
        """Stop the server (SIGTERM: it drains) and return its whole log: lines written after
        an answer was sent, such as its access line, are in it only then."""
        self.process.terminate()
        self.process.wait(timeout=timeout)
        return self.log()


@contextlib.contextmanager
def server_process(
    command: list[str],
    env: Mapping[str, str],
    *,
    ready_path: str = "/readyz",
    ready_timeout: float = 180.0,
    new_session: bool = True,
    probe: Mapping[str, typing.Any] | None = None,
    cwd: Path = REPO,
) -> Iterator[ServerProcess]:
    """Run ``command`` with ``env`` (plus HOST and PORT, a free port) until the block ends;
    yields the process once GET ``ready_path`` answers 200.

    The command runs in ``cwd`` (default: this checkout). With ``TLS_CERT_FILE`` in ``env`` the
    server speaks https, and ``probe`` holds the httpx options (``verify``, ``cert``) that its
    readiness is polled with.

    The log goes to a file, not a pipe nobody reads: a chatty server must never block on it.
    With ``new_session`` the process gets its own session, so that uvicorn's worker processes
    (WORKERS > 1) go with it at the end.

    Raises
    ------
    ServerNotReady
    """
    port = free_port()
    env = {**env, "HOST": HOST, "PORT": str(port)}
    with tempfile.TemporaryFile(mode="w+") as log:
        process = subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=new_session,
        )
        scheme = "https" if env.get("TLS_CERT_FILE") else "http"
        server = ServerProcess(process, port, log, scheme)
        try:
            _wait_until_ready(server, command, ready_path, ready_timeout, probe or {})
            yield server
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if new_session:
                with contextlib.suppress(ProcessLookupError):  # workers left behind, if any
                    os.killpg(process.pid, signal.SIGKILL)


def _wait_until_ready(
    server: ServerProcess,
    command: list[str],
    ready_path: str,
    timeout: float,
    probe: Mapping[str, typing.Any],
) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=server.url, timeout=1.0, **probe) as client:
        while True:
            if server.process.poll() is not None or time.monotonic() > deadline:
                state = (
                    f"exited with code {server.process.returncode}"
                    if server.process.poll() is not None
                    else f"not ready within {timeout:g} s"
                )
                raise ServerNotReady(
                    f"{' '.join(command)} {state}; its output:\n{server.log()[-3000:]}"
                )
            try:
                if client.get(ready_path).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)


@contextlib.contextmanager
def serving(
    command: list[str],
    env: Mapping[str, str],
    ready_path: str = "/readyz",
    ready_timeout: float = 180.0,
) -> Iterator[int]:
    """As :func:`server_process` with this process's environment under ``env``; yields the
    port, and exits with the server's output if it never becomes ready."""
    try:
        with server_process(
            command, {**os.environ, **env}, ready_path=ready_path, ready_timeout=ready_timeout
        ) as server:
            SESSIONS[server.port] = server.process.pid  # its own session: sid == pid
            try:
                yield server.port
            finally:
                SESSIONS.pop(server.port, None)
    except ServerNotReady as error:
        raise SystemExit(str(error)) from None


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
