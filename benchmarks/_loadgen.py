"""A keep-alive HTTP/1.1 load generator cheap enough to share two cores with the server.

Each client process (``python benchmarks/_loadgen.py``, driven by :func:`run_load`) opens its
connections with raw asyncio streams (on uvloop when installed) and, on each one, sends the same
precomputed request bytes in a closed loop: write, read the head up to the blank line, take the
status code and Content-Length, read exactly that many body bytes, repeat. No HTTP library on
the hot path. Latency is ``time.perf_counter_ns`` around write-to-last-byte.

All processes connect first, then start on one shared wall-clock instant; answers completing
in the first ``warmup`` seconds are dropped, then every answer completing in the next
``seconds`` is counted (its latency recorded, a non-200 status counted as an error).

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
from dataclasses import dataclass, field

import numpy as np


def http_request(host: str, port: int, path: str, body: bytes) -> bytes:
    """An HTTP/1.1 keep-alive POST of a JSON ``body``, as bytes on the wire."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


@dataclass
class LoadResult:
    """One measured cell: the answers completed inside the window and their latencies."""

    latencies_ns: np.ndarray
    seconds: float
    errors: Counter = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)

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
    request: bytes,
    concurrency: int,
    seconds: float,
    warmup: float = 0.5,
    processes: int = 1,
) -> LoadResult:
    """Drive ``concurrency`` keep-alive connections, split over ``processes`` client processes,
    for ``warmup`` + ``seconds``; return what completed in the last ``seconds``."""
    counts = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    config = {
        "host": host,
        "port": port,
        "request": base64.b64encode(request).decode("ascii"),
        "warmup_ns": int(warmup * 1e9),
        "seconds_ns": int(seconds * 1e9),
    }
    children = []
    try:
        for count in filter(None, counts):
            child = subprocess.Popen(
                [sys.executable, __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            children.append(child)
            child.stdin.write(json.dumps({**config, "connections": count}).encode() + b"\n")
            child.stdin.flush()
        for child in children:
            if child.stdout.readline() != b"ready\n":
                raise RuntimeError("a load-generator process failed to connect")
        start = f"{time.time_ns() + 20_000_000}\n".encode()  # 20 ms: every child reads it first
        for child in children:
            child.stdin.write(start)
            child.stdin.flush()
        parts, errors, samples = [], Counter(), []
        for child in children:
            output, _ = child.communicate(timeout=warmup + seconds + 60)
            summary, _, raw = output.partition(b"\n")
            if child.returncode or not summary:
                raise RuntimeError(f"a load-generator process exited with {child.returncode}")
            summary = json.loads(summary)
            errors.update(summary["errors"])
            samples.extend(summary["samples"])
            parts.append(np.frombuffer(raw, dtype=np.int64))
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    return LoadResult(np.concatenate(parts), seconds, errors, samples[:5])


# --- the client process ---------------------------------------------------------------------


async def _connect(host: str, port: int):
    reader, writer = await asyncio.open_connection(host, port)
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return reader, writer


async def _client(config, connection, window, latencies, errors, samples) -> None:
    host, port, request = config["host"], config["port"], config["request"]
    measure_from, stop = window
    reader, writer = connection
    perf = time.perf_counter_ns
    record = latencies.append
    while True:
        began = perf()
        if began >= stop:
            break
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
            if perf() >= measure_from:
                errors[f"connection: {type(error).__name__}"] += 1
            writer.close()
            reader, writer = await _connect(host, port)
            continue
        ended = perf()
        if measure_from <= ended < stop:
            record(ended - began)
            if status != 200:
                errors[str(status)] += 1
                if len(samples) < 5:
                    samples.append(f"{status}: {body[:300].decode(errors='replace')}")
        if b"\r\nconnection: close" in lower:
            writer.close()
            reader, writer = await _connect(host, port)
    writer.close()


async def _child() -> None:
    config = json.loads(sys.stdin.readline())
    config["request"] = base64.b64decode(config["request"])
    connections = [
        await _connect(config["host"], config["port"]) for _ in range(config["connections"])
    ]
    sys.stdout.buffer.write(b"ready\n")
    sys.stdout.buffer.flush()
    start_wall = int(sys.stdin.readline())
    start = time.perf_counter_ns() + (start_wall - time.time_ns())
    window = (start + config["warmup_ns"], start + config["warmup_ns"] + config["seconds_ns"])
    await asyncio.sleep(max(0, start - time.perf_counter_ns()) / 1e9)
    latencies, errors, samples = array("q"), Counter(), []
    await asyncio.gather(
        *(_client(config, c, window, latencies, errors, samples) for c in connections)
    )
    summary = {"errors": dict(errors), "samples": samples}
    sys.stdout.buffer.write(json.dumps(summary).encode() + b"\n" + latencies.tobytes())
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    try:
        import uvloop
    except ImportError:
        asyncio.run(_child())
    else:
        uvloop.run(_child())
