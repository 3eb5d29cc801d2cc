"""A model's version: what identifies it on disk (:func:`fingerprint`), and its loading,
verified and warmed up, into one immutable snapshot (:func:`load_snapshot`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from service.api.serving_file import BatchingPolicy, read_serving_file
from service.model import ArtifactError, ModelNotReadyError, NotFoundError, Predictor
from service.model.artifact import manifest_digest
from service.model.search import SearchIndex, catalogue_dir, search_dir
from service.model.search.catalogue import SHARDS_DIR
from service.model.search.remote import CatalogueSource

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
    batching : BatchingPolicy or None
        The model's own dynamic batching (its ``serving.json``); None: the server's settings.
    """

    name: str
    path: Path
    version: str
    search_version: str | None
    fingerprint: tuple
    predictor: Predictor
    search: SearchIndex | None
    search_problem: str | None
    batching: BatchingPolicy | None = None

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
    batching = read_serving_file(path)
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
        batching=batching,
    )
    if previous is not None and not force and snapshot.search_levels < previous.search_levels:
        missing = "search model" if snapshot.search_levels == 0 else "catalogue"
        raise ArtifactError(
            f"the new version at {path} has no {missing}, the served one has: build it "
            "(python -m training dictionary / index), or load the version explicitly"
        )
    return snapshot
