"""The data plane: between the HTTP routes and the model runtimes.

It owns what serving adds to a model: which model answers (the registry's snapshot), whether the
service is ready, the serving limits and defaults (batch size, top_k, examples), and where the
work runs. The model library (:mod:`service.model`) validates what a request means; the data
plane only enforces what this server allows.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from service.api.batching import Batcher
from service.api.catalogue_plane import CataloguePlane
from service.api.jobs import Jobs
from service.api.machinery.limits import RequestHold, WorkLimiter, concurrency_bound
from service.api.machinery.metrics import Metrics
from service.api.machinery.observability import answered_by
from service.api.placement import EXPLAINED, WorkPlacement
from service.api.registry import ModelRegistry
from service.api.serving_file import BatchingPolicy
from service.api.settings import Settings
from service.api.traffic import Shadow, ShadowRunner
from service.api.versions import ModelSnapshot
from service.model import BatchTooLargeError, InvalidInputError, NotFoundError
from service.model.answers import Answer, ClassifyCall
from service.model.errors import brief, located
from service.model.inputs.words import Vocabulary
from service.model.search import SearchQuery, SearchResult
from service.model.search.filters import AttributeLimits

# Most atoms one search reports with their items (each costs a pass over the catalogue).
MAX_STRONGEST_ATOMS = 100
# Most basis items one explanation names.
MAX_EXPLAIN_ITEMS = 100


class DataPlane(CataloguePlane, WorkPlacement):
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
            answers = await self.run_placed(
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
        self.check_batch(size, "instances")
        self._check_explain(call.explain)
        if call.top_k is None:
            call.top_k = self.default_top_k
        text_chars = 0 if call.texts is None else sum(map(len, call.texts))
        serially = snapshot.predictor.runs_serially(max(size, 1), explain=bool(call.explain))
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
        self.check_batch(_examples(query), "positives and negatives")
        # Learning a code fits small SVMs, and shards held elsewhere are waited for: never on
        # the loop, and no cost estimate to keep.
        parts = None
        if query.positives is None and not index.answers_elsewhere:
            parts = {"search": 1 + query.strongest_atoms, "ids": len(query.exclude)}
        result = await self.run_placed(
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
        self.check_batch(len(queries), "searches")
        for i, query in enumerate(queries):
            with located(f"searches[{i}]"):
                self._check_query(query)
        self.check_batch(sum(map(_examples, queries)), "positives and negatives in all")
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
        results = await self.run_placed(
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
        items = await self.run_placed(snapshot, parts, serially, lambda: index.atom_items(atom, k))
        self.metrics.search_rows(snapshot.name, 1)
        return snapshot, items, index.atom_classes(atom)

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

    def check_batch(self, size: int, what: str) -> None:
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
        if self.call.explain:
            parts[EXPLAINED] = self.instances
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
