"""The limited HTTP protocols, both implementations (httptools and h11), in a real uvicorn
server on a loopback port, with an app that has no deadlines of its own: deadlines, the
connection cap (the oldest idle connection makes room), the head limit, the send deadline, and
malformed requests answered in the service's JSON after the requests before them; and an
answer's head written with its body (httptools)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import threading
import time

import pytest
import uvicorn

from service.api.machinery.connections import ConnectionLimits
from service.api.machinery.http_protocols import (
    HeadWithBody,
    LimitedH11Protocol,
    LimitedHttpToolsProtocol,
    limited_config,
)
from tests.api.conftest import read_until_closed

pytestmark = pytest.mark.slow

HELD = 20.0
LIMITS = ConnectionLimits(
    header_timeout_s=0.5,
    body_timeout_s=1.0,
    max_connections=4,
    max_header_bytes=1024,
    send_timeout_s=1.0,
)
# Deadlines far away: what closes a connection here is the cap.
PATIENT = ConnectionLimits(header_timeout_s=30, body_timeout_s=30, max_connections=4)
# Bytes of the answer to GET /big: more than the kernel's socket buffers hold on loopback.
BIG_ANSWER = 16 * 2**20
PROTOCOLS = [
    pytest.param(LimitedH11Protocol, id="h11"),
    pytest.param(
        LimitedHttpToolsProtocol,
        id="httptools",
        marks=pytest.mark.skipif(LimitedHttpToolsProtocol is None, reason="no httptools"),
    ),
]


async def reading_app(scope, receive, send) -> None:
    """Reads the whole body, however long it takes, then answers 200 (GET /big: with
    BIG_ANSWER bytes)."""
    if scope["type"] != "http":
        return
    while True:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body"):
            break
    body = bytes(BIG_ANSWER) if scope["path"] == "/big" else b"ok"
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def running(
    protocol, limits: ConnectionLimits = LIMITS, keep_alive_s: float = 1.0, app=reading_app
):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = limited_config(
        app,
        limits,
        http=protocol,
        host="127.0.0.1",
        port=port,
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=keep_alive_s,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + HELD
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield ("127.0.0.1", port)
    finally:
        server.should_exit = True
        thread.join(HELD)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_deadlines_and_cap(protocol):
    with running(protocol) as address:
        silent = socket.create_connection(address)
        assert read_until_closed(silent) == b""

        partial = socket.create_connection(address)
        partial.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Le")
        head, _, body = read_until_closed(partial).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 ")
        assert json.loads(body)["error"]["type"] == "request_timeout"

        # The app would wait for this body for ever: the protocol tells it the client is gone.
        stalled = socket.create_connection(address)
        stalled.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nab")
        assert read_until_closed(stalled) == b""
        # A second request on a kept-alive connection has the same header deadline.
        second = socket.create_connection(address)
        second.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\nGET / HT")
        answers = read_until_closed(second)
        assert answers.startswith(b"HTTP/1.1 200 ")
        assert b"HTTP/1.1 408 " in answers

        # Connections busy with a request each (its body under way, none idle): one more is
        # refused.
        held = [socket.create_connection(address) for _ in range(LIMITS.max_connections)]
        for sock in held:
            sock.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nab")
        over = socket.create_connection(address)
        head, _, body = read_until_closed(over).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ")
        assert b"retry-after: 1" in head.lower()
        assert json.loads(body)["error"]["type"] == "overloaded"
        for sock in held:
            sock.close()


def _status(sock: socket.socket) -> int:
    """The status of the next answer on ``sock``, read whole (head and Content-Length body)."""
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(4096)
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(
        next(line for line in head.lower().split(b"\r\n") if b"content-length" in line)[15:]
    )
    while len(body) < length:
        body += sock.recv(4096)
    return int(head.split(b" ", 2)[1])


def _still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.setblocking(True)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_at_the_cap_the_oldest_idle_connection_makes_room(protocol):
    """Issue 22, defect 11: idle connections at the cap locked every new client out (503)."""
    with running(protocol, PATIENT, keep_alive_s=30) as address:
        answered = socket.create_connection(address)  # idle after an answer: a keep-alive
        answered.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert _status(answered) == 200
        silent = [socket.create_connection(address) for _ in range(PATIENT.max_connections - 1)]
        time.sleep(0.2)
        newcomer = socket.create_connection(address)
        newcomer.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert _status(newcomer) == 200
        # The oldest idle connection went, the others stay.
        assert read_until_closed(answered, 5) == b""
        assert all(_still_open(sock) for sock in silent)
        # An idle connection goes before one whose request has begun.
        for sock in silent:
            sock.sendall(b"GET / HT")
        another = socket.create_connection(address)
        another.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert _status(another) == 200
        assert read_until_closed(newcomer, 5) == b""  # idle since its answer: the oldest idle
        assert all(_still_open(sock) for sock in silent)
        for sock in [*silent, another]:
            sock.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_at_the_cap_the_oldest_unfinished_head_makes_room(protocol):
    """Issue 36, defect 7: connections with unfinished request lines held every place (1,100
    sockets of 26 bytes each: a normal client got 503), where silent ones were closed."""
    with running(protocol, PATIENT, keep_alive_s=30) as address:
        partial = []
        for _ in range(PATIENT.max_connections):
            sock = socket.create_connection(address)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHo")
            partial.append(sock)
            time.sleep(0.05)  # each older than the next
        for j in range(3):  # each newcomer takes the place of the oldest unfinished head
            newcomer = socket.create_connection(address)
            newcomer.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            assert _status(newcomer) == 200
            head, _, body = read_until_closed(partial[j], 5).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408 ")
            assert "MAX_CONNECTIONS" in json.loads(body)["error"]["message"]
            assert all(_still_open(sock) for sock in partial[j + 1 :])
            newcomer.close()
            time.sleep(0.2)  # the server sees the close; then the cap is full again
            partial.append(socket.create_connection(address))
            partial[-1].sendall(b"GET /healthz HTTP/1.1\r\nHo")
            time.sleep(0.05)
        # A request whose body is under way is never closed for another.
        for sock in partial[3:]:
            sock.sendall(b"st: t\r\nContent-Length: 10\r\n\r\nab")
        time.sleep(0.2)
        over = socket.create_connection(address)
        assert read_until_closed(over, 5).startswith(b"HTTP/1.1 503 ")
        assert all(_still_open(sock) for sock in partial[3:])
        for sock in partial:
            sock.close()


def _error(answer: bytes) -> tuple[int, dict, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"], head


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_malformed_requests_get_the_json_error(protocol):
    """Issue 22, defect 12: parse errors answered text/plain, not the documented JSON error."""
    with running(protocol) as address:
        sock = socket.create_connection(address)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n")
        status, error, head = _error(read_until_closed(sock))
        assert status == 400
        assert error["type"] == "bad_request"
        assert error["message"].startswith("malformed HTTP request")
        assert b"connection: close" in head.lower()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_malformed_request_after_pipelined_ones_is_answered_after_them(protocol):
    """Issue 22, defect 12: the requests before a malformed one on a connection got no answer
    (one of them was executed)."""
    with running(protocol) as address:
        sock = socket.create_connection(address)
        sock.sendall(
            b"GET / HTTP/1.1\r\nHost: t\r\n\r\n" * 2 + b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"
        )
        answers = read_until_closed(sock)
        assert answers.count(b"HTTP/1.1 200 ") == 2, answers
        last = answers[answers.index(b"HTTP/1.1 400 ") :]
        assert _error(last)[0] == 400


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_head_over_the_limit_gets_431(protocol):
    """Issue 22, defect 3: no limit on a header's size (a 96 MiB value answered 200)."""
    with running(protocol) as address:
        sock = socket.create_connection(address)
        # Refused while it is still being sent: the answer comes first.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * (4 << 20) + b"\r\n\r\n")
        answer = read_until_closed(sock)
        status, error, _ = _error(answer)
        assert status == 431
        assert error["type"] == "headers_too_large"
        assert "MAX_HEADER_BYTES" in error["message"]
        # A head within the limit, sent a byte at a time, is read as ever.
        sock = socket.create_connection(address)
        for byte in b"GET / HTTP/1.1\r\nHost: t\r\nX-Small: abc\r\n\r\n":
            sock.sendall(bytes([byte]))
        assert _status(sock) == 200
        sock.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_answer_nobody_reads_is_dropped_after_the_send_deadline(protocol):
    """Issue 22, defect 5: clients that never read their answer were held for ever."""
    with running(protocol) as address:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(address)
        sock.sendall(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
        time.sleep(LIMITS.send_timeout_s + 2.0)  # read nothing meanwhile
        received = read_until_closed(sock)
        # What the kernel's buffers held, then the connection was dropped: never all of it.
        assert received.startswith(b"HTTP/1.1 200 ")
        assert len(received) < BIG_ANSWER


class _Recording:
    """A transport that records what is written to it, and whether it was closed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n"


def test_an_answers_head_goes_out_with_its_body_in_one_write():
    transport = _Recording()
    held = HeadWithBody(transport)
    held.write(HEAD)
    assert transport.writes == []
    held.write(b"body")
    assert transport.writes == [HEAD + b"body"]
    # Whatever follows (a streamed body's later parts) goes out as it comes.
    held.write(b"more")
    assert transport.writes == [HEAD + b"body", b"more"]
    # The rest of the transport is the connection's.
    assert held.get_write_buffer_size() == 0


def test_an_interim_answer_is_not_held_and_the_head_after_it_is():
    transport = _Recording()
    held = HeadWithBody(transport)
    held.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    held.write(HEAD)
    held.write(b"body")
    assert transport.writes[1:] == [HEAD + b"body"]


def test_a_connection_closed_with_the_head_held_gets_the_head_first():
    transport = _Recording()
    held = HeadWithBody(transport)
    held.write(HEAD)
    held.close()
    assert transport.writes == [HEAD]
    assert transport.closed


@pytest.mark.skipif(LimitedHttpToolsProtocol is None, reason="no httptools")
def test_answers_through_the_server_are_whole_with_and_without_100_continue():
    with (
        running(LimitedHttpToolsProtocol, PATIENT) as address,
        socket.create_connection(address) as sock,
    ):
        sock.settimeout(HELD)
        for _ in range(3):  # keep-alive: each request's cycle holds its own head
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
            answer = b""
            while not answer.endswith(b"ok"):
                answer += sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        sock.sendall(
            b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
        )
        assert sock.recv(4096) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"hi")
        answer = b""
        while not answer.endswith(b"ok"):
            answer += sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


@pytest.mark.skipif(LimitedHttpToolsProtocol is None, reason="no httptools")
def test_a_head_request_is_answered_and_a_request_pipelined_after_it_too():
    # uvicorn ends a HEAD's answer without writing its body: its head must not wait for one.
    with (
        running(LimitedHttpToolsProtocol, PATIENT) as address,
        socket.create_connection(address) as sock,
    ):
        sock.settimeout(5)  # answers come in milliseconds
        sock.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"content-length: 2\r\n" in head
        sock.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = b""
        while not answers.endswith(b"ok"):
            answers += sock.recv(4096)
        assert answers.count(b"HTTP/1.1 200 OK\r\n") == 2
        assert answers.index(b"\r\n\r\n") < answers.index(b"HTTP/1.1 200 OK\r\n", 1)


# Seconds the event loop is held at each turn by hogging_app's /hog, and its turns.
HOG_TURN_S = 1.0
HOG_TURNS = 6


async def hogging_app(scope, receive, send) -> None:
    """GET /hog holds the event loop HOG_TURN_S at each of its next HOG_TURNS turns (the work
    of other requests, as heavy load makes each turn long); GET /healthz answers "ok" without
    reading a body, as the service's probes do; anything else as :func:`reading_app`."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/healthz":
        headers = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    if scope["path"] == "/hog":
        loop = asyncio.get_running_loop()

        def hog(turns: int) -> None:
            time.sleep(HOG_TURN_S)
            if turns > 1:
                loop.call_soon(hog, turns - 1)

        loop.call_soon(hog, HOG_TURNS)
    await reading_app(scope, receive, send)


@pytest.mark.skipif(LimitedHttpToolsProtocol is None, reason="no httptools")
def test_a_probe_is_answered_in_the_turn_of_the_event_loop_that_reads_it():
    """Issue 36, defect 6: under heavy load /healthz took up to 3.3 s. A probe ran as a task,
    a turn of the event loop after its bytes were read, behind everything else ready; each turn
    of a loaded server is long. Here each turn takes HOG_TURN_S: a probe answered as a task
    takes at least that long, one answered as it is read less (the rest of the turn under way)."""
    limits = dataclasses.replace(PATIENT, eager_paths=("/healthz",))
    with running(LimitedHttpToolsProtocol, limits, 30, hogging_app) as address:
        probe = socket.create_connection(address)  # made before the loop is held
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        assert _status(probe) == 200
        hog = socket.create_connection(address)
        hog.sendall(b"GET /hog HTTP/1.1\r\nHost: t\r\n\r\n")
        assert _status(hog) == 200
        latencies = []
        for _ in range(3):
            time.sleep(HOG_TURN_S / 2)  # into the middle of a turn
            started = time.monotonic()
            probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
            assert _status(probe) == 200
            latencies.append(time.monotonic() - started)
        probe.close()
        hog.close()
    assert sorted(latencies)[1] < 0.9 * HOG_TURN_S, latencies
