"""The model registry: every served model as one immutable snapshot, replaced only once its
successor has loaded.

A request takes a model's snapshot once (one attribute read) and uses it throughout, so a swap
never mixes two versions in one answer; requests in flight finish on the snapshot they took.
A new version is loaded and warmed on a worker thread while the old one keeps serving, then put
in place with one reference assignment on the event loop. A version that fails to load is
refused: the old one keeps serving and the entry records why.

All state changes happen on the event loop's thread; only the loading itself runs elsewhere.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.model import (
    ArtifactError,
    ModelNotReadyError,
    NotFoundError,
    Predictor,
)
from service.model.artifact import manifest_digest, read_manifest
from service.model.search import SearchIndex, catalogue_dir, search_dir

logger = logging.getLogger("service.api")


class ModelState(enum.StrEnum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    UNLOADED = "unloaded"


def fingerprint(path: Path) -> tuple[str | None, ...]:
    """Checksums of the manifests of a model, its search model and its catalogue (None where
    absent): any new version of any of them changes it."""
    digests = []
    for directory in (path, search_dir(path), catalogue_dir(path)):
        try:
            digests.append(manifest_digest(directory))
        except OSError:
            digests.append(None)
    return tuple(digests)


@dataclass(frozen=True, eq=False)
class ModelSnapshot:
    """One loaded version of a model: everything a request needs, never modified.

    Parameters
    ----------
    name : str
    path : Path
    version : str
        sha256 of the model's manifest, which names every array by checksum.
    fingerprint : tuple
        See :func:`fingerprint`; a different one on disk means a new version to load.
    predictor : Predictor
    search : SearchIndex or None
    search_problem : str or None
        Why the model's search artifacts could not be loaded: /search says so while /classify
        keeps serving.
    loaded_at : float
        ``time.time()`` of the swap.
    """

    name: str
    path: Path
    version: str
    fingerprint: tuple[str | None, ...]
    predictor: Predictor
    search: SearchIndex | None
    search_problem: str | None
    loaded_at: float
    costs: dict[str, float] = field(default_factory=dict)

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


class ModelChangedWhileLoading(ArtifactError):
    """The artifact was replaced while it was being read: try again."""


def load_snapshot(name: str, path: Path, *, keep_broken_search: bool) -> ModelSnapshot:
    """Load, verify and warm up one version of a model (blocking: run it on a thread).

    Parameters
    ----------
    name : str
    path : Path
    keep_broken_search : bool
        Serve the classifier even if the search artifacts are broken (the first version of a
        model); otherwise a broken search refuses the whole version, so that a new version
        never takes away a working /search.

    Raises
    ------
    ArtifactError
        The model (or, without ``keep_broken_search``, its search) cannot be loaded.
    """
    before = fingerprint(path)
    predictor = Predictor.load(path)
    predictor.warm_up()
    search, search_problem = None, None
    try:
        search = SearchIndex.load(path, predictor)
        if search is not None:
            search.warm_up()
    except ArtifactError as error:
        if not keep_broken_search:
            raise
        search_problem = str(error)
    if fingerprint(path) != before:
        raise ModelChangedWhileLoading(f"{path} was replaced while loading it")
    return ModelSnapshot(
        name=name,
        path=path,
        version=before[0] or "",
        fingerprint=before,
        predictor=predictor,
        search=search,
        search_problem=search_problem,
        loaded_at=time.time(),
    )


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
    attempted: tuple[str | None, ...] | None = None  # the fingerprint last tried
    held_unloaded: bool = False  # unloaded on request: repository scans leave it so
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def not_ready_message(self) -> str:
        if self.state == ModelState.FAILED:
            return f"model {self.name!r} failed to load: {self.reason}"
        if self.state == ModelState.UNLOADED:
            return f"model {self.name!r} is not served: {self.reason}"
        return f"model {self.name!r} is loading"

    def describe(self) -> dict[str, Any]:
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
        ``root`` is one model (MODEL_DIR): its name is its manifest's ``name``.
    """

    def __init__(self, root: Path, single: bool = False) -> None:
        self.root = Path(root)
        self.single = single

    def scan(self) -> dict[str, Path]:
        """The models there now, by name."""
        if self.single:
            return {self._single_name(): self.root}
        if not self.root.is_dir():
            return {}
        return {
            child.name: child
            for child in sorted(self.root.iterdir())
            # Staging and retired directories of an artifact being written start with a dot.
            if child.is_dir() and not child.name.startswith(".")
        }

    def path_of(self, name: str) -> Path | None:
        return self.scan().get(name)

    def _single_name(self) -> str:
        try:
            return str(read_manifest(self.root).get("name") or self.root.name)
        except ArtifactError:
            return self.root.name

    def describe(self) -> str:
        return f"model {self.root}" if self.single else f"repository {self.root}"


class ModelRegistry:
    """The served models by name, each an entry holding its current snapshot.

    Parameters
    ----------
    repository : Repository
    default_model : str, optional
        Answers the routes without a model name; default: the only model, else the first by
        name that is ready.
    """

    def __init__(self, repository: Repository, default_model: str | None = None) -> None:
        self.repository = repository
        self.default_model = default_model
        self.entries: dict[str, ModelEntry] = {}
        self._sync_lock = asyncio.Lock()
        self.synced = False

    # -- the request path: plain attribute reads, no awaiting ------------------------------

    def snapshot(self, name: str | None = None) -> ModelSnapshot:
        """The snapshot a request uses: of model ``name``, or of the default model.

        Raises
        ------
        NotFoundError
            No model of that name.
        ModelNotReadyError
            The model has no loaded version (loading, failed or unloaded), with the reason.
        """
        entry = self.entries.get(name) if name is not None else self._default_entry()
        if entry is None:
            raise NotFoundError(self._unknown(name))
        snapshot = entry.snapshot
        if snapshot is None:
            raise ModelNotReadyError(entry.not_ready_message())
        return snapshot

    def _default_entry(self) -> ModelEntry | None:
        if self.default_model is not None:
            return self.entries.get(self.default_model)
        if len(self.entries) == 1:
            return next(iter(self.entries.values()))
        ready = [e for name, e in sorted(self.entries.items()) if e.snapshot is not None]
        return ready[0] if ready else None

    def _unknown(self, name: str | None) -> str:
        known = ", ".join(map(repr, sorted(self.entries))) or "none"
        if name is None:
            if self.default_model is not None:
                return (
                    f"the default model {self.default_model!r} is not in the "
                    f"{self.repository.describe()}; models: {known}"
                )
            return f"no model is loaded from the {self.repository.describe()}"
        return f"no model named {name!r}; models: {known}"

    def readiness(self) -> tuple[bool, str]:
        """Ready when the first scan is done and the default model has a snapshot."""
        if not self.synced:
            return False, "models are loading"
        try:
            snapshot = self.snapshot()
        except (NotFoundError, ModelNotReadyError) as error:
            return False, str(error)
        ready = sum(e.snapshot is not None for e in self.entries.values())
        return True, f"model {snapshot.name!r} loaded ({ready} of {len(self.entries)} ready)"

    # -- changes: run on the event loop, loading on a thread -------------------------------

    async def sync(self) -> list[ModelEntry]:
        """Bring the registry in line with the repository: load new and changed models,
        retire removed ones. Models unloaded on request stay unloaded."""
        async with self._sync_lock:
            found = await asyncio.to_thread(self.repository.scan)
            for name in sorted(self.entries.keys() - found.keys()):
                if not self.repository.single:
                    self._retire(name, "removed from the repository")
            for name, path in found.items():
                entry = self.entries.get(name)
                if entry is not None and entry.held_unloaded:
                    continue
                await self.load(name, path=path, force=False)
            self.synced = True
            return list(self.entries.values())

    async def load(self, name: str, path: Path | None = None, force: bool = True) -> ModelEntry:
        """Load model ``name``'s version on disk and swap it in; the old one keeps serving if
        it fails.

        Parameters
        ----------
        name : str
        path : Path, optional
            Default: looked up in the repository.
        force : bool
            Load even when the version on disk is the one served (or was already refused).

        Raises
        ------
        NotFoundError
            No such model in the repository.
        """
        if path is None:
            path = await asyncio.to_thread(self.repository.path_of, name)
            if path is None:
                raise NotFoundError(f"no model named {name!r} in the {self.repository.describe()}")
        entry = self.entries.get(name)
        if entry is None:
            entry = self.entries[name] = ModelEntry(name, path)
        async with entry.lock:
            entry.held_unloaded = False
            on_disk = await asyncio.to_thread(fingerprint, path)
            if not force and on_disk == entry.attempted:
                return entry
            if entry.snapshot is None:
                entry.state = ModelState.LOADING
            started = time.perf_counter()
            for attempt in range(3):
                try:
                    snapshot = await asyncio.to_thread(
                        load_snapshot, name, path, keep_broken_search=entry.snapshot is None
                    )
                    break
                except ModelChangedWhileLoading:
                    if attempt == 2:
                        self._refuse(entry, on_disk, f"{path} kept changing while loading it")
                        return entry
                except ArtifactError as error:
                    self._refuse(entry, on_disk, str(error))
                    return entry
                except Exception as error:  # one model's bug must not take down the others
                    logger.exception("model %r: loading %s failed", name, path)
                    self._refuse(entry, on_disk, f"loading failed: {error!r}")
                    return entry
            previous = entry.snapshot
            entry.path, entry.snapshot, entry.attempted = path, snapshot, snapshot.fingerprint
            entry.state, entry.reason = ModelState.READY, None
            _log_loaded(snapshot, previous, time.perf_counter() - started)
            return entry

    def _refuse(self, entry: ModelEntry, attempted, reason: str) -> None:
        entry.attempted = attempted
        if entry.snapshot is None:
            entry.state, entry.reason = ModelState.FAILED, reason
            logger.error("model %r failed to load: %s", entry.name, reason)
        else:
            entry.reason = f"a new version was refused: {reason}"
            logger.error(
                "model %r: %s; still serving version %s",
                entry.name,
                entry.reason,
                entry.snapshot.version[:12],
            )

    async def unload(self, name: str) -> ModelEntry:
        """Stop serving ``name`` until it is loaded again on request."""
        entry = self.entries.get(name)
        if entry is None:
            raise NotFoundError(self._unknown(name))
        async with entry.lock:
            self._retire(name, "unloaded on request", keep_entry=True)
            entry.held_unloaded = True
        return entry

    def _retire(self, name: str, why: str, keep_entry: bool = False) -> None:
        entry = self.entries[name] if keep_entry else self.entries.pop(name)
        entry.snapshot, entry.state, entry.reason = None, ModelState.UNLOADED, why
        entry.attempted = None
        logger.info("model %r %s", name, why)

    def names(self) -> Iterable[str]:
        return sorted(self.entries)


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
            "model %r search: %d atoms over %s features, catalogue of %s items",
            snapshot.name,
            snapshot.search.model.n_atoms,
            snapshot.search.model.feature_space,
            "no" if catalogue is None else f"{catalogue.n_items:,}",
        )
    elif snapshot.search_problem is not None:
        logger.error("model %r: search not loaded: %s", snapshot.name, snapshot.search_problem)
