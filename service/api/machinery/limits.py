"""The service's limits above the connection (those below it:
:mod:`service.api.machinery.connections`).

- the request body's size, enforced while the body streams in (not after buffering it);
- :class:`MemoryBudget`: the request bytes a process holds at once (``MAX_BUFFERED_BYTES``),
  bodies as they arrive and what they decode into; 503 and Retry-After beyond it. Large answers
  are written in pieces, each once the client has read the one before, so the bytes a request
  holds are given back only once its answer is (nearly) all with the kernel;
- the request body's deadline (408);
- CORS, off unless ``CORS_ORIGINS`` is set;
- :class:`WorkLimiter`: how much model work may be under way at once (503 and Retry-After
  beyond it) and for how long one request waits for its work (504), used by the data plane.

See docs/operating/limits.md for every limit, its setting and what a client sees.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import numpy as np
from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import (
    MemoryLimitError,
    OverloadedError,
    RequestTooLargeError,
    WorkTimeoutError,
    error_response,
)
from service.api.machinery.connections import BODY_DEADLINE_KEY
from service.api.machinery.headers import first_header
from service.api.settings import Settings
from service.model.threads import available_cpus, lower_priority

T = TypeVar("T")

# Default bound on concurrent work, per CPU the process may use: deep enough that a burst of
# small requests (a few ms each) queues instead of failing, shallow enough that a queue never
# grows without end.
CONCURRENT_REQUESTS_PER_CPU = 64
# Headers a browser script may read from an answer when CORS is on.
EXPOSED_HEADERS = ["X-Model-Version", "X-Request-ID", "Retry-After"]
# Bytes of each request that MAX_BUFFERED_BYTES does not count: a small request never waits on
# the memory of large ones (the bound of docs/operating/limits.md#memory counts these per
# connection instead).
UNCOUNTED_BYTES = 64 * 1024
# A body is counted twice as it arrives: the chunks received, and the body joined from them.
BODY_COPIES = 2
# Answers are written at most this much at a time, each piece once the client has taken the
# one before (the server's flow control), so an answer to a client that does not read holds at
# most this much in the server's write buffer beyond the request's own bytes.
ANSWER_PIECE_BYTES = 64 * 1024
# What one connection may hold beyond MAX_BUFFERED_BYTES, at most: unread request bytes in the
# server's buffers (64 KiB, then reading pauses, plus one read of up to 256 KiB), the first
# UNCOUNTED_BYTES of its request, and its answer's bytes in the write buffer (64 KiB, then
# writing waits, plus one piece of ANSWER_PIECE_BYTES).
CONNECTION_BYTES = 512 * 1024
# Where a request's scope carries its RequestHold (for what its decoding adds).
HOLD_KEY = "besvm.hold"
# Memory that decoding one JSON value may take at its peak (pydantic's parse tree and the Python
# objects it builds, then their conversion to arrays): the worst shapes (empty arrays, short
# strings) take about 120 bytes a value, with room to spare.
DECODED_BYTES_PER_VALUE = 160
# Bytes of a body scanned at once when its values are counted outside strings.
_SCAN_CHUNK = 256 * 1024
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
# The bytes that open a JSON value beyond the first: a comma or a colon before it, or an
# opening bracket around it.
_VALUE_MARKS = b",:[{"
_VALUE_MARK_BYTES = tuple(bytes([mark]) for mark in _VALUE_MARKS)
_IS_VALUE_MARK = np.zeros(256, dtype=bool)
_IS_VALUE_MARK[list(_VALUE_MARKS)] = True


def json_values(raw: bytes, limit: int) -> int:
    """An upper bound on the JSON values of ``raw`` (numbers, strings, object keys, arrays and
    objects), counted without decoding anything: one plus the commas, colons and opening
    brackets outside strings.

    The bytes are counted first (C speed); only when that count is over ``limit`` and the body
    has strings are they counted again outside strings (numpy, a chunk at a time), so a text
    full of commas is not taken for a million values.

    Raises
    ------
    RequestTooLargeError
        More than ``limit`` values (413, MAX_JSON_VALUES).
    """
    values = 1 + sum(map(raw.count, _VALUE_MARK_BYTES))
    if values > limit and b'"' in raw:
        values = 1 + _value_marks_outside_strings(raw)
    if values > limit:
        raise RequestTooLargeError(
            f"the body holds more than {limit:,} JSON values (MAX_JSON_VALUES): send fewer, "
            "or large tensors as binary data"
        )
    return values


def _value_marks_outside_strings(raw: bytes) -> int:
    """Commas, colons and opening brackets of ``raw`` outside its strings. A quote ends or
    starts a string unless an odd number of backslashes comes right before it."""
    count, inside, backslashes = 0, 0, 0
    for start in range(0, len(raw), _SCAN_CHUNK):
        chunk = np.frombuffer(raw, np.uint8, min(_SCAN_CHUNK, len(raw) - start), start)
        quotes = chunk == _QUOTE
        is_backslash = chunk == _BACKSLASH
        if backslashes or is_backslash.any():
            # The last position before each that is no backslash (-1 - the run carried in
            # from the chunk before, for a run that starts there): the run before position i
            # is i - 1 - that.
            positions = np.arange(chunk.size, dtype=np.int64)
            last_other = np.maximum.accumulate(np.where(is_backslash, -1 - backslashes, positions))
            before = np.empty_like(last_other)
            before[0], before[1:] = -1 - backslashes, last_other[:-1]
            quotes &= (positions - 1 - before) % 2 == 0
            backslashes = int(chunk.size - 1 - last_other[-1])
        # Strings opened before a byte, this chunk's quote included: odd means inside.
        opened = np.cumsum(quotes, dtype=np.int64) + inside
        count += int(np.count_nonzero(_IS_VALUE_MARK[chunk] & (opened % 2 == 0)))
        inside = int(opened[-1] % 2)
    return count


def install_limits(app: FastAPI, settings: Settings, budget: MemoryBudget) -> None:
    """Add the request-level limits (size, body deadline, the process's ``budget`` of request
    bytes, which gRPC shares) and, if configured, CORS."""
    app.add_middleware(
        RequestSizeLimitMiddleware, max_bytes=settings.max_request_bytes, budget=budget
    )
    app.add_middleware(BodyDeadlineMiddleware)
    if settings.cors_origins:
        # Added last, so outermost: preflights are answered before any other limit applies.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Content-Type", "Authorization", "X-Request-ID"],
            expose_headers=EXPOSED_HEADERS,
            max_age=600,
        )


class MemoryBudget:
    """The request bytes one process holds at once (``MAX_BUFFERED_BYTES``), shared by its
    requests, HTTP and gRPC, through :class:`RequestHold`; safe to use from any thread.

    Parameters
    ----------
    capacity : int
        Bytes.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Bytes held now."""
        return self._held

    def available(self) -> int:
        """Bytes free now."""
        return self.capacity - self._held

    def take(self, n: int) -> bool:
        """Hold ``n`` more bytes if there is room (True), else nothing (False)."""
        with self._lock:
            if self._held + n > self.capacity:
                return False
            self._held += n
            return True

    def give(self, n: int) -> None:
        """Give back ``n`` bytes taken by :meth:`take`."""
        with self._lock:
            self._held -= n

    def exhausted(self, what: str, needed: int) -> MemoryLimitError:
        """The error of a request whose ``what`` needs ``needed`` bytes that are not free."""
        return MemoryLimitError(
            f"the server holds its limit of {self.capacity:,} bytes of requests at once "
            f"(MAX_BUFFERED_BYTES), and {what} needs {needed:,}; try again shortly"
        )


class RequestHold:
    """What one request holds of a :class:`MemoryBudget`, from its first body byte until its
    answer is written: its body (:data:`BODY_COPIES` times) and what decoding it costs. The
    first :data:`UNCOUNTED_BYTES` are free.

    Parameters
    ----------
    budget : MemoryBudget
    """

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.counted = 0
        self.taken = 0

    def add(self, n: int, what: str) -> None:
        """Count ``n`` more bytes of ``what`` (words for messages).

        Raises
        ------
        MemoryLimitError
            The process holds too much at the moment (503, Retry-After).
        RequestTooLargeError
            The request alone would hold more than the whole budget (413).
        """
        counted = self.counted + n
        needed = max(0, counted - UNCOUNTED_BYTES)
        if needed > self.taken:
            if needed > self.budget.capacity:
                raise RequestTooLargeError(
                    f"{what} would hold {needed:,} bytes of memory; this server holds at most "
                    f"{self.budget.capacity:,} for all requests at once (MAX_BUFFERED_BYTES)"
                )
            if not self.budget.take(needed - self.taken):
                raise self.budget.exhausted(what, needed)
            self.taken = needed
        self.counted = counted

    def release(self) -> None:
        """Give back everything held."""
        if self.taken:
            self.budget.give(self.taken)
            self.taken = 0


class RequestSizeLimitMiddleware:
    """Answer 413 to bodies over ``max_bytes``, declared (Content-Length) or streamed, and keep
    each request's bytes within the process's :class:`MemoryBudget` (503 beyond it; a declared
    body that does not fit is refused before any of it is read).

    The request's :class:`RequestHold` lives in its scope (:data:`HOLD_KEY`), so that decoding
    the body counts what it adds; it is given back once the answer is written, in pieces of
    :data:`ANSWER_PIECE_BYTES`, each after the client has read enough of the one before.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, budget: MemoryBudget) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.budget = budget

    def _too_large(self) -> str:
        return f"request body is larger than the limit of {self.max_bytes:,} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = first_header(scope["headers"], b"content-length")
        refusal = None
        if declared is not None and declared.isdigit():
            needed = BODY_COPIES * int(declared) - UNCOUNTED_BYTES
            if int(declared) > self.max_bytes:
                refusal = (413, "request_too_large", self._too_large())
            elif needed > self.budget.available():
                refusal = (503, "overloaded", str(self.budget.exhausted("the body", needed)))
        if refusal is not None:
            response = error_response(*refusal, path=scope["path"])
            await response(scope, receive, send)
            return
        hold = scope[HOLD_KEY] = RequestHold(self.budget)
        # The server reads exactly Content-Length bytes: only a streamed body is counted here.
        streamed = declared is None or not declared.isdigit()
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                received += size
                if streamed and received > self.max_bytes:
                    # Raised inside body parsing, FastAPI re-raises HTTPExceptions untouched.
                    raise HTTPException(413, self._too_large())
                hold.add(BODY_COPIES * size, "the request body")
            return message

        async def send_in_pieces(message: Message) -> None:
            body = message.get("body", b"")
            if message["type"] != "http.response.body" or len(body) <= ANSWER_PIECE_BYTES:
                await send(message)
                return
            more_body = message.get("more_body", False)
            view = memoryview(body)
            for start in range(0, len(body), ANSWER_PIECE_BYTES):
                end = start + ANSWER_PIECE_BYTES
                await send(
                    {
                        "type": "http.response.body",
                        "body": view[start:end],
                        "more_body": more_body or end < len(body),
                    }
                )

        try:
            await self.app(scope, limited_receive, send_in_pieces)
        finally:
            hold.release()


class BodyDeadlineMiddleware:
    """Answer 408 (and close the connection) when a request's body has not fully arrived
    BODY_TIMEOUT_S after its headers.

    The server's protocol keeps the deadline (:mod:`service.api.machinery.connections`: one
    deadline for
    the whole body, so a client trickling a byte at a time cannot extend it) and, when it
    passes, marks the request's scope and wakes a ``receive`` that waits. Here that mark
    becomes an HTTPException, like the size limit, so that no route goes on with half a body.
    Nothing is timed per request here: looking at the mark costs a dictionary lookup.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def receive_by_deadline() -> Message:
            message = await receive()
            late = scope.get("extensions", {}).get(BODY_DEADLINE_KEY)
            if late is not None and message["type"] == "http.request":
                raise HTTPException(408, late, headers={"Connection": "close"})
            return message

        await self.app(scope, receive_by_deadline, send)


def memory_bound(settings: Settings, loaded: int, work: int) -> int:
    """The most resident memory one server process takes, in bytes (docs/operating/limits.md,
    "Memory"): ``loaded`` (the process with its models loaded and warmed up) +
    MAX_BUFFERED_BYTES + MAX_CONNECTIONS x :data:`CONNECTION_BYTES` + with GRPC_PORT, the
    messages gRPC holds while they arrive, before they can be counted (a slot of
    MAX_CONCURRENT_REQUESTS each, MAX_REQUEST_BYTES at most) + ``work`` (the models' own
    working memory for the requests at work: one batch in parallel kernels, and serial ones,
    which are small by construction; for the digits model under 32 MiB)."""
    connections = settings.max_connections * CONNECTION_BYTES
    arriving = 0
    if settings.grpc_port is not None:
        arriving = concurrency_bound(settings) * settings.max_request_bytes
    return loaded + settings.max_buffered_bytes + connections + arriving + work


def concurrency_bound(settings: Settings) -> int:
    """MAX_CONCURRENT_REQUESTS, or its default from the CPUs this process may use."""
    if settings.max_concurrent_requests is not None:
        return settings.max_concurrent_requests
    return CONCURRENT_REQUESTS_PER_CPU * available_cpus()


class WorkLimiter:
    """A bound on concurrent work and a time limit on waiting for it.

    A piece of work holds a slot from :meth:`admit` until it has finished, wherever it runs: a
    request that stops waiting (its time limit passed) leaves its thread running, and that
    thread keeps its slot until it returns. Over the bound, :meth:`admit` raises
    :class:`OverloadedError` at once instead of queueing.

    Parameters
    ----------
    max_concurrent : int
        Slots.
    timeout_s : float
        Seconds :meth:`run` waits for a piece of work, its wait for a thread included.
    """

    def __init__(self, max_concurrent: int, timeout_s: float) -> None:
        self.max_concurrent = max_concurrent
        self.timeout_s = timeout_s
        # Slots free now: a count under a lock, as nothing ever waits for one (a semaphore,
        # written in Python, cost a one-digit request a few microseconds for the same).
        self._free = max_concurrent
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def free(self) -> int:
        """Slots free now."""
        return self._free

    def admit(self) -> None:
        """Take a slot, or raise :class:`OverloadedError` when none is free."""
        with self._lock:
            if self._free > 0:
                self._free -= 1
                return
        raise OverloadedError(
            f"the server is at its limit of {self.max_concurrent} concurrent requests "
            "(MAX_CONCURRENT_REQUESTS); try again shortly"
        )

    def release(self, slots: int = 1) -> None:
        """Give back ``slots`` slots taken by :meth:`admit` (from any thread)."""
        with self._lock:
            if self._free + slots > self.max_concurrent:
                raise ValueError("a slot was given back that was not taken")
            self._free += slots

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The worker threads for serial work: one per slot, so none waits for a thread."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.max_concurrent, thread_name_prefix="besvm-worker", initializer=lower_priority
            )
        return self._pool

    def submit(
        self, executor: concurrent.futures.Executor, work: Callable[[], T], slots: int = 1
    ) -> concurrent.futures.Future[T]:
        """Start ``work`` on ``executor`` under ``slots`` slots taken by :meth:`admit` (one
        per request it answers), given back when the work is done, or dropped before it
        started."""
        context = contextvars.copy_context()
        try:
            future = executor.submit(context.run, work)
        except BaseException:
            self.release(slots)
            raise
        future.add_done_callback(lambda _: self.release(slots))
        return future

    async def wait(self, awaitable: Awaitable[T], timed: bool = True) -> T:
        """``awaitable``'s answer, or :class:`WorkTimeoutError` after ``timeout_s`` (``timed``;
        untimed: short work whose effect must be known, done or not, such as taking a lock)."""
        deadline = asyncio.timeout(self.timeout_s if timed else None)
        try:
            # On time out the awaitable is cancelled: work not started yet never starts.
            async with deadline:
                return await awaitable
        except TimeoutError:
            if not deadline.expired():
                raise  # the work's own
            raise WorkTimeoutError(
                f"the request did not finish within {self.timeout_s:g} s (REQUEST_TIMEOUT_S)"
            ) from None

    async def run(
        self,
        executor: concurrent.futures.Executor,
        work: Callable[[], T],
        timed: bool = True,
        stop: Callable[[], bool] | None = None,
    ) -> T:
        """Run ``work`` on ``executor`` under a slot taken by :meth:`admit`; its answer, or
        :class:`WorkTimeoutError` after ``timeout_s`` (``timed``, as :meth:`wait`). The slot is
        given back when the work is done, or dropped before it started.

        ``stop``, when given, is asked at the time limit whether the work stops (True:
        WorkTimeoutError) or is past its point of no return (False: its answer is waited for,
        however long it takes: a change that is committing)."""
        future = self.submit(executor, work)
        try:
            return await self.wait(asyncio.wrap_future(future), timed)
        except WorkTimeoutError:
            if stop is not None and not stop():
                return await asyncio.wrap_future(future)
            raise

    def close(self) -> None:
        """Stop the worker threads, dropping work not started and not waiting for work under
        way (see :meth:`DataPlane.close`)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
