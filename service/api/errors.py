"""The one place where errors become HTTP responses.

The body's shape depends on the route family, chosen here by the request's path:

- the Open Inference Protocol's routes (``/v2``, ``/v2/health/...``, ``/v2/models/...``) answer
  the protocol's ``{"error": "message"}``, with 400 for every malformed request (the protocol's
  status for a bad request, where the other routes answer 422);
- every other route, ``/v2/repository/...`` included (our admin routes, with their token
  errors), answers ``{"error": {"type", "message", "details"?}}``.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.model.errors import (
    ArtifactError,
    BatchTooLargeError,
    InvalidInputError,
    ModelError,
    ModelNotReadyError,
    NotFoundError,
    SpecError,
)

logger = logging.getLogger("service.api")


class AdminDisabledError(ModelError):
    """A repository route was called but no ADMIN_TOKEN is configured."""


class UnauthorizedError(ModelError):
    """A repository route was called without the right bearer token."""


class LoadRefusedError(ArtifactError):
    """A model version on disk was refused on request; the old version keeps serving."""


class OverloadedError(ModelError):
    """The server holds its limit of concurrent work (MAX_CONCURRENT_REQUESTS)."""


class WorkTimeoutError(ModelError):
    """A request's work did not finish within its time limit (REQUEST_TIMEOUT_S)."""


# Most specific first: the first matching class decides the status.
_DOMAIN_STATUS: tuple[tuple[type[ModelError], int, str], ...] = (
    (UnauthorizedError, 401, "unauthorized"),
    (AdminDisabledError, 403, "forbidden"),
    (LoadRefusedError, 409, "load_refused"),
    (BatchTooLargeError, 413, "batch_too_large"),
    (InvalidInputError, 422, "invalid_input"),
    (SpecError, 422, "invalid_input"),
    (NotFoundError, 404, "not_found"),
    (ModelNotReadyError, 503, "not_ready"),
    (ArtifactError, 503, "not_ready"),
    (OverloadedError, 503, "overloaded"),
    (WorkTimeoutError, 504, "timeout"),
)
# Problems listed in a 422's details (all of them are counted).
MAX_ERROR_DETAILS = 20
_HEADERS = {503: {"Retry-After": "5"}, 401: {"WWW-Authenticate": "Bearer"}}
_HTTP_TYPES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "request_too_large",
    415: "unsupported_media_type",
}


# Statuses the protocol routes answer instead: a malformed request is a 400 there.
_PROTOCOL_STATUS = {422: 400}
_PROTOCOL_PREFIX = "/v2/"
_NOT_PROTOCOL_PREFIX = "/v2/repository/"


def is_protocol_route(path: str) -> bool:
    """Whether ``path`` belongs to the Open Inference Protocol's routes (their error shape)."""
    if path == "/v2":
        return True
    return path.startswith(_PROTOCOL_PREFIX) and not path.startswith(_NOT_PROTOCOL_PREFIX)


def error_response(
    status: int, type_: str, message: str, details=None, *, path: str = ""
) -> JSONResponse:
    """A JSON error response in the shape of the route family of ``path`` (see the module
    docstring)."""
    headers = _HEADERS.get(status)
    if is_protocol_route(path):
        status = _PROTOCOL_STATUS.get(status, status)
        return JSONResponse({"error": message}, status_code=status, headers=headers)
    body = {"type": type_, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def status_of(error: ModelError) -> tuple[int, str]:
    """HTTP status and error type of a domain error."""
    for cls, status, type_ in _DOMAIN_STATUS:
        if isinstance(error, cls):
            return status, type_
    return 500, "internal_error"


async def _domain_error(request: Request, error: ModelError) -> JSONResponse:
    status, type_ = status_of(error)
    if status == 500:
        logger.error("%s %s failed: %s", request.method, request.url.path, error)
    return error_response(status, type_, str(error), path=request.url.path)


def _location(loc: tuple) -> str:
    parts = [str(p) for p in loc if p != "body"]
    text = ""
    for part in parts:
        text += f"[{part}]" if part.isdigit() else (f".{part}" if text else part)
    return text or "body"


async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    details = []
    for problem in error.errors():
        loc = tuple(problem.get("loc", ()))
        if problem.get("type") == "json_invalid":
            at = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
            details.append({"location": "body", "problem": f"not valid JSON{at}"})
        else:
            details.append({"location": _location(loc), "problem": problem.get("msg", "")})
    message = "; ".join(f"{d['location']}: {d['problem']}" for d in details[:5])
    if len(details) > 5:
        message += f"; and {len(details) - 5} more"
    if len(details) > MAX_ERROR_DETAILS:
        # An answer stays small whatever the request: a huge body has as many problems.
        details = [
            *details[:MAX_ERROR_DETAILS],
            {"location": "body", "problem": f"and {len(details) - MAX_ERROR_DETAILS} more"},
        ]
    return error_response(
        422, "invalid_request", message or "invalid request", details, path=request.url.path
    )


async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    type_ = _HTTP_TYPES.get(error.status_code, "http_error")
    response = error_response(error.status_code, type_, str(error.detail), path=request.url.path)
    response.headers.update(error.headers or {})  # e.g. Allow, on 405
    return response


async def _unexpected_error(request: Request, error: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(
        500, "internal_error", "internal error; the server log has details", path=request.url.path
    )


def install_error_handlers(app: FastAPI) -> None:
    """Map the domain hierarchy and framework errors to HTTP responses."""
    app.add_exception_handler(ModelError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
