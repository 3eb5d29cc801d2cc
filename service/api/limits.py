"""Request body size limit, enforced while the body streams in (not after buffering it)."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import error_response


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
