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
        no worker's heartbeat is stale, and some worker has beaten within ``PROBE_STALE_S`` (or
        none ever has: the server is starting, its start bounded by the supervisor's health
        check and the orchestrator's start-up probe).
    ready (``/readyz``, ``/v2/health/ready``)
        no worker's heartbeat is stale, and at least one says ready (uvicorn gives a worker no
        connection before its models are loaded, so a worker that is still loading, e.g. one
        replacing a worker that died, takes no requests and counts against nothing; during a
        drain every worker says not ready).

A worker's file is removed as it stops, by the supervisor when it sees a worker exit, and by a
probe that finds its process gone.

This module imports nothing of the service (and nothing beyond the standard library): the probe
process starts in a fraction of a second and holds about 20 MiB.
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
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("service.probes")

# The variable through which a server's workers learn where to write their heartbeats.
HEARTBEAT_DIR_ENV = "PROBE_HEARTBEAT_DIR"

# Seconds between a worker's beats: well under any staleness worth declaring (PROBE_STALE_S is
# at least MIN_STALE_S).
BEAT_S = 0.25
MIN_STALE_S = 1.0

# One float64, little-endian, at offset 0 of the file. Neither the writer nor the reader is
# guaranteed a single 8-byte access, so a reader reads until two reads agree.
_BEAT = struct.Struct("<d")
_READS = 3
BEAT_SUFFIX = ".beat"

LIVE_PATHS = frozenset({"/healthz", "/v2/health/live"})
READY_PATHS = frozenset({"/readyz", "/v2/health/ready"})
PROBE_PATHS = LIVE_PATHS | READY_PATHS

# The probe listener's own limits: a request head of at most MAX_HEAD_BYTES, within
# HEAD_TIMEOUT_S; at most MAX_CONNECTIONS at once, and MAX_CONNECTIONS_PER_PEER from one
# address, the oldest unfinished one (of that address, else of all) closed to admit a new one:
# sockets that send nothing cannot hold the probe port against a prober that sends its request
# at once, unless they come faster than the prober's own round trip.
MAX_HEAD_BYTES = 8192
HEAD_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_PEER = 32
BACKLOG = 1024

# How often the probe process checks that the server that started it still runs.
PARENT_CHECK_S = 1.0

# A probe process that ends without being asked is started again after this long.
RESTART_DELAY_S = 1.0


class Heartbeat:
    """A worker's heartbeat file: :meth:`beat` writes it, :meth:`close` removes it.

    Parameters
    ----------
    directory : path
        The server's heartbeat directory (:func:`open_probe_port`).
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = heartbeat_path(directory, os.getpid())
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

    async def run(self, readiness: Callable[[], bool]) -> None:
        """Beat every :data:`BEAT_S` on the running loop, ready as ``readiness()`` says, until
        cancelled (then the file is removed)."""
        try:
            while True:
                self.beat(readiness())
                await asyncio.sleep(BEAT_S)
        finally:
            self.close()


def heartbeat_path(directory: str | os.PathLike, pid: int) -> Path:
    """The heartbeat file of worker ``pid``."""
    return Path(directory) / f"{pid}{BEAT_SUFFIX}"


def forget_heartbeat(pid: int, directory: str | os.PathLike | None) -> None:
    """Remove the heartbeat of worker ``pid``, which has exited (its supervisor saw it)."""
    if directory is not None:
        heartbeat_path(directory, pid).unlink(missing_ok=True)


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
            name, suffix = os.path.splitext(entry.name)
            if suffix != BEAT_SUFFIX or not name.isdigit():
                continue
            pid = int(name)
            if not _process_runs(pid):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                continue
            value = _read_beat(entry.path)
            if value is None or value == 0.0 or not math.isfinite(value):
                continue  # gone meanwhile, or created and not beaten yet
            beats.append(Beat(pid, max(0.0, now - abs(value)), value > 0))
    return beats


def _read_beat(path: str) -> float | None:
    """A heartbeat file's value, read until two reads agree (None if it is gone)."""
    previous = None
    try:
        with open(path, "rb") as file:
            for _ in range(_READS):
                data = os.pread(file.fileno(), _BEAT.size, 0)
                if len(data) < _BEAT.size:
                    return None
                if data == previous:
                    break
                previous = data
    except FileNotFoundError:
        return None
    return _BEAT.unpack(previous)[0]


def _process_runs(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rsplit(b")", 1)[-1].split()[:1] != [b"Z"]


def judge(
    path: str, beats: list[Beat], stale_s: float, silent_s: float | None = None
) -> tuple[int, dict]:
    """The status and body answering GET ``path`` given the workers' ``beats``, and how long
    ago a heartbeat was last seen (``silent_s``; None: never)."""
    stale = [beat.pid for beat in beats if not beat.fresh(stale_s)]
    stuck = (
        f"worker(s) {stale} wrote no heartbeat for over {stale_s:g} s (PROBE_STALE_S)"
        if stale
        else None
    )
    if not beats and silent_s is not None and silent_s > stale_s:
        stuck = (
            f"no worker has written a heartbeat for {silent_s:.0f} s (PROBE_STALE_S {stale_s:g})"
        )
    if path in LIVE_PATHS:
        if stuck:
            return 503, {"status": "not live", "detail": stuck}
        return 200, {"status": "ok", "detail": None if beats or silent_s else "starting"}
    if path in READY_PATHS:
        if stuck:
            return 503, {"status": "not ready", "detail": stuck}
        if not beats:
            detail = "starting" if silent_s is None else "no worker is running"
            return 503, {"status": "not ready", "detail": detail}
        if not any(beat.ready for beat in beats):
            detail = (
                f"worker(s) {[beat.pid for beat in beats]} not ready (loading or draining; the "
                "service port's /readyz says why)"
            )
            return 503, {"status": "not ready", "detail": detail}
        return 200, {"status": "ready", "detail": None}
    return 404, {"status": "not found", "detail": f"this port answers {sorted(PROBE_PATHS)}"}


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def _response(status: int, body: dict, head_only: bool = False) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n"
    ).encode()
    return head if head_only else head + payload


class HeadTooLarge(Exception):
    pass


async def read_head(reader: asyncio.StreamReader) -> bytes:
    """A request's head, its lines ended by CRLF or a bare LF, up to the blank line.

    Raises
    ------
    HeadTooLarge
        Beyond :data:`MAX_HEAD_BYTES`.
    asyncio.IncompleteReadError
        The client closed first.
    """
    lines = []
    size = 0
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise HeadTooLarge from None
        size += len(line)
        if size > MAX_HEAD_BYTES:
            raise HeadTooLarge
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)
        lines.append(line)


class ProbeListener:
    """The probe process's server: one request a connection, answered from the heartbeats."""

    def __init__(self, directory: str | os.PathLike, stale_s: float) -> None:
        self.directory = directory
        self.stale_s = stale_s
        self._unfinished: OrderedDict[asyncio.StreamWriter, object] = OrderedDict()
        self._open = 0
        self._by_peer: dict[object, int] = {}
        self._last_beat: float | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = (writer.get_extra_info("peername") or ("?",))[0]
        self._admit(writer, peer)
        try:
            try:
                head = await asyncio.wait_for(read_head(reader), HEAD_TIMEOUT_S)
                answer = self.answer(head)
            except HeadTooLarge:
                answer = _response(431, {"status": "too large", "detail": "8 KiB at most"})
            self._unfinished.pop(writer, None)
            writer.write(answer)
            await asyncio.wait_for(writer.drain(), HEAD_TIMEOUT_S)
        except (asyncio.IncompleteReadError, TimeoutError, OSError):
            pass
        finally:
            self._open -= 1
            self._by_peer[peer] -= 1
            if not self._by_peer[peer]:
                del self._by_peer[peer]
            self._unfinished.pop(writer, None)
            writer.close()

    def _admit(self, writer: asyncio.StreamWriter, peer: object) -> None:
        """Count the new connection; over a limit, close the oldest unfinished one of its
        address, else of all."""
        self._open += 1
        self._by_peer[peer] = self._by_peer.get(peer, 0) + 1
        victim = None
        if self._by_peer[peer] > MAX_CONNECTIONS_PER_PEER:
            victim = next((w for w, p in self._unfinished.items() if p == peer), None)
        elif self._open > MAX_CONNECTIONS:
            victim = next(iter(self._unfinished), None)
        if victim is not None:
            del self._unfinished[victim]
            victim.close()
        self._unfinished[writer] = peer

    def answer(self, head: bytes) -> bytes:
        """The response to a request ``head`` (its request line and headers)."""
        parts = head.split(b"\n", 1)[0].rstrip(b"\r").split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return _response(400, {"status": "bad request", "detail": "not an HTTP/1 request"})
        method, target = parts[0], parts[1].decode("latin-1").split("?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return _response(405, {"status": "method not allowed", "detail": "GET or HEAD"})
        beats = read_beats(self.directory)
        now = time.monotonic()
        if beats:
            self._last_beat = now - min(beat.age_s for beat in beats)
        silent_s = None if self._last_beat is None else now - self._last_beat
        status, body = judge(target, beats, self.stale_s, silent_s)
        return _response(status, body, method == b"HEAD")


async def _serve(sock: socket.socket, directory: str, stale_s: float, parent: int) -> None:
    listener = ProbeListener(directory, stale_s)
    server = await asyncio.start_server(listener.handle, sock=sock, limit=MAX_HEAD_BYTES)
    async with server:
        while os.getppid() == parent:
            await asyncio.sleep(PARENT_CHECK_S)
    # The server is gone without removing what it made (SIGKILL): remove it here.
    shutil.rmtree(directory, ignore_errors=True)


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


@dataclass
class ProbePort:
    """The probe port's listening socket and the heartbeat directory its answers read."""

    sock: socket.socket
    directory: str

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def open_probe_port(host: str, port: int | None) -> ProbePort | None:
    """The probe port's listening socket, bound, and a fresh heartbeat directory (None when
    ``port`` is None: no probe port). Made by the server before anything starts, so that a
    port in use stops its start (OSError)."""
    if port is None:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        directory = tempfile.mkdtemp(prefix="besvm-probes-")
    except OSError as error:
        sock.close()
        raise OSError(f"PROBE_PORT {host}:{port}: {error.strerror or error}") from None
    return ProbePort(sock, directory)


class ProbeProcess:
    """``python -m service.probes`` on a :class:`ProbePort`, started again when it ends
    without being asked (a crash, the OOM killer), so that the probes never fail for want of
    it while the server runs."""

    def __init__(self, port: ProbePort, stale_s: float) -> None:
        self.port = port
        self.stale_s = stale_s
        self._stopping = threading.Event()
        self.process = self._start()
        self._watcher = threading.Thread(target=self._watch, name="probe-process", daemon=True)
        self._watcher.start()

    def _start(self) -> subprocess.Popen:
        fd = self.port.sock.fileno()
        command = [
            sys.executable, "-m", "service.probes", "--fd", str(fd), "--directory",
            self.port.directory, "--stale-s", repr(self.stale_s), "--parent", str(os.getpid()),
        ]  # fmt: skip
        # A fresh interpreter that imports this module alone, not a fork of a server whose
        # threads (numba's, grpcio's) a fork would copy mid-operation. This process keeps its
        # copy of the socket: the listening queue survives a restart of the probe process.
        return subprocess.Popen(command, pass_fds=(fd,), stdin=subprocess.DEVNULL)

    def _watch(self) -> None:
        while True:
            status = self.process.wait()
            if self._stopping.wait(0.0):
                return
            logger.error(
                "the probe process (pid %d) ended with status %s: starting it again in %g s",
                self.process.pid,
                status,
                RESTART_DELAY_S,
            )
            if self._stopping.wait(RESTART_DELAY_S):
                return
            self.process = self._start()

    def stop(self) -> None:
        self._stopping.set()
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        self._watcher.join(5)


@contextlib.contextmanager
def probe_process(port: ProbePort | None, stale_s: float) -> Iterator[str | None]:
    """Within the ``with``, the probe process answering on ``port`` (:func:`open_probe_port`;
    its socket closed and directory removed at the end), and the heartbeat directory the
    workers write to (exported in ``PROBE_HEARTBEAT_DIR`` for worker processes started inside
    the ``with``); None without a port."""
    if port is None:
        os.environ.pop(HEARTBEAT_DIR_ENV, None)  # no worker writes heartbeats nobody reads
        yield None
        return
    process = ProbeProcess(port, stale_s)
    os.environ[HEARTBEAT_DIR_ENV] = port.directory
    logger.info(
        "health probes on %s, answered by a process of their own (pid %d)",
        port.url,
        process.process.pid,
    )
    try:
        yield port.directory
    finally:
        process.stop()
        port.sock.close()
        os.environ.pop(HEARTBEAT_DIR_ENV, None)
        shutil.rmtree(port.directory, ignore_errors=True)


if __name__ == "__main__":
    main()
