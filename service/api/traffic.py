"""Traffic policies: aliases over the repository's models, with a canary share and a shadow.

The repository holds one directory per model version a team wants served side by side
(``digits-1``, ``digits-2``); an **alias** is the name clients call (``digits``) and names the
model that answers it. A **canary** sends a stated share of the alias's classifications to a
second model; a **shadow** receives a copy of a stated share, its answers compared with the
served ones and never returned (KServe's ``canaryTrafficPercent``, Seldon's shadow).

**Where policies live.** ``TRAFFIC_FILE`` (default ``traffic.json`` in the repository), read at
every rescan (SIGHUP, ``RELOAD_INTERVAL_S``, ``/v2/repository/index``) as models are; the admin
routes edit that same file (under an exclusive lock, replaced by rename) and then apply it, so
that every worker process and every restart sees what the last change wrote::

    {"aliases": {"digits": {"model": "digits-1",
                            "canary": {"model": "digits-2", "percent": 10},
                            "shadow": {"model": "digits-3", "percent": 100}}}}

**Applying.** The policies are one immutable mapping, replaced by one assignment on the event
loop: a request resolves its alias once and finishes on the version it was given, so a change
never drops or mixes a request. A change that would send traffic to a model with no loaded
version (a model still loading, failed, or not in the repository) is refused: the alias keeps
its policy, and the refusal's reason is logged and listed (``GET /v2/repository/aliases``).

**What a policy applies to.** Classification (``/classify``, ``/v1/models/{alias}/classify``,
``/v2/models/{alias}/infer`` and gRPC ``ModelInfer``) is split between the model and its canary
and shadowed. Everything else an alias names (metadata, readiness, search, the catalogue)
answers from the alias's model. Every answer names the model and version that computed it.

**Shadows** (:class:`ShadowRunner`) run on a thread of their own after the served answer is
computed, at most :data:`SHADOW_QUEUE` at a time: a request beyond that is not shadowed (and
counted), so a slow shadow never holds a served request, and its failures are its own.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import fcntl
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from service.api.errors import TrafficPolicyError
from service.api.machinery.metrics import Metrics
from service.model import ModelNotReadyError, NotFoundError
from service.model.errors import brief

if TYPE_CHECKING:
    from service.api.versions import ModelSnapshot
    from service.model.answers import Answer

logger = logging.getLogger("service.api")
shadow_logger = logging.getLogger("service.api.shadow")


class ServedEntry(Protocol):
    """What the policies read of a model's entry in the registry
    (:class:`service.api.registry.ModelEntry`)."""

    @property
    def snapshot(self) -> ModelSnapshot | None:
        """The version it serves; None while none is ready."""

    def not_ready_message(self) -> str:
        """Why it serves no version."""


TRAFFIC_FILE_NAME = "traffic.json"
# Shadow comparisons queued or under way at once; a request beyond them is not shadowed.
SHADOW_QUEUE = 32
ALIAS_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_POLICY_FIELDS = frozenset({"model", "canary", "shadow", "previous"})
_SHARE_FIELDS = frozenset({"model", "percent"})


@dataclass(frozen=True, slots=True)
class Share:
    """A model that gets ``percent`` (0 < percent <= 100) of an alias's requests."""

    model: str
    percent: float

    def drawn(self) -> bool:
        """Whether one request falls in the share (an independent draw per request)."""
        return random.random() * 100.0 < self.percent

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "percent": self.percent}


@dataclass(frozen=True, slots=True)
class Shadow:
    """The shadow of one request: the alias, the shadow model, and its snapshot (None while it
    has no loaded version: the request is then not shadowed, and that is counted)."""

    alias: str
    model: str
    snapshot: ModelSnapshot | None


@dataclass(frozen=True, slots=True)
class AliasPolicy:
    """Where an alias's requests go.

    Parameters
    ----------
    model : str
        The model (a directory of the repository) that answers the alias.
    canary : Share, optional
        A second model answering ``canary.percent`` % of the classifications.
    shadow : Share, optional
        A model that gets a copy of ``shadow.percent`` % of the classifications.
    previous : str, optional
        The model the alias named before its last move: what ``rollback`` returns to.
    """

    model: str
    canary: Share | None = None
    shadow: Share | None = None
    previous: str | None = None

    def models(self) -> list[str]:
        """Every model the policy names, the previous one aside."""
        return [self.model] + [s.model for s in (self.canary, self.shadow) if s is not None]

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"model": self.model}
        for name in ("canary", "shadow"):
            share = getattr(self, name)
            if share is not None:
                document[name] = share.to_json()
        if self.previous is not None:
            document["previous"] = self.previous
        return document

    @classmethod
    def from_json(cls, alias: str, value: Any) -> AliasPolicy:
        """The policy of ``alias`` from its JSON object; TrafficPolicyError says what is wrong."""
        where = f"alias {brief(alias)}"
        if not isinstance(value, dict):
            raise TrafficPolicyError(f"{where}: expected an object with 'model'")
        unknown = sorted(set(value) - _POLICY_FIELDS)
        if unknown:
            raise TrafficPolicyError(f"{where}: unknown fields {unknown}: {sorted(_POLICY_FIELDS)}")
        model = _model_name(value.get("model"), f"{where}: model")
        previous = value.get("previous")
        if previous is not None:
            previous = _model_name(previous, f"{where}: previous")
        policy = cls(
            model,
            _share(value.get("canary"), f"{where}: canary"),
            _share(value.get("shadow"), f"{where}: shadow"),
            previous,
        )
        for name in ("canary", "shadow"):
            share = getattr(policy, name)
            if share is not None and share.model == model:
                raise TrafficPolicyError(f"{where}: the {name} is the alias's own model {model!r}")
        if policy.canary and policy.shadow and policy.canary.model == policy.shadow.model:
            raise TrafficPolicyError(f"{where}: the shadow is the canary's model: it would agree")
        return policy

    # -- the request path --------------------------------------------------------------------

    def route(
        self, alias: str, entries: Mapping[str, ServedEntry], version: str | None
    ) -> tuple[ModelSnapshot, Shadow | None]:
        """The snapshot that answers one classification, and its shadow (if drawn).

        A request naming a ``version`` goes to the model or canary serving it, undrawn; a
        canary with no loaded version leaves every request to the model."""
        snapshot = None
        canary = self.canary
        if canary is not None and (version is not None or canary.drawn()):
            entry = entries.get(canary.model)
            snapshot = None if entry is None else entry.snapshot
            if version is not None and (snapshot is None or snapshot.version != version):
                snapshot = None
        if snapshot is None:
            snapshot = self.primary(alias, entries, version)
        shadow = self.shadow
        if shadow is None or not shadow.drawn():
            return snapshot, None
        entry = entries.get(shadow.model)
        return snapshot, Shadow(alias, shadow.model, None if entry is None else entry.snapshot)

    def primary(
        self, alias: str, entries: Mapping[str, ServedEntry], version: str | None = None
    ) -> ModelSnapshot:
        """The snapshot of the alias's model (or of its canary, when that serves ``version``).

        Raises
        ------
        ModelNotReadyError
            The model is not in the repository, or has no loaded version.
        NotFoundError
            Neither the model nor the canary serves ``version``.
        """
        entry = entries.get(self.model)
        if entry is None:
            raise ModelNotReadyError(
                f"alias {alias!r} names model {self.model!r}, which is not in the repository"
            )
        snapshot = entry.snapshot
        if snapshot is None:
            raise ModelNotReadyError(f"alias {alias!r}: {entry.not_ready_message()}")
        if version is None or snapshot.version == version:
            return snapshot
        canary = None if self.canary is None else entries.get(self.canary.model)
        if (
            canary is not None
            and canary.snapshot is not None
            and canary.snapshot.version == version
        ):
            return canary.snapshot
        raise NotFoundError(
            f"alias {alias!r} serves no version {brief(version)}: model {self.model!r} serves "
            f"{snapshot.version}"
        )


def _model_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or value.startswith(".") or "/" in value:
        raise TrafficPolicyError(f"{where} must name a model of the repository")
    return value


def _share(value: Any, where: str) -> Share | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - _SHARE_FIELDS:
        raise TrafficPolicyError(f"{where}: expected {{'model': name, 'percent': 0 < p <= 100}}")
    percent = value.get("percent")
    if isinstance(percent, bool) or not isinstance(percent, int | float) or not 0 < percent <= 100:
        raise TrafficPolicyError(f"{where}: percent must be a number above 0 and at most 100")
    return Share(_model_name(value.get("model"), f"{where}: model"), float(percent))


def parse_traffic(raw: bytes, source: str) -> dict[str, AliasPolicy]:
    """The policies of a traffic file's bytes (empty bytes: none).

    Raises
    ------
    TrafficPolicyError
        Not JSON, not ``{"aliases": {name: policy}}``, or a policy that is not valid; naming
        ``source`` and the alias.
    """
    if not raw.strip():
        return {}
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise TrafficPolicyError(f"{source} is not JSON: {error}") from None
    if not isinstance(document, dict) or set(document) - {"aliases"}:
        raise TrafficPolicyError(f'{source}: expected {{"aliases": {{name: policy}}}}')
    aliases = document.get("aliases") or {}
    if not isinstance(aliases, dict):
        raise TrafficPolicyError(f"{source}: aliases must be an object of name: policy")
    policies = {}
    for alias, value in aliases.items():
        check_alias_name(alias)
        try:
            policies[alias] = AliasPolicy.from_json(alias, value)
        except TrafficPolicyError as error:
            raise TrafficPolicyError(f"{source}: {error}") from None
    return policies


def check_alias_name(alias: str) -> None:
    """TrafficPolicyError unless ``alias`` is 1 to 128 of ``A-Z a-z 0-9 . _ -``, not starting
    with a dot, underscore or hyphen (names a URL path holds as they are)."""
    if not ALIAS_PATTERN.fullmatch(alias):
        raise TrafficPolicyError(
            f"alias {brief(alias)}: a name is 1 to 128 of A-Z a-z 0-9 . _ -, starting with a "
            "letter or digit"
        )


def traffic_document(policies: Mapping[str, AliasPolicy]) -> bytes:
    """The traffic file of ``policies``: indented, aliases sorted (a file people edit too)."""
    aliases = {alias: policies[alias].to_json() for alias in sorted(policies)}
    return orjson.dumps({"aliases": aliases}, option=orjson.OPT_INDENT_2) + b"\n"


def read_traffic(path: Path) -> bytes:
    """The file's bytes; empty when it does not exist (no policies)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def edit_traffic_file(
    path: Path,
    change: Callable[[dict[str, AliasPolicy]], dict[str, AliasPolicy]],
) -> dict[str, AliasPolicy]:
    """Apply ``change`` to the policies in the file at ``path`` and write the result in its
    place (blocking: run it on a thread). Changes by several processes are serialised by an
    exclusive lock on a file beside it; the file is replaced by rename, so that a reader never
    sees half of it.

    Raises
    ------
    TrafficPolicyError
        The file cannot be read, parsed or written (or ``change`` refuses).
    """
    lock_path = path.with_name(f".{path.name}.lock")
    try:
        lock = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise TrafficPolicyError(
            f"cannot change {path}: {error.strerror} (a read-only repository: set TRAFFIC_FILE "
            "to a writable place, or edit the file where it is written)"
        ) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        policies = change(parse_traffic(read_traffic(path), str(path)))
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            staging.write_bytes(traffic_document(policies))
            os.replace(staging, path)
        except OSError as error:
            with contextlib.suppress(OSError):
                staging.unlink()
            raise TrafficPolicyError(f"cannot write {path}: {error.strerror}") from None
        return policies
    finally:
        os.close(lock)  # and with it the lock


# -- the changes the admin routes make ---------------------------------------------------------


def set_policy(
    alias: str, policy: AliasPolicy
) -> Callable[[dict[str, AliasPolicy]], dict[str, AliasPolicy]]:
    """The change that gives ``alias`` ``policy``; the model it named before becomes its
    ``previous`` when the model changes."""

    def change(policies: dict[str, AliasPolicy]) -> dict[str, AliasPolicy]:
        current = policies.get(alias)
        previous = None
        if current is not None:
            previous = current.model if current.model != policy.model else current.previous
        return {**policies, alias: replace(policy, previous=previous)}

    return change


def remove_policy(alias: str) -> Callable[[dict[str, AliasPolicy]], dict[str, AliasPolicy]]:
    """The change that removes ``alias`` (NotFoundError if there is none)."""

    def change(policies: dict[str, AliasPolicy]) -> dict[str, AliasPolicy]:
        _existing(policies, alias)
        return {name: policy for name, policy in policies.items() if name != alias}

    return change


def promote(alias: str) -> Callable[[dict[str, AliasPolicy]], dict[str, AliasPolicy]]:
    """The change that makes the canary the alias's model (all its traffic), the model before
    it the ``previous``; a shadow of the canary's model is dropped."""

    def change(policies: dict[str, AliasPolicy]) -> dict[str, AliasPolicy]:
        current = _existing(policies, alias)
        if current.canary is None:
            raise TrafficPolicyError(f"alias {alias!r} has no canary to promote")
        model = current.canary.model
        shadow = current.shadow if current.shadow and current.shadow.model != model else None
        return {**policies, alias: AliasPolicy(model, None, shadow, current.model)}

    return change


def rollback(alias: str) -> Callable[[dict[str, AliasPolicy]], dict[str, AliasPolicy]]:
    """The change that takes back the alias's last move: its canary (all traffic to the model
    again) if it has one, else the last promotion or move (the ``previous`` model answers)."""

    def change(policies: dict[str, AliasPolicy]) -> dict[str, AliasPolicy]:
        current = _existing(policies, alias)
        if current.canary is not None:
            return {**policies, alias: replace(current, canary=None)}
        if current.previous is None:
            raise TrafficPolicyError(
                f"alias {alias!r} has neither a canary nor a previous model to roll back to"
            )
        shadow = current.shadow
        if shadow is not None and shadow.model == current.previous:
            shadow = None
        return {**policies, alias: AliasPolicy(current.previous, None, shadow, None)}

    return change


def _existing(policies: Mapping[str, AliasPolicy], alias: str) -> AliasPolicy:
    policy = policies.get(alias)
    if policy is None:
        raise NotFoundError(f"no alias {brief(alias)}; aliases: {sorted(policies) or 'none'}")
    return policy


# -- checking policies against the models served -----------------------------------------------


def refusal(
    alias: str,
    policy: AliasPolicy,
    current: AliasPolicy | None,
    entries: Mapping[str, ServedEntry],
) -> str | None:
    """Why ``policy`` may not replace ``current`` for ``alias`` now (None: it may).

    Refused: an alias named as a model of the repository; a model that is not in the
    repository; traffic (the model, or a canary) moved to a model with no loaded version. A
    shadow may name a model still loading: it is shadowed once it serves."""
    if alias in entries:
        return f"alias {alias!r} is the name of a model of the repository: rename one of them"
    for model in policy.models():
        if model not in entries:
            return f"alias {alias!r}: model {model!r} is not in the repository"
    moved = [policy.model] if current is None or current.model != policy.model else []
    if policy.canary is not None and (current is None or current.canary != policy.canary):
        moved.append(policy.canary.model)
    for model in moved:
        if entries[model].snapshot is None:
            return f"alias {alias!r}: {entries[model].not_ready_message()}; traffic stays"
    return None


def apply_policies(
    wanted: Mapping[str, AliasPolicy],
    current: Mapping[str, AliasPolicy],
    entries: Mapping[str, ServedEntry],
) -> tuple[dict[str, AliasPolicy], dict[str, str]]:
    """The policies to serve: each of ``wanted`` that may replace the ``current`` one (see
    :func:`refusal`), else the current one kept; and the reasons of the refused, by alias."""
    applied, reasons = {}, {}
    for alias, policy in wanted.items():
        kept = current.get(alias)
        reason = None if policy == kept else refusal(alias, policy, kept, entries)
        if reason is None:
            applied[alias] = policy
            continue
        reasons[alias] = reason
        if kept is not None and alias not in entries:
            applied[alias] = kept
    return applied, reasons


def describe_policy(
    alias: str, policy: AliasPolicy, entries: Mapping[str, ServedEntry], reason: str | None
) -> dict[str, Any]:
    """An alias as the admin routes list it: its policy, each model's version served (None
    while it has none) and the reason its last change was refused (None)."""

    def version(model: str) -> str | None:
        entry = entries.get(model)
        return None if entry is None or entry.snapshot is None else entry.snapshot.version

    described: dict[str, Any] = {
        "name": alias,
        "model": policy.model,
        "version": version(policy.model),
    }
    for name in ("canary", "shadow"):
        share = getattr(policy, name)
        described[name] = (
            None if share is None else {**share.to_json(), "version": version(share.model)}
        )
    described["previous"] = policy.previous
    described["reason"] = reason
    return described


# -- shadows -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Comparison:
    """One request's copy for a shadow: its inputs and the answers served to them."""

    shadow: Shadow
    snapshot: ModelSnapshot
    served: ModelSnapshot
    instances: Sequence[Any] | None
    texts: Sequence[str] | None
    answers: list[Answer]


class ShadowRunner:
    """Runs shadow comparisons on a thread of its own, at most ``queue`` queued or under way.

    Parameters
    ----------
    metrics : Metrics
        Told of each comparison (instances agreeing and not, the shadow's time) and of each
        request not shadowed (the queue full, the shadow not loaded, the shadow failed).
    queue : int
    """

    def __init__(self, metrics: Metrics, queue: int = SHADOW_QUEUE) -> None:
        self.metrics = metrics
        self.queue = queue
        self._pending = 0
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._warned: set[tuple[str, str]] = set()

    def submit(
        self,
        shadow: Shadow,
        served: ModelSnapshot,
        instances: Sequence[Any] | None,
        texts: Sequence[str] | None,
        answers: list[Answer],
    ) -> None:
        """Compare ``shadow``'s answers to these inputs with the served ``answers``, later."""
        snapshot = shadow.snapshot
        if snapshot is None:
            self.metrics.shadow_skipped(shadow.alias, shadow.model, "not_ready")
            return
        with self._lock:
            if self._pending >= self.queue:
                full = True
            else:
                full = False
                self._pending += 1
        if full:
            self.metrics.shadow_skipped(shadow.alias, shadow.model, "queue_full")
            return
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="besvm-shadow"
            )
        job = Comparison(shadow, snapshot, served, instances, texts, answers)
        # In the request's context: the shadow's log lines carry the request's id.
        self._executor.submit(contextvars.copy_context().run, self._compare, job)

    def _compare(self, job: Comparison) -> None:
        shadow, snapshot, served, answers = job.shadow, job.snapshot, job.served, job.answers
        try:
            started = time.perf_counter()
            try:
                shadowed = snapshot.predictor.classify(job.instances, 1, texts=job.texts)
            except Exception as error:
                self.metrics.shadow_skipped(shadow.alias, shadow.model, "failed")
                self._failed(shadow, snapshot, error)
                return
            seconds = time.perf_counter() - started
            agreed = sum(a.label == b.label for a, b in zip(answers, shadowed, strict=True))
            disagreed = len(answers) - agreed
            self.metrics.shadow_compared(shadow.alias, shadow.model, agreed, disagreed, seconds)
            level = logging.INFO if disagreed else logging.DEBUG
            if shadow_logger.isEnabledFor(level):
                shadow_logger.log(
                    level,
                    "alias %r: shadow %r (version %s) disagreed with %r (version %s) on %d of "
                    "%d instances; shadow %.3f ms",
                    shadow.alias, shadow.model, snapshot.version[:12], served.name,
                    served.version[:12], disagreed, len(answers), seconds * 1000.0,
                )  # fmt: skip
        finally:
            with self._lock:
                self._pending -= 1

    def _failed(self, shadow: Shadow, snapshot: ModelSnapshot, error: Exception) -> None:
        # Once a version at warning: a shadow that cannot read the alias's inputs fails them all.
        key = (shadow.alias, snapshot.version)
        level = logging.DEBUG if key in self._warned else logging.WARNING
        self._warned.add(key)
        shadow_logger.log(
            level,
            "alias %r: shadow %r (version %s) failed: %s",
            shadow.alias, shadow.model, snapshot.version[:12], error,
        )  # fmt: skip

    def close(self) -> None:
        """Stop the thread; comparisons queued are dropped (nobody waits for them)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
