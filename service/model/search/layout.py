"""Where the search artifacts live under a model's directory, and how each level is tied to the
level it derives from.

::

    model-dir/                 the Basis Expanding SVM (see service.model.predictor)
        search/                SEARCH_DIR: the search model (see service.model.search.model)
            catalogue/         CATALOGUE_DIR: the catalogue (see service.model.search.catalogue)
"""

from __future__ import annotations

import os
from pathlib import Path

from service.model.errors import ArtifactIntegrityError

SEARCH_DIR = "search"
CATALOGUE_DIR = "catalogue"


def search_dir(model_dir: str | os.PathLike) -> Path:
    """Where a model's search model lives."""
    return Path(model_dir) / SEARCH_DIR


def catalogue_dir(model_dir: str | os.PathLike) -> Path:
    """Where a model's catalogue lives."""
    return search_dir(model_dir) / CATALOGUE_DIR


def check_parent(
    path: str | os.PathLike, manifest: dict, key: str, expected: str, parent: str | os.PathLike
) -> None:
    """Refuse an artifact built over another version of its parent.

    Parameters
    ----------
    path : path-like
        The artifact being loaded (for the message).
    manifest : dict
        Its manifest.
    key : str
        The manifest entry holding the parent's manifest checksum.
    expected : str
        The checksum of the parent's manifest as it is now.
    parent : path-like
        The parent artifact (for the message).

    Raises
    ------
    ArtifactIntegrityError
        The recorded checksum is missing or is not ``expected``.
    """
    if manifest.get(key) != expected:
        raise ArtifactIntegrityError(
            f"{path} was built for another version of {parent}: rebuild it "
            "(python -m training dictionary / index)"
        )
