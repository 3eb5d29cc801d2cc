"""Soak: hostile clients of every kind of issue 22 beside a normal /classify client.

``python benchmarks/soak.py --port 8000 --pids <server pid>`` against a running server (the
digits model as DEFAULT_MODEL, default settings), or :func:`soak` from a test
(tests/api/test_soak.py). For ``seconds``, ``clients`` hostile clients of each kind of
:data:`KINDS` run in one asyncio process of their own, a normal client sends one digit at a time
to /classify over a keep-alive connection (benchmarks.loadgen, another process), a probe asks
/readyz on a new connection every :data:`PROBE_INTERVAL_S`, and the resident memory of the
server's processes is sampled every :data:`RSS_INTERVAL_S`.

Hostile kinds (each a defect of issue 22):

- ``exclude``: /search excluding 8 million ids (16 MiB);
- ``lists``: /v2/models/digits/infer with a BYTES tensor of 4 million empty elements (binary),
  a shape of 8 million dimensions, 5.6 million outputs, 5.6 million empty arrays as data;
- ``headers``: a 4 MiB header value;
- ``slow-bodies``: bodies just under 16 MiB sent at 1.6 MiB/s, several at a time;
- ``non-readers``: an answer of 15 MB (an echoed request id) that the client never reads;
- ``aborts``: a body cut short (Content-Length 100, 12 bytes, close) or a broken chunked body;
- ``idle``: ``MAX_CONNECTIONS / clients`` idle connections each, reopened when closed;
- ``malformed``: pipelined requests then a malformed one; a path with a trailing slash;
- ``partial-heads`` (issue 36): :data:`PARTIAL_HEADS` ``/ clients`` connections each, 26 bytes
  of a request line and nothing more, renewed every :data:`PARTIAL_RENEW_S` (inside
  ``HEADER_TIMEOUT_S``);
- ``grpc-trickle`` (issue 36, with a gRPC port): :data:`TRICKLE_STREAMS` ModelInfer calls each,
  raw HTTP/2 streams declaring a 1 MiB message and sending a byte every second;
- ``upserts`` (issue 36, with an admin token): catalogue upserts of :data:`UPSERT_ITEMS` items
  with attributes (:data:`UPSERT_KEYS` keys each, from a pool of :data:`KEY_POOL`), one a second,
  so that the memory bound is checked with updates under way.

With a gRPC port, a normal gRPC client beside the normal REST one sends one digit at a time
(ModelInfer).

The figures (:class:`SoakResult`): the normal client's latencies and errors, every hostile
answer's status by kind, /readyz's answers, and the peak memory of each server process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

if __package__ in (None, ""):  # run as a script: the repository's root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.http2 import RawHttp2Connection
from benchmarks.loadgen import GrpcCall, LoadResult, http_request, run_load

KINDS = (
    "exclude",
    "lists",
    "headers",
    "slow-bodies",
    "non-readers",
    "aborts",
    "idle",
    "malformed",
    "partial-heads",
    "grpc-trickle",
    "upserts",
)
PROBE_INTERVAL_S = 0.25
# How often a partial-heads client sends its request line anew (HEADER_TIMEOUT_S is 10).
PARTIAL_RENEW_S = 8.0
PARTIAL_HEAD = b"GET /healthz HTTP/1.1\r\nHo"
# Connections holding a partial request line, over all clients: beside the idle ones (as many as
# MAX_CONNECTIONS) a few hundred keep the cap full; issue 36's 1,100 of them alone are
# tests/api/test_hostile_clients.py's.
PARTIAL_HEADS = 400
TRICKLE_STREAMS = 8
UPSERT_ITEMS, UPSERT_KEYS, KEY_POOL = 20, 8, 64
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
# Seconds the hostile clients get past the end to record the answers under way.
STOP_GRACE_S = 2.0
RSS_INTERVAL_S = 0.1
MAX_REQUEST_BYTES = 16 * 1024 * 1024
# A digit (item 1,009 of scikit-learn's digits, a 7).
DIGIT = load_digits().images[1009].astype(int).tolist()


@dataclass
class SoakResult:
    """What a soak measured."""

    normal: LoadResult
    hostile: dict[str, Counter]
    readiness: Counter
    peak_rss: dict[int, int] = field(default_factory=dict)
    grpc: LoadResult | None = None

    def summary(self) -> dict:
        clients = {"normal": self.normal, "grpc": self.grpc}
        return {
            **{
                name: {
                    "requests": len(result.latencies_ns),
                    "p50_ms": round(result.percentile_ms(50), 3),
                    "p99_ms": round(result.percentile_ms(99), 3),
                    "max_ms": round(result.percentile_ms(100), 3),
                    "errors": dict(result.errors),
                }
                for name, result in clients.items()
                if result is not None
            },
            "hostile": {kind: dict(counts) for kind, counts in self.hostile.items()},
            "readyz": dict(self.readiness),
            "peak_rss_mib": {pid: round(rss / 2**20, 1) for pid, rss in self.peak_rss.items()},
        }


def rss_bytes(pid: int) -> int:
    """VmRSS of process ``pid`` (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    line = next((line for line in status.splitlines() if line.startswith("VmRSS:")), None)
    return 0 if line is None else int(line.split()[1]) * 1024


def soak(
    host: str,
    port: int,
    pids: list[int],
    seconds: float = 15.0,
    clients: int = 4,
    grpc_port: int | None = None,
    admin_token: str | None = None,
) -> SoakResult:
    """Run the soak against the server at ``host:port`` whose processes are ``pids``; with
    ``grpc_port``, gRPC's clients too, with ``admin_token``, catalogue upserts."""
    stop = threading.Event()
    peak = dict.fromkeys(pids, 0)
    readiness: Counter = Counter()

    def sample_memory() -> None:
        while not stop.is_set():
            for pid in pids:
                peak[pid] = max(peak[pid], rss_bytes(pid))
            stop.wait(RSS_INTERVAL_S)

    def probe_readiness() -> None:
        while not stop.is_set():
            readiness[_status_of(host, port, b"GET /readyz HTTP/1.1\r\nHost: soak\r\n\r\n")] += 1
            stop.wait(PROBE_INTERVAL_S)

    threads = [threading.Thread(target=f, daemon=True) for f in (sample_memory, probe_readiness)]
    extra = [] if grpc_port is None else ["--grpc-port", str(grpc_port)]
    extra += [] if admin_token is None else ["--admin-token", admin_token]
    hostile = subprocess.Popen(
        [sys.executable, __file__, "--hostile", "--host", host, "--port", str(port),
         "--seconds", str(seconds), "--clients", str(clients), *extra],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    grpc_load: dict[str, LoadResult] = {}
    if grpc_port is not None:

        def grpc_client() -> None:
            grpc_load["result"] = run_load(
                host, grpc_port, _infer_message(), 1, seconds - 1.0, 0.0,
                grpc=GrpcCall(MODEL_INFER),
            )  # fmt: skip

        threads.append(threading.Thread(target=grpc_client, name="grpc", daemon=True))
    try:
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # the hostile clients at work first
        body = json.dumps({"instances": [DIGIT]}).encode()
        normal = run_load(
            host, port, http_request(host, port, "/classify", body), 1, seconds - 1.0, 0.0
        )
        output, _ = hostile.communicate(timeout=seconds + 120)
    finally:
        stop.set()
        if hostile.poll() is None:
            hostile.kill()
            hostile.wait()
        for thread in threads:
            thread.join(5 if thread.name != "grpc" else seconds + 60)
    counts = {kind: Counter(statuses) for kind, statuses in json.loads(output).items()}
    return SoakResult(normal, counts, readiness, peak, grpc_load.get("result"))


def _infer_message() -> bytes:
    """One digit as a serialized ModelInferRequest (FP64, raw contents), as tritonclient sends
    it."""
    from service.api.protocol import inference_pb2

    request = inference_pb2.ModelInferRequest(model_name="digits")
    request.inputs.add(name="input", datatype="FP64", shape=[1, 8, 8])
    request.raw_input_contents.append(np.asarray(DIGIT, dtype="<f8").tobytes())
    return request.SerializeToString()


def _status_of(host: str, port: int, request: bytes) -> str:
    """The status of one request on a new connection, or what went wrong."""
    try:
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(request)
            head = b""
            while b"\r\n" not in head:
                chunk = sock.recv(4096)
                if not chunk:
                    return "closed"
                head += chunk
            return head.split(b" ", 2)[1].decode()
    except OSError as error:
        return type(error).__name__


# --- the hostile clients (a process of their own) -------------------------------------------


def raw_post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    """A POST of a JSON ``body`` on the wire, with ``extra`` header lines (CRLF-ended)."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


def _requests() -> dict[str, list[bytes]]:
    limit = MAX_REQUEST_BYTES - 4096
    ids = b"1," * ((limit - 40) // 2)
    n_texts = (limit - 200) // 4
    binary = {"inputs": [{"name": "input", "datatype": "BYTES", "shape": [n_texts],
                          "parameters": {"binary_data_size": 4 * n_texts}}]}  # fmt: skip
    header = json.dumps(binary).encode()
    digit = json.dumps({"name": "input", "datatype": "FP32", "shape": [1, 8, 8],
                        "data": np.ravel(DIGIT).tolist()}).encode()  # fmt: skip
    infer = "/v2/models/digits/infer"
    big_value, zeros = b"a" * (4 << 20), b"0," * ((limit - 40) // 2)
    return {
        "exclude": [raw_post("/search", b'{"class": "7", "exclude": [' + ids + b"1]}")],
        "lists": [
            raw_post(
                infer,
                header + bytes(4 * n_texts),
                f"Inference-Header-Content-Length: {len(header)}\r\n".encode(),
            ),
            raw_post(
                infer,
                b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": ['
                + ids
                + b'1], "data": []}]}',
            ),
            raw_post(
                infer,
                b'{"inputs": [' + digit + b'], "outputs": ['
                + b'{"name": "label"},' * ((limit - 400) // 18)
                + b'{"name": "label"}]}',
            ),
            raw_post(
                infer,
                b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1], "data": ['
                + b"[]," * ((limit - 200) // 3)
                + b"[]]}]}",
            ),
        ],
        "headers": [b"GET /healthz HTTP/1.1\r\nHost: soak\r\nX-Big: " + big_value + b"\r\n\r\n"],
        "slow-bodies": [raw_post("/classify", b'{"instances": [' + zeros + b"0]}")],
        "non-readers": [
            raw_post(infer, b'{"id": "' + b"x" * (15 << 20) + b'", "inputs": [' + digit + b"]}")
        ],
        "aborts": [
            b"POST /classify HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"instances"',
            b"POST /classify HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"ins\r\nzz\r\n",
        ],
        "malformed": [
            b"GET /healthz HTTP/1.1\r\nHost: soak\r\n\r\n" * 2 + b"GARBAGE / HTTP/9\r\n\r\n",
            b"GET /healthz/ HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        ],
    }  # fmt: skip


async def _statuses(reader: asyncio.StreamReader, at_most: int) -> list[str]:
    """The statuses of up to ``at_most`` answers, each read whole (Content-Length)."""
    statuses = []
    while len(statuses) < at_most:
        head = await reader.readuntil(b"\r\n\r\n")
        statuses.append(head.split(b" ", 2)[1].decode())
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
    return statuses


class _Hostile:
    def __init__(
        self,
        host: str,
        port: int,
        deadline: float,
        grpc_port: int | None = None,
        admin_token: str | None = None,
    ) -> None:
        self.host, self.port, self.deadline = host, port, deadline
        self.grpc_port, self.admin_token = grpc_port, admin_token
        self.requests = _requests()
        self.statuses: dict[str, Counter] = {kind: Counter() for kind in KINDS}

    def running(self) -> bool:
        return time.monotonic() < self.deadline

    async def connect(self, receive_buffer: int | None = None):
        sock = socket.socket()
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (self.host, self.port))
        return await asyncio.open_connection(sock=sock)

    async def exchange(self, kind: str, request: bytes, answers: int = 1) -> None:
        """Send ``request``, record the statuses of its answers (or how it failed)."""
        writer = None
        try:
            reader, writer = await self.connect()
            writer.write(request)
            await writer.drain()
            for status in await asyncio.wait_for(_statuses(reader, answers), 60):
                self.statuses[kind][status] += 1
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as error:
            self.statuses[kind][type(error).__name__] += 1
        except TimeoutError:
            self.statuses[kind]["no answer in 60 s"] += 1
        finally:
            if writer is not None:
                writer.close()

    async def abort(self) -> None:
        """Send part of a request and go away, again and again."""
        requests = self.requests["aborts"]
        i = 0
        while self.running():
            try:
                _, writer = await self.connect()
                writer.write(requests[i % len(requests)])
                await writer.drain()
                writer.close()
                self.statuses["aborts"]["sent"] += 1
            except OSError as error:
                self.statuses["aborts"][type(error).__name__] += 1
            i += 1
            await asyncio.sleep(0.01)

    async def repeat(self, kind: str) -> None:
        requests = self.requests[kind]
        i = 0
        while self.running():
            request = requests[i % len(requests)]
            await self.exchange(kind, request, 3 if request.count(b"GET /healthz ") == 2 else 1)
            i += 1
            await asyncio.sleep(0.01)

    async def slow_body(self) -> None:
        request = self.requests["slow-bodies"][0]
        step = 1 << 20
        while self.running():
            writer = None
            try:
                reader, writer = await self.connect()
                for start in range(0, len(request), step):
                    writer.write(request[start : start + step])
                    await writer.drain()
                    await asyncio.sleep(0.6)
                    if reader.at_eof() or not self.running():
                        break
                for status in await asyncio.wait_for(_statuses(reader, 1), 60):
                    self.statuses["slow-bodies"][status] += 1
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as error:
                self.statuses["slow-bodies"][type(error).__name__] += 1
                await asyncio.sleep(0.5)
            finally:
                if writer is not None:
                    writer.close()

    async def non_reader(self) -> None:
        request = self.requests["non-readers"][0]
        held = []
        while self.running():
            try:
                _, writer = await self.connect(receive_buffer=4096)
                writer.write(request)
                held.append(writer)
                self.statuses["non-readers"]["sent"] += 1
            except OSError as error:
                self.statuses["non-readers"][type(error).__name__] += 1
            await asyncio.sleep(2.0)
        for writer in held:
            writer.transport.abort()

    async def idle(self, connections: int) -> None:
        await self.hold("idle", connections)

    async def partial_heads(self, connections: int) -> None:
        await self.hold("partial-heads", connections, PARTIAL_HEAD, PARTIAL_RENEW_S)

    async def hold(
        self, kind: str, connections: int, sent: bytes = b"", renew_s: float | None = None
    ) -> None:
        """``connections`` connections that send ``sent`` (nothing: idle) and then wait, each
        reopened when the server closes it, or every ``renew_s`` seconds."""

        async def one() -> None:
            while self.running():
                try:
                    reader, writer = await self.connect()
                    if sent:
                        writer.write(sent)
                        await writer.drain()
                        self.statuses[kind]["sent"] += 1
                except OSError as error:
                    self.statuses[kind][type(error).__name__] += 1
                    await asyncio.sleep(0.1)
                    continue
                wait = max(self.deadline - time.monotonic(), 0.01)
                try:
                    answer = await asyncio.wait_for(reader.read(65536), min(wait, renew_s or wait))
                    status = answer.split(b" ", 2)[1].decode() if answer[:5] == b"HTTP/" else None
                    self.statuses[kind][status or "closed by the server"] += 1
                except TimeoutError:
                    pass
                except OSError as error:
                    self.statuses[kind][type(error).__name__] += 1
                writer.close()

        await asyncio.gather(*(one() for _ in range(connections)))

    def grpc_trickle(self) -> None:
        """TRICKLE_STREAMS calls on one connection, each a byte a second (on a thread: the
        raw HTTP/2 client is blocking), reopened when the server ends them."""
        while self.running():
            try:
                connection = RawHttp2Connection(self.host, self.grpc_port)
            except OSError as error:
                self.statuses["grpc-trickle"][type(error).__name__] += 1
                time.sleep(0.5)
                continue
            streams = [
                connection.start_call(MODEL_INFER, [], 1 << 20, b"\0")
                for _ in range(TRICKLE_STREAMS)
            ]
            self.statuses["grpc-trickle"]["sent"] += len(streams)
            while self.running() and not connection.closed.is_set():
                if all(stream in connection.ended for stream in streams):
                    break
                time.sleep(1.0)
                for stream in streams:
                    connection.trickle(stream)
            self.statuses["grpc-trickle"]["ended by the server"] += len(connection.ended)
            connection.close()

    async def upserts(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        n = 0
        while self.running():
            ids = [f"soak-{seed}-{n}-{j}" for j in range(UPSERT_ITEMS)]
            keys = [rng.choice(KEY_POOL, UPSERT_KEYS, replace=False) for _ in ids]
            body = {
                "ids": ids,
                "instances": [DIGIT] * UPSERT_ITEMS,
                "attributes": [{f"key-{k}": float(k) for k in chosen} for chosen in keys],
            }
            request = raw_post(
                "/v1/models/digits/catalogue/items",
                json.dumps(body).encode(),
                f"Authorization: Bearer {self.admin_token}\r\n".encode(),
            )
            await self.exchange("upserts", request)
            n += 1
            await asyncio.sleep(1.0)


async def _hostile_main(host: str, port: int, seconds: float, clients: int, **options) -> dict:
    """Every hostile client for ``seconds``; ``options``: :class:`_Hostile`'s ``grpc_port`` and
    ``admin_token``."""
    hostile = _Hostile(host, port, time.monotonic() + seconds, **options)
    grpc_port, admin_token = hostile.grpc_port, hostile.admin_token
    tasks = []
    for _ in range(clients):
        tasks += [hostile.repeat(k) for k in ("exclude", "lists", "headers", "malformed")]
        tasks.append(hostile.abort())
        tasks += [hostile.slow_body() for _ in range(2)]
        tasks += [hostile.non_reader(), hostile.idle(1000 // clients)]
        tasks.append(hostile.partial_heads(PARTIAL_HEADS // clients))
        if grpc_port is not None:
            tasks.append(asyncio.to_thread(hostile.grpc_trickle))
        if admin_token is not None:
            tasks.append(hostile.upserts(len(tasks)))
    running = [asyncio.ensure_future(task) for task in tasks]
    # Answers still awaited at the end are not waited for (a slow body is never finished).
    _, late = await asyncio.wait(running, timeout=seconds + STOP_GRACE_S)
    for task in late:
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    return {kind: dict(counts) for kind, counts in hostile.statuses.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--pids", default="", help="server processes to sample, comma-separated")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=4, help="hostile clients of each kind")
    parser.add_argument("--grpc-port", type=int, help="the server's GRPC_PORT: gRPC clients too")
    parser.add_argument("--admin-token", help="the server's ADMIN_TOKEN: catalogue upserts too")
    parser.add_argument("--hostile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hostile:
        options = {"grpc_port": args.grpc_port, "admin_token": args.admin_token}
        result = asyncio.run(
            _hostile_main(args.host, args.port, args.seconds, args.clients, **options)
        )
        print(json.dumps(result))
        return
    pids = [int(pid) for pid in args.pids.split(",") if pid]
    result = soak(
        args.host, args.port, pids, args.seconds, args.clients, args.grpc_port, args.admin_token
    )
    print(json.dumps(result.summary(), indent=2))


if __name__ == "__main__":
    main()
