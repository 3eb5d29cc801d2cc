"""A shard: the projected items ``D^T X`` of a range of a catalogue's items, atom major, with
their ids, labels and attributes. Shards never change once written: a catalogue version names
its shards, and a new version reuses every shard it keeps, already mapped and verified.

::

    shards/shard-000007-3fa2b1c0/   manifest.json (model_type catalogue-shard, n_items,
                                    attributes), projected.npy (A x n float32, memory-mapped),
                                    ids.npy, id_order.npy (the ids' sorting permutation),
                                    labels.npy (optional), attribute_<i>[_codes|_values].npy
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.model.artifact import MappedFile, manifest_digest, manifest_fields, read_typed_artifact
from service.model.artifact_writing import StreamedArray, write_artifact
from service.model.errors import ArtifactChangedError, ArtifactIntegrityError
from service.model.search.filters import (
    ATTRIBUTE_KINDS,
    NUL,
    Column,
    Condition,
    ConditionCache,
    Filter,
    all_bits,
    column_from_arrays,
    pack_bits,
    unpack_bits,
)

SHARD_TYPE = "catalogue-shard"


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


def lookup_ids(ids: Sequence[Any]) -> np.ndarray:
    """Ids to look up as the str array :meth:`Shard.lookup` takes: an id ending in NUL, which
    numpy's strings would drop (matching the id without it), becomes ``""``, which no item has.

    Parameters
    ----------
    ids : sequence of str or int

    Returns
    -------
    ndarray of shape (len(ids),), str
    """
    texts = [str(i) for i in ids]
    if not texts:
        return np.zeros(0, dtype=str)
    return np.asarray(["" if text.endswith(NUL) else text for text in texts], dtype=str)


@dataclass(frozen=True, eq=False)
class Shard:
    """One shard, loaded: its memory-mapped rows, ids and attribute columns.

    Parameters
    ----------
    name : str
        Its directory's name (the catalogue manifest's reference).
    projected : ndarray of shape (A, n), float32
        Usually a read-only memory map.
    ids : ndarray of shape (n,), str
        Unique within the shard.
    id_order : ndarray of shape (n,), int64
        The permutation that sorts ``ids``.
    labels : ndarray of shape (n,), str, optional
    columns : dict of key to Column
        Attribute columns (keys this shard's items have).
    digest : str
        sha256 of its manifest.
    mapped : MappedFile, optional
        The file ``projected`` maps, checked before reads (see :meth:`readable`).
    """

    name: str
    projected: np.ndarray
    ids: np.ndarray
    id_order: np.ndarray
    labels: np.ndarray | None = None
    columns: dict[str, Column] = field(default_factory=dict)
    digest: str = ""
    mapped: MappedFile | None = None
    conditions: ConditionCache = field(default_factory=ConditionCache, repr=False)

    def __post_init__(self) -> None:
        n_items = self.projected.shape[1]
        if self.projected.dtype != np.float32 or not self.projected.flags.c_contiguous:
            raise ArtifactIntegrityError(
                f"shard {self.name}: projected must be C-contiguous float32"
            )
        if (
            self.ids.shape != (n_items,)
            or self.id_order.shape != (n_items,)
            or (self.labels is not None and self.labels.shape != (n_items,))
        ):
            raise ArtifactIntegrityError(
                f"shard {self.name}: ids and labels need {n_items} entries"
            )
        order = self.id_order.astype(np.int64, copy=False)
        if n_items and (order.min() < 0 or order.max() >= n_items):
            raise ArtifactIntegrityError(f"shard {self.name}: id order out of range")
        sorted_ids = self.ids[order]
        # Strictly increasing: the order sorts, and the ids are unique.
        if n_items > 1 and not (sorted_ids[1:] > sorted_ids[:-1]).all():
            raise ArtifactIntegrityError(f"shard {self.name}: ids are not unique or unsorted")
        object.__setattr__(self, "_sorted_ids", sorted_ids)

    @property
    def n_items(self) -> int:
        return int(self.projected.shape[1])

    @property
    def n_words(self) -> int:
        """Words of a bitmap of its items."""
        return (self.n_items + 63) // 64

    @functools.cached_property
    def every_item(self) -> np.ndarray:
        """The bitmap of all its items (the unused bits of the last word clear)."""
        bits = all_bits(self.n_items)
        bits.flags.writeable = False
        return bits

    def readable(self) -> np.ndarray:
        """``projected``, once its file is known to still hold it (ArtifactChangedError if
        not: a file cut short or rewritten in place)."""
        if self.mapped is not None:
            try:
                self.mapped.check()
            except ArtifactChangedError as error:
                raise ArtifactChangedError(
                    f"the catalogue changed on disk: {error}; searches are answered again once "
                    "a whole catalogue is in place and loaded"
                ) from None
        return self.projected

    def intact(self) -> bool:
        """Whether the file ``projected`` maps is as it was loaded (not cut short or rewritten
        in place): only then may a later version reuse this shard as it is."""
        if self.mapped is None:
            return True
        try:
            self.mapped.check()
        except ArtifactChangedError:
            return False
        return True

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Positions in this shard of ``ids`` (a str array), -1 for those it lacks."""
        found = np.full(len(ids), -1, dtype=np.int64)
        if not len(ids) or not self.n_items:
            return found
        # An id longer than every id here matches none: never cast (which would cut it to a
        # false match) nor searched (which would widen every id to its length).
        width = self._sorted_ids.dtype.itemsize // np.dtype("U1").itemsize
        fits = np.char.str_len(ids) <= width
        wanted = np.where(fits, ids, "").astype(self._sorted_ids.dtype)
        at = np.minimum(np.searchsorted(self._sorted_ids, wanted), self.n_items - 1)
        hit = fits & (self._sorted_ids[at] == wanted)
        found[hit] = self.id_order[at[hit]]
        return found

    def condition_bits(self, condition: Condition) -> np.ndarray:
        """The condition's bits over this shard's items (computed once, then kept)."""
        return self.conditions.get(
            condition.cache_key,
            lambda: pack_bits(condition.holds(self.columns.get(condition.key), self.n_items)),
        )

    def allowed(self, query_filter: Filter | None, live: np.ndarray | None) -> np.ndarray | None:
        """The bitmap of this shard's items that ``query_filter`` allows among those of
        ``live`` (None: every item), or None when both are None (every item)."""
        if query_filter is None:
            return live
        words = query_filter.bits(self.condition_bits, self.n_words)
        words &= self.every_item
        if live is not None:
            words &= live
        return words

    def tally(self, key: str, words: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """The values of attribute ``key`` among the items of the bitmap ``words`` (None: every
        item), and how many items have each (see :meth:`StringColumn.tally`)."""
        column = self.columns.get(key)
        if column is None:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        return column.tally(None if words is None else unpack_bits(words, self.n_items))

    def attributes_at(self, j: int) -> dict[str, Any]:
        """The attributes item ``j`` has."""
        values = {key: column.value_at(j) for key, column in self.columns.items()}
        return {key: value for key, value in values.items() if value is not None}


def write_shard(
    path: str | os.PathLike,
    n_atoms: int,
    ids: np.ndarray,
    fill_projected: Callable[[np.ndarray], None],
    columns: Mapping[str, Column] | None = None,
    labels: np.ndarray | None = None,
    metadata: dict[str, Any] | None = None,
) -> str:
    """Write a shard (staged and renamed into place, see
    :func:`service.model.artifact_writing.write_artifact`); return its manifest's sha256.

    Parameters
    ----------
    path : path-like
        Its directory, which must not exist.
    n_atoms : int
    ids : ndarray of shape (n,)
        Unique (the caller checks).
    fill_projected : callable
        Writes ``D^T x`` of every item into the (A, n) float32 memory map it is given.
    columns : dict of key to Column, optional
    labels : ndarray of shape (n,), optional
    metadata : dict, optional
        Recorded in the manifest.
    """
    ids = narrow_strings(ids)
    arrays: dict[str, Any] = {
        "projected": StreamedArray((n_atoms, len(ids)), np.dtype(np.float32), fill_projected),
        "ids": ids,
        "id_order": np.argsort(ids, kind="stable").astype(np.int64),
    }
    if labels is not None:
        arrays["labels"] = narrow_strings(labels)
    described = []
    for i, (key, column) in enumerate(sorted((columns or {}).items())):
        name = f"attribute_{i}"
        arrays.update(column.arrays(name))
        described.append({"key": key, "kind": column.kind, "array": name})
    manifest = {
        "model_type": SHARD_TYPE,
        "n_items": len(ids),
        "n_atoms": n_atoms,
        "attributes": described,
        **(metadata or {}),
    }
    write_artifact(path, manifest, arrays)
    return manifest_digest(path)


def read_shard(path: str | os.PathLike, expected_digest: str | None = None) -> Shard:
    """Load one shard (``projected`` memory-mapped), verified against its manifest and, if
    given, the manifest checksum its catalogue recorded.

    Raises
    ------
    ArtifactError, ArtifactIntegrityError
    """
    path = Path(path)
    digest = manifest_digest(path) if path.is_dir() else None
    if expected_digest is not None and digest != expected_digest:
        raise ArtifactIntegrityError(
            f"{path}: the shard's manifest is not the one its catalogue names"
        )
    artifact = read_typed_artifact(
        path, SHARD_TYPE, {"projected", "ids", "id_order"}, mmap={"projected"}
    )
    arrays = artifact.arrays
    n_items = arrays["projected"].shape[1]
    columns = {}
    with manifest_fields(path):
        for entry in artifact.manifest.get("attributes", []):
            kind, key, name = str(entry["kind"]), str(entry["key"]), str(entry["array"])
            if kind not in ATTRIBUTE_KINDS:
                raise ValueError(f"unknown attribute kind {kind!r}")
            columns[key] = column_from_arrays(kind, name, arrays, n_items)
    return Shard(
        name=path.name,
        projected=arrays["projected"],
        ids=arrays["ids"],
        id_order=arrays["id_order"],
        labels=arrays.get("labels"),
        columns=columns,
        digest=digest or "",
        mapped=artifact.mapped.get("projected"),
    )
