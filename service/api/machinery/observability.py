"""Request ids, the access log, request metrics and the log format.

**Request ids.** A client's ``X-Request-ID`` is kept when it is 1 to 128 characters of
``A-Z a-z 0-9 . _ : -``; any other value is replaced by a fresh id (32 random hex digits), never
echoed (a header is no place for a client's arbitrary bytes, and a request must not fail over
its tracing header). The id is in the ``X-Request-ID`` header of every answer, errors included,
and in every log line written while the request is served (a context variable, read by
:class:`RequestIdFilter`), the access line included.

**Where.** :func:`install` puts :class:`RequestObservability` around the whole app, outside
Starlette's error middleware, so that the 500 of an unhandled error and its log line carry the
id as well.

**Logs.** One JSON object per line (``LOG_FORMAT=json``, :class:`JsonFormatter`) or plain text,
at ``LOG_LEVEL``; the service writes the access log itself (``ACCESS_LOG``; uvicorn's is off),
health probes and scrapes at debug level.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import itertools
import logging
import math
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.machinery.headers import first_header
from service.api.machinery.metrics import CONTENT_TYPE, Metrics

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID_NAME = REQUEST_ID_HEADER.encode()
REQUEST_ID_PATTERN = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
UNMATCHED_ROUTE = "unmatched"
# Answers to orchestrators and scrapers, every few seconds: logged at debug, not info.
QUIET_PATHS = frozenset(
    {
        "/healthz",
        "/readyz",
        "/metrics",
        "/v2/health/live",
        "/v2/health/ready",
        "/inference.GRPCInferenceService/ServerLive",
        "/inference.GRPCInferenceService/ServerReady",
    }
)
# Longest path an access line quotes.
MAX_LOGGED_PATH = 1024
ACCESS_FIELDS = ("method", "path", "status", "duration_ms", "client", "key")
# An access line's message: client, method, path, status and milliseconds.
ACCESS_MESSAGE = '%s "%s %s" %s %.3f ms'

access_logger = logging.getLogger("service.api.access")

router = APIRouter()


@router.get(
    "/metrics",
    tags=["operations"],
    response_class=Response,
    responses={
        200: {
            "description": "The metrics in Prometheus's text format (of every worker process).",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
async def metrics(request: Request) -> Response:
    """Prometheus metrics: requests, latency, batch sizes, search rows read, model loads and
    versions (docs/operating/observability.md lists them)."""
    # Off the loop: with several workers this reads every worker's files.
    body = await run_in_threadpool(request.app.state.metrics.exposition)
    return Response(body, media_type=CONTENT_TYPE)


@dataclass(slots=True)
class RequestContext:
    """What the log lines and metrics of one request share: its id, the model that answered it
    (set by the data plane once it has the model's snapshot), and the fingerprint of the API key
    that allowed it (set by :mod:`service.api.machinery.auth`; empty for open routes)."""

    request_id: str
    model: str = ""
    key: str = ""


_current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "besvm_request", default=None
)


def current_request() -> RequestContext | None:
    """The request being served in this context (None outside requests)."""
    return _current.get()


def answered_by(model: str) -> None:
    """Record that model ``model`` answers the current request (its metrics' model label)."""
    context = _current.get()
    if context is not None:
        context.model = model


@contextlib.contextmanager
def request_scope(request_id: str | None) -> Iterator[RequestContext]:
    """The context of one request served outside the HTTP middleware (a gRPC call): the id
    (a client's, if valid, else a fresh one) in its log lines, the model and key it names."""
    if request_id is None or not REQUEST_ID_PATTERN.fullmatch(request_id.encode("latin-1")):
        request_id = fresh_request_id()
    context = RequestContext(request_id)
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


# Fresh ids: this process's random prefix and a counter, 32 hex digits as a random id would be,
# unique across processes and restarts without a system call per request (os.urandom's).
_ID_PREFIX = os.urandom(8).hex()
_id_numbers = itertools.count()


def fresh_request_id() -> str:
    """A new request id (32 hex digits)."""
    return f"{_ID_PREFIX}{next(_id_numbers) & 0xFFFFFFFFFFFFFFFF:016x}"


def request_id_of(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's X-Request-ID if valid, else a fresh one (see the module docstring)."""
    value = first_header(headers, _REQUEST_ID_NAME)
    if value is not None and REQUEST_ID_PATTERN.fullmatch(value):
        return value.decode("ascii")
    return fresh_request_id()


def route_of(scope: Scope, routes: list) -> str:
    """The template of the route that matched (or would have matched, for a request answered
    before routing, e.g. a 413), else :data:`UNMATCHED_ROUTE`: bounded label values."""
    route = scope.get("route")
    if route is None:
        partial = None
        for candidate in routes:
            match, _ = candidate.matches(scope)
            if match is Match.FULL:
                route = candidate
                break
            if match is Match.PARTIAL and partial is None:
                partial = candidate
        route = route or partial
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED_ROUTE


class RequestObservability:
    """ASGI middleware: request id, request metrics and the access log of every HTTP request.

    Parameters
    ----------
    app : ASGIApp
        The app's middleware stack, routing included.
    routes : list
        The app's routes, to name the route of requests answered before routing.
    metrics : Metrics
    access_log : bool
        Write one access line per request.
    """

    def __init__(self, app: ASGIApp, routes: list, metrics: Metrics, access_log: bool) -> None:
        self.app = app
        self.routes = routes
        self.metrics = metrics
        self.access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = request_id_of(scope["headers"])
        context = RequestContext(request_id)
        token = _current.set(context)
        id_header = (_REQUEST_ID_NAME, request_id.encode("ascii"))
        status = 500  # unless an answer starts: the server answers 500 to an app that raised

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        self.metrics.request_started()
        failed = False
        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            failed = True
            raise
        finally:
            seconds = time.perf_counter() - started
            route = route_of(scope, self.routes)
            self.metrics.request_finished(scope["method"], route, context.model, status, seconds)
            if self.access_log:
                _log_access(scope, status, seconds)
            # After an error the server logs it once this returns, in this request's task: its
            # line keeps the id.
            if not failed:
                _current.reset(token)


def _log_access(scope: Scope, status: int, seconds: float) -> None:
    client = scope.get("client")
    context = _current.get()
    log_access(
        scope["method"],
        scope["path"],
        status,
        seconds,
        None if client is None else f"{client[0]}:{client[1]}",
        "" if context is None else context.key,
    )


def log_access(
    method: str, path: str, status: int | str, seconds: float, client: str | None, key: str = ""
) -> None:
    """One access line (HTTP, and gRPC with method ``GRPC``, the call's path and its status
    code's name): at debug for probes and scrapes, else info; ``key`` is the fingerprint of the
    API key that allowed the request, if any."""
    level = logging.DEBUG if path in QUIET_PATHS else logging.INFO
    if not access_logger.isEnabledFor(level):
        return
    handler = _sole_json_handler(access_logger, level)
    if handler is not None:
        context = _current.get()
        request_id = None if context is None else context.request_id
        handler.write_later(
            JsonFormatter.access_line,
            (handler.formatter, time.time(), level, method, path, status, seconds, client, key,
             request_id),
        )  # fmt: skip
        return
    arguments, fields = _access_fields(method, path, status, seconds, client, key)
    # The record made directly: Logger.log would first look for the caller's file and line in
    # the stack, which an access line never shows.
    access_logger.handle(
        access_logger.makeRecord(
            access_logger.name, level, "", 0, ACCESS_MESSAGE, arguments, None, extra=fields
        )
    )


def _access_fields(
    method: str, path: str, status: int | str, seconds: float, client: str | None, key: str
) -> tuple[tuple, dict[str, Any]]:
    """The arguments of an access line's message (:data:`ACCESS_MESSAGE`) and its fields."""
    fields = {
        "method": method,
        "path": path[:MAX_LOGGED_PATH],
        "status": status,
        "duration_ms": round(seconds * 1000.0, 3),
        "client": client,
    }
    if key:
        fields["key"] = key
    return (client, method, fields["path"], status, fields["duration_ms"]), fields


def _sole_json_handler(logger: logging.Logger, level: int) -> BackgroundStreamHandler | None:
    """The one handler that writes ``logger``'s records of ``level``, when a line can be given
    to it without a LogRecord: a :class:`BackgroundStreamHandler` with a :class:`JsonFormatter`
    whose filters only add the request id, and no other handler or logger filter on the way.
    Else None: the record goes through ``logging``.

    An access line is the one record of every request: made as a record, filtered, formatted
    and queued through logging's handler lock, it cost a one-digit request more than all of its
    model's numpy calls. Given to this handler, its values are queued as they are (a tuple of
    strings and numbers) and the writer thread formats them (:meth:`BackgroundStreamHandler.
    write_later`)."""
    handlers: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        handlers.extend(current.handlers)
        if not current.propagate:
            break
        current = current.parent  # type: ignore[assignment]
    if len(handlers) != 1:
        return None
    handler = handlers[0]
    if (
        isinstance(handler, BackgroundStreamHandler)
        and level >= handler.level
        and isinstance(handler.formatter, JsonFormatter)
        and all(isinstance(f, RequestIdFilter) for f in handler.filters)
    ):
        return handler
    return None


def install(app: FastAPI, metrics: Metrics, access_log: bool) -> None:
    """Wrap ``app``'s whole middleware stack in :class:`RequestObservability`: outside
    Starlette's error middleware, whose 500 answers would otherwise miss the id header and
    their log lines the id."""
    build_stack = app.build_middleware_stack

    def build_middleware_stack() -> ASGIApp:
        return RequestObservability(build_stack(), app.router.routes, metrics, access_log)

    app.build_middleware_stack = build_middleware_stack  # type: ignore[method-assign]


# -- log format ------------------------------------------------------------------------------


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` (None outside requests) to every record a handler writes."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _current.get()
        record.request_id = None if context is None else context.request_id
        return True


_LEVEL_NAMES = {
    level: logging.getLevelName(level).lower()
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    ``request_id``; access lines add ``method``, ``path``, ``status``, ``duration_ms``,
    ``client`` and ``key``; errors add ``exception`` (the traceback)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The second last formatted and its text, as one tuple: the writer thread and the
        # threads that log read and replace it at once.
        self._second: tuple[int | None, str] = (None, "")

    def _timestamp(self, created: float) -> str:
        """``created`` in ISO 8601 to the millisecond, UTC, as ``datetime.isoformat`` writes
        it; the date and time up to the second computed once a second (the writer formats
        hundreds of lines a second)."""
        fraction, whole = math.modf(created)
        second, microseconds = int(whole), round(fraction * 1e6)  # as datetime rounds
        if microseconds >= 1_000_000:
            second, microseconds = second + 1, microseconds - 1_000_000
        cached, text = self._second
        if second != cached:
            text = datetime.datetime.fromtimestamp(second, datetime.UTC).strftime(
                "%Y-%m-%dT%H:%M:%S"
            )
            self._second = (second, text)
        return f"{text}.{microseconds // 1000:03d}+00:00"

    def format(self, record: logging.LogRecord) -> str:
        extra = {f: record.__dict__[f] for f in ACCESS_FIELDS if f in record.__dict__}
        if record.exc_info:
            extra["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            extra["exception"] = record.exc_text
        return self.line(
            record.created, record.levelno, record.name, record.getMessage(),
            getattr(record, "request_id", None), extra,
        )  # fmt: skip

    def line(
        self,
        created: float,
        level: int,
        logger: str,
        message: str,
        request_id: str | None,
        extra: dict[str, Any],
    ) -> str:
        """The line of a record of these values (what :meth:`format` writes), ``extra`` last."""
        line: dict[str, Any] = {
            "ts": self._timestamp(created),
            "level": _level_name(level),
            "logger": logger,
            "message": message,
            "request_id": request_id,
            **extra,
        }
        return orjson.dumps(line, default=str).decode()

    def access_line(
        self,
        created: float,
        level: int,
        method: str,
        path: str,
        status: int | str,
        seconds: float,
        client: str | None,
        key: str,
        request_id: str | None,
    ) -> str:
        """The line of an access line's values: what :meth:`format` writes for its record
        (:func:`log_access`), made in one step. The log writer makes tens of these at a time
        while it holds the interpreter, and the event loop waits that long for it: made in one
        step, a line costs about a fifth less."""
        milliseconds = seconds * 1000.0
        path = path[:MAX_LOGGED_PATH]
        line: dict[str, Any] = {
            "ts": self._timestamp(created),
            "level": _level_name(level),
            "logger": access_logger.name,
            "message": ACCESS_MESSAGE % (client, method, path, status, milliseconds),
            "request_id": request_id,
            "method": method,
            "path": path,
            "status": status,
            "duration_ms": round(milliseconds, 3),
            "client": client,
        }
        if key:
            line["key"] = key
        return orjson.dumps(line, default=str).decode()


def _level_name(level: int) -> str:
    return _LEVEL_NAMES.get(level) or logging.getLevelName(level).lower()


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
# How long the log writer gathers lines once one has come: long enough that a busy server pays
# one wake-up, one format loop and one write for tens of lines, short enough that the event loop
# never waits long for the interpreter while the writer makes them. Each batch costs the server
# more in thread switches (the writer taking the interpreter from the loop, and again after its
# write) than in formatting, so fewer batches save CPU, while a longer gathering raises the p99
# at one client (docs/measurements/benchmarks-operations.md, "The log writer's thread
# switches").
LOG_FLUSH_INTERVAL_S = 0.010


class BackgroundStreamHandler(logging.StreamHandler):
    """A stream handler that writes on a thread of its own.

    The thread that logs runs the filters (the request id is read there, from the request's
    context), formats the record and queues the line: the record itself is never held. The
    writer thread sleeps while nothing is queued; once a line comes it gathers for
    :data:`LOG_FLUSH_INTERVAL_S`, then writes what has queued up with one write and one flush:
    a wake-up per line (a thread switch, the interpreter's lock handed over and back) would
    cost a request more than formatting its line. Lines keep their order. :meth:`close`
    (``logging.shutdown``, at exit) writes what is still queued; a process killed outright
    loses the lines of its last moments.

    Records are formatted by the thread that logs, not queued: queued records (objects with a
    dictionary each, a busy server's hundreds of them at a time) would ride through the
    collector's young generations and cost the event loop more than formatting them. Access
    lines are the exception, queued as flat tuples of their values (:meth:`write_later`):
    nothing for the collector to walk, and formatted hundreds at a time on the writer thread,
    warm, they cost a fraction of what formatting each one among a request's other work would
    (docs/measurements/benchmarks-operations.md has the figures).
    """

    def __init__(self, stream=None, max_pending: int | None = None) -> None:
        super().__init__(stream)
        # Items queued at most by write_later (None: no bound); more are refused, not queued.
        self.max_pending = max_pending
        # Neither format shows a record's process or thread: skip looking them up for every
        # record (a system call and two lookups of each access line).
        logging.logProcesses = logging.logThreads = logging.logMultiprocessing = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = threading.Event()
        self._starting = threading.Lock()
        self._writer: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self.write_line(line)

    def write_line(self, line: str) -> None:
        """Queue a formatted line (without its terminator), as :meth:`emit` does a record's:
        from any thread, without the handler's lock."""
        self._put(line + self.terminator)

    def write_later(self, make_line: Callable[..., str], values: tuple) -> bool:
        """Queue the line ``make_line(*values)``, made on the writer thread, in its place among
        the others: ``values`` are strings and numbers (no object the collector has to walk).
        False, nothing queued, when ``max_pending`` items wait already."""
        if self.max_pending is not None and self._queue.qsize() >= self.max_pending:
            return False
        self._put((make_line, values))
        return True

    def _put(self, item: str | tuple) -> None:
        if self._writer is None:
            with self._starting:
                if self._writer is None:
                    writer = threading.Thread(
                        target=self._write, name="besvm-log-writer", daemon=True
                    )
                    writer.start()
                    self._writer = writer
        self._queue.put(item)

    def _write(self) -> None:
        while True:
            # Asleep while nothing is logged; once a line comes, the others of the next moment
            # are gathered with it.
            first = self._queue.get()
            closing = self._closing.wait(LOG_FLUSH_INTERVAL_S)
            lines: list[str] = []
            item = first
            with contextlib.suppress(queue.Empty):
                while True:
                    if type(item) is str:
                        lines.append(item)
                    elif item is not _WAKE:
                        try:
                            lines.append(item[0](*item[1]) + self.terminator)
                        except Exception:
                            self.handleError(logging.makeLogRecord({"msg": "a line's values"}))
                    item = self._queue.get_nowait()
            if lines:
                try:
                    self.stream.write("".join(lines))
                    self.stream.flush()
                except Exception:  # a closed or broken stream: as logging does, go on
                    self.handleError(logging.makeLogRecord({"msg": f"{len(lines)} log lines"}))
            if closing:
                return

    def close(self) -> None:
        writer = self._writer
        if writer is not None and writer.is_alive():
            self._closing.set()
            self._queue.put(_WAKE)
            writer.join(timeout=5)
        super().close()


# What close() queues to wake a writer thread asleep on an empty queue.
_WAKE = ("wake",)


def logging_config(level: str, log_format: str) -> dict[str, Any]:
    """``logging.config.dictConfig`` of the server: uvicorn's loggers and the service's on one
    handler (stderr) with the request id, in ``log_format`` ("json" or "text") at ``level``.
    uvicorn's access logger stays silent: the service writes its own access lines."""
    formatter = (
        {"()": f"{__name__}.JsonFormatter"} if log_format == "json" else {"format": TEXT_FORMAT}
    )
    level = level.upper()
    logger = {"handlers": ["default"], "level": level, "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": f"{__name__}.RequestIdFilter"}},
        "formatters": {"default": formatter},
        "handlers": {
            "default": {
                "class": f"{__name__}.BackgroundStreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "default",
                "filters": ["request_id"],
            }
        },
        "loggers": {
            "uvicorn": logger,
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
            "service": logger,
        },
    }
