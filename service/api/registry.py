"""The model registry: every served model as one immutable snapshot, replaced only once its
successor has loaded.

A request takes a model's snapshot once (one attribute read) and uses it throughout, so a swap
never mixes two versions in one answer; requests in flight finish on the snapshot they took.
A new version is loaded and warmed on a worker thread while the old one keeps serving, then put
in place with one reference assignment on the event loop. A version that fails to load is
refused: the old one keeps serving and the entry records why.

All state changes happen on the event loop's thread, each model's under its own lock; only the
reading of the repository runs elsewhere, each call on a daemon thread of its own and waited for
at most ``LOAD_TIMEOUT_S`` (:func:`off_loop`): a file system that never answers costs a thread,
never a rescan, the rescans after it, or the process's exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from service.api.errors import TrafficPolicyError
from service.api.machinery.metrics import Metrics
from service.api.repository import Repository
from service.api.traffic import (
    AliasPolicy,
    Shadow,
    apply_policies,
    describe_policy,
    edit_traffic_file,
    parse_traffic,
    read_traffic,
    refusal,
)
from service.api.versions import (
    ModelChangedWhileLoadingError,
    ModelSnapshot,
    fingerprint,
    load_snapshot,
)
from service.model import ArtifactError, ModelNotReadyError, NotFoundError
from service.model.errors import brief
from service.model.search.remote import CatalogueSource
from service.model.threads import lower_priority

logger = logging.getLogger("service.api")


# Tries to load a version that keeps changing underneath (a writer still at work), and the pause
# between them.
LOAD_ATTEMPTS = 3
LOAD_RETRY_PAUSE_S = 0.2
# A model missing from a scan is looked for once more after this pause before it is retired, so
# that a replacement by two renames (where the kernel cannot exchange them) never retires it.
MISSING_RECHECK_S = 0.05
# Default of LOAD_TIMEOUT_S: seconds one read of the repository (a scan, a version's files, the
# loading and warm-up of a version) may take.
DEFAULT_LOAD_TIMEOUT_S = 300.0


T = TypeVar("T")


async def off_loop(function: Callable[..., T], *args: Any, timeout_s: float | None = None) -> T:
    """``function(*args)``, run on a daemon thread of its own; TimeoutError after ``timeout_s``.

    Not the loop's thread pool: a call that never returns (a file on a hung file system) would
    hold one of its threads, and the interpreter waits for those at exit. A daemon thread is
    left behind instead.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        lower_priority()  # the loop that serves requests runs first
        try:
            outcome: tuple[Any, BaseException | None] = (function(*args), None)
        except BaseException as error:
            outcome = (None, error)
        # A closed loop (RuntimeError) has nobody waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, *outcome)

    # The time counts from before the start: a thread that runs the whole call while this one
    # waits to run again (the GIL, a busy host) is still late.
    async with asyncio.timeout(timeout_s):
        threading.Thread(target=run, name="besvm-repository", daemon=True).start()
        return await future


class ModelState(enum.StrEnum):
    """A model's state as served: ``loading`` (its first version), ``ready`` (serving a
    version), ``failed`` (no version could be loaded) or ``unloaded``."""

    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    UNLOADED = "unloaded"


@dataclass(eq=False)
class ModelEntry:
    """A model the registry knows of: its current snapshot (if any) and its state.

    ``state`` is the state of the model as served: a model whose new version was refused stays
    ``ready`` on its old snapshot, with ``reason`` saying why the new one was refused.
    """

    name: str
    path: Path
    state: ModelState = ModelState.LOADING
    snapshot: ModelSnapshot | None = None
    reason: str | None = None
    attempted: tuple | None = None  # the fingerprint last tried, loaded or refused
    held_unloaded: bool = False  # unloaded on request: repository scans leave it so
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def not_ready_message(self) -> str:
        """Why requests to this model cannot be answered (it has no snapshot)."""
        if self.state == ModelState.FAILED:
            return f"model {self.name!r} failed to load: {self.reason}"
        if self.state == ModelState.UNLOADED:
            return f"model {self.name!r} is not served: {self.reason}"
        return f"model {self.name!r} is loading"

    def describe(self) -> dict[str, Any]:
        """Name, state, version served (or None) and reason (or None)."""
        return {
            "name": self.name,
            "state": str(self.state),
            "version": None if self.snapshot is None else self.snapshot.version,
            "reason": self.reason,
        }


class ModelRegistry:
    """The served models by name, each an entry holding its current snapshot.

    Parameters
    ----------
    repository : Repository
    default_model : str, optional
        Answers the routes without a model name; default: the only model.
    metrics : Metrics, optional
        Told of loads (their time and the version served), failed loads and retirements.
    load_timeout_s : float
        Seconds one read of the repository may take (a scan, or loading one version); a
        version that takes longer is refused.
    source : CatalogueSource, optional
        Where the models' catalogues are searched; default: in this process.
    """

    def __init__(
        self,
        repository: Repository,
        default_model: str | None = None,
        metrics: Metrics | None = None,
        load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
        source: CatalogueSource | None = None,
    ) -> None:
        self.repository = repository
        self.default_model = default_model
        self.metrics = metrics or Metrics()
        self.load_timeout_s = load_timeout_s
        self.source = source
        self.entries: dict[str, ModelEntry] = {}
        # Aliases and their canaries and shadows (service.api.traffic): replaced whole, never
        # changed in place; the reasons of changes refused, and why the file was not read.
        self.policies: dict[str, AliasPolicy] = {}
        self.policy_reasons: dict[str, str] = {}
        self.traffic_problem: str | None = None
        self._traffic_lock = asyncio.Lock()
        self._sync_lock = asyncio.Lock()
        self._rechecks: dict[str, asyncio.Task] = {}
        self.synced = False

    # -- the request path: plain attribute reads, no awaiting ----------------------------------

    def snapshot(self, name: str | None = None, version: str | None = None) -> ModelSnapshot:
        """The snapshot a request uses: of model ``name``, or of the default model; for an
        alias, of its model (or of its canary, if that serves ``version``).

        Raises
        ------
        NotFoundError
            No model or alias of that name (or no default model).
        ModelNotReadyError
            The model has no loaded version (loading, failed or unloaded), with the reason.
        """
        key = name if name is not None else self._default_name()
        entry = self.entries.get(key)
        if entry is None:
            policy = self.policies.get(key)
            if policy is None:
                raise NotFoundError(self._unknown(name))
            return policy.primary(key, self.entries, version)
        snapshot = entry.snapshot
        if snapshot is None:
            raise ModelNotReadyError(entry.not_ready_message())
        return snapshot

    def route(
        self, name: str | None = None, version: str | None = None
    ) -> tuple[ModelSnapshot, Shadow | None]:
        """The snapshot that answers one classification, as :meth:`snapshot`, but an alias's
        canary and shadow drawn (see :meth:`AliasPolicy.route`)."""
        key = name if name is not None else self._default_name()
        entry = self.entries.get(key)
        if entry is not None and entry.snapshot is not None:
            return entry.snapshot, None
        policy = None if entry is not None else self.policies.get(key)
        if policy is not None:
            return policy.route(key, self.entries, version)
        return self.snapshot(name, version), None  # the error

    def _default_name(self) -> str | None:
        if self.default_model is not None:
            return self.default_model
        if len(self.entries) == 1:
            return next(iter(self.entries))
        return None

    def _unknown(self, name: str | None) -> str:
        known = ", ".join(map(repr, sorted(self.entries))) or "none"
        if self.policies:
            known += "; aliases: " + ", ".join(map(repr, sorted(self.policies)))
        if name is not None:
            return f"no model named {brief(name)}; models: {known}"
        if self.default_model is not None:
            return (
                f"the default model {self.default_model!r} is not in the "
                f"{self.repository.describe()}; models: {known}"
            )
        if not self.entries:
            return f"no model in the {self.repository.describe()}"
        return (
            f"the {self.repository.describe()} holds several models ({known}): name one "
            "(/v1/models/{name}/...), or set DEFAULT_MODEL"
        )

    def readiness(self) -> tuple[bool, str]:
        """Ready when the first scan is done and the default model (if there is one; else any
        model) has a snapshot."""
        if not self.synced:
            return False, "models are loading"
        ready = sum(e.snapshot is not None for e in self.entries.values())
        summary = f"{ready} of {len(self.entries)} models ready"
        if self._default_name() is None and len(self.entries) > 1:
            return (ready > 0, summary) if ready else (False, f"no model is ready: {summary}")
        try:
            snapshot = self.snapshot()
        except (NotFoundError, ModelNotReadyError) as error:
            return False, str(error)
        return True, f"model {snapshot.name!r} loaded ({summary})"

    def entries_by_name(self) -> list[ModelEntry]:
        """Every entry, sorted by name."""
        return [self.entries[name] for name in sorted(self.entries)]

    # -- changes: run on the event loop, loading on a thread ---------------------------------

    async def sync(self) -> list[ModelEntry]:
        """Bring the registry in line with the repository: load new and changed models,
        retire removed ones. Models unloaded on request stay unloaded."""
        async with self._sync_lock:
            found = await self._scan()
            missing = self.entries.keys() - found.keys()
            if missing:
                await asyncio.sleep(MISSING_RECHECK_S)
                found = await self._scan()
                missing = self.entries.keys() - found.keys()
            for name in sorted(missing):
                entry = self.entries[name]
                async with entry.lock:
                    if self.entries.get(name) is entry:
                        self._retire(entry, "removed from the repository")
                        del self.entries[name]
            for name, path in found.items():
                await self.load(name, path=path, force=False)
            await self.apply_traffic()
            self.synced = True
            return self.entries_by_name()

    async def _scan(self) -> dict[str, Path]:
        try:
            return await off_loop(self.repository.scan, timeout_s=self.load_timeout_s)
        except TimeoutError:
            raise ModelNotReadyError(
                f"the {self.repository.describe()} could not be listed within "
                f"{self.load_timeout_s:g} s (LOAD_TIMEOUT_S)"
            ) from None

    async def load(self, name: str, path: Path | None = None, force: bool = True) -> ModelEntry:
        """Load model ``name``'s version on disk and swap it in; the old one keeps serving if
        it fails.

        Parameters
        ----------
        name : str
        path : Path, optional
            Default: looked up in the repository.
        force : bool
            An explicit load: also when the version on disk is the one served (or was already
            refused), also of a model unloaded on request, and also of a version without the
            search model or catalogue the served one has.

        Raises
        ------
        NotFoundError
            No such model in the repository.
        """
        if path is None:
            path = (await self._scan()).get(name)
            if path is None:
                raise NotFoundError(
                    f"no model named {brief(name)} in the {self.repository.describe()}"
                )
        entry = self.entries.get(name)
        if entry is None:
            entry = self.entries[name] = ModelEntry(name, path)
        async with entry.lock:
            if self.entries.get(name) is not entry:  # retired while this load waited
                raise NotFoundError(f"model {name!r} was removed from the repository")
            if not force and entry.held_unloaded:
                return entry
            try:
                on_disk = await off_loop(fingerprint, path, timeout_s=self.load_timeout_s)
            except TimeoutError:
                self._refuse(entry, None, self._too_slow(path, "reading"))
                return entry
            if not force and on_disk == entry.attempted:
                return entry
            entry.held_unloaded = False
            if entry.snapshot is None:
                entry.state = ModelState.LOADING
            started = time.perf_counter()
            snapshot = await self._load_with_retries(entry, path, on_disk, force)
            if snapshot is None:
                return entry
            previous = entry.snapshot
            entry.path, entry.snapshot, entry.attempted = path, snapshot, snapshot.fingerprint
            entry.state, entry.reason = ModelState.READY, None
            seconds = time.perf_counter() - started
            _log_loaded(snapshot, previous, seconds)
            self.metrics.model_loaded(
                name, snapshot.version, None if previous is None else previous.version, seconds
            )
            return entry

    async def _load_with_retries(
        self, entry: ModelEntry, path: Path, on_disk: tuple, force: bool
    ) -> ModelSnapshot | None:
        """The new snapshot, or None after recording why it was refused."""
        for attempt in range(LOAD_ATTEMPTS):
            try:
                return await off_loop(
                    self._checked_load, entry, path, force, timeout_s=self.load_timeout_s
                )
            except ModelChangedWhileLoadingError:
                if attempt + 1 < LOAD_ATTEMPTS:
                    await asyncio.sleep(LOAD_RETRY_PAUSE_S)
                    try:
                        on_disk = await off_loop(fingerprint, path, timeout_s=self.load_timeout_s)
                    except TimeoutError:
                        self._refuse(entry, None, self._too_slow(path, "reading"))
                        return None
                    continue
                # Not recorded as attempted: the next scan tries again.
                self._refuse(entry, None, f"{path} kept changing while loading it")
            except ArtifactError as error:
                self._refuse(entry, on_disk, str(error))
            except TimeoutError:
                # Recorded as attempted: the next scan does not start another such load.
                self._refuse(entry, on_disk, self._too_slow(path, "loading"))
            except Exception as error:  # one model's bug must not take down the others
                logger.exception("model %r: loading %s failed", entry.name, path)
                self._refuse(entry, on_disk, f"loading failed: {error!r}")
            return None
        return None

    def _checked_load(self, entry: ModelEntry, path: Path, force: bool) -> ModelSnapshot:
        """Load a version (on a thread) once its links are known to stay in the repository."""
        self.repository.check_links(path)
        return load_snapshot(entry.name, path, entry.snapshot, force, self.source)

    def _too_slow(self, path: Path, doing: str) -> str:
        return f"{doing} {path} took longer than {self.load_timeout_s:g} s (LOAD_TIMEOUT_S)"

    def _refuse(self, entry: ModelEntry, attempted: tuple | None, reason: str) -> None:
        entry.attempted = attempted
        self.metrics.model_load_failed(entry.name)
        if entry.snapshot is None:
            entry.state, entry.reason = ModelState.FAILED, reason
            logger.error("model %r failed to load: %s", entry.name, reason)
        else:
            entry.reason = f"a new version was refused: {reason}"
            # A warning: the model keeps serving, and a half-written update is a normal sight.
            logger.warning(
                "model %r: %s; still serving version %s",
                entry.name,
                entry.reason,
                entry.snapshot.version[:12],
            )

    def recheck(self, name: str) -> None:
        """Look at model ``name`` on disk again soon, once (a request found one of its files
        changed in place): a changed version is loaded, or refused, as on a rescan."""
        if name in self._rechecks:
            return
        task = asyncio.get_running_loop().create_task(self._recheck(name))
        self._rechecks[name] = task
        task.add_done_callback(lambda _: self._rechecks.pop(name, None))

    async def _recheck(self, name: str) -> None:
        logger.debug("model %r: a file changed in place on disk; looking at it again", name)
        try:
            await self.load(name, force=False)
        except Exception:  # e.g. removed meanwhile: the next scan settles it
            logger.exception("model %r: looking at it again failed", name)

    async def unload(self, name: str) -> ModelEntry:
        """Stop serving ``name`` until it is loaded again on request."""
        entry = self.entries.get(name)
        if entry is None:
            raise NotFoundError(self._unknown(name))
        async with entry.lock:
            self._retire(entry, "unloaded on request")
            entry.held_unloaded = True
        return entry

    def _retire(self, entry: ModelEntry, why: str) -> None:
        if entry.snapshot is not None:
            self.metrics.model_retired(entry.name, entry.snapshot.version)
        entry.snapshot, entry.state, entry.reason = None, ModelState.UNLOADED, why
        entry.attempted = None
        logger.info("model %r %s", entry.name, why)

    # -- traffic policies (service.api.traffic) ------------------------------------------------

    async def apply_traffic(self) -> None:
        """Read the traffic file and serve its policies (each one that may be applied now; see
        :func:`~service.api.traffic.refusal`). A file that cannot be read or parsed leaves
        every policy as it is, the reason logged once and listed."""
        path = self.repository.traffic_file
        if path is None:
            return
        async with self._traffic_lock:
            try:
                raw = await off_loop(read_traffic, path, timeout_s=self.load_timeout_s)
                wanted = parse_traffic(raw, str(path))
            except TrafficPolicyError as error:
                self._traffic_unread(str(error))
                return
            except (OSError, TimeoutError) as error:
                self._traffic_unread(f"{path}: {error!r}")
                return
            self.traffic_problem = None
            self._serve_policies(wanted)

    def _traffic_unread(self, problem: str) -> None:
        if problem != self.traffic_problem:
            logger.error("traffic policies not re-read, those in force stay: %s", problem)
        self.traffic_problem = problem

    async def change_traffic(self, change) -> dict[str, Any]:
        """Apply ``change`` (see :mod:`service.api.traffic`: set, remove, promote, roll back) to
        the traffic file, then serve it; the alias it changed, described, is the caller's to
        pick from :meth:`describe_aliases`.

        Raises
        ------
        TrafficPolicyError
            No traffic file (one model served without TRAFFIC_FILE), the file cannot be read or
            written, or the change is refused (the models it names are not served).
        NotFoundError
            The change names an alias that does not exist.
        """
        path = self.repository.traffic_file
        if path is None:
            raise TrafficPolicyError(
                "aliases need a model repository (MODEL_REPOSITORY) or TRAFFIC_FILE"
            )

        def checked(policies: dict[str, AliasPolicy]) -> dict[str, AliasPolicy]:
            changed = change(policies)
            for alias, policy in changed.items():
                if policies.get(alias) != policy:
                    reason = refusal(alias, policy, self.policies.get(alias), self.entries)
                    if reason is not None:
                        raise TrafficPolicyError(reason)
            return changed

        async with self._traffic_lock:
            try:
                wanted = await off_loop(
                    edit_traffic_file, path, checked, timeout_s=self.load_timeout_s
                )
            except TimeoutError:
                raise TrafficPolicyError(
                    f"{path} could not be changed within {self.load_timeout_s:g} s (LOAD_TIMEOUT_S)"
                ) from None
            self.traffic_problem = None
            self._serve_policies(wanted)
        return self.describe_aliases()

    def _serve_policies(self, wanted: dict[str, AliasPolicy]) -> None:
        policies, reasons = apply_policies(wanted, self.policies, self.entries)
        for alias in sorted(reasons.keys() - self.policy_reasons.keys()):
            logger.error("traffic policy of alias %r refused: %s", alias, reasons[alias])
        for alias in sorted(policies):
            if self.policies.get(alias) != policies[alias]:
                logger.info("alias %r now: %s", alias, _policy_words(policies[alias]))
        for alias in sorted(self.policies.keys() - policies.keys()):
            logger.info("alias %r removed", alias)
        self.policies, self.policy_reasons = policies, reasons

    def describe_aliases(self) -> dict[str, Any]:
        """The aliases served (with each model's version served) and those refused, the
        traffic file and why it was last not read (None)."""
        served = [
            describe_policy(alias, policy, self.entries, self.policy_reasons.get(alias))
            for alias, policy in sorted(self.policies.items())
        ]
        refused = [
            {"name": alias, "reason": reason}
            for alias, reason in sorted(self.policy_reasons.items())
            if alias not in self.policies
        ]
        path = self.repository.traffic_file
        return {
            "file": None if path is None else str(path),
            "problem": self.traffic_problem,
            "aliases": served,
            "refused": refused,
        }


def _policy_words(policy: AliasPolicy) -> str:
    words = f"model {policy.model!r}"
    if policy.canary is not None:
        words += f", canary {policy.canary.model!r} at {policy.canary.percent:g}%"
    if policy.shadow is not None:
        words += f", shadow {policy.shadow.model!r} at {policy.shadow.percent:g}%"
    return words


def _log_loaded(snapshot: ModelSnapshot, previous: ModelSnapshot | None, seconds: float) -> None:
    predictor = snapshot.predictor
    action = "loaded" if previous is None else f"replaced version {previous.version[:12]} with"
    logger.info(
        "model %r %s version %s from %s in %.2f s (%d classes, %s, %d basis items)",
        snapshot.name,
        action,
        snapshot.version[:12],
        snapshot.path,
        seconds,
        len(predictor.classes),
        " + ".join(predictor.similarity_names),
        predictor.n_basis,
    )
    if snapshot.search is not None:
        catalogue = snapshot.search.catalogue
        logger.info(
            "model %r search version %s: %d atoms over %s features, catalogue of %s items",
            snapshot.name,
            (snapshot.search_version or "")[:12],
            snapshot.search.model.n_atoms,
            snapshot.search.model.feature_space,
            "no" if catalogue is None else f"{catalogue.n_items:,}",
        )
    elif snapshot.search_problem is not None:
        logger.error("model %r: search not loaded: %s", snapshot.name, snapshot.search_problem)
