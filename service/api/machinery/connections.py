"""Connection limits below the ASGI app: uvicorn's HTTP protocols with read deadlines and a cap
on open connections.

uvicorn bounds only the idle time between a response and the next request (``KEEP_ALIVE_S``).
A client that connects and sends nothing, or sends part of its headers and stalls, or trickles a
body after the app has answered without reading it, holds its connection (a file descriptor and
a protocol object) forever. These protocols add:

- a **header deadline** (``HEADER_TIMEOUT_S``), from the moment the connection is made (first
  request) or the request's first byte arrives (later requests) until its headers are complete.
  When it passes, a connection that sent part of a request gets a 408 and is closed; one that
  sent nothing is closed;
- a **body deadline** (``BODY_TIMEOUT_S``), from the end of the headers until the end of the
  body, for the whole body (a trickle cannot extend it). When it passes, the connection closes
  after the app's answer; the app is told through the request's scope
  (:class:`service.api.machinery.limits.BodyDeadlineMiddleware` answers 408), and an app that does
  not
  answer soon after, or a body nobody reads any more, cannot hold the connection;
- a **send deadline** (``SEND_TIMEOUT_S``): an answer the client has read nothing of for that
  long (its bytes still in the server's write buffer), or a closing connection whose last bytes
  the client never takes, is dropped (nginx's ``send_timeout``);
- a **head limit** (``MAX_HEADER_BYTES``): a request line and headers larger than that are
  answered 431 and the connection closes, counted as the bytes arrive (before the parser joins
  them);
- a **connection cap** (``MAX_CONNECTIONS``): at the cap, the connection idle the longest (no
  request under way, nothing unsent), else the one whose request's headers have been unfinished
  the longest, is closed to admit a new one, as nginx does; when there is neither, the new one
  is answered 503 at once and closed, before it costs more.

A request the parser refuses (malformed HTTP) gets the service's JSON error, after the answers
to the requests before it on the connection (pipelining), then the connection closes.

Deadlines are timestamps, checked a few times a second by one timer per server (see
:attr:`ConnectionLimits.sweep_interval_s`), so a request costs no timer of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http
import json
import ssl
import sys
import time
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Seconds past the body deadline that the app has to begin its answer (a 408) before the
# connection is closed under it.
BODY_GRACE_S = 1.0
# Where the scope of a request tells the app that its body is late (the message says why).
BODY_DEADLINE_KEY = "besvm.body_deadline_passed"


@dataclasses.dataclass(frozen=True)
class ConnectionLimits:
    """What the protocols enforce; seconds and a count."""

    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    max_header_bytes: int = 32 * 1024
    send_timeout_s: float = 60.0
    # GET requests of these paths (the health probes) are answered as soon as their head is
    # read, in the same turn of the event loop (see LimitedHttpToolsProtocol._start_asgi_task).
    eager_paths: tuple[str, ...] = ()

    @property
    def sweep_interval_s(self) -> float:
        """How often deadlines are checked: a deadline passes at most this much late."""
        shortest = min(self.header_timeout_s, self.body_timeout_s, self.send_timeout_s)
        return min(1.0, max(0.05, shortest / 8))


def raw_error(status: int, type_: str, message: str, headers: dict | None = None):
    """A complete HTTP/1.1 error response, in the service's error shape, that closes the
    connection (written by the protocol itself, where no ASGI app is running)."""
    body = json.dumps({"error": {"type": type_, "message": message}}).encode()
    lines = [
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _sweep(loop: asyncio.AbstractEventLoop, server_state: Any, interval_s: float) -> None:
    """Check the deadlines of every connection of one server, then again in ``interval_s``
    while it has connections: one timer per server, instead of timers armed and cancelled on
    every request (a few microseconds each, on the hot path)."""
    now = loop.time()
    for connection in list(server_state.connections):
        check = getattr(connection, "_check_deadlines", None)
        if check is not None:
            check(now)
    if server_state.connections:
        _SWEEPS[server_state] = loop.call_later(interval_s, _sweep, loop, server_state, interval_s)
    else:
        _SWEEPS.pop(server_state, None)


# The sweep of each server (uvicorn's ServerState) that has connections.
_SWEEPS: weakref.WeakKeyDictionary[Any, asyncio.TimerHandle] = weakref.WeakKeyDictionary()


class LimitedConnection:
    """The deadlines and the cap, shared by both protocol implementations (a mixin placed
    before uvicorn's class). Deadlines are times on the loop's clock, checked by
    :func:`_sweep`; None when not running."""

    config: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    connections: set
    server_state: Any
    cycle: Any
    timeout_keep_alive: float
    timeout_keep_alive_task: Any

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._start_limits()

    def connection_made(self, transport) -> None:
        tls = getattr(self.config, "tls_context", None)
        if tls is not None:
            self._start_tls(transport, tls)
            return
        super().connection_made(transport)  # type: ignore[misc]
        self._idle_since = time.monotonic()
        if self._admit():
            self._arm_header_deadline()

    def connection_lost(self, exc) -> None:
        if self._handshake is not None:  # closed before its handshake began
            self._forget()
            return
        self._stop_limits()
        super().connection_lost(exc)  # type: ignore[misc]

    # -- TLS -------------------------------------------------------------------------------------

    def _start_tls(self, transport: asyncio.Transport, context: ssl.SSLContext) -> None:
        """A TLS connection is one from its first byte: counted toward MAX_CONNECTIONS, under
        HEADER_TIMEOUT_S from then (its handshake included), closed for another at the cap as
        an idle one is. asyncio's own TLS (``create_server(ssl=...)``) hands a connection over
        only once the handshake is done, and holds unfinished handshakes for 60 s, uncounted."""
        self.connections.add(self)
        self.transport = transport
        self._idle_since = time.monotonic()
        if not self._admit():
            return
        self._arm_header_deadline()
        handoff = _Handoff()
        handshake = self.loop.start_tls(
            transport,
            handoff,
            context,
            server_side=True,
            ssl_handshake_timeout=self.limits.header_timeout_s,
        )
        # The TLS protocol must take the connection's bytes from the first: uvloop starts
        # reading as soon as this method returns (a pause asked for here is not kept), and a
        # task would only begin the handshake later. So its first step runs now, up to its
        # wait for the handshake: the TLS protocol is then in place.
        try:
            waiting = handshake.send(None)
        except BaseException:
            self._forget()
            transport.close()
            return
        self._handshake = self.loop.create_task(
            self._handshake_then_serve(transport, handshake, waiting, handoff)
        )

    async def _handshake_then_serve(
        self,
        transport: asyncio.Transport,
        handshake: Coroutine[Any, Any, asyncio.Transport | None],
        waiting: Any,
        handoff: _Handoff,
    ) -> None:
        try:
            secure = await resumed(handshake, waiting)
        except BaseException as error:  # a failed, late or aborted handshake: nothing to serve
            self._forget()
            transport.close()
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        self._handshake = None
        if secure is None or secure.is_closing() or handoff.lost is not None:
            self._forget()
            return
        # uvicorn's protocol starts here, on the TLS transport (the header deadline stays the
        # one armed when the connection was made), with what arrived with the handshake.
        super().connection_made(secure)  # type: ignore[misc]
        secure.set_protocol(self)  # type: ignore[arg-type]
        for data in handoff.received:
            self.data_received(data)  # type: ignore[attr-defined]

    def _forget(self) -> None:
        """Drop a connection that never got to serve (its handshake failed or never began)."""
        self._handshake = None
        self._stop_limits()
        self.connections.discard(self)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._idle_since = time.monotonic()
        if self._refusal is not None and not self._answers_due():
            self._send_refusal()

    def _start_limits(self) -> None:
        self.limits = ConnectionLimits(**self.config.connection_limits)
        self._header_due: float | None = None
        self._body_due: float | None = None
        self._answer_due: float | None = None
        self._send_due: float | None = None
        self._unsent = 0
        self._partial_request = False
        self._idle_since = 0.0
        # An error answer that waits for the answers to the requests before it.
        self._refusal: bytes | None = None
        # A TLS connection's handshake, while it runs (see _start_tls).
        self._handshake: asyncio.Task | None = None

    # -- the connection cap ----------------------------------------------------------------------

    def _idle(self) -> bool:
        """No request under way or waiting on this connection, and nothing left to send
        (``_idle_since``: since when, or since its last bytes arrived, on the monotonic clock:
        the loop's is coarser, and ties would make "the oldest" arbitrary)."""
        cycle = self.cycle
        return (
            (cycle is None or cycle.response_complete)
            and not self._partial_request
            and not getattr(self, "pipeline", None)
            and not self.transport.is_closing()
            and not self.transport.get_write_buffer_size()
        )

    def _head_unfinished(self) -> bool:
        """A request's head (request line and headers) begun and not complete, and nothing
        else under way on this connection (``_header_due``: the head's deadline, so the
        earliest is the oldest)."""
        cycle = self.cycle
        return (
            self._partial_request
            and self._header_due is not None
            and (cycle is None or cycle.response_complete)
            and not getattr(self, "pipeline", None)
            and not self.transport.is_closing()
        )

    def _admit(self) -> bool:
        """Whether this new connection stays open (it is in ``connections`` already): at the
        cap, the connection idle the longest is closed for it, else the one whose request's
        head has been unfinished the longest (no more entitled to its place than a silent
        one: nginx does the same), if there is one."""
        if len(self.connections) > self.limits.max_connections:
            others = [
                connection
                for connection in self.connections
                if connection is not self and isinstance(connection, LimitedConnection)
            ]
            idle = [connection for connection in others if connection._idle()]
            unfinished = [connection for connection in others if connection._head_unfinished()]
            if idle:
                min(idle, key=lambda connection: connection._idle_since).transport.close()
            elif unfinished:
                min(unfinished, key=lambda connection: connection._header_due)._make_room()
            else:
                self._refuse_connection()
                return False
        if self.server_state not in _SWEEPS:
            _sweep(self.loop, self.server_state, self.limits.sweep_interval_s)
        return True

    def _make_room(self) -> None:
        """Close this connection, whose request's head is unfinished, for a new one."""
        self._disarm_header_deadline()
        self.transport.write(
            raw_error(
                408,
                "request_timeout",
                "the request's headers were not complete when the server, at its limit of "
                f"{self.limits.max_connections} connections (MAX_CONNECTIONS), needed the "
                "connection for another",
            )
        )
        self.transport.close()

    def _refuse_connection(self) -> None:
        if getattr(self.config, "tls_context", None) is not None:
            self.transport.close()  # no handshake yet: an HTTP answer would be noise to it
            return
        self.transport.write(
            raw_error(
                503,
                "overloaded",
                f"the server holds its limit of {self.limits.max_connections} connections, none "
                "of them idle (MAX_CONNECTIONS); try again later",
                {"retry-after": "1"},
            )
        )
        self.transport.close()

    def _check_deadlines(self, now: float) -> None:
        if self._header_due is not None and now >= self._header_due:
            self._header_due = None
            self._header_deadline_passed()
        if self._body_due is not None and now >= self._body_due:
            self._body_due = None
            self._body_deadline_passed(now)
        if self._answer_due is not None and now >= self._answer_due:
            self._answer_due = None
            self._close_if_unanswered()
        self._check_send_deadline(now)
        if (
            self.timeout_keep_alive_task is None
            and time.monotonic() - self._idle_since >= self.timeout_keep_alive
            and self._idle()
        ):
            # Idle with no keep-alive timer: uvicorn arms one when an answer completes, not
            # when the rest of a body it answered early (a 413, a 503) has been read.
            self.transport.close()

    # -- sending -------------------------------------------------------------------------------

    def _check_send_deadline(self, now: float) -> None:
        """Drop the connection when bytes have waited in its write buffer SEND_TIMEOUT_S
        without the client taking any (the buffer shrinking re-arms the deadline)."""
        unsent = self.transport.get_write_buffer_size()
        if not unsent:
            self._send_due, self._unsent = None, 0
            return
        if self._send_due is None or unsent < self._unsent:
            self._send_due = now + self.limits.send_timeout_s
        self._unsent = unsent
        if now >= self._send_due:
            self._send_due = None
            self.transport.abort()

    # -- malformed requests --------------------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request its parser refused (called where it catches the
        parser's error): the service's JSON error, with the parser's reason, once the requests
        before it on the connection are answered."""
        error = sys.exception()
        if getattr(error, "error_status_hint", 400) == 431:  # h11's own limit on a head
            self._refuse(*self._head_too_large())
            return
        self._refuse(400, "bad_request", f"malformed HTTP request: {error or msg}")

    def _head_too_large(self) -> tuple[int, str, str]:
        return (
            431,
            "headers_too_large",
            "the request line and headers are larger than the limit of "
            f"{self.limits.max_header_bytes:,} bytes (MAX_HEADER_BYTES)",
        )

    def _refuse(self, status: int, type_: str, message: str) -> None:
        """Answer a request that cannot be read with an error and close the connection: now, or
        once the requests before it (complete, being answered) have their answers."""
        self._refusal = raw_error(status, type_, message)
        self._disarm_header_deadline()
        if self._answers_due():
            self.transport.pause_reading()
        else:
            self._send_refusal()

    def _answers_due(self) -> bool:
        """Whether requests read in full before the one refused still wait for answers."""
        cycle = self.cycle
        under_way = cycle is not None and not cycle.response_complete and not cycle.more_body
        return under_way or bool(getattr(self, "pipeline", None))

    def _send_refusal(self) -> None:
        if not self.transport.is_closing():
            self.transport.write(self._refusal or b"")
            self.transport.close()

    # -- headers -------------------------------------------------------------------------------

    def _arm_header_deadline(self) -> None:
        if self._header_due is None:
            self._header_due = self.loop.time() + self.limits.header_timeout_s

    def _disarm_header_deadline(self) -> None:
        self._partial_request = False
        self._header_due = None

    def _header_deadline_passed(self) -> None:
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request's headers are late while the one before is being answered:
            # end the connection after that answer.
            self.cycle.keep_alive = False
            return
        if self._partial_request:
            self.transport.write(
                raw_error(
                    408,
                    "request_timeout",
                    "the request's headers did not arrive within "
                    f"{self.limits.header_timeout_s:g} s (HEADER_TIMEOUT_S)",
                )
            )
        self.transport.close()

    # -- body ----------------------------------------------------------------------------------

    def _arm_body_deadline(self) -> None:
        self._body_due = self.loop.time() + self.limits.body_timeout_s
        self._answer_due = None

    def _disarm_body_deadline(self) -> None:
        self._body_due = None

    def _body_deadline_passed(self, now: float) -> None:
        cycle = self.cycle
        if self.transport.is_closing():
            return
        if cycle is None or cycle.response_complete:
            # The app answered without reading the whole body, and the rest is late.
            self.transport.close()
            return
        # The connection ends after the app's answer. The app is told (BODY_DEADLINE_KEY in the
        # scope, and a wake-up of a receive() waiting) so that it answers 408; an app that
        # does not look is told the client is gone (http.disconnect) shortly after.
        cycle.keep_alive = False
        if not cycle.response_started:
            cycle.scope.setdefault("extensions", {})[BODY_DEADLINE_KEY] = (
                f"the request body did not arrive within {self.limits.body_timeout_s:g} s "
                "(BODY_TIMEOUT_S)"
            )
            cycle.message_event.set()
            self._answer_due = now + BODY_GRACE_S

    def _close_if_unanswered(self) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.more_body and not cycle.response_started:
            self.transport.close()

    def _stop_limits(self) -> None:
        self._disarm_header_deadline()
        self._disarm_body_deadline()
        self._answer_due = None


async def resumed(coroutine: Coroutine[Any, T, R], waiting: Any) -> R:
    """Finish a ``coroutine`` whose first step has run and yielded ``waiting`` (the future it
    awaits), as its task would: each future it yields is waited for, then it goes on."""
    try:
        while True:
            if waiting is None:  # a bare yield: a turn of the loop
                await asyncio.sleep(0)
            else:
                await asyncio.wait((waiting,))
            waiting = coroutine.send(None)  # type: ignore[arg-type]
    except StopIteration as done:
        return done.value
    except asyncio.CancelledError:
        coroutine.close()  # its own cleanup (start_tls closes the transport)
        raise


class _Handoff(asyncio.Protocol):
    """What a TLS connection's bytes go to from the end of its handshake until the limited
    protocol takes over: asyncio delivers the data that came with the handshake's last message
    at once, before the coroutine that awaited the handshake runs again."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.lost: tuple[BaseException | None] | None = None

    def data_received(self, data: bytes) -> None:
        self.received.append(bytes(data))

    def eof_received(self) -> bool:
        return True  # the limited protocol, once it takes over, sees the close

    def connection_lost(self, exc: BaseException | None) -> None:
        self.lost = (exc,)
