"""Health probes answered by a process of their own, on ``PROBE_PORT``.

A worker's event loop shares the interpreter's lock with its decoding and work threads: under
heavy valid load it gets the lock only between them, and a probe on the service's port waits
behind that work (issue 36: p99 above half a second with 150 clients posting 1,000 digits each,
on a machine whose cores the server had to itself). An orchestrator kills a pod whose liveness
probe takes over a second. This process holds no model, decodes no request and shares no lock
with the workers: it answers from the *heartbeats* the workers write.

The heartbeat
    Each worker's event loop writes, every :data:`BEAT_S`, one float64 into a file of its own,
    ``<directory>/<pid>.beat``: the ``CLOCK_MONOTONIC`` time of the beat, negated while the
    worker is not ready (models loading, draining). A worker whose loop cannot write for
    ``PROBE_STALE_S`` is stuck, not busy: its heartbeat is *stale*.

The answers
    live (``/healthz``, ``/v2/health/live``)
        every worker's heartbeat is fresh; a server none of whose workers has written one yet is
        starting, and live (its start is bounded by the supervisor's health check and the
        orchestrator's start-up probe).
    ready (``/readyz``, ``/v2/health/ready``)
        at least one worker has written one, and every worker's is fresh and ready.

A worker's file is removed as it stops; the file of a worker that died (a pid that no longer
exists) is removed when a probe reads it.

This module imports nothing of the service (and nothing beyond the standard library): the probe
process starts in a fraction of a second and holds a few MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import mmap
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("service.probes")

# The variable through which a server's workers learn where to write their heartbeats.
HEARTBEAT_DIR_ENV = "PROBE_HEARTBEAT_DIR"

# Seconds between a worker's beats: well under any staleness worth declaring.
BEAT_S = 0.25

# One float64, little-endian, at offset 0 of the file: an aligned 8-byte store, which a reader
# never sees half written.
_BEAT = struct.Struct("<d")

LIVE_PATHS = frozenset({"/healthz", "/v2/health/live"})
READY_PATHS = frozenset({"/readyz", "/v2/health/ready"})

# The probe listener's own limits: a request head of at most MAX_HEAD_BYTES, within
# HEAD_TIMEOUT_S, and at most MAX_CONNECTIONS at once, the oldest unfinished one closed to
# admit a new one (a prober that sends its request at once is never locked out by sockets that
# do not).
MAX_HEAD_BYTES = 8192
HEAD_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 256

# How often the probe process checks that the server that started it still runs.
PARENT_CHECK_S = 1.0


class Heartbeat:
    """A worker's heartbeat file: :meth:`beat` writes it, :meth:`close` removes it.

    Parameters
    ----------
    directory : path
        The server's heartbeat directory (:func:`heartbeat_directory`).
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = Path(directory) / f"{os.getpid()}.beat"
        with open(self.path, "w+b") as file:
            file.write(_BEAT.pack(0.0))
            file.flush()
            self._map = mmap.mmap(file.fileno(), _BEAT.size)
        self.draining = False

    def beat(self, ready: bool) -> None:
        """Say "alive now", and whether ready (never once :attr:`draining`)."""
        now = time.monotonic()
        _BEAT.pack_into(self._map, 0, now if ready and not self.draining else -now)

    def drain(self) -> None:
        """From now on, not ready: the process stops taking requests."""
        self.draining = True
        self.beat(False)

    def close(self) -> None:
        self._map.close()
        self.path.unlink(missing_ok=True)

    async def run(self, readiness) -> None:
        """Beat every :data:`BEAT_S` on the running loop, ready as ``readiness()`` says, until
        cancelled (then the file is removed)."""
        try:
            while True:
                self.beat(readiness())
                await asyncio.sleep(BEAT_S)
        finally:
            self.close()


@dataclass(frozen=True)
class Beat:
    """What one worker's heartbeat says at a moment."""

    pid: int
    age_s: float  # since the last beat
    ready: bool

    def fresh(self, stale_s: float) -> bool:
        return self.age_s <= stale_s


def read_beats(directory: str | os.PathLike) -> list[Beat]:
    """The heartbeats in ``directory``, by worker (a worker that has not beaten yet, and one
    whose process is gone, left out; the latter's file removed)."""
    beats = []
    now = time.monotonic()
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            if not entry.name.endswith(".beat"):
                continue
            pid = int(entry.name.removesuffix(".beat"))
            if not _process_exists(pid):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                continue
            try:
                with open(entry.path, "rb") as file:
                    data = file.read(_BEAT.size)
            except FileNotFoundError:  # the worker stopped meanwhile
                continue
            if len(data) < _BEAT.size:
                continue
            (value,) = _BEAT.unpack(data)
            if value == 0.0 or not math.isfinite(value):
                continue  # created, not beaten yet
            beats.append(Beat(pid, max(0.0, now - abs(value)), value > 0))
    return beats


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: exists
        return True
    return True


def judge(path: str, beats: list[Beat], stale_s: float) -> tuple[int, dict]:
    """The status and body answering GET ``path`` given the workers' ``beats``."""
    stale = [beat.pid for beat in beats if not beat.fresh(stale_s)]
    if path in LIVE_PATHS:
        if stale:
            detail = f"worker(s) {stale} wrote no heartbeat for over {stale_s:g} s (PROBE_STALE_S)"
            return 503, {"status": "not live", "detail": detail}
        return 200, {"status": "ok", "detail": None if beats else "starting"}
    if path in READY_PATHS:
        if not beats:
            return 503, {"status": "not ready", "detail": "starting: no worker has loaded yet"}
        if stale:
            detail = f"worker(s) {stale} wrote no heartbeat for over {stale_s:g} s (PROBE_STALE_S)"
            return 503, {"status": "not ready", "detail": detail}
        waiting = [beat.pid for beat in beats if not beat.ready]
        if waiting:
            detail = (
                f"worker(s) {waiting} not ready (loading or draining; the service port's "
                "/readyz says why)"
            )
            return 503, {"status": "not ready", "detail": detail}
        return 200, {"status": "ready", "detail": None}
    return 404, {
        "status": "not found",
        "detail": f"this port answers {sorted(LIVE_PATHS | READY_PATHS)}",
    }


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


def _response(status: int, body: dict, head_only: bool) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n"
    ).encode()
    return head if head_only else head + payload


class ProbeListener:
    """The probe process's server: one request a connection, answered from the heartbeats."""

    def __init__(self, directory: str | os.PathLike, stale_s: float) -> None:
        self.directory = directory
        self.stale_s = stale_s
        self._unfinished: OrderedDict[asyncio.StreamWriter, None] = OrderedDict()
        self._open = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open += 1
        if self._open > MAX_CONNECTIONS and self._unfinished:
            oldest, _ = self._unfinished.popitem(last=False)
            oldest.close()
        self._unfinished[writer] = None
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
            self._unfinished.pop(writer, None)
            writer.write(self.answer(head))
            await asyncio.wait_for(writer.drain(), HEAD_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            pass
        finally:
            self._open -= 1
            self._unfinished.pop(writer, None)
            writer.close()

    def answer(self, head: bytes) -> bytes:
        """The response to a request ``head`` (its request line and headers)."""
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return _response(
                400, {"status": "bad request", "detail": "not an HTTP/1 request"}, False
            )
        method, target = parts[0], parts[1].decode("latin-1").split("?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return _response(405, {"status": "method not allowed", "detail": "GET or HEAD"}, False)
        status, body = judge(target, read_beats(self.directory), self.stale_s)
        return _response(status, body, method == b"HEAD")


async def _serve(sock: socket.socket, directory: str, stale_s: float, parent: int) -> None:
    listener = ProbeListener(directory, stale_s)
    server = await asyncio.start_server(listener.handle, sock=sock, limit=MAX_HEAD_BYTES)
    async with server:
        while os.getppid() == parent:
            await asyncio.sleep(PARENT_CHECK_S)


def main(argv: list[str] | None = None) -> None:
    """``python -m service.probes --fd N --directory D --stale-s S --parent P``: answer on the
    listening socket ``N`` (bound by the server, inherited) until the process ``P`` (the server
    that started this one) is gone, or a SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m service.probes", description=main.__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the listening socket's descriptor")
    parser.add_argument("--directory", required=True, help="the workers' heartbeat directory")
    parser.add_argument("--stale-s", type=float, required=True, help="PROBE_STALE_S")
    parser.add_argument("--parent", type=int, required=True, help="the server's pid")
    args = parser.parse_args(argv)
    # Ctrl-C reaches the whole process group: the server decides when it ends, and ends this.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(0))
    sock = socket.socket(fileno=args.fd)
    asyncio.run(_serve(sock, args.directory, args.stale_s, args.parent))


def bind_probe_socket(host: str, port: int | None) -> socket.socket | None:
    """The probe port's listening socket (None when ``port`` is None: no probe port), bound
    by the server, so that a port in use stops its start (OSError), not the probe process's."""
    if port is None:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as error:
        sock.close()
        raise OSError(f"PROBE_PORT {host}:{port}: {error.strerror}") from None
    return sock


@contextlib.contextmanager
def probe_process(sock: socket.socket | None, stale_s: float) -> Iterator[str | None]:
    """Within the ``with``, the probe process answering on the listening socket ``sock``
    (:func:`bind_probe_socket`; closed here), and the heartbeat directory its workers write to
    (exported in ``PROBE_HEARTBEAT_DIR`` for worker processes started inside the ``with``), or
    None when ``sock`` is None."""
    if sock is None:
        yield None
        return
    host, port = sock.getsockname()[:2]
    directory = tempfile.mkdtemp(prefix="besvm-probes-")
    command = [
        sys.executable, "-m", "service.probes", "--fd", str(sock.fileno()),
        "--directory", directory, "--stale-s", repr(stale_s), "--parent", str(os.getpid()),
    ]  # fmt: skip
    # A fresh interpreter that imports this module alone, not a fork of a server whose threads
    # (numba's, grpcio's) a fork would copy mid-operation.
    process = subprocess.Popen(command, pass_fds=(sock.fileno(),), stdin=subprocess.DEVNULL)
    sock.close()
    os.environ[HEARTBEAT_DIR_ENV] = directory
    logger.info(
        "health probes on http://%s:%d, answered by a process of their own (pid %d)",
        host,
        port,
        process.pid,
    )
    try:
        yield directory
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
        os.environ.pop(HEARTBEAT_DIR_ENV, None)
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
