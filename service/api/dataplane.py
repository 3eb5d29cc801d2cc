"""The data plane: between the HTTP routes and the model runtimes.

It owns what serving adds to a model: which model answers (the registry's snapshot), whether it
is ready, the serving limits and defaults (batch size, top_k, examples), and where the work runs.
The model library (:mod:`service.model`) validates what a request means; the data plane only
enforces what this server allows.

**Where work runs.** A request whose model time is estimated below ``INLINE_BUDGET_MS`` runs on
the event loop: a thread-pool hop costs more than a one-digit prediction (tens of microseconds),
and an answer computed inline needs no context switch. Anything longer runs on a worker thread,
so that no request holds the loop for long: large batches, searches of large catalogues, codes
learned from examples (always). The estimate is the cost per item measured on this snapshot's
own earlier requests; the first request of each kind runs on a thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from service.api.registry import ModelRegistry, ModelSnapshot
from service.api.settings import Settings
from service.model import BatchTooLargeError, InvalidInputError, NotFoundError
from service.model.predictor import Answer
from service.model.search import SearchQuery, SearchResult

T = TypeVar("T")

# Weight of the newest measurement in a snapshot's running cost estimate.
_COST_SMOOTHING = 0.2


class DataPlane:
    """Model lookup, readiness, limits, defaults and scheduling for the routes.

    Parameters
    ----------
    registry : ModelRegistry
    settings : Settings
    """

    def __init__(self, registry: ModelRegistry, settings: Settings) -> None:
        self.registry = registry
        self.max_batch_size = settings.max_batch_size
        self.default_top_k = settings.default_top_k
        self.default_search_top_k = settings.default_search_top_k
        self.max_search_top_k = settings.max_search_top_k
        self.inline_budget_s = settings.inline_budget_ms / 1000.0

    def snapshot(self, name: str | None) -> ModelSnapshot:
        return self.registry.snapshot(name)

    async def classify(
        self,
        name: str | None,
        instances: Sequence[Any] | None,
        texts: Sequence[str] | None,
        top_k: int | None,
    ) -> tuple[ModelSnapshot, list[Answer]]:
        """Classify a batch with model ``name`` (None: the default model)."""
        snapshot = self.registry.snapshot(name)
        batch = instances if instances is not None else texts
        size = 0 if batch is None else len(batch)
        self._check_batch(size, "instances")
        predictor, k = snapshot.predictor, top_k or self.default_top_k
        answers = await self._run(
            snapshot,
            "classify",
            max(size, 1),
            lambda: predictor.classify(instances, k, texts=texts),
        )
        return snapshot, answers

    async def search(
        self, name: str | None, query: dict[str, Any]
    ) -> tuple[ModelSnapshot, SearchResult]:
        """Answer a search with model ``name``; ``query`` holds :class:`SearchQuery`'s fields,
        ``top_k`` None for the default."""
        snapshot = self.registry.snapshot(name)
        index = snapshot.require_search()
        top_k = query.get("top_k") or self.default_search_top_k
        self._check_top_k(top_k)
        examples = len(query.get("positives") or ()) + len(query.get("negatives") or ())
        self._check_batch(examples, "positives and negatives")
        search_query = SearchQuery(**{**query, "top_k": top_k})
        # Learning a code fits a few small SVMs: never on the loop.
        kind = "search" if search_query.positives is None else None
        result = await self._run(snapshot, kind, 1, lambda: index.run(search_query))
        return snapshot, result

    async def atom(
        self, name: str, atom: int, top_k: int | None
    ) -> tuple[ModelSnapshot, list[tuple[str, float]], list[tuple[str, float]]]:
        """The items one atom of model ``name`` ranks highest, and the classes using it."""
        snapshot = self.registry.snapshot(name)
        index = snapshot.require_search()
        k = top_k or self.default_search_top_k
        self._check_top_k(k)
        items = await self._run(snapshot, "search", 1, lambda: index.atom_items(atom, k))
        return snapshot, items, index.atom_classes(atom)

    def vocabulary(self, name: str):
        snapshot = self.registry.snapshot(name)
        vocabulary = snapshot.predictor.vocabulary
        if vocabulary is None:
            raise NotFoundError(f"model {name!r} reads no text: it has no vocabulary")
        return snapshot, vocabulary

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

    async def _run(
        self, snapshot: ModelSnapshot, kind: str | None, units: int, work: Callable[[], T]
    ) -> T:
        """Run ``work`` inline or on a thread (see the module's docstring), and learn its cost.

        ``kind`` names the cost estimate to use and update (None: always on a thread).
        """
        costs = snapshot.costs
        per_unit = costs.get(kind) if kind is not None else None
        if per_unit is not None and per_unit * units <= self.inline_budget_s:
            started = time.perf_counter()
            result = work()
            _observe(costs, kind, (time.perf_counter() - started) / units)
            return result
        timed: list[float] = []

        def timed_work() -> T:
            started = time.perf_counter()
            try:
                return work()
            finally:
                timed.append(time.perf_counter() - started)

        try:
            return await run_in_threadpool(timed_work)
        finally:
            if kind is not None and timed:
                _observe(costs, kind, timed[0] / units)


def _observe(costs: dict[str, float], kind: str, seconds_per_unit: float) -> None:
    previous = costs.get(kind)
    costs[kind] = (
        seconds_per_unit
        if previous is None
        else (1 - _COST_SMOOTHING) * previous + _COST_SMOOTHING * seconds_per_unit
    )
