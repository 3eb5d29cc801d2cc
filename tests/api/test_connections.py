"""The limited HTTP protocols, both implementations (httptools and h11), in a real uvicorn
server on a loopback port, with an app that has no deadlines of its own."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import pytest
import uvicorn

from service.api.connections import (
    ConnectionLimits,
    LimitedH11Protocol,
    LimitedHttpToolsProtocol,
    limited_config,
)
from tests.api.conftest import read_until_closed

pytestmark = pytest.mark.slow

HELD = 20.0
LIMITS = ConnectionLimits(header_timeout_s=0.5, body_timeout_s=1.0, max_connections=4)
PROTOCOLS = [
    pytest.param(LimitedH11Protocol, id="h11"),
    pytest.param(
        LimitedHttpToolsProtocol,
        id="httptools",
        marks=pytest.mark.skipif(LimitedHttpToolsProtocol is None, reason="no httptools"),
    ),
]


async def reading_app(scope, receive, send) -> None:
    """Reads the whole body, however long it takes, then answers 200."""
    if scope["type"] != "http":
        return
    while True:
        message = await receive()
        if message["type"] == "http.disconnect" or not message.get("more_body"):
            break
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.contextmanager
def running(protocol):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = limited_config(
        reading_app,
        LIMITS,
        http=protocol,
        host="127.0.0.1",
        port=port,
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=1,
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

        held = [socket.create_connection(address) for _ in range(LIMITS.max_connections)]
        over = socket.create_connection(address)
        head, _, body = read_until_closed(over).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ")
        assert b"retry-after: 1" in head.lower()
        assert json.loads(body)["error"]["type"] == "overloaded"
        for sock in held:
            sock.close()
