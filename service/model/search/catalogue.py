"""The catalogue: projected items ``X' = D^T X`` (A x N float32, atom major, memory-mapped),
their ids, optional labels, and the fixed random sample of items that serves as negatives of
learned codes.

::

    catalogue/     projected.npy (A x N float32), ids.npy, negatives.npy, labels.npy (optional)

The manifest records the checksum of the search model's manifest: a catalogue built with another
dictionary is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.model.artifact import (
    MappedFile,
    StreamedArray,
    manifest_digest,
    read_typed_artifact,
    write_artifact,
)
from service.model.errors import (
    ArtifactChangedError,
    ArtifactIntegrityError,
    InvalidInputError,
    brief,
)
from service.model.kernels.search import search_top_k
from service.model.search.codes import SparseCode
from service.model.search.layout import check_parent
from service.model.search.model import UnionOfSubspacesModel

CATALOGUE_TYPE = "catalogue"
DEFAULT_NEGATIVES = 1000


@dataclass(frozen=True, eq=False)
class Catalogue:
    """Projected catalogue items and their ids.

    Parameters
    ----------
    projected : ndarray of shape (A, N), float32
        ``D^T x`` of every item, atom major; usually a read-only memory map.
    ids : ndarray of shape (N,), str
    negatives : ndarray of shape (n_negatives,), int64
        Positions of the fixed random sample that serves as negatives of learned codes.
    labels : ndarray of shape (N,), str, optional
        Known classes of the items (evaluation only).
    metadata : dict
    mapped : MappedFile, optional
        The file ``projected`` maps, checked before every read of the map (see
        :meth:`MappedFile.check`): a search on a catalogue cut short on disk raises
        ArtifactChangedError instead of killing the process.
    """

    projected: np.ndarray
    ids: np.ndarray
    negatives: np.ndarray
    labels: np.ndarray | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    mapped: MappedFile | None = None

    def __post_init__(self) -> None:
        n_items = self.projected.shape[1]
        if self.projected.dtype != np.float32 or not self.projected.flags.c_contiguous:
            raise ArtifactIntegrityError("catalogue: projected must be C-contiguous float32")
        if self.ids.shape != (n_items,) or (
            self.labels is not None and self.labels.shape != (n_items,)
        ):
            raise ArtifactIntegrityError(f"catalogue: ids and labels must have {n_items} entries")
        if self.negatives.size and not 0 <= self.negatives.min() <= self.negatives.max() < n_items:
            raise ArtifactIntegrityError("catalogue: negatives sample is out of range")
        order = np.argsort(self.ids, kind="stable")
        sorted_ids = self.ids[order]
        if n_items > 1 and (sorted_ids[1:] == sorted_ids[:-1]).any():
            raise ArtifactIntegrityError("catalogue: ids are not unique")
        object.__setattr__(self, "_id_order", order)
        object.__setattr__(self, "_sorted_ids", sorted_ids)
        # Gathered once: columns of an atom-major map are scattered reads, paid at load time.
        object.__setattr__(
            self, "_negative_rows", np.ascontiguousarray(self.projected[:, self.negatives].T)
        )

    @property
    def n_items(self) -> int:
        return int(self.projected.shape[1])

    @property
    def n_atoms(self) -> int:
        return int(self.projected.shape[0])

    def positions(self, ids: Sequence[str], what: str = "id") -> np.ndarray:
        """Catalogue positions of ``ids``, shape (n,); unknown ids raise InvalidInputError."""
        texts = [str(i) for i in ids]
        if not texts:
            return np.zeros(0, dtype=np.int64)
        # An id longer than every catalogue id matches none: it is never cast (which would cut
        # it to a false match) nor searched (which would widen every catalogue id to its length,
        # gigabytes for one long id).
        width = self._sorted_ids.dtype.itemsize // np.dtype("U1").itemsize
        fits = np.fromiter((len(t) <= width for t in texts), dtype=bool, count=len(texts))
        wanted = np.asarray([t if f else "" for t, f in zip(texts, fits, strict=True)])
        wanted = wanted.astype(self._sorted_ids.dtype)
        at = np.searchsorted(self._sorted_ids, wanted)
        at_clipped = np.minimum(at, self.n_items - 1)
        found = fits & (at < self.n_items) & (self._sorted_ids[at_clipped] == wanted)
        if not found.all():
            missing = np.flatnonzero(~found)
            unknown = ", ".join(brief(texts[i]) for i in missing[:5])
            more = "" if missing.size <= 5 else f" (and {missing.size - 5} more)"
            raise InvalidInputError(f"unknown catalogue {what}(s): {unknown}{more}")
        return self._id_order[at_clipped].astype(np.int64)

    def _readable(self) -> np.ndarray:
        """``projected``, once its file is known to still hold it (ArtifactChangedError if
        not)."""
        if self.mapped is not None:
            try:
                self.mapped.check()
            except ArtifactChangedError as error:
                raise ArtifactChangedError(
                    f"the catalogue changed on disk: {error}; searches are answered again once "
                    "a whole catalogue is in place and loaded"
                ) from None
        return self.projected

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """Projected items at ``positions``, shape (n, A)."""
        return np.ascontiguousarray(self._readable()[:, positions].T, dtype=np.float64)

    def negative_rows(self, excluded: np.ndarray) -> np.ndarray:
        """The fixed negatives sample, without the items at ``excluded``, shape (n, A)."""
        keep = ~np.isin(self.negatives, excluded)
        return self._negative_rows[keep].astype(np.float64)

    def top(self, code: SparseCode, k: int, excluded: np.ndarray | None = None):
        """The ``k`` best items for ``code``, best first (see
        :func:`service.model.kernels.search.search_top_k`).

        Parameters
        ----------
        code : SparseCode
        k : int
            At least 1; fewer items come back when the catalogue has fewer left.
        excluded : ndarray of shape (n_excluded,), int64, optional
            Sorted unique positions never returned.

        Returns
        -------
        positions : ndarray of shape (m,), int64
            ``m = min(k, N - n_excluded)``.
        scores : ndarray of shape (m,), float64
        """
        return search_top_k(self._readable(), code.atoms, code.weights, code.bias, k, excluded)


def write_catalogue(
    path: str | os.PathLike,
    model: UnionOfSubspacesModel,
    search_path: str | os.PathLike,
    ids: np.ndarray,
    fill_projected: Callable[[np.ndarray], None],
    labels: np.ndarray | None = None,
    n_negatives: int = DEFAULT_NEGATIVES,
    seed: int = 0,
    metadata: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a catalogue artifact; ``fill_projected`` writes ``D^T x`` into an (A, N) float32
    memory map, chunk by chunk, so memory stays bounded.

    Parameters
    ----------
    path : path-like
    model : UnionOfSubspacesModel
    search_path : path-like
        The search model's directory (its checksum is recorded).
    ids : ndarray of shape (N,)
        Unique item ids (stored as strings).
    fill_projected : callable
    labels : ndarray of shape (N,), optional
    n_negatives : int
        Size of the fixed random sample of negatives for learned codes.
    seed : int
    metadata : dict, optional
        Recorded in the manifest.
    overwrite : bool

    Returns
    -------
    Path
        The artifact's directory.

    Raises
    ------
    InvalidInputError
        No ids, or a repeated one.
    """
    ids = narrow_strings(ids)
    n_items = len(ids)
    if n_items == 0:
        raise InvalidInputError("the catalogue is empty")
    sorted_ids = np.sort(ids)
    repeated = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if repeated.size:
        raise InvalidInputError(f"duplicate catalogue ids, e.g. {str(sorted_ids[repeated[0]])!r}")
    del sorted_ids
    negatives = sample_positions(n_items, min(n_negatives, n_items), np.random.default_rng(seed))
    arrays: dict[str, Any] = {
        "projected": StreamedArray((model.n_atoms, n_items), np.dtype(np.float32), fill_projected),
        "ids": ids,
        "negatives": negatives.astype(np.int64),
    }
    if labels is not None:
        arrays["labels"] = narrow_strings(labels)
    manifest = {
        "model_type": CATALOGUE_TYPE,
        "n_items": n_items,
        "n_atoms": model.n_atoms,
        "search_manifest_sha256": manifest_digest(search_path),
        "negatives_seed": seed,
        **(metadata or {}),
    }
    return write_artifact(path, manifest, arrays, overwrite=overwrite)


def narrow_strings(values) -> np.ndarray:
    """As a Unicode array only as wide as its longest entry: ``np.arange(n).astype(str)`` is 21
    characters (84 bytes) an item, the ids of a large catalogue would take more than its rows.

    Parameters
    ----------
    values : array-like of shape (N,)
        Strings or integers.

    Returns
    -------
    ndarray of shape (N,), ``<U{width}``
    """
    values = np.asarray(values)
    if values.size and values.dtype.kind in "iu":
        width = max(len(str(values.min())), len(str(values.max())))
        return values.astype(f"<U{width}")
    if values.dtype.kind != "U":
        values = values.astype(str)
    width = int(np.char.str_len(values).max()) if values.size else 1
    return values.astype(f"<U{max(width, 1)}", copy=False)


def sample_positions(n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` distinct positions of ``0..n-1``, uniformly, in O(m) memory (Floyd's algorithm),
    sorted.

    Parameters
    ----------
    n : int
    m : int
        At most ``n``.
    rng : numpy.random.Generator

    Returns
    -------
    ndarray of shape (m,), int64
    """
    chosen: set[int] = set()
    for j in range(n - m, n):
        t = int(rng.integers(0, j + 1))
        chosen.add(j if t in chosen else t)
    return np.sort(np.fromiter(chosen, dtype=np.int64, count=m))


def read_catalogue(path: str | os.PathLike, search_path: str | os.PathLike) -> Catalogue:
    """Load a catalogue (``projected`` memory-mapped) built for the search model at
    ``search_path``.

    Raises
    ------
    ArtifactError
        Not a catalogue.
    ArtifactIntegrityError
        Built for another search model, arrays missing or inconsistent.
    """
    artifact = read_typed_artifact(
        path, CATALOGUE_TYPE, {"projected", "ids", "negatives"}, mmap={"projected"}
    )
    arrays = artifact.arrays
    check_parent(
        path, artifact.manifest, "search_manifest_sha256", manifest_digest(search_path), search_path
    )
    return Catalogue(
        projected=arrays["projected"],
        ids=arrays["ids"],
        negatives=arrays["negatives"].astype(np.int64),
        labels=arrays.get("labels"),
        metadata=artifact.metadata,
        mapped=artifact.mapped.get("projected"),
    )
