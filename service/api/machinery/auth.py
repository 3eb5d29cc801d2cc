"""API keys: who may call which route, for REST and gRPC alike.

**Keys.** ``API_KEYS_FILE`` holds one ``<key> <scope>`` a line (``#`` starts a comment), the
scope ``read`` (classify, search, metadata) or ``admin`` (also the repository routes). A line may
give ``sha256:<64 hex digits>``, the key's SHA-256, instead of the key itself, so that the file
need not hold the secret. ``ADMIN_TOKEN`` is the shorthand for one ``admin`` key. Keys are held as
digests only; a presented key's digest is compared with every one held, in constant time, so
the time taken tells nothing of which digest, if any, it matched. Logs and answers name a key by
its fingerprint (the first 8 hex digits of its digest), never the key.

**What needs a key** (:class:`AccessPolicy`): the repository routes, catalogue updates
(``POST /v1/models/{name}/catalogue/items`` and ``.../delete``) and the catalogue's snapshots
(``.../catalogue/snapshots``, listed, taken or restored, and their status) an ``admin`` key,
always (with no admin key configured they answer 403 and say how to enable them); every other
route a key of any scope once ``API_KEYS_FILE`` is set, except liveness and readiness, the API
docs, and ``/metrics`` unless ``METRICS_REQUIRE_KEY``. Without ``API_KEYS_FILE`` only the admin
routes are guarded (as they were by ``ADMIN_TOKEN`` alone).

**Re-reading.** :meth:`KeyStore.reload` reads the file again (on SIGHUP and on each rescan of
the repository, off the event loop): a key removed is refused from then on, without a restart.
The file is checked as a model's files are (:func:`service.model.artifact.open_regular`): a
regular file of at most :data:`MAX_KEY_FILE_BYTES`, opened without blocking. A file that cannot
be read, is not such a file, or cannot be parsed is refused with a logged error, and the keys
read before stay in force.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.errors import RateLimitedError, error_response
from service.api.machinery.observability import current_request
from service.api.settings import Settings
from service.model.artifact import open_regular
from service.model.errors import ArtifactError
from service.probes import PROBE_PATHS

logger = logging.getLogger("service.api")

BEARER_PREFIX = "bearer "
# The headers (gRPC: metadata keys) a key may come in, lower case as HTTP/2 and ASGI give them.
API_KEY_HEADER = "x-api-key"
AUTHORIZATION_HEADER = "authorization"
DIGEST_PREFIX = "sha256:"
# The largest key file read: some 13,000 keys given by digest.
MAX_KEY_FILE_BYTES = 1 << 20
FINGERPRINT_DIGITS = 8
# What a 401 answers in WWW-Authenticate (RFC 6750): a bearer token, our API key.
CHALLENGE = 'Bearer realm="besvm"'
HOW_TO_SEND = "send it as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'"


class KeyScope(enum.IntEnum):
    """What a key may do; a larger scope includes the smaller ones."""

    READ = 1
    ADMIN = 2


class Access(enum.IntEnum):
    """What a route needs: nothing, or a key of at least that scope."""

    OPEN = 0
    READ = KeyScope.READ
    ADMIN = KeyScope.ADMIN


class KeyFileError(ValueError):
    """API_KEYS_FILE cannot be read, or a line is not ``<key> <scope>``."""


class MissingKeyError(Exception):
    """No key was sent, or a key not held (401)."""


class ForbiddenError(Exception):
    """A key (or none configured) that does not allow the route (403)."""


@dataclass(frozen=True, slots=True)
class Key:
    """A key as held: its digest, scope, rate limit (``rate`` requests a second, ``burst`` at
    once; a rate of 0: none) and fingerprint (the name logs give it, computed once: every
    request a key allows names it)."""

    digest: bytes
    scope: KeyScope
    rate: float = 0.0
    burst: int = 0
    fingerprint: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fingerprint", self.digest.hex()[:FINGERPRINT_DIGITS])


def digest_of(key: str) -> bytes:
    """The SHA-256 of a key as a client sends it (UTF-8)."""
    return hashlib.sha256(key.encode()).digest()


# A rate's units: rate=<n>[/s|/min|/h], requests per second by default.
RATE_UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0}


def parse_limit(options: list[str], where: str) -> tuple[float, int]:
    """A key line's ``rate=<n>[/s|/min|/h]`` and ``burst=<n>``: the rate in requests a second
    (0: none) and the burst (default: a second's worth, at least 1)."""
    values: dict[str, str] = {}
    for option in options:
        name, equals, value = option.partition("=")
        if not equals or name not in ("rate", "burst") or name in values:
            raise KeyFileError(
                f"{where}: expected '<key> <scope> [rate=<n>[/s|/min|/h]] [burst=<n>]', got "
                f"{brief_option(option)}"
            )
        values[name] = value
    rate = 0.0
    if "rate" in values:
        count, _, unit = values["rate"].partition("/")
        try:
            rate = float(count) / RATE_UNITS[unit or "s"]
        except (KeyError, ValueError):
            rate = -1.0
        if not (rate > 0 and math.isfinite(rate)):
            raise KeyFileError(f"{where}: rate must be a positive number [/s, /min or /h]")
    if "burst" not in values:
        return rate, max(1, math.ceil(rate)) if rate else 0
    if not rate:
        raise KeyFileError(f"{where}: burst needs a rate")
    burst = values["burst"]
    if not (burst.isascii() and burst.isdigit()) or int(burst) < 1:
        raise KeyFileError(f"{where}: burst must be a whole number of at least 1")
    return rate, int(burst)


def brief_option(option: str) -> str:
    """An option of a key line, for a message: its name, never a value that may be a key."""
    name = option.partition("=")[0]
    return f"{name!r}" if name in ("rate", "burst") else "a field that is neither rate= nor burst="


def parse_key_file(text: str, source: str = "API_KEYS_FILE") -> list[Key]:
    """The keys of a key file's ``text``; KeyFileError names the line (never its key)."""
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) < 2:
            raise KeyFileError(
                f"{source}, line {number}: expected '<key> <scope>', got {len(fields)} fields"
            )
        secret, scope_name, *options = fields
        rate, burst = parse_limit(options, f"{source}, line {number}")
        try:
            scope = KeyScope[scope_name.upper()]
        except KeyError:
            raise KeyFileError(
                f"{source}, line {number}: unknown scope {scope_name!r}: read or admin"
            ) from None
        if secret.lower().startswith(DIGEST_PREFIX):
            hex_digest = secret[len(DIGEST_PREFIX) :]
            try:
                digest = bytes.fromhex(hex_digest)
            except ValueError:
                digest = b""
            if len(digest) != hashlib.sha256().digest_size:
                raise KeyFileError(
                    f"{source}, line {number}: {DIGEST_PREFIX} must be followed by 64 hex digits"
                )
        else:
            digest = digest_of(secret)
        keys.append(Key(digest, scope, rate, burst))
    return keys


class KeyStore:
    """The keys in force: those of ``API_KEYS_FILE`` and ``ADMIN_TOKEN``.

    Parameters
    ----------
    settings : Settings

    Raises
    ------
    KeyFileError
        The file cannot be read or parsed (the server refuses to start).
    """

    def __init__(self, settings: Settings) -> None:
        self.path: Path | None = settings.api_keys_file
        token = settings.admin_token
        self._token_key = (
            None if token is None else Key(digest_of(token.get_secret_value()), KeyScope.ADMIN)
        )
        self._keys: tuple[Key, ...] = ()
        self._keys = self._read()
        # Each rate-limited key's bucket, by digest: kept across re-reads while its limit is.
        self._buckets: dict[bytes, TokenBucket] = {}
        self._buckets = self._buckets_of(self._keys)

    def _buckets_of(self, keys: tuple[Key, ...]) -> dict[bytes, TokenBucket]:
        buckets = {}
        for key in keys:
            if key.rate:
                bucket = self._buckets.get(key.digest)
                if bucket is None or (bucket.rate, bucket.burst) != (key.rate, key.burst):
                    bucket = TokenBucket(key.rate, key.burst)
                buckets[key.digest] = bucket
        return buckets

    def spend(self, key: Key) -> None:
        """Count one request of a rate-limited ``key`` (on the event loop's thread).

        Raises
        ------
        RateLimitedError
            Its rate is spent for now: 429 (gRPC RESOURCE_EXHAUSTED), with when to retry.
        """
        bucket = self._buckets.get(key.digest)
        if bucket is None:
            return
        wait = bucket.take(time.monotonic())
        if wait:
            raise RateLimitedError(
                f"key {key.fingerprint} is over its rate of {_rate_words(key.rate)} "
                f"(burst {key.burst}); try again in {wait:.2f} s",
                wait,
            )

    def _read(self) -> tuple[Key, ...]:
        keys = []
        if self.path is not None:
            try:
                # Checked as a model's files are: a regular file (never a FIFO, which would
                # wait for a writer, nor /dev/zero, which never ends) of a bounded size.
                with open_regular(self.path, MAX_KEY_FILE_BYTES) as handle:
                    text = handle.read(MAX_KEY_FILE_BYTES + 1).decode("utf-8")
            except (OSError, UnicodeDecodeError, ArtifactError) as error:
                raise KeyFileError(f"API_KEYS_FILE {self.path}: {error}") from None
            keys = parse_key_file(text, f"API_KEYS_FILE {self.path}")
        if self._token_key is not None:
            keys.append(self._token_key)
        return tuple(keys)

    def reload(self) -> None:
        """Read the key file again; on failure log why and keep the keys in force."""
        if self.path is None:
            return
        try:
            keys = self._read()
        except KeyFileError as error:
            logger.error("API keys not re-read, the %d keys read before stay: %s", len(self), error)
            return
        if keys != self._keys:
            logger.info("API keys re-read: %d keys (%s)", len(keys), _count_by_scope(keys))
        # Run on a thread of its own (the rescans read files off the event loop): the new state
        # is put in place by two reference assignments, the buckets first, so that a request
        # checked meanwhile finds its key's bucket.
        self._buckets = self._buckets_of(keys)
        self._keys = keys

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def has_admin(self) -> bool:
        return any(key.scope is KeyScope.ADMIN for key in self._keys)

    def find(self, presented: str) -> Key | None:
        """The key held whose digest is the presented key's, else None; every digest is
        compared (in constant time), whichever matches."""
        digest = digest_of(presented)
        found = None
        for key in self._keys:
            if hmac.compare_digest(digest, key.digest):
                found = key
        return found


class TokenBucket:
    """A token bucket: ``burst`` requests at once, refilled at ``rate`` a second (one process's
    count: with several worker processes each counts its own)."""

    __slots__ = ("burst", "rate", "tokens", "updated")

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.updated = time.monotonic()

    def take(self, now: float) -> float:
        """Take a token at time ``now``: 0.0 if there was one, else the seconds until there
        will be (nothing taken)."""
        tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return 0.0
        self.tokens = tokens
        return (1.0 - tokens) / self.rate


def _rate_words(rate: float) -> str:
    if rate >= 1:
        return f"{rate:g}/s"
    if rate * 60 >= 1:
        return f"{rate * 60:g}/min"
    return f"{rate * 3600:g}/h"


def _count_by_scope(keys: Iterable[Key]) -> str:
    scopes = [key.scope.name.lower() for key in keys]
    return ", ".join(f"{scopes.count(name)} {name}" for name in ("read", "admin"))


def presented_key(authorizations: Sequence[str], api_keys: Sequence[str]) -> str | None:
    """The key a request sends: ``Authorization: Bearer <key>``, else ``X-API-Key``, given the
    values of every header of each name it sent.

    Raises
    ------
    MissingKeyError
        More than one of those headers: which one holds the key would be a guess (a bad key
        followed by a good one must not pass), so none does.
    """
    if len(authorizations) + len(api_keys) > 1:
        raise MissingKeyError(
            f"the request sends {len(authorizations)} Authorization and {len(api_keys)} "
            f"X-API-Key headers: send one key, in one header ({HOW_TO_SEND})"
        )
    if authorizations:
        authorization = authorizations[0]
        if authorization[:7].lower() == BEARER_PREFIX:
            token = authorization[7:].strip()
            if token:
                return token
    if api_keys and api_keys[0].strip():
        return api_keys[0].strip()
    return None


def key_headers(pairs: Iterable[tuple[Any, Any]]) -> tuple[list[str], list[str]]:
    """The values of every Authorization and X-API-Key header among ``pairs`` of (name,
    value): ASGI's byte pairs or gRPC's metadata."""
    found: tuple[list[str], list[str]] = ([], [])
    for name, value in pairs:
        which = _KEY_HEADERS.get(name)
        if which is not None:
            found[which].append(value.decode("latin-1") if isinstance(value, bytes) else value)
    return found


_KEY_HEADERS = {
    name: which
    for which, header in enumerate((AUTHORIZATION_HEADER, API_KEY_HEADER))
    for name in (header, header.encode())
}


# Routes every client and orchestrator may call without a key: the probes (service.probes'
# PROBE_PATHS, answered on PROBE_PORT too).
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
ADMIN_PREFIX = "/v2/repository/"
# The catalogue's updates (POST); reading the catalogue and its items needs what /search needs.
# Matches a request's path and the OpenAPI document's template alike.
CATALOGUE_UPDATE = re.compile(r"/v1/models/[^/]+/catalogue/(?:items|delete)")
# The catalogue's snapshots, listed, taken or restored, and their status: files of the server's
# disk.
CATALOGUE_SNAPSHOTS = re.compile(r"/v1/models/[^/]+/catalogue/snapshots(?:/[^/]+(?:/restore)?)?")
METRICS_PATH = "/metrics"


class AccessPolicy:
    """What each route (REST path, gRPC method) needs, and the check of a presented key.

    Parameters
    ----------
    keys : KeyStore
    settings : Settings
    """

    def __init__(self, keys: KeyStore, settings: Settings) -> None:
        self.keys = keys
        self.default = Access.READ if settings.api_keys_file is not None else Access.OPEN
        self.metrics = Access.READ if settings.metrics_require_key else Access.OPEN

    @property
    def keys_required(self) -> bool:
        """Whether the read routes need a key."""
        return self.default is not Access.OPEN

    def for_route(self, method: str, path: str) -> Access:
        """What a request of ``method`` (HTTP, upper case) on ``path`` needs."""
        if path.startswith(ADMIN_PREFIX):
            return Access.ADMIN
        if method == "POST" and CATALOGUE_UPDATE.fullmatch(path):
            return Access.ADMIN
        if CATALOGUE_SNAPSHOTS.fullmatch(path):
            return Access.ADMIN
        if path in PROBE_PATHS or path in DOCS_PATHS:
            return Access.OPEN
        if path == METRICS_PATH:
            return self.metrics
        return self.default

    def check(self, needed: Access, presented: str | None, limited: bool = True) -> Key | None:
        """The key that allows ``needed`` (None when the route is open), its request counted
        against its rate unless not ``limited`` (a scrape of /metrics).

        Raises
        ------
        MissingKeyError
            No key, or one not held.
        ForbiddenError
            An admin route with no admin key configured, or a key of too small a scope.
        RateLimitedError
            The key's rate is spent for now.
        """
        if needed is Access.OPEN:
            return None
        if needed is Access.ADMIN and not self.keys.has_admin:
            raise ForbiddenError(
                "the repository routes and catalogue updates are disabled: set ADMIN_TOKEN, or "
                f"give a key the admin scope in API_KEYS_FILE, and {HOW_TO_SEND}"
            )
        if presented is None:
            raise MissingKeyError(f"this route needs an API key: {HOW_TO_SEND}")
        key = self.keys.find(presented)
        if key is None:
            raise MissingKeyError(f"the API key is not valid (revoked, or mistyped): {HOW_TO_SEND}")
        if key.scope < needed:
            raise ForbiddenError(
                f"key {key.fingerprint} has the {key.scope.name.lower()} scope; this route "
                f"needs {KeyScope(needed).name.lower()}"
            )
        if key.rate and limited:
            identify(key)  # a refusal's access line names the key that is over its rate
            self.keys.spend(key)
        return key


def identify(key: Key | None) -> None:
    """Name ``key`` (its fingerprint) in the current request's log lines."""
    context = current_request()
    if context is not None and key is not None:
        context.key = key.fingerprint


class KeyCheckMiddleware:
    """ASGI middleware: 401 (with ``WWW-Authenticate``) or 403 before any route runs, in the
    error shape of the route family; the key's fingerprint goes into the access line."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS":  # CORS preflights
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        needed = self.policy.for_route(scope["method"], path)
        if needed is not Access.OPEN:
            try:
                presented = presented_key(*key_headers(scope["headers"]))
                identify(self.policy.check(needed, presented, path != METRICS_PATH))
            except RateLimitedError as error:
                response = error_response(429, "rate_limited", str(error), path=path)
                response.headers["retry-after"] = error.retry_after()
                await response(scope, receive, send)
                return
            except MissingKeyError as error:
                response = error_response(401, "unauthorized", str(error), path=path)
                response.headers["www-authenticate"] = CHALLENGE
                await response(scope, receive, send)
                return
            except ForbiddenError as error:
                response = error_response(403, "forbidden", str(error), path=path)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


# -- the OpenAPI document ----------------------------------------------------------------------

SECURITY_SCHEMES: dict[str, Any] = {
    "bearerKey": {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key (API_KEYS_FILE, or ADMIN_TOKEN) as a bearer token.",
    },
    "apiKeyHeader": {
        "type": "apiKey",
        "in": "header",
        "name": "X-API-Key",
        "description": "The same key in the X-API-Key header.",
    },
}
_EITHER_SCHEME = [{"bearerKey": []}, {"apiKeyHeader": []}]


def document_security(document: dict[str, Any], policy: AccessPolicy) -> None:
    """Declare the key schemes in an OpenAPI ``document`` and, per operation, whether it needs
    one (so that /docs can send a key), with its 401 and 403."""
    document.setdefault("components", {})["securitySchemes"] = SECURITY_SCHEMES
    unauthorized = {
        "description": "No API key, or one not valid (WWW-Authenticate: Bearer).",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
    }
    forbidden = {
        "description": "The key's scope does not allow this route (or, for the repository "
        "routes and catalogue updates, no admin key is configured).",
        "content": unauthorized["content"],
    }
    rate_limited = {
        "description": "The key is over its rate (API_KEYS_FILE: rate=, burst=); Retry-After "
        "says when to try again.",
        "content": unauthorized["content"],
    }
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            needed = policy.for_route(method.upper(), path)
            if needed is Access.OPEN:
                operation["security"] = []
                continue
            operation["security"] = _EITHER_SCHEME
            responses = operation.setdefault("responses", {})
            responses.setdefault("401", unauthorized)
            if needed is Access.ADMIN or policy.keys_required:
                responses.setdefault("403", forbidden)
            if path != METRICS_PATH:
                responses.setdefault("429", rate_limited)
