"""uvicorn's HTTP protocols, httptools' and h11's, under the connection limits
(:class:`~service.api.machinery.connections.LimitedConnection`), and the configuration that
serves them.

With httptools (the implementation served when it is installed), an answer's head goes out
with its body's first bytes, in one write (:class:`HeadWithBody`).

uvicorn starts these classes from the configuration that :func:`limited_config` builds, which
carries the limits into worker processes.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import ssl
import time
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from service.api.machinery.connections import ConnectionLimits, LimitedConnection, resumed
from service.api.settings import Settings
from service.probes import PROBE_PATHS

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is optional for uvicorn; h11 always comes with it
    HttpToolsProtocol = None  # type: ignore[assignment,misc]


if HttpToolsProtocol is not None:

    class LimitedHttpToolsProtocol(LimitedConnection, HttpToolsProtocol):
        """uvicorn's httptools protocol with :class:`ConnectionLimits`.

        The head's size is counted as bytes arrive, before the parser sees them: httptools joins
        the pieces of a header as they come, in time quadratic in its length.
        """

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._start_head()

        def _start_head(self, reading: bool = True) -> None:
            self._in_head = reading
            self._head_bytes = 0
            self._head_tail = b""  # the last bytes seen, for an end of head split over reads

        def data_received(self, data: bytes) -> None:
            self._idle_since = time.monotonic()
            if self._refusal is not None:
                return  # the parser stopped at a malformed request: nothing after it is read
            if self._in_head and not self._head_fits(data):
                self._refuse(*self._head_too_large())
                return
            super().data_received(data)

        def _head_fits(self, data: bytes) -> bool:
            """Whether the head being read stays within MAX_HEADER_BYTES with ``data``: all of
            it, or an end of the head (an empty line) within what is left."""
            left = self.limits.max_header_bytes - self._head_bytes
            if len(data) <= left:
                self._head_bytes += len(data)
                self._head_tail = (self._head_tail + data)[-3:]
                return True
            return b"\r\n\r\n" in self._head_tail + data[: max(left, 0)]

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._partial_request = True
            self._arm_header_deadline()

        def on_headers_complete(self) -> None:
            self._start_head(reading=False)
            self._disarm_header_deadline()
            self._arm_body_deadline()
            super().on_headers_complete()
            cycle = self.cycle
            # A new request's; not a HEAD's, whose answer uvicorn ends without a body write; not
            # one answered (or begun) at once (a probe, see _start_asgi_task).
            if (
                cycle is not None
                and cycle.transport is self.transport
                and cycle.scope["method"] != "HEAD"
                and not cycle.response_started
            ):
                cycle.transport = HeadWithBody(self.transport)

        def on_response_complete(self) -> None:
            # An answer is never complete with its head held back; in case one were, it goes.
            transport = self.cycle.transport if self.cycle is not None else None
            if type(transport) is HeadWithBody:
                transport.flush()
            super().on_response_complete()

        def on_message_complete(self) -> None:
            self._start_head()
            self._disarm_body_deadline()
            super().on_message_complete()

        def _start_asgi_task(self, cycle, app) -> None:
            """A probe (GET of one of ``eager_paths``) is run at once, while its bytes are read,
            up to its answer or its first wait: as a task it would wait for a turn of the
            event loop behind everything else ready, and under heavy load each turn is long (an
            orchestrator kills a pod whose liveness probe takes over a second). The rest, if it
            waits, runs as a task in the same context."""
            scope = cycle.scope
            if scope["method"] != "GET" or scope["path"] not in self.limits.eager_paths:
                super()._start_asgi_task(cycle, app)
                return
            context = contextvars.copy_context()
            run = cycle.run_asgi(app)
            try:
                waiting = context.run(run.send, None)
            except StopIteration:
                return  # answered in full
            task = self.loop.create_task(resumed(run, waiting), context=context)
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

else:  # pragma: no cover
    LimitedHttpToolsProtocol = None  # type: ignore[assignment,misc]


class LimitedH11Protocol(LimitedConnection, H11Protocol):
    """uvicorn's h11 protocol with :class:`ConnectionLimits`.

    h11 has no parser callbacks: the deadlines follow the state after each batch of events.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._timed_cycle = None

    def data_received(self, data: bytes) -> None:
        self._idle_since = time.monotonic()
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


class HeadWithBody:
    """The transport one request's answer is written to: its head (status line and headers) is
    held back until its body's first bytes, and both go out in one write.

    uvicorn writes an answer's head and body apart: two system calls, two TCP segments, and a
    client woken twice for one small answer (on loopback, about a tenth of a one-digit
    request's time, most of it in the kernel's delivery of the extra segment). Only the head,
    the first write, is held, and only until the next: a streamed body goes out as it comes.
    An interim answer (``100 Continue``, written before the head) is not held; a connection
    closed with the head held (an app that failed after starting its answer) gets the head
    first, as it would have. A HEAD request's answer, which uvicorn ends without writing its
    body, is not given one of these.

    Parameters
    ----------
    transport : asyncio.Transport
        The connection's.
    """

    __slots__ = ("held", "state", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.held: bytes | None = None
        self.state = _HEAD_DUE

    def write(self, data: bytes) -> None:
        if self.state is _HEAD_HELD:
            self.state = _HEAD_WRITTEN
            data, self.held = self.held + data, None  # type: ignore[operator]
        elif self.state is _HEAD_DUE and not data.startswith(_INTERIM):
            self.state, self.held = _HEAD_HELD, bytes(data)
            return
        self.transport.write(data)

    def flush(self) -> None:
        """Write the head if it is held."""
        if self.state is _HEAD_HELD:
            self.write(b"")

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


_HEAD_DUE, _HEAD_HELD, _HEAD_WRITTEN = "head due", "head held", "head written"
# How an interim answer begins (uvicorn writes only ``100 Continue``, always as HTTP/1.1).
_INTERIM = b"HTTP/1.1 1"


class LimitedConfig(uvicorn.Config):
    """uvicorn's configuration, whose TLS context (``ssl``) the limited protocols apply
    themselves (``tls_context``, see :meth:`LimitedConnection._start_tls`): the listening sockets
    are plain TCP, so that a connection is under the limits from its first byte."""

    tls_context: ssl.SSLContext | None = None

    def load(self) -> None:
        super().load()
        self.tls_context, self.ssl = self.ssl, None


def service_limits(settings: Settings) -> ConnectionLimits:
    """The connection limits ``settings`` set for the service's HTTP server, the health probes'
    paths answered as soon as their head has arrived."""
    return ConnectionLimits(
        settings.header_timeout_s,
        settings.body_timeout_s,
        settings.max_connections,
        max_header_bytes=settings.max_header_bytes,
        send_timeout_s=settings.send_timeout_s,
        eager_paths=tuple(sorted(PROBE_PATHS)),
    )


def limited_config(app: Any, limits: ConnectionLimits, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration, serving with the limited protocols (httptools when installed,
    as uvicorn's "auto" would, else h11), whose ``limits`` it carries into worker processes."""
    if "http" not in options:
        name = "LimitedHttpToolsProtocol" if HttpToolsProtocol is not None else "LimitedH11Protocol"
        options["http"] = f"{__name__}:{name}"
    # h11 keeps its own limit on the bytes of an incomplete head.
    options.setdefault("h11_max_incomplete_event_size", limits.max_header_bytes)
    config = LimitedConfig(app, **options)
    config.connection_limits = dataclasses.asdict(limits)  # read by the protocols
    return config
