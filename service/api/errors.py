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
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from service.api.rest.schemas.common import ErrorResponse
from service.model.errors import (
    ArtifactError,
    BatchTooLargeError,
    InvalidInputError,
    ModelError,
    ModelNotReadyError,
    NotFoundError,
    ShardsUnavailableError,
    SnapshotRefusedError,
    SpecError,
    VersionConflictError,
)

logger = logging.getLogger("service.api")


class LoadRefusedError(ArtifactError):
    """A model version on disk was refused on request; the old version keeps serving."""


class TrafficPolicyError(ModelError):
    """A traffic policy (an alias, its canary or shadow) that cannot be applied: the file or
    the change is not valid, a model it names is not served, or the file cannot be written."""


class RateLimitedError(ModelError):
    """The API key's rate (API_KEYS_FILE) is spent for now; ``retry_after_s``: when the next
    request will be allowed."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def retry_after(self) -> str:
        """The ``Retry-After`` value: whole seconds, at least 1."""
        return str(max(1, math.ceil(self.retry_after_s)))


class JobInProgressError(ModelError):
    """A snapshot or a restore of the catalogue is under way, and one runs at a time;
    ``location``: its status route (None while it is not known)."""

    def __init__(self, message: str, location: str | None) -> None:
        super().__init__(message)
        self.location = location


class OverloadedError(ModelError):
    """The server holds its limit of concurrent work (MAX_CONCURRENT_REQUESTS)."""


class MemoryLimitError(OverloadedError):
    """The process holds its limit of request bytes at once (MAX_BUFFERED_BYTES)."""


class RequestTooLargeError(ModelError):
    """A request larger than this server ever takes: more JSON values than MAX_JSON_VALUES, or
    more memory than MAX_BUFFERED_BYTES on its own."""


class WorkTimeoutError(ModelError):
    """A request's work did not finish within its time limit (REQUEST_TIMEOUT_S)."""


class BodyTimeoutError(ModelError):
    """A request's body (a gRPC call's message) did not arrive in time (BODY_TIMEOUT_S)."""


class MalformedBodyError(ModelError):
    """The body is not a JSON document: a syntax error, bytes that are not UTF-8, nesting deeper
    than the parser's limit, an integer too long to read, or nothing at all."""


class UnsupportedMediaTypeError(ModelError):
    """The body was declared (Content-Type) as something other than JSON."""


# Most specific first: the first matching class decides the status.
_DOMAIN_STATUS: tuple[tuple[type[ModelError], int, str], ...] = (
    (MalformedBodyError, 400, "bad_request"),
    (UnsupportedMediaTypeError, 415, "unsupported_media_type"),
    (LoadRefusedError, 409, "load_refused"),
    (TrafficPolicyError, 409, "policy_refused"),
    (RateLimitedError, 429, "rate_limited"),
    (VersionConflictError, 409, "version_conflict"),
    (SnapshotRefusedError, 409, "snapshot_refused"),
    (JobInProgressError, 409, "in_progress"),
    (BatchTooLargeError, 413, "batch_too_large"),
    (RequestTooLargeError, 413, "request_too_large"),
    (InvalidInputError, 422, "invalid_input"),
    (SpecError, 422, "invalid_input"),
    (NotFoundError, 404, "not_found"),
    (ModelNotReadyError, 503, "not_ready"),
    (ShardsUnavailableError, 503, "shards_unavailable"),
    (ArtifactError, 503, "not_ready"),
    (OverloadedError, 503, "overloaded"),
    (WorkTimeoutError, 504, "timeout"),
    (BodyTimeoutError, 408, "request_timeout"),
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
    503: "overloaded",
}
# What the server records for a request whose client went away before its answer (nginx's
# convention): no answer is sent, the metrics and the access line say so.
CLIENT_CLOSED_REQUEST = 499


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
    response = error_response(status, type_, str(error), path=request.url.path)
    if isinstance(error, RateLimitedError):
        response.headers["retry-after"] = error.retry_after()
    if isinstance(error, JobInProgressError) and error.location is not None:
        response.headers["location"] = error.location
    return response


def _location(loc: tuple) -> str:
    parts = [str(p) for p in loc if p != "body"]
    text = ""
    for part in parts:
        text += f"[{part}]" if part.isdigit() else (f".{part}" if text else part)
    return text or "body"


# The parser's limits (pydantic-core's JSON parser), stated in the schema and
# docs/reference/errors.md.
MAX_JSON_DEPTH = 201
MAX_INTEGER_DIGITS = 4300
_PARSER_HINTS = {
    "recursion limit exceeded": f"nested deeper than {MAX_JSON_DEPTH} levels",
    "number out of range": f"a number of more than {MAX_INTEGER_DIGITS:,} digits",
    "invalid unicode code point": "bytes that are not UTF-8",
}


def malformed_body_message(reason: str, empty: bool = False) -> str:
    """What a 400 says about a body the JSON parser refused (``reason``: the parser's words)."""
    if empty:
        return "the body is empty: send a JSON object"
    hint = next((h for key, h in _PARSER_HINTS.items() if reason.startswith(key)), None)
    return f"the body is not valid JSON ({hint or reason})" + (f": {reason}" if hint else "")


async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    problems = error.errors()
    for problem in problems:
        if problem.get("type") == "json_invalid":  # a body FastAPI parsed itself
            reason = str((problem.get("ctx") or {}).get("error", "cannot be parsed"))
            return error_response(
                400, "bad_request", malformed_body_message(reason), path=request.url.path
            )
    details = [
        {"location": _location(tuple(p.get("loc", ()))), "problem": p.get("msg", "")}
        for p in problems
    ]
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
    message = str(error.detail)
    path = request.url.path
    if error.status_code == 404 and len(path) > 1 and path.endswith("/"):
        # No redirect to the path without the slash: its Location would be built from the
        # client's Host header.
        message = f"no route {path[:100]}: the routes have no trailing slash"
    response = error_response(error.status_code, type_, message, path=path)
    response.headers.update(error.headers or {})  # e.g. Allow, on 405
    return response


async def _client_gone(request: Request, error: ClientDisconnect) -> Response:
    logger.debug(
        "%s %s: the client went away before its request was read", request.method, request.url.path
    )
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _unexpected_error(request: Request, error: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(
        500, "internal_error", "internal error; the server log has details", path=request.url.path
    )


async def error_answer(request: Request, error: Exception) -> Response:
    """The answer to ``error`` raised by a route's code, as the handlers below give it, for code
    that runs outside FastAPI's routing (:mod:`service.api.machinery.hotpath`); anything else is
    raised
    again (the server's error middleware answers 500 and logs it)."""
    if isinstance(error, ModelError):
        return await _domain_error(request, error)
    if isinstance(error, RequestValidationError):
        return await _validation_error(request, error)
    if isinstance(error, StarletteHTTPException):
        return await _http_error(request, error)
    if isinstance(error, ClientDisconnect):
        return await _client_gone(request, error)
    raise error


def install_error_handlers(app: FastAPI) -> None:
    """Map the domain hierarchy and framework errors to HTTP responses."""
    app.add_exception_handler(ModelError, _domain_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _unexpected_error)


# What each error status means: the OpenAPI document lists, per route, every status it can
# answer, each with the one error body (``ErrorResponse``). Settings-dependent limits are stated
# in the document by ``service.api.rest.routes.state_limits``.
ERROR_MEANINGS: dict[int, str] = {
    400: "The body is not a JSON document: a syntax error, bytes that are not UTF-8, nesting "
    f"deeper than {MAX_JSON_DEPTH} levels, an integer of more than {MAX_INTEGER_DIGITS:,} digits, "
    "or no body at all.",
    401: "No API key, or one not valid (WWW-Authenticate: Bearer).",
    403: "The key's scope does not allow the route, or (repository routes) no admin key is "
    "configured (ADMIN_TOKEN, or an admin key in API_KEYS_FILE).",
    404: "No model of that name.",
    409: "The version on disk was refused; the old one (if any) keeps serving.",
    413: "The body is larger than MAX_REQUEST_BYTES, holds more than MAX_JSON_VALUES JSON "
    "values, or the batch is larger than MAX_BATCH_SIZE.",
    429: "The API key's rate limit (API_KEYS_FILE) is spent for now; Retry-After says when "
    "to try again.",
    415: "The body was declared (Content-Type) as something other than JSON.",
    422: "Valid JSON that breaks the schema (a type, a required or unknown field, a bound it "
    "states) or the model's rules (an instance's shape or values, a class or id it does not "
    "know); the message says what, details locate each problem.",
    408: "The body did not arrive within BODY_TIMEOUT_S; the connection is closed.",
    503: "The model is not loaded (yet), its search artifacts are not available, or the server "
    "is at its limit of concurrent requests (MAX_CONCURRENT_REQUESTS) or of request bytes held "
    "at once (MAX_BUFFERED_BYTES); says which (with Retry-After).",
    504: "The work took longer than REQUEST_TIMEOUT_S.",
}


def documented_errors(
    *statuses: int, meanings: dict[int, str] | None = None
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for ``statuses``: each with the error body and its meaning
    (from :data:`ERROR_MEANINGS`, or ``meanings`` where a route says more)."""
    meanings = {**ERROR_MEANINGS, **(meanings or {})}
    return {s: {"model": ErrorResponse, "description": meanings[s]} for s in statuses}
