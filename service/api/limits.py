"""The service's limits above the connection (those below it: :mod:`service.api.connections`).

- the request body's size, enforced while the body streams in (not after buffering it);
- the request body's deadline (408);
- CORS, off unless ``CORS_ORIGINS`` is set;
- :class:`WorkLimiter`: how much model work may be under way at once (503 and Retry-After
  beyond it) and for how long one request waits for its work (504), used by the data plane.

See docs/limits.md for every limit, its setting and what a client sees.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.connections import BODY_DEADLINE_KEY
from service.api.errors import OverloadedError, WorkTimeoutError, error_response
from service.api.settings import Settings
from service.model.threads import available_cpus

T = TypeVar("T")

# Default bound on concurrent work, per CPU the process may use: deep enough that a burst of
# small requests (a few ms each) queues instead of failing, shallow enough that a queue never
# grows without end.
CONCURRENT_REQUESTS_PER_CPU = 64
# Headers a browser script may read from an answer when CORS is on.
EXPOSED_HEADERS = ["X-Model-Version", "X-Request-ID", "Retry-After"]


def install_limits(app: FastAPI, settings: Settings) -> None:
    """Add the request-level limits (size, body deadline) and, if configured, CORS."""
    app.add_middleware(RequestSizeLimitMiddleware, max_bytes=settings.max_request_bytes)
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


class RequestSizeLimitMiddleware:
    """Answer 413 to bodies over ``max_bytes``, declared (Content-Length) or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> str:
        return f"request body is larger than the limit of {self.max_bytes:,} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = value
                break
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_bytes:
                response = error_response(
                    413, "request_too_large", self._too_large(), path=scope["path"]
                )
                await response(scope, receive, send)
                return
            # The server reads exactly Content-Length bytes: nothing more to count.
            await self.app(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # Raised inside body parsing, FastAPI re-raises HTTPExceptions untouched.
                    raise HTTPException(413, self._too_large())
            return message

        await self.app(scope, limited_receive, send)


class BodyDeadlineMiddleware:
    """Answer 408 (and close the connection) when a request's body has not fully arrived
    BODY_TIMEOUT_S after its headers.

    The server's protocol keeps the deadline (:mod:`service.api.connections`: one deadline for
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
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def admit(self) -> None:
        """Take a slot, or raise :class:`OverloadedError` when none is free."""
        if not self._slots.acquire(blocking=False):
            raise OverloadedError(
                f"the server is at its limit of {self.max_concurrent} concurrent requests "
                "(MAX_CONCURRENT_REQUESTS); try again shortly"
            )

    def release(self) -> None:
        """Give back a slot taken by :meth:`admit` (for work that ran inline)."""
        self._slots.release()

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        """The worker threads for serial work: one per slot, so none waits for a thread."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self.max_concurrent, thread_name_prefix="besvm-worker"
            )
        return self._pool

    async def run(self, executor: concurrent.futures.Executor, work: Callable[[], T]) -> T:
        """Run ``work`` on ``executor`` under a slot taken by :meth:`admit`; its answer, or
        :class:`WorkTimeoutError` after ``timeout_s``. The slot is given back when the work is
        done, or dropped before it started."""
        context = contextvars.copy_context()
        try:
            future = executor.submit(context.run, work)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        deadline = asyncio.timeout(self.timeout_s)
        try:
            # On time out the wrapped future is cancelled: work not started yet never starts.
            async with deadline:
                return await asyncio.wrap_future(future)
        except TimeoutError:
            if not deadline.expired():
                raise  # the work's own
            raise WorkTimeoutError(
                f"the request did not finish within {self.timeout_s:g} s (REQUEST_TIMEOUT_S)"
            ) from None

    def close(self) -> None:
        """Stop the worker threads, dropping work not started and not waiting for work under
        way (see :meth:`DataPlane.close`)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
