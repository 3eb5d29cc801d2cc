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

What the repository may hold: directories whose names are not UTF-8 are skipped (they could not
be named in any answer) and logged once; symbolic links that lead out of the repository, the
model directory itself or anything in it, are refused unless ``ALLOW_EXTERNAL_SYMLINKS`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from service.api.errors import TrafficPolicyError
from service.api.machinery.metrics import Metrics
from service.api.traffic import (
    TRAFFIC_FILE_NAME,
    AliasPolicy,
    Shadow,
    apply_policies,
    describe_policy,
    edit_traffic_file,
    parse_traffic,
    read_traffic,
    refusal,
)
from service.model import ArtifactError, ModelNotReadyError, NotFoundError, Predictor
from service.model.artifact import manifest_digest, read_manifest
from service.model.errors import brief
from service.model.search import SearchIndex, catalogue_dir, search_dir
from service.model.search.catalogue import SHARDS_DIR
from service.model.search.remote import CatalogueSource

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


# The levels of a model on disk, as _level_paths lists them.
MODEL_LEVEL, SEARCH_LEVEL, CATALOGUE_LEVEL = 0, 1, 2


def _level_paths(path: Path) -> tuple[Path, Path, Path]:
    return path, search_dir(path), catalogue_dir(path)


def fingerprint(path: Path) -> tuple:
    """What identifies the model, search model and catalogue at ``path`` as they are on disk:
    their manifests' checksums, and every file's size, modification time and inode (the
    catalogue's shards' files included; names starting with a dot, a writer's staging files,
    left out). Any new version, and any file still being copied or changed in place, changes
    it."""
    levels = []
    for level, directory in enumerate(_level_paths(path)):
        try:
            digest = manifest_digest(directory)
            files = _file_stats(directory)
            shards = directory / SHARDS_DIR
            if level == CATALOGUE_LEVEL and shards.is_dir():
                files += tuple(
                    (f"{entry.name}/{name}", *stat)
                    for entry in sorted(os.scandir(shards), key=lambda e: e.name)
                    if entry.is_dir() and not entry.name.startswith(".")
                    for name, *stat in _file_stats(Path(entry.path))
                )
        except (OSError, ArtifactError):  # loading says what is wrong
            levels.append(None)
            continue
        levels.append((digest, files))
    return tuple(levels)


def _file_stats(directory: Path) -> tuple:
    return tuple(
        (entry.name, stat.st_size, stat.st_mtime_ns, stat.st_ino)
        for entry in sorted(os.scandir(directory), key=lambda e: e.name)
        if entry.is_file() and not entry.name.startswith(".") and (stat := entry.stat())
    )


@dataclass(frozen=True, eq=False)
class ModelSnapshot:
    """One loaded version of a model: everything a request needs, never modified.

    Parameters
    ----------
    name : str
    path : Path
    version : str
        sha256 of the model's manifest, which names every array by checksum.
    search_version : str or None
        sha256 of the catalogue's manifest (else of the search model's), which records the
        checksums of the levels it derives from: it identifies what answers /search.
    fingerprint : tuple
        See :func:`fingerprint`; a different one on disk means a new version to load.
    predictor : Predictor
    search : SearchIndex or None
    search_problem : str or None
        Why the model's search artifacts could not be loaded: /search says so while /classify
        keeps serving.
    """

    name: str
    path: Path
    version: str
    search_version: str | None
    fingerprint: tuple
    predictor: Predictor
    search: SearchIndex | None
    search_problem: str | None

    def require_search(self) -> SearchIndex:
        """The search index; raises NotFoundError or ModelNotReadyError naming the fix."""
        if self.search is not None:
            return self.search
        if self.search_problem is not None:
            raise ModelNotReadyError(
                f"model {self.name!r}: search not available: {self.search_problem}"
            )
        raise NotFoundError(
            f"model {self.name!r} has no search model: build one with "
            "python -m training dictionary, then python -m training index"
        )

    @property
    def search_levels(self) -> int:
        """0: no search model; 1: a search model; 2: a search model and its catalogue."""
        if self.search is None:
            return 0
        return 1 if self.search.catalogue is None else 2


class ModelChangedWhileLoadingError(ArtifactError):
    """The artifact was replaced while it was being read: try again."""


def load_snapshot(
    name: str,
    path: Path,
    previous: ModelSnapshot | None = None,
    force: bool = False,
    source: CatalogueSource | None = None,
) -> ModelSnapshot:
    """Load, verify and warm up one version of a model (blocking: run it on a thread).

    Parameters
    ----------
    name : str
    path : Path
    previous : ModelSnapshot, optional
        The version served now. Without one, a model whose search artifacts are broken still
        serves /classify. With one, a new version is refused if its search artifacts are
        broken or missing where the served one has them (a retrained model whose search model
        and catalogue are not rebuilt yet), so that an update never takes /search away.
    force : bool
        Accept a version with fewer search levels than ``previous`` (an explicit load).
    source : CatalogueSource, optional
        Where catalogues are searched (this process, or a cluster's workers).

    Raises
    ------
    ModelChangedWhileLoadingError
        The files changed while they were read.
    ArtifactError
        The version cannot be loaded, or is refused.
    """
    before = fingerprint(path)
    try:
        snapshot = _load(name, path, before, previous, force, source)
    except ArtifactError as error:
        if fingerprint(path) != before:
            raise ModelChangedWhileLoadingError(f"{path} changed while loading it") from error
        raise
    if fingerprint(path) != before:
        raise ModelChangedWhileLoadingError(f"{path} changed while loading it")
    return snapshot


def _load(
    name: str,
    path: Path,
    before: tuple,
    previous: ModelSnapshot | None,
    force: bool,
    source: CatalogueSource | None,
) -> ModelSnapshot:
    # Only the catalogue changed (an update of its items): the model and search model served
    # stay, and the catalogue's new version loads only the shards it adds.
    catalogue_only = (
        previous is not None
        and previous.search is not None
        and before[:CATALOGUE_LEVEL] == previous.fingerprint[:CATALOGUE_LEVEL]
    )
    if catalogue_only:
        predictor = previous.predictor
    else:
        predictor = Predictor.load(path)
        predictor.warm_up()
    search, search_problem = None, None
    try:
        reuse = None if previous is None else previous.search
        search = SearchIndex.load(path, predictor, reuse, source)
        # A new catalogue version needs no warm-up, unless it is the first (nothing ran yet).
        if search is not None and (not catalogue_only or previous.search.catalogue is None):
            search.warm_up()
    except ArtifactError as error:
        if previous is not None:
            raise
        search_problem = str(error)
    model, search_level, catalogue_level = before
    snapshot = ModelSnapshot(
        name=name,
        path=path,
        version=model[0] if model else "",
        search_version=(catalogue_level or search_level or (None,))[0],
        fingerprint=before,
        predictor=predictor,
        search=search,
        search_problem=search_problem,
    )
    if previous is not None and not force and snapshot.search_levels < previous.search_levels:
        missing = "search model" if snapshot.search_levels == 0 else "catalogue"
        raise ArtifactError(
            f"the new version at {path} has no {missing}, the served one has: build it "
            "(python -m training dictionary / index), or load the version explicitly"
        )
    return snapshot


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


class Repository:
    """Where models live: a directory of model directories, or one model directory.

    Parameters
    ----------
    root : Path
        The repository, or the model directory when ``single`` is true.
    single : bool
        ``root`` is one model (MODEL_DIR), named by its manifest's ``name`` when the server
        first looks (else by its directory).
    """

    def __init__(
        self,
        root: Path,
        single: bool = False,
        allow_external_symlinks: bool = False,
        traffic_file: Path | None = None,
    ) -> None:
        self.root = Path(root)
        self.single = single
        self.allow_external_symlinks = allow_external_symlinks
        # The traffic policies (service.api.traffic): TRAFFIC_FILE, else traffic.json in a
        # repository; a single model has none unless TRAFFIC_FILE names one.
        if traffic_file is None and not single:
            traffic_file = self.root / TRAFFIC_FILE_NAME
        self.traffic_file = traffic_file
        self._single_name: str | None = None
        self._skipped: set[str] = set()  # names logged as skipped, so logged once

    def scan(self) -> dict[str, Path]:
        """The models there now, by name (directories whose names are not UTF-8 left out)."""
        if self.single:
            if self._single_name is None:
                self._single_name = self._manifest_name() or self.root.name
            return {self._single_name: self.root}
        if not self.root.is_dir():
            return {}
        found, skipped = {}, set()
        for child in sorted(self.root.iterdir()):
            # Staging and retired directories of an artifact being written start with a dot.
            if child.name.startswith(".") or not child.is_dir():
                continue
            if _is_utf8(child.name):
                found[child.name] = child
                continue
            skipped.add(child.name)
            if child.name not in self._skipped:
                logger.warning(
                    "skipping %s in the %s: its name is not UTF-8, so no answer could name it; "
                    "rename it",
                    ascii(child.name),
                    self.describe(),
                )
        self._skipped = skipped
        return found

    def check_links(self, path: Path) -> None:
        """Refuse a model directory that is, or holds, a symbolic link to a place outside the
        repository (the model's directory, for one model), unless ALLOW_EXTERNAL_SYMLINKS.

        Raises
        ------
        ArtifactError
            Naming the link and where it leads.
        """
        if self.allow_external_symlinks:
            return
        inside = os.path.realpath(self.root)
        links = [path] if path.is_symlink() else []
        for directory, subdirectories, files in os.walk(path):
            for name in subdirectories + files:
                if os.path.islink(os.path.join(directory, name)):
                    links.append(Path(directory, name))
        for link in links:
            target = os.path.realpath(link)
            if os.path.commonpath([inside, target]) != inside:
                raise ArtifactError(
                    f"{link} is a symbolic link to {target}, outside the "
                    f"{self.describe()}: refused (ALLOW_EXTERNAL_SYMLINKS=true serves it)"
                )

    def _manifest_name(self) -> str | None:
        try:
            return str(read_manifest(self.root).get("name") or "") or None
        except ArtifactError:
            return None

    def describe(self) -> str:
        """In words, for messages: "repository <path>" or "model <path>"."""
        return f"model {self.root}" if self.single else f"repository {self.root}"


def _is_utf8(name: str) -> bool:
    """Whether a file name read from the system was valid UTF-8 (undecodable bytes come back
    as lone surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
