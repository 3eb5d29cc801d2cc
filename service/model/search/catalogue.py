"""The catalogue: a manifest naming shards of projected items ``X' = D^T X``, and one version of
it loaded (:class:`Catalogue`).

::

    catalogue/
        manifest.json                   model_type catalogue, layout shards, its version, the
                                        shards (name, items, manifest checksum) in order, the
                                        attributes' kinds, the checksum of the search model
        tombstones-000007.npy           global positions of removed items (replaced or deleted)
        negatives-000007.npy            the fixed random sample of live items that serves as
                                        negatives of learned codes
        shards/shard-000007-3fa2b1c0/   see :mod:`service.model.search.shards`

Item j of shard s is at global position ``offsets[s] + j``: positions stay valid for a version,
and the shards only ever grow at the end until a compaction (see
:mod:`service.model.search.store`, which writes versions). A catalogue written before shards
(``projected.npy``, ``ids.npy``, ``negatives.npy`` and ``labels.npy`` beside its manifest) loads
as a version 0 of one shard.

The manifest records the checksum of the search model's manifest: a catalogue built with another
dictionary is refused.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.model.artifact import (
    manifest_digest,
    manifest_fields,
    read_manifest,
    read_typed_artifact,
)
from service.model.errors import (
    ArtifactChangedError,
    ArtifactIntegrityError,
    InvalidInputError,
    brief,
)
from service.model.kernels.search import (
    ShardSet,
    kernel_query,
    search_shards,
    search_shards_many,
)
from service.model.search.codes import SparseCode
from service.model.search.filters import (
    ATTRIBUTE_KINDS,
    Filter,
    count_bits,
    merge_tallies,
    pack_bits,
)
from service.model.search.layout import check_parent
from service.model.search.shards import Shard, lookup_ids, narrow_strings, read_shard

CATALOGUE_TYPE = "catalogue"
SHARDED_LAYOUT = "shards"
SHARDS_DIR = "shards"
DEFAULT_NEGATIVES = 1000

__all__ = [
    "CATALOGUE_TYPE",
    "DEFAULT_NEGATIVES",
    "Catalogue",
    "CatalogueQueries",
    "Facet",
    "RankRequest",
    "Ranking",
    "narrow_strings",
    "read_catalogue",
    "sample_positions",
]


@dataclass(frozen=True, eq=False)
class Ranking:
    """The best items of a search, best first.

    Parameters
    ----------
    positions : ndarray of shape (m,), int64
        Global positions.
    sums : ndarray of shape (m,), float64
        Unbiased scores: the code's bias plus these are the scores.
    ids : list of str, length m
    missing_shards : tuple of str
        Shards that did not answer in time (a partial answer; catalogues held elsewhere only).
    """

    positions: np.ndarray
    sums: np.ndarray
    ids: list[str]
    missing_shards: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class RankRequest:
    """One ranking of a batch (:meth:`Catalogue.top_many`): the arguments of
    :meth:`Catalogue.top` for one query.

    Parameters
    ----------
    code : SparseCode
    k : int
        At least 1.
    excluded : ndarray, int64, optional
        Sorted unique global positions never returned.
    query_filter : Filter, optional
    after : (float, int), optional
    """

    code: SparseCode
    k: int
    excluded: np.ndarray | None = None
    query_filter: Filter | None = None
    after: tuple[float, int] | None = None


@dataclass(frozen=True)
class Facet:
    """Counts of live items per value of one attribute.

    Parameters
    ----------
    key : str
    values : list of str or float
        The values with the most items, most first (ties by value).
    counts : list of int
        Items of each.
    n_values : int
        Distinct values among the items counted (``len(values)`` when all are listed).
    """

    key: str
    values: list[Any]
    counts: list[int]
    n_values: int


class CatalogueQueries:
    """What every catalogue version answers the same way, from its ``lookup``, attributes,
    negatives sample and shards: held here (:class:`Catalogue`) or by a cluster's workers
    (:class:`service.model.search.remote.RemoteCatalogue`)."""

    def positions(self, ids: Sequence[Any], what: str = "id") -> np.ndarray:
        """Global positions of ``ids``, shape (n,); unknown ids raise InvalidInputError."""
        texts = [str(i) for i in ids]
        if not texts:
            return np.zeros(0, dtype=np.int64)
        found = self.lookup(texts)
        if (found < 0).any():
            missing = np.flatnonzero(found < 0)
            unknown = ", ".join(brief(texts[i]) for i in missing[:5])
            more = "" if missing.size <= 5 else f" (and {missing.size - 5} more)"
            raise InvalidInputError(f"unknown catalogue {what}(s): {unknown}{more}")
        return found

    def negative_rows(self, excluded: np.ndarray) -> np.ndarray:
        """The fixed negatives sample, without the items at ``excluded``, shape (n, A)."""
        keep = ~np.isin(self.negatives, excluded)
        return self._negative_rows[keep]

    def check_filter(self, query_filter: Filter) -> None:
        """InvalidInputError unless every condition names one of the attributes, with an
        operand of its kind."""
        query_filter.check(self.attributes)

    def check_key(self, key: str, where: str = "key") -> None:
        """InvalidInputError unless ``key`` is one of the catalogue's attributes."""
        if key not in self.attributes:
            known = ", ".join(repr(k) for k in sorted(self.attributes)) or "none"
            raise InvalidInputError(
                f"{where}: unknown attribute {brief(key)}; the catalogue's attributes are: {known}"
            )

    def facet(self, key: str, query_filter: Filter | None = None, limit: int = 10) -> Facet:
        """The ``limit`` values of attribute ``key`` held by the most live items that
        ``query_filter`` allows (None: every live item), with their counts, exact.

        Raises
        ------
        InvalidInputError
            An unknown key, a filter that does not fit the attributes, ``limit`` below 1.
        """
        self.check_key(key)
        if query_filter is not None:
            self.check_filter(query_filter)
        if limit < 1:
            raise InvalidInputError(f"limit must be at least 1, got {limit!r}")
        values, counts, n_values = merge_tallies(self.tallies(key, query_filter), limit)
        return Facet(key, values, counts, n_values)

    def describe(self) -> dict[str, Any]:
        """Version, sizes, shards and attributes, for clients."""
        return {
            "version": self.version,
            "n_items": self.n_items,
            "n_removed": int(self.tombstones.size),
            "n_shards": len(self.shards),
            "shard_sizes": [shard.n_items for shard in self.shards],
            "attributes": dict(sorted(self.attributes.items())),
        }


@dataclass(frozen=True, eq=False)
class Catalogue(CatalogueQueries):
    """One version of a catalogue: its shards, the positions removed from them, the negatives
    sample and the attributes' kinds. Immutable: a request that took it answers from it
    throughout, whatever versions follow.

    Parameters
    ----------
    shards : tuple of Shard
        At least one; every one of the same A.
    negatives : ndarray of shape (n_negatives,), int64
        Global positions of the fixed random sample of live items that serves as negatives of
        learned codes.
    tombstones : ndarray of shape (n_removed,), int64
        Sorted global positions of removed items.
    attributes : dict of key to kind
        ``string`` or ``number``: what filters may name.
    version : int
    digest : str
        sha256 of its manifest (the version's identity across processes).
    metadata : dict
    """

    shards: tuple[Shard, ...]
    negatives: np.ndarray
    tombstones: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    attributes: dict[str, str] = field(default_factory=dict)
    version: int = 0
    digest: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.shards:
            raise ArtifactIntegrityError("catalogue: no shard")
        shard_set = ShardSet([shard.projected for shard in self.shards])
        n = shard_set.n_items
        tombstones = np.asarray(self.tombstones, dtype=np.int64)
        if tombstones.size and (
            tombstones[0] < 0 or tombstones[-1] >= n or (np.diff(tombstones) <= 0).any()
        ):
            raise ArtifactIntegrityError("catalogue: tombstones are not sorted positions")
        negatives = np.asarray(self.negatives, dtype=np.int64)
        if negatives.size and not 0 <= negatives.min() <= negatives.max() < n:
            raise ArtifactIntegrityError("catalogue: negatives sample is out of range")
        if np.isin(negatives, tombstones).any():
            raise ArtifactIntegrityError("catalogue: negatives sample holds removed items")
        object.__setattr__(self, "tombstones", tombstones)
        object.__setattr__(self, "negatives", negatives)
        object.__setattr__(self, "_shard_set", shard_set)
        object.__setattr__(self, "_alive", self._alive_bits(shard_set, tombstones))
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_concatenated", {})
        # Gathered once: columns of atom-major maps are scattered reads, paid at load time.
        object.__setattr__(self, "_negative_rows", self._gather(negatives))

    def _alive_bits(self, shard_set: ShardSet, tombstones: np.ndarray) -> np.ndarray | None:
        """The live items' bitmap, or None when none was removed (every item lives)."""
        if not tombstones.size:
            return None
        bits = shard_set.empty_bitmap()
        for s, shard in enumerate(self.shards):
            base = shard_set.bitmap_bases[s]
            lo, hi = shard_set.offsets[s], shard_set.offsets[s + 1]
            mask = np.ones(shard.n_items, dtype=bool)
            removed = tombstones[(tombstones >= lo) & (tombstones < hi)] - lo
            mask[removed] = False
            words = pack_bits(mask)
            bits[base : base + len(words)] = words
        return bits

    # -- sizes ---------------------------------------------------------------------------------

    @property
    def n_positions(self) -> int:
        """Positions in this version, removed items included."""
        return self._shard_set.n_items

    @property
    def n_items(self) -> int:
        """Live items."""
        return self.n_positions - int(self.tombstones.size)

    @property
    def n_atoms(self) -> int:
        return self._shard_set.n_atoms

    @property
    def offsets(self) -> np.ndarray:
        """Global position of each shard's first item, and the end; shape (S + 1,)."""
        return self._shard_set.offsets

    @property
    def shard_set(self) -> ShardSet:
        return self._shard_set

    # -- items ---------------------------------------------------------------------------------

    def _locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard index, position in shard) of global positions."""
        shard = np.searchsorted(self.offsets, positions, side="right") - 1
        return shard, positions - self.offsets[shard]

    def is_live(self, positions: np.ndarray) -> np.ndarray:
        """Whether each global position holds a live item."""
        positions = np.asarray(positions, dtype=np.int64)
        if not self.tombstones.size:
            return np.ones(positions.shape, dtype=bool)
        at = np.minimum(np.searchsorted(self.tombstones, positions), self.tombstones.size - 1)
        return self.tombstones[at] != positions

    def lookup(self, ids: Sequence[str]) -> np.ndarray:
        """Global positions of the live items of ``ids``, -1 for ids no live item has."""
        wanted = lookup_ids(ids)
        found = np.full(len(wanted), -1, dtype=np.int64)
        # Newest shard first: a replaced item's old copies are removed, its last one lives.
        for s in range(len(self.shards) - 1, -1, -1):
            missing = np.flatnonzero(found < 0)
            if not missing.size:
                break
            local = self.shards[s].lookup(wanted[missing])
            hit = local >= 0
            positions = self.offsets[s] + local[hit]
            live = self.is_live(positions)
            found[missing[hit][live]] = positions[live]
        return found

    def _gather(self, positions: np.ndarray) -> np.ndarray:
        rows = np.empty((len(positions), self.n_atoms), dtype=np.float64)
        shard, local = self._locate(np.asarray(positions, dtype=np.int64))
        for s in np.unique(shard):
            at = np.flatnonzero(shard == s)
            rows[at] = self.shards[s].readable()[:, local[at]].T
        return rows

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """Projected items at global ``positions``, shape (n, A), float64."""
        return self._gather(positions)

    def ids_at(self, positions: np.ndarray) -> list[str]:
        """The ids at global ``positions``."""
        shard, local = self._locate(np.asarray(positions, dtype=np.int64))
        return [
            str(self.shards[s].ids[j]) for s, j in zip(shard.tolist(), local.tolist(), strict=True)
        ]

    def attributes_at(self, positions: np.ndarray) -> list[dict[str, Any]]:
        """The attributes of the items at global ``positions``."""
        shard, local = self._locate(np.asarray(positions, dtype=np.int64))
        return [
            self.shards[s].attributes_at(j)
            for s, j in zip(shard.tolist(), local.tolist(), strict=True)
        ]

    # -- whole arrays (evaluation and tests) -------------------------------------------------

    def _concatenation(self, name: str, parts, axis: int = 0) -> np.ndarray:
        with self._lock:
            if name not in self._concatenated:
                self._concatenated[name] = (
                    parts[0] if len(parts) == 1 else np.concatenate(parts, axis=axis)
                )
            return self._concatenated[name]

    @property
    def projected(self) -> np.ndarray:
        """X' of every position as one (A, N) array: the shard's own map for one shard, else a
        copy (evaluation and tests only: a large catalogue does not fit in memory)."""
        return self._concatenation("projected", [shard.readable() for shard in self.shards], axis=1)

    @property
    def ids(self) -> np.ndarray:
        """The ids of every position, shape (N,)."""
        return self._concatenation("ids", [shard.ids for shard in self.shards])

    @property
    def labels(self) -> np.ndarray | None:
        """The labels of every position if every shard has them (evaluation only), else None."""
        if any(shard.labels is None for shard in self.shards):
            return None
        return self._concatenation("labels", [shard.labels for shard in self.shards])

    # -- ranking -------------------------------------------------------------------------------

    def allowed_bits(self, query_filter: Filter | None) -> np.ndarray | None:
        """The bitmap of live items the filter allows (None: every item, none removed)."""
        if query_filter is None:
            return self._alive
        bits = self._shard_set.empty_bitmap()
        for s, shard in enumerate(self.shards):
            base = self._shard_set.bitmap_bases[s]
            bits[base : base + shard.n_words] = shard.allowed(query_filter, None)
        if self._alive is not None:
            bits &= self._alive
        return bits

    def top(
        self,
        code: SparseCode,
        k: int,
        excluded: np.ndarray | None = None,
        query_filter: Filter | None = None,
        after: tuple[float, int] | None = None,
        allow_partial: bool = False,
    ) -> Ranking:
        """The ``k`` best live items for ``code``, best first, ties by global position (see
        :func:`service.model.kernels.search.search_shards`).

        Parameters
        ----------
        code : SparseCode
        k : int
            At least 1; fewer items come back when fewer are left.
        excluded : ndarray of shape (n_excluded,), int64, optional
            Sorted unique global positions never returned.
        query_filter : Filter, optional
            Checked against the attributes (see :meth:`check_filter`).
        after : (float, int), optional
            Only items ranked after this unbiased score and global position (a page's cursor).

        allow_partial : bool
            For catalogues whose shards are held elsewhere; every shard answers here.

        Returns
        -------
        Ranking
        """
        for shard in self.shards:
            shard.readable()
        positions, sums = search_shards(
            self._shard_set, code.atoms, code.weights, k, excluded,
            self.allowed_bits(query_filter), after,
        )  # fmt: skip
        return Ranking(positions, sums, self.ids_at(positions))

    def top_many(
        self, requests: Sequence[RankRequest], allow_partial: bool = False
    ) -> list[Ranking]:
        """:meth:`top` of each request, in order, each exactly what it answers alone, from one
        pass over the shards (see :func:`service.model.kernels.search.search_shards_many`):
        queries whose codes share atoms read those rows once.

        Parameters
        ----------
        requests : sequence of RankRequest
        allow_partial : bool
            For catalogues whose shards are held elsewhere; every shard answers here.

        Returns
        -------
        list of Ranking
        """
        for shard in self.shards:
            shard.readable()
        bits: dict[str, np.ndarray | None] = {}  # a filter's bitmap once per batch
        queries = []
        for request in requests:
            flt = request.query_filter
            text = "" if flt is None else flt.canonical()
            if text not in bits:
                bits[text] = self.allowed_bits(flt)
            queries.append(kernel_query(
                self._shard_set, request.code.atoms, request.code.weights, request.k,
                request.excluded, bits[text], request.after,
            ))  # fmt: skip
        answers = search_shards_many(self._shard_set, queries)
        return [Ranking(positions, sums, self.ids_at(positions)) for positions, sums in answers]

    # -- counts --------------------------------------------------------------------------------

    def count(self, query_filter: Filter | None = None) -> int:
        """Live items that ``query_filter`` allows (None: every live item), exact.

        Raises
        ------
        InvalidInputError
            A filter that does not fit the attributes.
        """
        if query_filter is None:
            return self.n_items
        self.check_filter(query_filter)
        return count_bits(self.allowed_bits(query_filter))

    def tallies(self, key: str, query_filter: Filter | None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each shard's values of attribute ``key`` among the live items ``query_filter``
        allows, and their counts (see :meth:`Shard.tally`)."""
        bits = self.allowed_bits(query_filter)
        bases = self._shard_set.bitmap_bases
        return [
            shard.tally(key, None if bits is None else bits[base : base + shard.n_words])
            for shard, base in zip(self.shards, bases.tolist(), strict=True)
        ]


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


def sample_live_positions(
    n_positions: int, tombstones: np.ndarray, m: int, seed: int
) -> np.ndarray:
    """``min(m, live)`` distinct live positions, uniformly: Floyd's sample of live ranks, each
    rank r mapped to the position holding the r-th live item.

    Parameters
    ----------
    n_positions : int
    tombstones : ndarray, int64, sorted
    m : int
    seed : int

    Returns
    -------
    ndarray, int64, sorted
    """
    n_live = n_positions - tombstones.size
    ranks = sample_positions(n_live, min(m, n_live), np.random.default_rng(seed))
    # tombstones[i] - i live items come before the i-th removed one.
    return ranks + np.searchsorted(tombstones - np.arange(tombstones.size), ranks, side="right")


def read_catalogue(
    path: str | os.PathLike, search_path: str | os.PathLike, reuse: Catalogue | None = None
) -> Catalogue:
    """Load the catalogue at ``path`` (shards memory-mapped) built for the search model at
    ``search_path``; shards that ``reuse`` (an earlier version) holds are taken from it as
    they are, already mapped and verified.

    Raises
    ------
    ArtifactError
        Not a catalogue.
    ArtifactIntegrityError
        Built for another search model, files missing or inconsistent.
    """
    path = Path(path)
    manifest = read_manifest(path)
    if manifest.get("layout") != SHARDED_LAYOUT:
        return _read_single_file(path, search_path)
    check_parent(
        path, manifest, "search_manifest_sha256", manifest_digest(search_path), search_path
    )
    digest = manifest_digest(path)
    intact = () if reuse is None else tuple(s for s in reuse.shards if s.intact())
    if reuse is not None and reuse.digest == digest and len(intact) == len(reuse.shards):
        return reuse
    artifact = read_typed_artifact(
        path, CATALOGUE_TYPE, {"negatives", "tombstones"}, {"shards", "attributes"}
    )
    manifest = artifact.manifest
    if manifest_digest(path) != digest:
        raise ArtifactChangedError(f"{path} changed while it was read")
    known = {(s.name, s.digest): s for s in intact}
    shards = []
    with manifest_fields(path):
        attributes = {str(k): str(v) for k, v in dict(manifest["attributes"]).items()}
        if set(attributes.values()) - set(ATTRIBUTE_KINDS):
            raise ValueError(f"unknown attribute kinds in {attributes}")
        for entry in manifest["shards"]:
            name, expected = str(entry["name"]), str(entry["manifest_sha256"])
            if Path(name).name != name or name.startswith("."):
                raise ValueError(f"shard name {name!r}")
            shard = known.get((name, expected)) or read_shard(path / SHARDS_DIR / name, expected)
            if shard.n_items != int(entry["n_items"]):
                raise ValueError(
                    f"shard {name} holds {shard.n_items} items, not {entry['n_items']}"
                )
            shards.append(shard)
        version = int(manifest["version"])
    return Catalogue(
        shards=tuple(shards),
        negatives=artifact.arrays["negatives"].astype(np.int64),
        tombstones=artifact.arrays["tombstones"].astype(np.int64),
        attributes=attributes,
        version=version,
        digest=digest,
        metadata=artifact.metadata,
    )


def _read_single_file(path: Path, search_path: str | os.PathLike) -> Catalogue:
    """A catalogue written before shards: version 0, one shard, no attributes."""
    artifact = read_typed_artifact(
        path, CATALOGUE_TYPE, {"projected", "ids", "negatives"}, mmap={"projected"}
    )
    arrays = artifact.arrays
    check_parent(
        path, artifact.manifest, "search_manifest_sha256", manifest_digest(search_path),
        search_path,
    )  # fmt: skip
    ids = arrays["ids"]
    shard = Shard(
        name=path.name,
        projected=arrays["projected"],
        ids=ids,
        id_order=np.argsort(ids, kind="stable").astype(np.int64),
        labels=arrays.get("labels"),
        digest=manifest_digest(path),
        mapped=artifact.mapped.get("projected"),
    )
    return Catalogue(
        shards=(shard,),
        negatives=arrays["negatives"].astype(np.int64),
        version=0,
        digest=shard.digest,
        metadata=artifact.metadata,
    )
