"""The hot routes without FastAPI's per-request machinery.

``POST /classify``, ``/v1/models/{name}/classify``, ``/search``, ``/v1/models/{name}/search`` and
``/v2/models/{name}/infer`` (and its ``/versions/{version}`` form) are answered here, by the same
route code (:data:`service.api.rest.routes.HOT_HANDLERS`,
:data:`service.api.protocol.rest.HOT_HANDLERS`) and
with the same error answers (:func:`service.api.errors.error_answer`), but without the router's
walk over every route, the per-request exit stack, the dependency solver and the exception
middleware: together several times a one-digit model's own time. The routes stay FastAPI's too:
they are documented (``/openapi.json``) and answer every other method (405).

:class:`HotRoutes` sits inside every other middleware (the key check, the limits, the request's
id and metrics), so that nothing else changes for these requests; it names the route in the
scope, as the router would, for the metrics' route label.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.errors import error_answer
from service.api.machinery.payloads import PayloadLog
from service.api.machinery.responses import VERSION_HEADER

Handler = Callable[[Request, dict[str, str]], Awaitable[Response]]
_VERSION = VERSION_HEADER.encode("latin-1")


class HotRoutes:
    """ASGI middleware: answer POSTs to the routes of ``handlers`` (by template) directly.

    Parameters
    ----------
    app : ASGIApp
    routes : list
        The app's routes (read once, when the middleware stack is built).
    handlers : dict of str to Handler
    """

    def __init__(
        self,
        app: ASGIApp,
        routes: list,
        handlers: dict[str, Handler],
        payloads: PayloadLog | None = None,
    ) -> None:
        self.app = app
        self.payloads = payloads
        self.exact: dict[str, tuple[object, Handler]] = {}
        self.templated: list[tuple[re.Pattern, object, Handler]] = []
        for route in routes:
            handler = handlers.get(getattr(route, "path", ""))
            if handler is None or "POST" not in getattr(route, "methods", ()):
                continue
            if route.param_convertors:
                self.templated.append((route.path_regex, route, handler))
            else:
                self.exact[route.path] = (route, handler)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            path = scope["path"]
            found, params = self.exact.get(path), {}
            if found is None:
                for pattern, route, handler in self.templated:
                    match = pattern.match(path)
                    if match is not None:
                        found, params = (route, handler), match.groupdict()
                        break
            if found is not None:
                route, handler = found
                scope["route"], scope["path_params"] = route, params
                request = Request(scope, receive)
                try:
                    response = await handler(request, params)
                except Exception as error:
                    response = await error_answer(request, error)
                if self.payloads is not None and self.payloads.sampled():
                    await _record(self.payloads, request, response)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _record(payloads: PayloadLog, request: Request, response: Response) -> None:
    """Queue the payload records of a sampled request: its body (as read by the route; one the
    route never read is read now) and the answer's."""
    try:
        body = await request.body()
    except Exception:  # the client went away: the answer says so
        body = b""
    version = next((v for k, v in response.raw_headers if k == _VERSION), b"").decode("latin-1")
    payloads.record(
        request.scope["route"].path,
        body,
        request.headers.get("content-type", "application/json"),
        bytes(response.body),
        response.media_type or "application/json",
        response.status_code,
        version or None,
    )
