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

With dynamic batching (:mod:`service.api.batching`), a classification joins its model
version's queue and is computed with the requests waiting beside it; each batch is placed as
above, whichever route it came by (REST, the protocol over REST, gRPC).
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from service.api.batching import Batcher, BatchingPolicy
from service.api.errors import WorkTimeoutError
from service.api.jobs import DONE, RESTORE, SNAPSHOT, Claim, JobKind, JobRecords, Jobs
from service.api.machinery.limits import RequestHold, WorkLimiter, concurrency_bound
from service.api.machinery.metrics import Metrics
from service.api.machinery.observability import answered_by
from service.api.registry import ModelRegistry, ModelSnapshot
from service.api.settings import Settings
from service.api.traffic import Shadow, ShadowRunner
from service.model import BatchTooLargeError, InvalidInputError, ModelNotReadyError, NotFoundError
from service.model.answers import Answer, ClassifyCall
from service.model.errors import ArtifactChangedError, ArtifactError, brief, located
from service.model.inputs.words import Vocabulary
from service.model.search import (
    Catalogue,
    Filter,
    SearchIndex,
    SearchQuery,
    SearchResult,
    UpdateResult,
)
from service.model.search.catalogue import Facet
from service.model.search.filters import AttributeLimits
from service.model.search.snapshots import (
    Snapshot,
    described_snapshot,
    list_snapshots,
    new_snapshot_name,
    remove_unfinished,
    snapshot_in,
)
from service.model.search.store import CommitGate
from service.model.threads import lower_priority

T = TypeVar("T")

# Weight of the newest measurement in a snapshot's running cost estimate.
COST_SMOOTHING = 0.2
# A measurement counts at most this many times the estimate: one request preempted on a busy
# host (milliseconds, for microseconds of work) must not send the next ones off the loop.
COST_OUTLIER_FACTOR = 4.0
# Threads that decode large bodies (see DataPlane.convert): two, so that a large body does not
# hold up every other one behind it.
DECODE_THREADS = 2
# Most atoms one search reports with their items (each costs a pass over the catalogue).
MAX_STRONGEST_ATOMS = 100
# Most basis items one explanation names.
MAX_EXPLAIN_ITEMS = 100
# Values a facet answers by default, and at most.
DEFAULT_FACET_VALUES = 10
MAX_FACET_VALUES = 1000

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
        # What one search may rank, and a batch of them in all.
        self.most_ranked = settings.max_search_top_k + settings.max_search_offset
        self.snapshots_dir = settings.snapshots_dir
        # Worker processes beside this one (uvicorn's supervisor passes SIGHUP on to them).
        self.has_siblings = settings.workers > 1
        self.inline_budget_s = settings.inline_budget_ms / 1000.0
        self.inline_body_bytes = settings.inline_body_bytes
        self.max_json_values = settings.max_json_values
        self.attribute_limits = AttributeLimits(
            settings.max_item_attributes,
            settings.max_catalogue_attributes,
            "MAX_ITEM_ATTRIBUTES",
            "MAX_CATALOGUE_ATTRIBUTES",
        )
        # Seconds per unit of work by kind, per snapshot: a new version learns its own.
        self._costs: weakref.WeakKeyDictionary[ModelSnapshot, dict[str, float]] = (
            weakref.WeakKeyDictionary()
        )
        self._compute: ThreadPoolExecutor | None = None
        self._decoder: ThreadPoolExecutor | None = None
        # Concurrent work and its time limit: overload answers at once instead of queueing.
        self.work = WorkLimiter(concurrency_bound(settings), settings.request_timeout_s)
        # Dynamic batching, unless a model's serving.json says otherwise; a batcher per version.
        self.batching = BatchingPolicy(
            settings.dynamic_batch_max_instances, settings.dynamic_batch_max_delay_ms / 1000.0
        )
        self._batchers: weakref.WeakKeyDictionary[ModelSnapshot, Batcher] = (
            weakref.WeakKeyDictionary()
        )
        # Aliases' shadows: compared off the request path, on a thread of their own.
        self.shadows = ShadowRunner(self.metrics)
        # Snapshots and restores, which outlive the request that starts them if they must.
        self.jobs = Jobs(settings.request_timeout_s)

    def close(self) -> None:
        """Stop the compute thread and the worker threads. Work queued is dropped and work under
        way is not waited for: its requests were answered (or timed out), and waiting here would
        hold the shutdown past SHUTDOWN_TIMEOUT_S."""
        for pool in (self._compute, self._decoder):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self._compute = self._decoder = None
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

    def aliases(self) -> list[dict[str, Any]]:
        """Every alias served: its model, canary and shadow, each with the version it serves
        (see :func:`service.api.traffic.describe_policy`)."""
        return self.registry.describe_aliases()["aliases"]

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
        explain: int = 0,
    ) -> tuple[ModelSnapshot, list[Answer]]:
        """Classify a batch with model ``name`` (None: the default model), ``version`` if
        given (see :meth:`snapshot`), with ``explain`` items per explanation (0: none); with
        dynamic batching together with the requests waiting beside it
        (:mod:`service.api.batching`)."""
        call = ClassifyCall(instances, texts, top_k, explain)
        snapshot, shadow, request = self._classification(name, version, call)
        batcher = self.batcher(snapshot)
        if batcher is not None and request.size <= batcher.policy.max_instances:
            answers = await batcher.classify(request.call, request.instances, request.text_chars)
        else:
            answers = await self._run(
                snapshot, request.parts, request.serially, request.work(snapshot.predictor)
            )
        self._answered(snapshot, shadow, request, answers)
        return snapshot, answers

    def _classification(
        self, name: str | None, version: str | None, call: ClassifyCall
    ) -> tuple[ModelSnapshot, Shadow | None, _Classification]:
        """The snapshot a classification uses (an alias's canary and shadow drawn), its shadow,
        and what it asks, checked against the limits."""
        snapshot, shadow = self.route(name, version)
        batch = call.instances if call.instances is not None else call.texts
        size = 0 if batch is None else len(batch)
        self._check_batch(size, "instances")
        self._check_explain(call.explain)
        if call.top_k is None:
            call.top_k = self.default_top_k
        text_chars = 0 if call.texts is None else sum(map(len, call.texts))
        serially = snapshot.predictor.runs_serially(max(size, 1))
        return snapshot, shadow, _Classification(call, size, text_chars, serially)

    def _answered(
        self,
        snapshot: ModelSnapshot,
        shadow: Shadow | None,
        request: _Classification,
        answers: list[Answer],
    ) -> None:
        """What follows a classification's answers: its batch size counted, its shadow run."""
        self.metrics.batch(snapshot.name, request.size)
        if shadow is not None:
            call = request.call
            self.shadows.submit(shadow, snapshot, call.instances, call.texts, answers)

    def batcher(self, snapshot: ModelSnapshot) -> Batcher | None:
        """The batcher of ``snapshot``'s version; None without dynamic batching."""
        batcher = self._batchers.get(snapshot)
        if batcher is None:
            policy = snapshot.batching or self.batching
            if not policy.enabled:
                return None
            batcher = self._batchers[snapshot] = Batcher(self, snapshot, policy)
        return batcher

    async def search(
        self, name: str | None, query: SearchQuery
    ) -> tuple[ModelSnapshot, SearchResult]:
        """Answer a search with model ``name`` (None: the default model)."""
        snapshot = self.snapshot(name)
        index = snapshot.require_search()
        self._check_query(query)
        self._check_batch(_examples(query), "positives and negatives")
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

    async def search_many(
        self, name: str | None, queries: Sequence[SearchQuery], hold: RequestHold | None = None
    ) -> tuple[ModelSnapshot, list[SearchResult]]:
        """Answer a batch of searches with model ``name`` (None: the default model), each
        exactly as alone (see :meth:`SearchIndex.run_many`). The batch counts toward the limits
        as one request: at most MAX_BATCH_SIZE searches, and positives and negatives; offset +
        top_k of every query together at most what one query may rank (MAX_SEARCH_TOP_K +
        MAX_SEARCH_OFFSET); what it holds while ranking against the memory budget (``hold``);
        one slot of concurrent work and one REQUEST_TIMEOUT_S. A query that breaks a rule of its
        own fails the batch, named (``searches[3]: ...``).

        Raises
        ------
        BatchTooLargeError
            Too many searches, examples or items ranked in all (413).
        InvalidInputError
            No search, or one that is not valid (422).
        """
        snapshot = self.snapshot(name)
        index = snapshot.require_search()
        if not queries:
            raise InvalidInputError("searches is empty: give at least one query")
        self._check_batch(len(queries), "searches")
        for i, query in enumerate(queries):
            with located(f"searches[{i}]"):
                self._check_query(query)
        self._check_batch(sum(map(_examples, queries)), "positives and negatives in all")
        ranked, most = sum(q.offset + q.top_k for q in queries), self.most_ranked
        if ranked > most:
            raise BatchTooLargeError(
                f"the searches rank {ranked} items in all (offset + top_k of each); a batch "
                f"ranks at most {most}, what one search may (MAX_SEARCH_TOP_K + MAX_SEARCH_OFFSET)"
            )
        if hold is not None:
            hold.add(index.batch_bytes(queries), f"ranking {len(queries)} searches")
        parts = None
        if not index.answers_elsewhere and all(q.positives is None for q in queries):
            parts = {
                "batch_search": len(queries),
                "search": sum(q.strongest_atoms for q in queries),
                "ids": sum(len(q.exclude) for q in queries),
            }
        results = await self._run(
            snapshot, parts, index.batch_runs_serially(queries), lambda: index.run_many(queries)
        )
        rows = sum(r.code.n_nonzero + len(r.strongest_atoms) for r in results)
        self.metrics.search_rows(snapshot.name, rows)
        return snapshot, results

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
        self,
        name: str,
        size: int,
        change: Callable[[SearchIndex, CommitGate], UpdateResult],
        hold: RequestHold | None = None,
        work_bytes: Callable[[SearchIndex], int] | None = None,
    ) -> tuple[ModelSnapshot, UpdateResult]:
        """Run ``change`` (an upsert or a deletion of ``size`` items) on model ``name``'s search
        index, on a worker thread, then serve the version it wrote before answering.

        The change is on disk when it returns (see :mod:`service.model.search.store`); the
        version served here is then at least the one written. Other worker processes are told
        at once (SIGHUP through the supervisor, which rescans every worker), and in any case
        see it at their next rescan (RELOAD_INTERVAL_S). At REQUEST_TIMEOUT_S a change not yet
        committing is abandoned (its gate: it never commits, the answer is 504); one
        committing is waited for (its answer is the change's).

        Parameters
        ----------
        name : str
        size : int
        change : callable
            ``change(index, gate)``, the gate to pass to the index's update.
        hold : RequestHold, optional
            The request's bytes of the memory budget: ``work_bytes(index)`` more are taken
            before the change runs (503 when they do not fit now, 413 when they never could).
        work_bytes : callable, optional
            What the change will hold of memory (it may refuse the change first).

        Raises
        ------
        BatchTooLargeError
            More than MAX_BATCH_SIZE items.
        ModelNotReadyError
            The version written could not be loaded (the reason says why; it is on disk).
        WorkTimeoutError
            Abandoned at REQUEST_TIMEOUT_S: nothing was applied.
        """
        self._check_batch(size, "ids")
        snapshot = self.snapshot(name)
        index = snapshot.require_search()
        if hold is not None and work_bytes is not None:
            hold.add(work_bytes(index), "the update's work")
        gate = CommitGate()
        self.work.admit()
        try:
            result = await self.work.run(
                self.work.pool(), lambda: change(index, gate), stop=gate.abandon
            )
        except WorkTimeoutError as error:
            raise WorkTimeoutError(
                f"{error}: the update was not applied, and never will be (nothing of it was "
                "written); send it again"
            ) from None
        return await self._serve_written(snapshot.name, result), result

    async def _serve_written(self, name: str, result: UpdateResult) -> ModelSnapshot:
        """Serve the catalogue version that an update of model ``name`` wrote (``result``), and
        tell the other worker processes; the snapshot that serves it.

        Raises
        ------
        ModelNotReadyError
            The version written could not be loaded (the reason says why; it is on disk).
        """
        entry = await self.registry.load(name, force=False)
        served = entry.snapshot
        catalogue = None if served is None or served.search is None else served.search.catalogue
        if served is None or catalogue is None or catalogue.version < result.version:
            raise ModelNotReadyError(
                f"model {name!r}: catalogue version {result.version} was written but is not "
                f"served: {entry.reason}"
            )
        if self.has_siblings:
            os.kill(os.getppid(), signal.SIGHUP)
        return served

    async def count(self, name: str, query_filter: Filter | None) -> tuple[ModelSnapshot, int, int]:
        """The catalogue version of model ``name`` and its live items that ``query_filter``
        allows (None: all), exact (on a worker thread: the shards may be held elsewhere)."""
        snapshot, catalogue = self.catalogue(name)
        self.work.admit()
        count = await self.work.run(self.work.pool(), lambda: catalogue.count(query_filter))
        return snapshot, catalogue.version, count

    async def facet(
        self, name: str, key: str, query_filter: Filter | None, limit: int | None
    ) -> tuple[ModelSnapshot, int, Facet]:
        """The catalogue version of model ``name`` and the counts of its live items that
        ``query_filter`` allows per value of attribute ``key``: the ``limit`` values (default
        :data:`DEFAULT_FACET_VALUES`, at most :data:`MAX_FACET_VALUES`) with the most."""
        snapshot, catalogue = self.catalogue(name)
        limit = DEFAULT_FACET_VALUES if limit is None else limit
        if limit > MAX_FACET_VALUES:
            raise InvalidInputError(f"limit must be at most {MAX_FACET_VALUES}, got {limit}")
        self.work.admit()
        facet = await self.work.run(
            self.work.pool(), lambda: catalogue.facet(key, query_filter, limit)
        )
        return snapshot, catalogue.version, facet

    # -- snapshots -----------------------------------------------------------------------------

    def snapshots_of(self, name: str) -> Path:
        """Where model ``name``'s catalogue snapshots are kept; NotFoundError without
        SNAPSHOTS_DIR."""
        if self.snapshots_dir is None:
            raise NotFoundError(
                "this server keeps no catalogue snapshots: set SNAPSHOTS_DIR to a directory it "
                "may write (or take one with python -m training index --snapshot OUT)"
            )
        return self.snapshots_dir / name

    async def _claim(self, records: JobRecords, kind: JobKind, name: str) -> Claim:
        """``kind``'s lock on the catalogue for job ``name`` (JobInProgressError: one runs),
        taken on a worker thread (files); a snapshot's first removes what snapshots
        interrupted before it left half-written (hidden staging directories)."""

        def claim() -> Claim:
            try:
                claimed = records.claim(kind, name)
            except OSError as error:  # SNAPSHOTS_DIR not writable: said, never a 500
                raise ArtifactError(f"cannot write {records.directory}: {error}") from None
            if kind is SNAPSHOT:
                remove_unfinished(records.directory)
            return claimed

        self.work.admit()
        # Untimed: a claim is taken or not, never left held by a request that stopped waiting.
        return await self.work.run(self.work.pool(), claim, timed=False)

    async def take_snapshot(
        self, name: str, wait: bool, answer: Callable[[ModelSnapshot, Snapshot], dict[str, Any]]
    ) -> tuple[ModelSnapshot, Claim, dict[str, Any] | None]:
        """Start a snapshot of model ``name``'s newest catalogue version under SNAPSHOTS_DIR, a
        job (see :mod:`service.api.jobs`) on a thread of its own while searches and updates go
        on, and wait for it up to REQUEST_TIMEOUT_S if ``wait``: the model's snapshot that
        serves, the job's claim (its name, record and status route) and ``answer`` of the
        snapshot taken, None while it is under way.

        Raises
        ------
        JobInProgressError
            A snapshot of the catalogue is being taken.
        ModelError
            The snapshot failed within the wait (the error it would answer).
        """
        served = self.snapshot(name)
        index = served.require_search()
        index.require_catalogue()
        records = JobRecords(self.snapshots_of(served.name), served.name)
        claim = await self._claim(records, SNAPSHOT, new_snapshot_name())
        out = records.directory / claim.name

        async def finish(taken: Snapshot) -> dict[str, Any]:
            return answer(served, taken)

        task = self.jobs.start(claim, lambda progress: index.snapshot(out, progress), finish)
        return served, claim, await self.jobs.outcome(task, wait)

    async def restore_snapshot(
        self,
        name: str,
        snapshot_name: str,
        wait: bool,
        answer: Callable[[ModelSnapshot, UpdateResult, Snapshot], dict[str, Any]],
    ) -> tuple[ModelSnapshot, Claim, dict[str, Any] | None]:
        """Start the restore of model ``name``'s snapshot ``snapshot_name``, a job as
        :meth:`take_snapshot`: every file verified, then its version made the catalogue's
        newest and served by this process (the others told) before the job is done; the
        model's snapshot that serves, the job's claim and ``answer`` of the restore, None while
        it is under way.

        Raises
        ------
        JobInProgressError
            A restore of the catalogue is running.
        ModelError
            No such snapshot; or the restore failed within the wait (a damaged snapshot:
            SnapshotRefusedError, nothing written).
        """
        served = self.snapshot(name)
        index = served.require_search()
        records = JobRecords(self.snapshots_of(served.name), served.name)
        path = snapshot_in(records.directory, snapshot_name)
        claim = await self._claim(records, RESTORE, snapshot_name)

        def restore(progress: Claim) -> tuple[UpdateResult, Snapshot]:
            return index.restore(path, progress), described_snapshot(path)

        async def finish(restored: tuple[UpdateResult, Snapshot]) -> dict[str, Any]:
            result, verified = restored
            return answer(await self._serve_written(served.name, result), result, verified)

        task = self.jobs.start(claim, restore, finish)
        return served, claim, await self.jobs.outcome(task, wait)

    async def job_status(
        self,
        name: str,
        kind: JobKind,
        snapshot_name: str,
        answer: Callable[[ModelSnapshot, Snapshot], dict[str, Any]],
    ) -> tuple[ModelSnapshot, dict[str, Any]]:
        """The record of model ``name``'s snapshot or restore ``snapshot_name`` (see
        :mod:`service.api.jobs`): in progress, done with its result, or failed with its error.
        A snapshot's directory, complete, is its record's last word: done (``answer`` of it,
        where no record says so), whoever took it.

        Raises
        ------
        NotFoundError
            No such job known (nor, for a snapshot, such a snapshot).
        """
        served = self.snapshot(name)
        records = JobRecords(self.snapshots_of(served.name), served.name)

        def read() -> dict[str, Any]:
            record = records.status(kind, snapshot_name)
            if kind is SNAPSHOT and (record is None or record["state"] != DONE):
                with contextlib.suppress(NotFoundError):
                    taken = described_snapshot(snapshot_in(records.directory, snapshot_name))
                    record = records.done(kind, snapshot_name, answer(served, taken), record)
            if record is None:
                raise NotFoundError(
                    f"model {served.name!r}: no {kind.name} {brief(snapshot_name)} known"
                )
            return record

        self.work.admit()
        return served, await self.work.run(self.work.pool(), read, timed=False)

    async def list_snapshots(self, name: str) -> tuple[list[Snapshot], list[str]]:
        """Model ``name``'s catalogue snapshots, oldest first, and the directories there that
        hold none readable (see :func:`service.model.search.snapshots.list_snapshots`)."""
        where = self.snapshots_of(self.snapshot(name).name)
        self.work.admit()
        return await self.work.run(self.work.pool(), lambda: list_snapshots(where))

    def _check_query(self, query: SearchQuery) -> None:
        """What this server allows one search: top_k, strongest_atoms and offset."""
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

    def _check_batch(self, size: int, what: str) -> None:
        if size > self.max_batch_size:
            raise BatchTooLargeError(
                f"the request holds {size} {what}; the limit is {self.max_batch_size}"
            )

    def _check_explain(self, explain: int) -> None:
        if explain > MAX_EXPLAIN_ITEMS:
            raise InvalidInputError(
                f"explain must be at most {MAX_EXPLAIN_ITEMS} basis items, got {explain}"
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
        up to INLINE_BODY_BYTES, else on one of :data:`DECODE_THREADS` decoding threads under a
        slot of :attr:`work` (OverloadedError when none is free, WorkTimeoutError past
        REQUEST_TIMEOUT_S; the wait for a decoding thread counts).

        Decoding JSON into Python objects holds the interpreter's lock throughout, so more
        threads decode no faster; they only make the event loop wait longer for the lock (each
        thread that wants it is as likely to get it next): with 128 threads decoding 0.24 MB
        bodies, /healthz took seconds."""
        if size <= self.inline_body_bytes:
            return work()
        self.work.admit()
        if self._decoder is None:
            self._decoder = ThreadPoolExecutor(
                DECODE_THREADS, thread_name_prefix="besvm-decode", initializer=lower_priority
            )
        return await self.work.run(self._decoder, work)

    def executor(self, place: Placement) -> ThreadPoolExecutor:
        """The threads of work placed on the compute thread or the thread pool."""
        if place is not Placement.COMPUTE_THREAD:
            return self.work.pool()
        if self._compute is None:
            self._compute = ThreadPoolExecutor(
                1, thread_name_prefix="besvm-compute", initializer=lower_priority
            )
        return self._compute

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
                result, seconds = await self.work.run(self.executor(place), lambda: _timed(work))
        except ArtifactChangedError:
            # A file of the snapshot was rewritten in place: what is on disk now is loaded as
            # any new version would be (or refused, the message says why in the log).
            self.registry.recheck(snapshot.name)
            raise
        if parts:
            self.observe(snapshot, parts, seconds)
        return result


@dataclass(slots=True)
class _Classification:
    """One classification request as the data plane runs it."""

    call: ClassifyCall
    size: int
    text_chars: int
    serially: bool

    @property
    def instances(self) -> int:
        """Its instances, at least one (an empty batch still costs its refusal)."""
        return max(self.size, 1)

    @property
    def parts(self) -> dict[str, int]:
        parts = {"instances": self.instances}
        if self.call.texts is not None:
            parts["text_chars"] = self.text_chars
        return parts

    def work(self, predictor) -> Callable[[], list[Answer]]:
        call = self.call
        return lambda: predictor.classify(
            call.instances, call.top_k, texts=call.texts, explain=call.explain
        )


def _examples(query: SearchQuery) -> int:
    """Positives and negatives of a search (instances or ids)."""
    return len(query.positives or ()) + len(query.negatives or ())


def _not_serving(snapshot: ModelSnapshot, version: str) -> NotFoundError:
    return NotFoundError(
        f"model {snapshot.name!r} serves version {snapshot.version}, not {brief(version)}"
    )


def _timed(work: Callable[[], T]) -> tuple[T, float]:
    """``work()`` and the seconds it took."""
    started = time.perf_counter()
    result = work()
    return result, time.perf_counter() - started
