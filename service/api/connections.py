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
  (:class:`service.api.limits.BodyDeadlineMiddleware` answers 408), and an app that does not
  answer soon after, or a body nobody reads any more, cannot hold the connection;
- a **connection cap** (``MAX_CONNECTIONS``): a connection over it is answered 503 at once and
  closed, before it costs more.

Deadlines are timestamps, checked a few times a second by one timer per server (see
:attr:`ConnectionLimits.sweep_interval_s`), so a request costs no timer of its own.

uvicorn starts these classes from the configuration that :func:`limited_config` builds, which
carries the limits into worker processes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import weakref
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional for uvicorn; h11 always comes with it
    HttpToolsProtocol = None  # type: ignore[assignment,misc]


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

    @property
    def sweep_interval_s(self) -> float:
        """How often deadlines are checked: a deadline passes at most this much late."""
        return min(1.0, max(0.05, min(self.header_timeout_s, self.body_timeout_s) / 8))


def raw_error(status: int, reason: str, type_: str, message: str, headers: dict | None = None):
    """A complete HTTP/1.1 error response, in the service's error shape, that closes the
    connection (written by the protocol itself, where no ASGI app is running)."""
    body = json.dumps({"error": {"type": type_, "message": message}}).encode()
    lines = [
        f"HTTP/1.1 {status} {reason}",
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


class _Deadlines:
    """The deadlines and the cap, shared by both protocol implementations (a mixin placed
    before uvicorn's class). Deadlines are times on the loop's clock, checked by
    :func:`_sweep`; None when not running."""

    config: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    connections: set
    server_state: Any
    cycle: Any

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._start_limits()

    def connection_made(self, transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if self._admit():
            self._arm_header_deadline()

    def connection_lost(self, exc) -> None:
        self._stop_limits()
        super().connection_lost(exc)  # type: ignore[misc]

    def _start_limits(self) -> None:
        self.limits = ConnectionLimits(**self.config.connection_limits)
        self._header_due: float | None = None
        self._body_due: float | None = None
        self._answer_due: float | None = None
        self._partial_request = False

    def _admit(self) -> bool:
        """Whether this new connection stays open (it is in ``connections`` already)."""
        if len(self.connections) > self.limits.max_connections:
            self.transport.write(
                raw_error(
                    503,
                    "Service Unavailable",
                    "overloaded",
                    f"the server holds its limit of {self.limits.max_connections} connections "
                    "(MAX_CONNECTIONS); try again later",
                    {"retry-after": "1"},
                )
            )
            self.transport.close()
            return False
        if self.server_state not in _SWEEPS:
            _sweep(self.loop, self.server_state, self.limits.sweep_interval_s)
        return True

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
                    "Request Timeout",
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


if HttpToolsProtocol is not None:

    class LimitedHttpToolsProtocol(_Deadlines, HttpToolsProtocol):
        """uvicorn's httptools protocol with :class:`ConnectionLimits`."""

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._partial_request = True
            self._arm_header_deadline()

        def on_headers_complete(self) -> None:
            self._disarm_header_deadline()
            self._arm_body_deadline()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._disarm_body_deadline()
            super().on_message_complete()

else:  # pragma: no cover
    LimitedHttpToolsProtocol = None  # type: ignore[assignment,misc]


class LimitedH11Protocol(_Deadlines, H11Protocol):
    """uvicorn's h11 protocol with :class:`ConnectionLimits`.

    h11 has no parser callbacks: the deadlines follow the state after each batch of events.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._timed_cycle = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_state()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_state()

    def _follow_state(self) -> None:
        cycle = self.cycle
        if cycle is not None and cycle is not self._timed_cycle:
            # A new request's headers are complete.
            self._timed_cycle = cycle
            self._disarm_header_deadline()
            if cycle.more_body:
                self._arm_body_deadline()
        if cycle is not None and not cycle.more_body:
            self._disarm_body_deadline()
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._partial_request = True
            self._arm_header_deadline()


def limited_config(app: Any, limits: ConnectionLimits, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration, serving with the limited protocols (httptools when installed,
    as uvicorn's "auto" would, else h11), whose ``limits`` it carries into worker processes."""
    if "http" not in options:
        name = "LimitedHttpToolsProtocol" if HttpToolsProtocol is not None else "LimitedH11Protocol"
        options["http"] = f"{__name__}:{name}"
    config = uvicorn.Config(app, **options)
    config.connection_limits = dataclasses.asdict(limits)  # read by the protocols
    return config
