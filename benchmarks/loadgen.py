"""A keep-alive HTTP/1.1 load generator cheap enough to share two cores with the server.

Used by the HTTP benchmarks and by the load and crash tests (tests/api/test_load.py,
tests/api/test_crash.py), which import it as ``benchmarks.loadgen``.

Each client process (``python benchmarks/loadgen.py``, driven by :func:`run_load`) opens its
connections with raw asyncio streams (on uvloop when installed) and, on each one, sends the same
precomputed request bytes in a closed loop: write, read the head up to the blank line, take the
status code and Content-Length, read exactly that many body bytes, repeat. No HTTP library on
the hot path. Latency is ``time.perf_counter_ns`` around write-to-last-byte. With several
requests given, connection ``j`` (counted over all processes) sends request ``j % len``.

All processes connect first, then start on one shared wall-clock instant. Timed: answers
completing in the first ``warmup`` seconds are dropped, then every answer completing in the next
``seconds`` is counted (its latency recorded, a non-200 status counted as an error). Counted
(``count`` given): exactly ``count`` requests are sent, shared over the connections, and every
answer is counted. The distinct bodies of the 200 answers are tallied per request, so a caller
can check that every answer is the right one. A connection that fails (reset, refused, closed
mid-answer) counts an error and reconnects, every 10 ms until it succeeds or the run ends: a
server killed and restarted under load shows up as errors, not as a crashed client. In a
counted run each failed attempt uses up one request, so a run against a dead server ends.

**gRPC** (``grpc=GrpcCall(...)``): each connection is a gRPC channel of its own (grpc.aio), and
the request bytes are a serialized message sent as they are to one unary method (no protobuf
code on the client's hot path either); a status other than OK counts as an error by its name.

Protocol with the parent: stdin line 1, a JSON config; the child connects and prints ``ready``;
stdin line 2, the start instant (``time.time_ns()``); stdout, a JSON summary line followed by
the latencies as raw int64 nanoseconds.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import sys
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# Distinct 200 bodies tallied per request and client process; more are counted as "other".
MAX_DISTINCT_ANSWERS = 8
RECONNECT_PAUSE_S = 0.01


@dataclass(frozen=True)
class GrpcCall:
    """A unary gRPC method (``/package.Service/Method``) and the metadata every call sends."""

    method: str
    metadata: tuple[tuple[str, str], ...] = ()


def http_request(
    host: str, port: int, path: str, body: bytes, headers: dict[str, str] | None = None
) -> bytes:
    """An HTTP/1.1 keep-alive POST of a JSON ``body`` (with ``headers``), as bytes on the
    wire."""
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"{extra}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


@dataclass
class LoadResult:
    """One measured cell: the answers completed inside the window and their latencies.

    ``answers[i]`` counts the distinct bodies of the 200 answers to request ``i`` (at most
    :data:`MAX_DISTINCT_ANSWERS` per client process; the rest under the key ``None``)."""

    latencies_ns: np.ndarray
    seconds: float
    errors: Counter = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    answers: list[Counter] = field(default_factory=list)
    # The server's CPU microseconds per request, where a caller measured them.
    cpu_us: float = float("nan")

    @property
    def requests_per_second(self) -> float:
        return len(self.latencies_ns) / self.seconds

    def percentile_ms(self, q: float) -> float:
        if len(self.latencies_ns) == 0:
            return float("nan")
        return float(np.percentile(self.latencies_ns, q)) / 1e6

    @property
    def n_errors(self) -> int:
        return sum(self.errors.values())


def run_load(
    host: str,
    port: int,
    request: bytes | Sequence[bytes],
    concurrency: int,
    seconds: float = 0.0,
    warmup: float = 0.5,
    processes: int = 1,
    count: int | None = None,
    timeout: float | None = None,
    grpc: GrpcCall | None = None,
) -> LoadResult:
    """Drive ``concurrency`` keep-alive connections, split over ``processes`` client processes:
    for ``warmup`` + ``seconds``, returning what completed in the last ``seconds``; or, with
    ``count``, for exactly ``count`` requests, returning them all (``seconds``: the time taken).

    ``request`` is the bytes of one request, or a sequence of them, spread over the connections.
    ``timeout``: seconds to wait for a counted run (default: no limit; a timed run waits
    ``warmup + seconds + 60``); past it, :class:`subprocess.TimeoutExpired`. ``grpc``: the
    requests are serialized messages of that gRPC call (see the module docstring).
    """
    requests = [request] if isinstance(request, bytes) else list(request)
    counts = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    quotas = [None] * processes
    if count is not None:
        quotas = [count * c // concurrency for c in counts]
        quotas[0] += count - sum(quotas)
    config = {
        "host": host,
        "port": port,
        "requests": [base64.b64encode(r).decode("ascii") for r in requests],
        "warmup_ns": 0 if count is not None else int(warmup * 1e9),
        "seconds_ns": None if count is not None else int(seconds * 1e9),
        "grpc": None if grpc is None else {"method": grpc.method, "metadata": grpc.metadata},
    }
    children = []
    try:
        first = 0
        for connections, quota in zip(counts, quotas, strict=True):
            if not connections:
                continue
            child = subprocess.Popen(
                [sys.executable, __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            children.append(child)
            own = {"connections": connections, "first_connection": first, "count": quota}
            child.stdin.write(json.dumps({**config, **own}).encode() + b"\n")
            child.stdin.flush()
            first += connections
        for child in children:
            if child.stdout.readline() != b"ready\n":
                raise RuntimeError("a load-generator process failed to connect")
        start = f"{time.time_ns() + 20_000_000}\n".encode()  # 20 ms: every child reads it first
        for child in children:
            child.stdin.write(start)
            child.stdin.flush()
        parts, errors, samples, elapsed = [], Counter(), [], []
        answers = [Counter() for _ in requests]
        budget = warmup + seconds + 60 if count is None else timeout
        for child in children:
            output, _ = child.communicate(timeout=budget)
            summary, _, raw = output.partition(b"\n")
            if child.returncode or not summary:
                raise RuntimeError(f"a load-generator process exited with {child.returncode}")
            summary = json.loads(summary)
            errors.update(summary["errors"])
            samples.extend(summary["samples"])
            elapsed.append(summary["elapsed_ns"] / 1e9)
            for index, body, n in summary["answers"]:
                answers[index][None if body is None else base64.b64decode(body)] += n
            parts.append(np.frombuffer(raw, dtype=np.int64))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    measured = max(elapsed) if count is not None else seconds
    return LoadResult(np.concatenate(parts), measured, errors, samples[:5], answers)


# --- the client process ---------------------------------------------------------------------


async def _connect(host: str, port: int):
    reader, writer = await asyncio.open_connection(host, port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return reader, writer


class _Run:
    """What one client process shares between its connections: the window, the requests left
    (counted runs) and the tallies."""

    def __init__(self, config: dict, start: int) -> None:
        self.host, self.port = config["host"], config["port"]
        self.requests = [base64.b64decode(r) for r in config["requests"]]
        self.measure_from = start + config["warmup_ns"]
        seconds = config["seconds_ns"]
        self.stop = float("inf") if seconds is None else self.measure_from + seconds
        self.left = config["count"]
        self.latencies = array("q")
        self.errors: Counter = Counter()
        self.samples: list[str] = []
        self.answers: Counter = Counter()
        self.distinct: Counter = Counter()

    def take(self) -> bool:
        """Whether a connection may send one more request (and, counted, claim it)."""
        if self.left is None:
            return time.perf_counter_ns() < self.stop
        if self.left <= 0:
            return False
        self.left -= 1
        return True

    def tally(self, index: int, body: bytes) -> None:
        key = (index, body)
        if key in self.answers or self.distinct[index] < MAX_DISTINCT_ANSWERS:
            self.distinct[index] += key not in self.answers
            self.answers[key] += 1
        else:
            self.answers[index, None] += 1

    async def reconnect(self, writer):
        """Close ``writer`` and connect again, retrying (each failure an error) while the run
        lasts; None once it has ended."""
        writer.close()
        while self.left is None or self.left > 0:
            if time.perf_counter_ns() >= self.stop:
                return None
            try:
                return await _connect(self.host, self.port)
            except OSError as error:
                self.errors[f"connection: {type(error).__name__}"] += 1
                if self.left is not None:  # a counted run ends even if the server is gone
                    self.left -= 1
                await asyncio.sleep(RECONNECT_PAUSE_S)
        return None


async def _client(run: _Run, index: int, connection) -> None:
    request = run.requests[index]
    reader, writer = connection
    perf = time.perf_counter_ns
    record = run.latencies.append
    while run.take():
        began = perf()
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            lower = head.lower()
            at = lower.find(b"\r\ncontent-length:")
            if at < 0:
                raise ValueError(f"no Content-Length in {head[:200]!r}")
            length = int(lower[at + 17 : lower.index(b"\r\n", at + 2)])
            body = await reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as error:
            if perf() >= run.measure_from:
                run.errors[f"connection: {type(error).__name__}"] += 1
            connection = await run.reconnect(writer)
            if connection is None:
                return
            reader, writer = connection
            continue
        ended = perf()
        if run.measure_from <= ended < run.stop:
            record(ended - began)
            if status == 200:
                run.tally(index, body)
            else:
                run.errors[str(status)] += 1
                if len(run.samples) < 5:
                    run.samples.append(f"{status}: {body[:300].decode(errors='replace')}")
        if b"\r\nconnection: close" in lower:
            connection = await run.reconnect(writer)
            if connection is None:
                return
            reader, writer = connection
    writer.close()


async def _grpc_client(run: _Run, index: int, call) -> None:
    """As :func:`_client`, for gRPC: one unary call after the other on the connection's own
    channel."""
    import grpc

    request = run.requests[index]
    perf = time.perf_counter_ns
    record = run.latencies.append
    while run.take():
        began = perf()
        try:
            answer = await call(request)
            status = "OK"
        except grpc.aio.AioRpcError as error:
            status = error.code().name
        ended = perf()
        if run.measure_from <= ended < run.stop:
            record(ended - began)
            if status == "OK":
                run.tally(index, answer)
            else:
                run.errors[status] += 1


async def _grpc_connections(config: dict) -> list:
    """One channel per connection, connected, each as its method's callable."""
    from grpc import aio

    target, grpc_config = f"{config['host']}:{config['port']}", config["grpc"]
    metadata = tuple(tuple(pair) for pair in grpc_config["metadata"])
    calls = []
    for _ in range(config["connections"]):
        # A channel of its own (not one shared from gRPC's pool): a connection of its own.
        channel = aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        await channel.channel_ready()
        method = channel.unary_unary(grpc_config["method"])

        async def call(request, method=method):
            return await method(request, metadata=metadata)

        calls.append(call)
    return calls


async def _child() -> None:
    config = json.loads(sys.stdin.readline())
    if config["grpc"] is not None:
        connections = await _grpc_connections(config)
        client = _grpc_client
    else:
        connections = [
            await _connect(config["host"], config["port"]) for _ in range(config["connections"])
        ]
        client = _client
    sys.stdout.buffer.write(b"ready\n")
    sys.stdout.buffer.flush()
    start_wall = int(sys.stdin.readline())
    start = time.perf_counter_ns() + (start_wall - time.time_ns())
    run = _Run(config, start)
    await asyncio.sleep(max(0, start - time.perf_counter_ns()) / 1e9)
    first, n_requests = config["first_connection"], len(run.requests)
    await asyncio.gather(
        *(
            client(run, (first + j) % n_requests, connection)
            for j, connection in enumerate(connections)
        )
    )
    answers = [
        [index, None if body is None else base64.b64encode(body).decode("ascii"), n]
        for (index, body), n in run.answers.items()
    ]
    summary = {
        "errors": dict(run.errors),
        "samples": run.samples,
        "answers": answers,
        "elapsed_ns": time.perf_counter_ns() - start,
    }
    sys.stdout.buffer.write(json.dumps(summary).encode() + b"\n" + run.latencies.tobytes())
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:
        asyncio.run(_child())
    else:
        uvloop.run(_child())
