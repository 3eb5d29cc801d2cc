"""The data plane: between the HTTP routes and the model runtimes.

It owns what serving adds to a model: which model answers (the registry's snapshot), whether the
service is ready, the serving limits and defaults (batch size, top_k, examples), and where the
work runs. The model library (:mod:`service.model`) validates what a request means; the data
plane only enforces what this server allows.

**Where work runs** (:meth:`DataPlane.placement`, the one place that decides):

- on the event loop, when the work stays on the calling thread (serial kernels only: no wait for
  the parallel-region lock) and its time, estimated from the same snapshot's earlier successful
  requests, is below ``INLINE_BUDGET_MS``: a thread-pool round trip costs more than a one-digit
  prediction. The estimate counts every part of a request (:data:`Parts`): instances, the
  characters of texts, searches, and the ids a search excludes, each with its own learned cost;
- on the compute thread, one dedicated thread, when the work runs parallel kernels: those take
  one process-wide lock anyway, and calling them from one thread keeps one warm OpenMP team
  (a new calling thread starts a new team);
- on the thread pool otherwise: long serial work, and codes learned from examples (scikit-learn).

The first request with a part of each kind leaves the loop, since its cost is not known yet.

Decoding a request's body (:meth:`DataPlane.convert`) runs on the loop only for bodies up to
``INLINE_BODY_BYTES``; larger ones are decoded on a worker thread, under the same bound on
concurrent work.
"""

from __future__ import annotations

import enum
import os
import signal
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from service.api.machinery.limits import WorkLimiter, concurrency_bound
from service.api.machinery.metrics import Metrics
from service.api.machinery.observability import answered_by
from service.api.registry import ModelRegistry, ModelSnapshot
from service.api.settings import Settings
from service.api.traffic import Shadow, ShadowRunner
from service.model import BatchTooLargeError, InvalidInputError, ModelNotReadyError, NotFoundError
from service.model.errors import ArtifactChangedError, brief
from service.model.inputs.words import Vocabulary
from service.model.predictor import Answer
from service.model.search import Catalogue, SearchIndex, SearchQuery, SearchResult, UpdateResult

T = TypeVar("T")

# Weight of the newest measurement in a snapshot's running cost estimate.
COST_SMOOTHING = 0.2
# A measurement counts at most this many times the estimate: one request preempted on a busy
# host (milliseconds, for microseconds of work) must not send the next ones off the loop.
COST_OUTLIER_FACTOR = 4.0
# Most atoms one search reports with their items (each costs a pass over the catalogue).
MAX_STRONGEST_ATOMS = 100

# A request's work by part, each counted in its own units ("instances", "text_chars",
# "search", "ids", "atom"); an empty mapping, or None: no estimate, never inline.
Parts = Mapping[str, int]


class Placement(enum.Enum):
    """Where a request's model work runs."""

    INLINE = "inline"
    COMPUTE_THREAD = "compute thread"
    THREAD_POOL = "thread pool"


class DataPlane:
    """Model lookup, readiness, limits, defaults and scheduling for the routes.

    Parameters
    ----------
    registry : ModelRegistry
    settings : Settings
    metrics : Metrics, optional
        Told of batch sizes and of the catalogue rows searches read.
    """

    def __init__(
        self, registry: ModelRegistry, settings: Settings, metrics: Metrics | None = None
    ) -> None:
        self.registry = registry
        self.metrics = metrics or Metrics()
        self.max_batch_size = settings.max_batch_size
        self.default_top_k = settings.default_top_k
        self.default_search_top_k = settings.default_search_top_k
        self.max_search_top_k = settings.max_search_top_k
        self.max_search_offset = settings.max_search_offset
        # Worker processes beside this one (uvicorn's supervisor passes SIGHUP on to them).
        self.has_siblings = settings.workers > 1
        self.inline_budget_s = settings.inline_budget_ms / 1000.0
        self.inline_body_bytes = settings.inline_body_bytes
        self.max_json_values = settings.max_json_values
        # Seconds per unit of work by kind, per snapshot: a new version learns its own.
        self._costs: weakref.WeakKeyDictionary[ModelSnapshot, dict[str, float]] = (
            weakref.WeakKeyDictionary()
        )
        self._compute: ThreadPoolExecutor | None = None
        # Concurrent work and its time limit: overload answers at once instead of queueing.
        self.work = WorkLimiter(concurrency_bound(settings), settings.request_timeout_s)
        # Aliases' shadows: compared off the request path, on a thread of their own.
        self.shadows = ShadowRunner(self.metrics)

    def close(self) -> None:
        """Stop the compute thread and the worker threads. Work queued is dropped and work under
        way is not waited for: its requests were answered (or timed out), and waiting here would
        hold the shutdown past SHUTDOWN_TIMEOUT_S."""
        if self._compute is not None:
            self._compute.shutdown(wait=False, cancel_futures=True)
            self._compute = None
        self.work.close()
        self.shadows.close()

    # -- models --------------------------------------------------------------------------------

    def snapshot(self, name: str | None, version: str | None = None) -> ModelSnapshot:
        """The snapshot of model ``name`` (None: the default model) a request uses; the
        request's metrics are labelled with its model from now on.

        Parameters
        ----------
        name : str or None
        version : str, optional
            The version the request names: NotFoundError unless it is the one served.
        """
        snapshot = self.registry.snapshot(name, version)
        answered_by(snapshot.name)
        if version is not None and version != snapshot.version:
            raise _not_serving(snapshot, version)
        return snapshot

    def route(
        self, name: str | None, version: str | None = None
    ) -> tuple[ModelSnapshot, Shadow | None]:
        """As :meth:`snapshot`, for a classification: an alias's canary and shadow drawn (see
        :mod:`service.api.traffic`)."""
        snapshot, shadow = self.registry.route(name, version)
        answered_by(snapshot.name)
        if version is not None and version != snapshot.version:
            raise _not_serving(snapshot, version)
        return snapshot, shadow

    def readiness(self) -> tuple[bool, str]:
        """Whether the service is ready, and why (not)."""
        return self.registry.readiness()

    def models(self) -> list[tuple[dict[str, Any], ModelSnapshot | None]]:
        """Every model's status (name, state, version, reason) and its snapshot, by name."""
        return [(entry.describe(), entry.snapshot) for entry in self.registry.entries_by_name()]

    def model(self, name: str) -> tuple[dict[str, Any], ModelSnapshot]:
        """One ready model's status and snapshot (an alias's: its model's)."""
        snapshot = self.snapshot(name)
        return self.registry.entries[snapshot.name].describe(), snapshot

    def vocabulary(self, name: str) -> tuple[ModelSnapshot, Vocabulary]:
        """A text model's vocabulary; NotFoundError for models that read no text."""
        snapshot = self.snapshot(name)
        vocabulary = snapshot.predictor.vocabulary
        if vocabulary is None:
            raise NotFoundError(f"model {name!r} reads no text: it has no vocabulary")
        return snapshot, vocabulary

    # -- requests ------------------------------------------------------------------------------

    async def classify(
        self,
        name: str | None,
        instances: Sequence[Any] | None,
        texts: Sequence[str] | None,
        top_k: int | None,
        version: str | None = None,
    ) -> tuple[ModelSnapshot, list[Answer]]:
        """Classify a batch with model ``name`` (None: the default model), ``version`` if
        given (see :meth:`snapshot`)."""
        snapshot, shadow = self.route(name, version)
        batch = instances if instances is not None else texts
        size = 0 if batch is None else len(batch)
        self._check_batch(size, "instances")
        predictor = snapshot.predictor
        k = self.default_top_k if top_k is None else top_k
        parts = {"instances": max(size, 1)}
        if texts is not None:
            parts["text_chars"] = sum(map(len, texts))
        answers = await self._run(
            snapshot,
            parts,
            predictor.runs_serially(max(size, 1)),
            lambda: predictor.classify(instances, k, texts=texts),
        )
        self.metrics.batch(snapshot.name, size)
        if shadow is not None:
            self.shadows.submit(shadow, snapshot, instances, texts, answers)
        return snapshot, answers

    async def search(
        self, name: str | None, query: SearchQuery
    ) -> tuple[ModelSnapshot, SearchResult]:
        """Answer a search with model ``name`` (None: the default model)."""
        snapshot = self.snapshot(name)
        index = snapshot.require_search()
        self._check_top_k(query.top_k)
        if query.strongest_atoms > MAX_STRONGEST_ATOMS:
            raise InvalidInputError(
                f"strongest_atoms must be at most {MAX_STRONGEST_ATOMS}, "
                f"got {query.strongest_atoms}"
            )
        if query.offset > self.max_search_offset:
            raise InvalidInputError(
                f"offset must be at most {self.max_search_offset} (MAX_SEARCH_OFFSET), got "
                f"{query.offset}: page further with next_cursor"
            )
        examples = len(query.positives or ()) + len(query.negatives or ())
        self._check_batch(examples, "positives and negatives")
        # Learning a code fits small SVMs, and shards held elsewhere are waited for: never on
        # the loop, and no cost estimate to keep.
        parts = None
        if query.positives is None and not index.answers_elsewhere:
            parts = {"search": 1 + query.strongest_atoms, "ids": len(query.exclude)}
        result = await self._run(
            snapshot, parts, index.runs_serially(query), lambda: index.run(query)
        )
        # The ranking reads one catalogue row per atom of the code, each strongest atom one more.
        self.metrics.search_rows(snapshot.name, result.code.n_nonzero + len(result.strongest_atoms))
        return snapshot, result

    async def atom(
        self, name: str, atom: int, top_k: int | None
    ) -> tuple[ModelSnapshot, list[tuple[str, float]], list[tuple[str, float]]]:
        """The items one atom of model ``name`` ranks highest, and the classes using it."""
        snapshot = self.snapshot(name)
        index = snapshot.require_search()
        k = self.default_search_top_k if top_k is None else top_k
        self._check_top_k(k)
        serially = index.runs_serially(SearchQuery(code=([atom], [1.0]), top_k=k))
        parts = None if index.answers_elsewhere else {"atom": 1}
        items = await self._run(snapshot, parts, serially, lambda: index.atom_items(atom, k))
        self.metrics.search_rows(snapshot.name, 1)
        return snapshot, items, index.atom_classes(atom)

    # -- catalogues ----------------------------------------------------------------------------

    def catalogue(self, name: str) -> tuple[ModelSnapshot, Catalogue]:
        """The catalogue version model ``name`` serves; NotFoundError without one."""
        snapshot = self.snapshot(name)
        return snapshot, snapshot.require_search().require_catalogue()

    async def catalogue_item(
        self, name: str, item_id: str
    ) -> tuple[ModelSnapshot, int, dict[str, Any]]:
        """The catalogue version and attributes of one item of model ``name``'s catalogue
        (looked up on a worker thread: the shards may be held elsewhere); NotFoundError if it
        is not there."""
        snapshot, catalogue = self.catalogue(name)

        def find() -> dict[str, Any]:
            (position,) = catalogue.lookup([item_id]).tolist()
            if position < 0:
                raise NotFoundError(f"model {snapshot.name!r}: no catalogue item {brief(item_id)}")
            return catalogue.attributes_at([position])[0]

        self.work.admit()
        return snapshot, catalogue.version, await self.work.run(self.work.pool(), find)

    async def update_catalogue(
        self, name: str, size: int, change: Callable[[SearchIndex], UpdateResult]
    ) -> tuple[ModelSnapshot, UpdateResult]:
        """Run ``change`` (an upsert or a deletion of ``size`` items) on model ``name``'s search
        index, on a worker thread, then serve the version it wrote before answering.

        The change is on disk when it returns (see :mod:`service.model.search.store`); the
        version served here is then at least the one written. Other worker processes are told
        at once (SIGHUP through the supervisor, which rescans every worker), and in any case
        see it at their next rescan (RELOAD_INTERVAL_S).

        Raises
        ------
        BatchTooLargeError
            More than MAX_BATCH_SIZE items.
        ModelNotReadyError
            The version written could not be loaded (the reason says why; it is on disk).
        """
        self._check_batch(size, "ids")
        snapshot = self.snapshot(name)
        index = snapshot.require_search()
        self.work.admit()
        result = await self.work.run(self.work.pool(), lambda: change(index))
        entry = await self.registry.load(snapshot.name, force=False)
        served = entry.snapshot
        catalogue = None if served is None or served.search is None else served.search.catalogue
        if catalogue is None or catalogue.version < result.version:
            raise ModelNotReadyError(
                f"model {snapshot.name!r}: catalogue version {result.version} was written but "
                f"is not served: {entry.reason}"
            )
        if self.has_siblings:
            os.kill(os.getppid(), signal.SIGHUP)
        return served, result

    def _check_batch(self, size: int, what: str) -> None:
        if size > self.max_batch_size:
            raise BatchTooLargeError(
                f"the request holds {size} {what}; the limit is {self.max_batch_size}"
            )

    def _check_top_k(self, top_k: int) -> None:
        if top_k > self.max_search_top_k:
            raise InvalidInputError(
                f"top_k must be at most {self.max_search_top_k} (MAX_SEARCH_TOP_K), got {top_k}"
            )

    # -- scheduling ----------------------------------------------------------------------------

    def placement(self, snapshot: ModelSnapshot, parts: Parts | None, serially: bool) -> Placement:
        """Where work of ``parts`` on ``snapshot`` runs (see the module docstring).

        Parameters
        ----------
        snapshot : ModelSnapshot
        parts : Parts or None
            The request's work by part; None (or nothing): no estimate, never inline.
        serially : bool
            Whether the work stays on the calling thread (serial kernels only).
        """
        if not serially:
            return Placement.COMPUTE_THREAD
        estimate = self.estimate_of(snapshot, parts)
        if estimate is not None and estimate <= self.inline_budget_s:
            return Placement.INLINE
        return Placement.THREAD_POOL

    def estimate_of(self, snapshot: ModelSnapshot, parts: Parts | None) -> float | None:
        """Seconds the work of ``parts`` is estimated to take (None: a part of it has no
        estimate yet)."""
        if not parts:
            return None
        total = 0.0
        for kind, units in parts.items():
            if units:
                per_unit = self.estimate(snapshot, kind)
                if per_unit is None:
                    return None
                total += per_unit * units
        return total

    def estimate(self, snapshot: ModelSnapshot, kind: str) -> float | None:
        """Seconds per unit of ``kind`` on ``snapshot`` learned so far (None: none yet)."""
        return self._costs.get(snapshot, {}).get(kind)

    def observe(self, snapshot: ModelSnapshot, parts: Parts, seconds: float) -> None:
        """Fold one successful request's time into ``snapshot``'s estimates of its parts.

        The parts with an estimate are scaled together by how far the time was from their sum;
        parts without one share what the others' estimates leave of the time (at least half of
        it: an estimate of nothing could never grow again), by units.
        """
        costs = self._costs.setdefault(snapshot, {})
        expected, new_units = 0.0, 0
        for kind, units in parts.items():
            if units:
                per_unit = costs.get(kind)
                if per_unit is None:
                    new_units += units
                else:
                    expected += per_unit * units
        if new_units:
            left = max(seconds - expected, seconds / 2) / new_units
            for kind, units in parts.items():
                if units and kind not in costs:
                    costs[kind] = left
            return
        # A measurement counts at most COST_OUTLIER_FACTOR times the estimate.
        scale = min(seconds / expected, COST_OUTLIER_FACTOR) if expected > 0 else 1.0
        for kind, units in parts.items():
            if units:
                costs[kind] *= 1 - COST_SMOOTHING + COST_SMOOTHING * scale

    async def convert(self, size: int, work: Callable[[], T]) -> T:
        """Decode or convert a request's body of ``size`` bytes with ``work``: on the event loop
        up to INLINE_BODY_BYTES, else on a worker thread under a slot of :attr:`work`
        (OverloadedError when none is free, WorkTimeoutError past REQUEST_TIMEOUT_S)."""
        if size <= self.inline_body_bytes:
            return work()
        self.work.admit()
        return await self.work.run(self.work.pool(), work)

    async def _run(
        self,
        snapshot: ModelSnapshot,
        parts: Parts | None,
        serially: bool,
        work: Callable[[], T],
    ) -> T:
        """Run ``work`` where :meth:`placement` says, and learn its cost when it succeeds.

        Every request's work takes a slot of :attr:`work` (OverloadedError when none is free);
        work on a thread is waited for at most REQUEST_TIMEOUT_S (WorkTimeoutError), work
        inline is short by construction (INLINE_BUDGET_MS).
        """
        place = self.placement(snapshot, parts, serially)
        self.work.admit()
        try:
            if place is Placement.INLINE:
                try:
                    result, seconds = _timed(work)
                finally:
                    self.work.release()
            else:
                if place is Placement.COMPUTE_THREAD:
                    if self._compute is None:
                        self._compute = ThreadPoolExecutor(1, thread_name_prefix="besvm-compute")
                    executor = self._compute
                else:
                    executor = self.work.pool()
                result, seconds = await self.work.run(executor, lambda: _timed(work))
        except ArtifactChangedError:
            # A file of the snapshot was rewritten in place: what is on disk now is loaded as
            # any new version would be (or refused, the message says why in the log).
            self.registry.recheck(snapshot.name)
            raise
        if parts:
            self.observe(snapshot, parts, seconds)
        return result


def _not_serving(snapshot: ModelSnapshot, version: str) -> NotFoundError:
    return NotFoundError(
        f"model {snapshot.name!r} serves version {snapshot.version}, not {brief(version)}"
    )


def _timed(work: Callable[[], T]) -> tuple[T, float]:
    """``work()`` and the seconds it took."""
    started = time.perf_counter()
    result = work()
    return result, time.perf_counter() - started
