"""Where the data plane's work runs, and what it costs.

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

import enum
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from service.api.machinery.limits import WorkLimiter
from service.api.machinery.metrics import Metrics
from service.api.registry import ModelRegistry
from service.api.versions import ModelSnapshot
from service.model.errors import ArtifactChangedError
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

# A request's work by part, each counted in its own units ("instances", "text_chars",
# "search", "ids", "atom", EXPLAINED); an empty mapping, or None: no estimate, never inline.
Parts = Mapping[str, int]

# The part of the instances whose answers explain their scores: an explanation reads every basis
# item and every measure, where the scores alone read the items in use, so it learns its own cost.
EXPLAINED = "explained_instances"


class Placement(enum.Enum):
    """Where a request's model work runs."""

    INLINE = "inline"
    COMPUTE_THREAD = "compute thread"
    THREAD_POOL = "thread pool"


class WorkPlacement:
    """Where a request's work runs and its cost learned: a part of
    :class:`~service.api.dataplane.DataPlane`, which holds the settings and state read here."""

    registry: ModelRegistry
    work: WorkLimiter
    metrics: Metrics
    inline_budget_s: float
    inline_body_bytes: int
    _costs: weakref.WeakKeyDictionary[ModelSnapshot, dict[str, float]]
    _compute: ThreadPoolExecutor | None
    _decoder: ThreadPoolExecutor | None

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
        thread that wants it is as likely to get it next), and the probes with it
        (docs/operating/limits.md)."""
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

    async def run_placed(
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


def _timed(work: Callable[[], T]) -> tuple[T, float]:
    """``work()`` and the seconds it took."""
    started = time.perf_counter()
    result = work()
    return result, time.perf_counter() - started
