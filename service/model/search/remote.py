"""Catalogues whose shards are held by a Dask cluster's workers (``SEARCH_CLUSTER``).

Each shard is held by an actor (:class:`ShardActor`) pinned to a worker, which memory-maps the
shard's files (the workers read the same model directories as the service) and answers the
shard's part of every search with the same kernel as a catalogue held in process. The serving
process holds no shard: a :class:`RemoteCatalogue` (one catalogue version) fans each search out
to its shards' actors from the service's own event loop (one ``Client(asynchronous=True,
direct_to_workers=True)`` for the process: actor calls go straight to the workers, never through
scheduler tasks), merges the answers (ties by global position: equal to one shard of the same
items), and fails with :class:`~service.model.errors.ShardsUnavailableError` (503) when a shard
misses its deadline, or leaves it out if the request allows a partial answer.

A search's arguments and answer each travel as one message of bytes (:func:`pack_message`):
Dask serialises every argument of an actor call on its own, which cost more than the search.
The actor's ``search`` is a coroutine, so the worker runs it on its event loop instead of handing
it to the actor's thread and back (about half a millisecond each way on a small host).

Actors have no resilience: a call that finds its actor's worker gone drops the actor, which is
created again on a live worker for the next search (its files are on disk). Catalogue versions
reach the actors as their shards' tombstones, sent once per version (:meth:`ShardActor.prepare`).

Nothing here runs on the event loop but the fan-out itself: searches and loads call in from
worker threads (see :meth:`SearchCluster.run`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import threading
import uuid
import weakref
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.model.artifact import manifest_digest, read_manifest, read_typed_artifact
from service.model.errors import (
    ArtifactError,
    ShardsUnavailableError,
)
from service.model.kernels.search import (
    ShardSet,
    kernel_query,
    search_shards,
    search_shards_many,
)
from service.model.search.catalogue import (
    CATALOGUE_TYPE,
    SHARDED_LAYOUT,
    SHARDS_DIR,
    Catalogue,
    CatalogueQueries,
    Ranking,
    RankRequest,
    read_catalogue,
)
from service.model.search.codes import SparseCode
from service.model.search.filters import Filter, count_bits, pack_bits
from service.model.search.layout import check_parent
from service.model.search.shards import lookup_ids, read_shard

logger = logging.getLogger("service.model.search")

# Catalogue versions an actor keeps prepared (requests in flight may still use older ones).
VERSIONS_KEPT = 4
# Seconds to create an actor (its shard's checksum is verified as it loads).
ACTOR_START_S = 600.0


def pack_message(header: dict[str, Any], arrays: Sequence[np.ndarray]) -> bytes:
    """One message of bytes: a JSON header, then ``arrays`` (their dtypes and lengths recorded in
    it), so that Dask sends it as one frame.

    Parameters
    ----------
    header : dict
        JSON-serialisable; floats round-trip exactly.
    arrays : sequence of ndarray
        One-dimensional, of fixed-size dtypes.
    """
    arrays = [np.ascontiguousarray(a) for a in arrays]
    text = json.dumps(
        {"header": header, "arrays": [[a.dtype.str, int(a.size)] for a in arrays]},
        separators=(",", ":"),
    ).encode()
    return b"".join([struct.pack("<I", len(text)), text, *(a.tobytes() for a in arrays)])


def unpack_message(message: bytes) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The header and arrays of a :func:`pack_message` message (the arrays read-only views)."""
    (length,) = struct.unpack_from("<I", message)
    start = 4 + length
    layout = json.loads(message[4:start])
    arrays = []
    for dtype, size in layout["arrays"]:
        array = np.frombuffer(message, dtype=np.dtype(dtype), count=size, offset=start)
        arrays.append(array)
        start += array.nbytes
    return layout["header"], arrays


class VersionNotPreparedError(KeyError):
    """A search named a catalogue version its actor was not told of (a new actor)."""


class ShardActor:
    """One shard on a worker: its rows memory-mapped, its ids, attributes and the live items of
    the catalogue versions in use.

    Parameters
    ----------
    path : str
        The shard's directory (on a file system the worker shares).
    digest : str
        Its manifest's sha256, as the catalogue names it.
    first_position : int
        The global position of its first item.
    """

    def __init__(self, path: str, digest: str, first_position: int) -> None:
        self.shard = read_shard(path, digest)
        self.first = int(first_position)
        self.shard_set = ShardSet([self.shard.projected], self.first)
        self.versions: OrderedDict[str, np.ndarray | None] = OrderedDict()
        self.lock = threading.Lock()
        # Load the kernel's compiled code now, not within a search's deadline.
        if self.shard.n_items:
            search_shards(self.shard_set, [0], [1.0], 1)

    def prepare(self, version: str, removed: np.ndarray) -> int:
        """Remember a catalogue version by the local positions of its removed items; return
        the shard's items."""
        removed = np.asarray(removed, dtype=np.int64)
        live = None
        if removed.size:
            mask = np.ones(self.shard.n_items, dtype=bool)
            mask[removed] = False
            live = pack_bits(mask)
        with self.lock:
            self.versions[version] = live
            self.versions.move_to_end(version)
            while len(self.versions) > VERSIONS_KEPT:
                self.versions.popitem(last=False)
        return self.shard.n_items

    def _live(self, version: str) -> np.ndarray | None:
        with self.lock:
            if version not in self.versions:
                raise VersionNotPreparedError(version)
            return self.versions[version]

    def _allowed(self, version: str, filter_json: Any, known: dict[str, Any]) -> Any:
        """The bitmap of the live items of ``version`` that a filter (its JSON, None for none)
        allows, None for every item; each filter's bitmap once per call (``known``)."""
        text = json.dumps(filter_json, sort_keys=True)
        if text not in known:
            query_filter = None if filter_json is None else Filter.parse(filter_json)
            known[text] = self.shard.allowed(query_filter, self._live(version))
        return known[text]

    async def search(self, request: bytes) -> bytes:
        """This shard's best ``k`` live items for each query of a request packed by
        :meth:`RemoteCatalogue.top_many` (:func:`pack_message`: the version and each query's
        k, filter and cursor in the header; each query's code length, the atoms, the weights,
        each query's number of excluded positions and the excluded positions as arrays): a
        message of their ids (header), and each query's count, the global positions and the
        unbiased sums (arrays), in one pass over the shard."""
        header, (code_lengths, atoms, weights, excluded_lengths, excluded) = unpack_message(request)
        end = self.first + self.shard.n_items
        code_cuts, excluded_cuts = np.cumsum(code_lengths)[:-1], np.cumsum(excluded_lengths)[:-1]
        known: dict[str, Any] = {}
        queries = []
        for spec, query_atoms, query_weights, query_excluded in zip(
            header["queries"], np.split(atoms, code_cuts), np.split(weights, code_cuts),
            np.split(excluded, excluded_cuts), strict=True,
        ):  # fmt: skip
            after = spec["after"]
            inside = query_excluded[(query_excluded >= self.first) & (query_excluded < end)]
            queries.append(kernel_query(
                self.shard_set, query_atoms, query_weights, spec["k"], inside,
                self._allowed(header["version"], spec["filter"], known),
                None if after is None else (float(after[0]), int(after[1])),
            ))  # fmt: skip
        answers = search_shards_many(self.shard_set, queries)
        ids = [self.shard.ids[positions - self.first].tolist() for positions, _ in answers]
        return pack_message({"ids": ids}, [
            np.array([len(positions) for positions, _ in answers], dtype=np.int64),
            np.concatenate([positions for positions, _ in answers]).astype(np.int64),
            np.concatenate([sums for _, sums in answers]).astype(np.float64),
        ])  # fmt: skip

    def count(self, version: str, filter_json: Any) -> int:
        """The live items of ``version`` here that a filter (its JSON) allows."""
        bits = self._allowed(version, filter_json, {})
        return self.shard.n_items if bits is None else count_bits(bits)

    def tally(self, version: str, key: str, filter_json: Any) -> bytes:
        """The values of attribute ``key`` among the live items here that a filter (its JSON,
        None for none) allows, and their counts: a message of two arrays (see
        :meth:`Shard.tally`)."""
        values, counts = self.shard.tally(key, self._allowed(version, filter_json, {}))
        return pack_message({}, [values, counts])

    def lookup(self, version: str, ids: list[str]) -> np.ndarray:
        """Global positions of the live items of ``ids`` here, -1 for the others."""
        live = self._live(version)
        local = self.shard.lookup(lookup_ids(ids))
        if live is not None:
            held = local >= 0
            words, bits = local[held] >> 6, (local[held] & 63).astype(np.uint64)
            alive = ((live[words] >> bits) & np.uint64(1)).astype(bool)
            local[np.flatnonzero(held)[~alive]] = -1
        return np.where(local >= 0, local + self.first, -1)

    def rows(self, version: str, positions: np.ndarray) -> np.ndarray:
        """Projected items at global ``positions`` (all of this shard), shape (n, A)."""
        self._live(version)
        local = np.asarray(positions, dtype=np.int64) - self.first
        return np.ascontiguousarray(self.shard.readable()[:, local].T, dtype=np.float64)

    def attributes_at(self, version: str, positions: np.ndarray) -> list[dict[str, Any]]:
        """The attributes of the items at global ``positions`` (all of this shard)."""
        self._live(version)
        return [self.shard.attributes_at(int(p) - self.first) for p in positions]


@dataclass(frozen=True)
class ShardRef:
    """A shard of a catalogue version, as its manifest names it."""

    name: str
    path: str
    digest: str
    first: int
    n_items: int

    @property
    def key(self) -> tuple[str, str]:
        return (self.path, self.digest)


class SearchCluster:
    """The Dask client of a serving process and the actors holding its shards.

    Parameters
    ----------
    address : str
        The scheduler's address (``tcp://host:port``).
    deadline_s : float
        Seconds each shard has to answer a search.
    """

    def __init__(self, address: str, deadline_s: float) -> None:
        self.address = address
        self.deadline_s = deadline_s
        self.client = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._actors: dict[tuple[str, str], Any] = {}
        self._futures: dict[tuple[str, str], Any] = {}
        self._placed: dict[tuple[str, str], str] = {}
        self._creating: dict[tuple[str, str], asyncio.Future] = {}
        self._users: Counter[tuple[str, str]] = Counter()

    async def start(self) -> SearchCluster:
        """Connect (on the running loop, which every later call goes through) and check that
        client, scheduler and workers run the same versions."""
        from distributed import Client

        self.loop = asyncio.get_running_loop()
        self.client = await Client(self.address, asynchronous=True, direct_to_workers=True)
        await self.client.get_versions(check=True)
        return self

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None

    def run(self, make: Callable[[], Awaitable[Any]], timeout: float) -> Any:
        """Run a coroutine on the cluster's loop from another thread and wait for it."""
        if self.loop is None:
            raise ShardsUnavailableError("the search cluster is not connected")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise RuntimeError("SearchCluster.run waits for the loop: call it from a thread")
        future = asyncio.run_coroutine_threadsafe(make(), self.loop)
        try:
            return future.result(timeout)
        except FutureTimeoutError:
            future.cancel()
            raise ShardsUnavailableError(
                f"the search cluster did not answer within {timeout:g} s"
            ) from None

    # -- actors --------------------------------------------------------------------------------

    async def actor(self, shard: ShardRef) -> Any:
        """The actor holding ``shard``, created on the least loaded worker if it has none (a
        search of other shards never waits for it)."""
        actor = self._actors.get(shard.key)
        if actor is not None:
            return actor
        creating = self._creating.get(shard.key)
        if creating is None:
            creating = self._creating[shard.key] = asyncio.ensure_future(self._create(shard))
        return await asyncio.shield(creating)

    async def _create(self, shard: ShardRef) -> Any:
        try:
            identity = await self.client.scheduler.identity(n_workers=-1)
            workers = sorted(identity["workers"])
            if not workers:
                raise ShardsUnavailableError(f"the search cluster {self.address} has no worker")
            # Counted with the actors still being created (chosen, not yet placed).
            held = [self._placed.get(key) for key in (*self._actors, *self._creating)]
            worker = min(workers, key=held.count)
            self._placed[shard.key] = worker
            # A key of its own: an actor whose worker was lost is never revived in place.
            future = self.client.submit(
                ShardActor, shard.path, shard.digest, shard.first, actor=True, workers=[worker],
                key=f"shard-actor-{uuid.uuid4().hex}",
            )  # fmt: skip
            actor = await future
            self._actors[shard.key] = actor
            self._futures[shard.key] = future
            return actor
        finally:
            self._creating.pop(shard.key, None)

    async def actors(self, shards: Sequence[ShardRef]) -> list[Any]:
        """The actors of ``shards`` (see :meth:`actor`), created at once where missing."""
        return list(await asyncio.gather(*(self.actor(shard) for shard in shards)))

    def hold(self, catalogue: RemoteCatalogue) -> None:
        """Keep the actors of ``catalogue``'s shards while it lives; once no catalogue version
        in use names a shard any more (a compaction removed it), its actor is released."""
        keys = [shard.key for shard in catalogue.shards]
        self._users.update(keys)
        weakref.finalize(catalogue, self._let_go, keys)

    def _let_go(self, keys: list[tuple[str, str]]) -> None:
        for key in keys:
            self._users[key] -= 1
            if self._users[key] <= 0:
                del self._users[key]
                with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to release
                    self.loop.call_soon_threadsafe(self._release, key)

    def _release(self, key: tuple[str, str]) -> None:
        if key in self._users:  # held again meanwhile
            return
        self._actors.pop(key, None)
        self._placed.pop(key, None)
        future = self._futures.pop(key, None)
        if future is not None:
            future.release()

    def forget(self, shard: ShardRef, why: str) -> None:
        """Drop a shard's actor (its worker is gone): the next call creates it again."""
        if self._actors.pop(shard.key, None) is not None:
            future = self._futures.pop(shard.key, None)
            if future is not None:
                future.release()
            logger.warning("search cluster: shard %s lost (%s); creating it again", shard.name, why)

    async def call(self, shard: ShardRef, method: str, *args) -> Any:
        """One call to a shard's actor; an actor found lost is forgotten (and created again by
        the next call), and ShardsUnavailableError raised."""
        actor = await self.actor(shard)
        try:
            return await getattr(actor, method)(*args)
        except (OSError, RuntimeError) as error:
            # The worker holding the actor was lost (distributed raises these two for it).
            self.forget(shard, repr(error))
            raise ShardsUnavailableError(f"shard {shard.name} is unavailable: {error}") from None


class RemoteCatalogue(CatalogueQueries):
    """One catalogue version whose shards are held by a :class:`SearchCluster`: the interface of
    :class:`~service.model.search.catalogue.Catalogue` (searches, ids, rows, attributes), each
    answer assembled from the shards' actors (blocking calls: from worker threads only).

    Made by :meth:`open`, which tells the actors of the version; the negatives' rows are
    fetched from them once.
    """

    def __init__(
        self,
        cluster: SearchCluster,
        shards: Sequence[ShardRef],
        tombstones: np.ndarray,
        negatives: np.ndarray,
        attributes: dict[str, str],
        version: int,
        digest: str,
        n_atoms: int,
        metadata: dict[str, Any],
    ) -> None:
        self.cluster = cluster
        self.shards = tuple(shards)
        self.tombstones = tombstones
        self.negatives = negatives
        self.attributes = attributes
        self.version = version
        self.digest = digest
        self.metadata = metadata
        self._n_atoms = n_atoms
        ends = [shard.first + shard.n_items for shard in self.shards]
        self.offsets = np.array([0, *ends], dtype=np.int64)
        self._negative_rows = self.rows(negatives)

    @classmethod
    def open(
        cls,
        cluster: SearchCluster,
        path: str | Path,
        search_path: str | Path,
        reuse: RemoteCatalogue | None = None,
    ) -> RemoteCatalogue:
        """The catalogue version at ``path``, its shards' actors created where missing and told
        of this version."""
        path = Path(path)
        digest = manifest_digest(path)
        if reuse is not None and reuse.digest == digest:
            return reuse
        if read_manifest(path).get("layout") != SHARDED_LAYOUT:
            raise ArtifactError(
                f"{path} was written before shards: a cluster serves sharded catalogues "
                "(rebuild it with python -m training index, or add an item to it once)"
            )
        artifact = read_typed_artifact(
            path, CATALOGUE_TYPE, {"negatives", "tombstones"}, {"shards", "attributes"}
        )
        manifest = artifact.manifest
        check_parent(path, manifest, "search_manifest_sha256", manifest_digest(search_path),
                     search_path)  # fmt: skip
        shards, first = [], 0
        for entry in manifest["shards"]:
            name, n_items = str(entry["name"]), int(entry["n_items"])
            location = str((path / SHARDS_DIR / name).resolve())
            shards.append(ShardRef(name, location, str(entry["manifest_sha256"]), first, n_items))
            first += n_items
        tombstones = artifact.arrays["tombstones"].astype(np.int64)

        async def prepare() -> None:
            actors = await cluster.actors(shards)
            await asyncio.gather(*(
                actor.prepare(digest, _local(tombstones, shard))
                for actor, shard in zip(actors, shards, strict=True)
            ))  # fmt: skip

        cluster.run(prepare, ACTOR_START_S)
        catalogue = cls(
            cluster, shards, tombstones, artifact.arrays["negatives"].astype(np.int64),
            {str(k): str(v) for k, v in dict(manifest["attributes"]).items()},
            int(manifest["version"]), digest, int(manifest["n_atoms"]), artifact.metadata,
        )  # fmt: skip
        cluster.hold(catalogue)
        return catalogue

    # -- sizes ---------------------------------------------------------------------------------

    @property
    def n_positions(self) -> int:
        return int(self.offsets[-1])

    @property
    def n_items(self) -> int:
        return self.n_positions - int(self.tombstones.size)

    @property
    def n_atoms(self) -> int:
        return self._n_atoms

    # -- fan-out -------------------------------------------------------------------------------

    def _each(
        self,
        calls: Sequence[tuple[ShardRef, tuple]],
        method: str,
        allow_partial: bool = False,
    ) -> tuple[list[Any | None], list[str]]:
        """Call ``method`` with each pair's arguments (which name the catalogue version, as every
        method of :class:`ShardActor` needs it) on its shard's actor, all at once, each within the
        deadline: the answers in order (None for a shard that missed it), and the names of those
        that did. A shard missing without ``allow_partial`` raises
        ShardsUnavailableError."""
        cluster = self.cluster

        async def one(shard: ShardRef, args: tuple):
            try:
                return await cluster.call(shard, method, *args)
            except VersionNotPreparedError:
                # A new actor (its worker was lost): tell it of this version, then ask again.
                await cluster.call(shard, "prepare", self.digest, _local(self.tombstones, shard))
                return await cluster.call(shard, method, *args)

        async def gather():
            tasks = [asyncio.ensure_future(one(shard, args)) for shard, args in calls]
            if tasks:
                await asyncio.wait(tasks, timeout=cluster.deadline_s)
            answers: list[Any | None] = []
            missing: list[str] = []
            for (shard, _), task in zip(calls, tasks, strict=True):
                if not task.done():
                    task.cancel()
                elif task.exception() is None:
                    answers.append(task.result())
                    continue
                elif not isinstance(task.exception(), ShardsUnavailableError):
                    raise task.exception()
                answers.append(None)
                missing.append(shard.name)
            return answers, missing

        answers, missing = cluster.run(gather, cluster.deadline_s + 5.0)
        if missing and not allow_partial:
            raise ShardsUnavailableError(
                f"shard(s) {', '.join(missing)} did not answer within {cluster.deadline_s:g} s "
                "(SEARCH_SHARD_TIMEOUT_S); ask with allow_partial for the other shards' items"
            )
        return answers, missing

    def _per_shard(self, positions: np.ndarray) -> list[tuple[ShardRef, np.ndarray]]:
        """(shard, indices into ``positions``) of each shard holding some of them."""
        shard = np.searchsorted(self.offsets, positions, side="right") - 1
        return [(self.shards[s], np.flatnonzero(shard == s)) for s in np.unique(shard)]

    # -- the catalogue's interface -------------------------------------------------------------

    def lookup(self, ids: Sequence[str]) -> np.ndarray:
        texts = [str(i) for i in ids]
        found = np.full(len(texts), -1, dtype=np.int64)
        if texts:
            calls = [(shard, (self.digest, texts)) for shard in self.shards]
            answers, _ = self._each(calls, "lookup")
            for positions in answers:
                found = np.maximum(found, positions)
        return found

    def rows(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        rows = np.empty((len(positions), self._n_atoms))
        groups = self._per_shard(positions)
        answers, _ = self._each([(s, (self.digest, positions[at])) for s, at in groups], "rows")
        for (_, at), answer in zip(groups, answers, strict=True):
            rows[at] = answer
        return rows

    def attributes_at(self, positions) -> list[dict[str, Any]]:
        positions = np.asarray(positions, dtype=np.int64)
        result: list[dict[str, Any]] = [{} for _ in positions]
        groups = self._per_shard(positions)
        calls = [(s, (self.digest, positions[at])) for s, at in groups]
        answers, _ = self._each(calls, "attributes_at")
        for (_, at), answer in zip(groups, answers, strict=True):
            for i, attributes in zip(at, answer, strict=True):
                result[i] = attributes
        return result

    def top(
        self,
        code: SparseCode,
        k: int,
        excluded: np.ndarray | None = None,
        query_filter: Filter | None = None,
        after: tuple[float, int] | None = None,
        allow_partial: bool = False,
    ) -> Ranking:
        """The best ``k`` live items: each shard's best ``k``, merged by unbiased score then
        global position (the in-process order, so the same ranking)."""
        (ranking,) = self.top_many(
            [RankRequest(code, k, excluded, query_filter, after)], allow_partial
        )
        return ranking

    def top_many(
        self, requests: Sequence[RankRequest], allow_partial: bool = False
    ) -> list[Ranking]:
        """:meth:`top` of each request, in order, from one call to each shard's actor, which
        answers them all in one pass over its shard."""
        none = np.zeros(0, dtype=np.int64)
        excluded = [none if r.excluded is None else np.asarray(r.excluded, np.int64)
                    for r in requests]  # fmt: skip
        request = pack_message(
            {
                "version": self.digest,
                "queries": [
                    {
                        "k": int(r.k),
                        "filter": None if r.query_filter is None else _filter_json(r.query_filter),
                        "after": None if r.after is None else [float(r.after[0]), int(r.after[1])],
                    }
                    for r in requests
                ],
            },
            [
                np.array([r.code.atoms.size for r in requests], dtype=np.int64),
                np.concatenate([np.asarray(r.code.atoms, np.int64) for r in requests]),
                np.concatenate([np.asarray(r.code.weights, np.float64) for r in requests]),
                np.array([e.size for e in excluded], dtype=np.int64),
                np.concatenate(excluded),
            ],
        )
        answers, missing = self._each(
            [(shard, (request,)) for shard in self.shards], "search", allow_partial
        )
        # Each shard's answer cut into its queries' parts: parts[q] lists (ids, positions, sums).
        parts: list[list[tuple[list[str], np.ndarray, np.ndarray]]] = [[] for _ in requests]
        for answer in answers:
            if answer is None:
                continue
            header, (sizes, positions, sums) = unpack_message(answer)
            cuts = np.cumsum(sizes)[:-1]
            for q, (ids, p, v) in enumerate(zip(
                header["ids"], np.split(positions, cuts), np.split(sums, cuts), strict=True
            )):  # fmt: skip
                parts[q].append((ids, p, v))
        return [_merged(query_parts, r.k, tuple(missing))
                for query_parts, r in zip(parts, requests, strict=True)]  # fmt: skip

    def count(self, query_filter: Filter | None = None) -> int:
        """Live items that ``query_filter`` allows (None: every live item), exact: the sum of
        every shard's count (a shard that does not answer in time fails it)."""
        if query_filter is None:
            return self.n_items
        self.check_filter(query_filter)
        text = _filter_json(query_filter)
        answers, _ = self._each([(s, (self.digest, text)) for s in self.shards], "count")
        return int(sum(answers))

    def tallies(self, key: str, query_filter: Filter | None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each shard's values of attribute ``key`` among the live items ``query_filter``
        allows, and their counts, from its actor."""
        text = None if query_filter is None else _filter_json(query_filter)
        calls = [(shard, (self.digest, key, text)) for shard in self.shards]
        answers, _ = self._each(calls, "tally")
        return [tuple(unpack_message(answer)[1]) for answer in answers]


def _filter_json(query_filter: Filter) -> Any:
    """A filter as the actors read it back (:meth:`Filter.parse`)."""
    return json.loads(query_filter.canonical())


def _merged(
    parts: Sequence[tuple[list[str], np.ndarray, np.ndarray]], k: int, missing: tuple[str, ...]
) -> Ranking:
    """One query's ranking from its shards' parts (ids, positions, sums): merged by unbiased
    score, then global position (the in-process order), the best ``k``."""
    if not parts:
        return Ranking(np.zeros(0, np.int64), np.zeros(0), [], missing)
    positions = np.concatenate([p for _, p, _ in parts])
    sums = np.concatenate([v for _, _, v in parts])
    ids = [i for part_ids, _, _ in parts for i in part_ids]
    order = np.lexsort((positions, -sums))[:k]
    return Ranking(positions[order], sums[order], [ids[i] for i in order], missing)


def _local(tombstones: np.ndarray, shard: ShardRef) -> np.ndarray:
    """The removed items of one shard, by local position."""
    inside = (tombstones >= shard.first) & (tombstones < shard.first + shard.n_items)
    return tombstones[inside] - shard.first


class CatalogueSource:
    """Where a catalogue version's shards are searched: in this process (memory-mapped here) or
    by a cluster's workers; the one place that chooses."""

    def __init__(self, cluster: SearchCluster | None = None) -> None:
        self.cluster = cluster

    def open(self, path, search_path, reuse=None) -> Catalogue | RemoteCatalogue:
        """The catalogue version at ``path``, reusing what ``reuse`` (the version before)
        holds."""
        if self.cluster is None:
            local = reuse if isinstance(reuse, Catalogue) else None
            return read_catalogue(path, search_path, local)
        previous = reuse if isinstance(reuse, RemoteCatalogue) else None
        return RemoteCatalogue.open(self.cluster, path, search_path, previous)

    @property
    def remote(self) -> bool:
        """Whether searches leave this process (never run them on the event loop)."""
        return self.cluster is not None
