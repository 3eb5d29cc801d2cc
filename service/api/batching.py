"""Dynamic batching: classification requests for one model version that wait together are
computed as one batch (Triton's ``dynamic_batching``, MLServer's adaptive batching).

A model's similarities and scores are matrix products, so a batch of n instances costs far less
than n requests of one (a matrix-matrix product instead of n matrix-vector ones): a heavy model
answers several times the requests a second under load.

**Only what already waits is batched.** A request for a model with nothing computing runs at
once, alone: it is never held back for company. Requests that arrive while batches compute
(as many at once as the model's work allows: one when its work runs parallel kernels, one per
CPU when it runs on one thread) gather in a queue, and when a batch ends the next one takes the
queue, oldest first, up to ``max_instances`` instances. ``max_delay_s`` lets a batch that has
gathered fewer wait for more, counted from its oldest request's arrival; at 0 (the default) it
never waits. A request of more instances than ``max_instances`` is computed alone, unbatched.

**Per request, as before**: every request holds its own slot of the data plane's work limit
from its arrival (``MAX_CONCURRENT_REQUESTS``: a full queue answers 503 at once), waits at most
``REQUEST_TIMEOUT_S`` from its arrival, queue included (504), is validated on its own before it
joins the batch (a bad instance fails its own request only), and gets its own answers (equal to
those it gets alone, within the kernels' rounding). A batch runs where the data plane places
work of its size (:meth:`~service.api.dataplane.DataPlane.placement`): on the event loop when
it is small, on the compute thread for parallel kernels, else on the thread pool.

The settings are ``DYNAMIC_BATCH_MAX_INSTANCES`` and ``DYNAMIC_BATCH_MAX_DELAY_MS``; a model's
``serving.json`` (beside its manifest) may set its own, which changes with the file.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass
from typing import Any

from service.api.placement import EXPLAINED, WorkPlacement
from service.api.serving_file import BatchingPolicy
from service.api.versions import ModelSnapshot
from service.model import ModelNotReadyError
from service.model.answers import Answer, ClassifyCall
from service.model.errors import ArtifactChangedError
from service.model.threads import available_cpus


@dataclass(slots=True, eq=False)
class Waiting:
    """One request in a batcher: what it asks, its size, its future and its arrival."""

    call: ClassifyCall
    instances: int
    text_chars: int
    future: asyncio.Future
    arrived: float


class Batcher:
    """The batches of one model version (see the module docstring).

    Parameters
    ----------
    plane : WorkPlacement
        Its work limit, placement, executors and cost estimates; told of each batch's time.
    snapshot : ModelSnapshot
    policy : BatchingPolicy
    """

    def __init__(
        self, plane: WorkPlacement, snapshot: ModelSnapshot, policy: BatchingPolicy
    ) -> None:
        self.plane = plane
        self.snapshot = snapshot
        self.policy = policy
        # Batches at once: one where a single instance already runs parallel kernels (the one
        # compute thread), else one per CPU (each batch on one thread of the pool).
        self.capacity = available_cpus() if snapshot.predictor.runs_serially(1) else 1
        self.running = 0
        self.queue: collections.deque[Waiting] = collections.deque()
        self.queued_instances = 0
        self._timer: asyncio.TimerHandle | None = None

    async def classify(self, call: ClassifyCall, instances: int, text_chars: int) -> list[Answer]:
        """``call``'s answers, computed with what waits beside it.

        Raises
        ------
        OverloadedError
            No slot of the work limit is free.
        WorkTimeoutError
            Not answered within REQUEST_TIMEOUT_S of its arrival.
        InvalidInputError
            The request is malformed (its own, never another's).
        """
        work = self.plane.work
        work.admit()
        future = asyncio.get_running_loop().create_future()
        waiting = Waiting(call, instances, text_chars, future, time.perf_counter())
        future.add_done_callback(
            lambda done: self._abandoned(waiting) if done.cancelled() else None
        )
        if self.running < self.capacity and not self.queue:
            self._start([waiting])
        else:
            self.queue.append(waiting)
            self.queued_instances += instances
            if self.queued_instances >= self.policy.max_instances:
                self._start_next()
        return await work.wait(future)

    def _start_next(self) -> None:
        """Start batches from the queue while the model has room for them (and, with a delay,
        once the batch is full or its oldest request has waited it out)."""
        while self.running < self.capacity and self.queue:
            self._drop_abandoned()
            if not self.queue:
                return
            delay = self.policy.max_delay_s
            if delay > 0 and self.queued_instances < self.policy.max_instances:
                due = self.queue[0].arrived + delay
                if time.perf_counter() < due:
                    if self._timer is None:
                        loop = asyncio.get_running_loop()
                        self._timer = loop.call_at(
                            loop.time() + due - time.perf_counter(), self._timed_out
                        )
                    return
            batch = [self.queue.popleft()]
            size = batch[0].instances
            while self.queue and size + self.queue[0].instances <= self.policy.max_instances:
                size += self.queue[0].instances
                batch.append(self.queue.popleft())
            self.queued_instances -= size
            batch = self._live(batch)
            if batch:
                self._start(batch)

    def _timed_out(self) -> None:
        self._timer = None
        self._start_next()

    def _abandoned(self, waiting: Waiting) -> None:
        """A request that stopped waiting (timed out, cancelled) while queued leaves the queue
        and gives back its slot; one whose batch computes keeps it until the batch ends."""
        try:
            self.queue.remove(waiting)
        except ValueError:
            return
        self.queued_instances -= waiting.instances
        self.plane.work.release()

    def _drop_abandoned(self) -> None:
        """Requests at the head of the queue that stopped waiting (timed out, cancelled) give
        back their slots."""
        while self.queue and self.queue[0].future.done():
            self.queued_instances -= self.queue.popleft().instances
            self.plane.work.release()

    def _live(self, batch: list[Waiting]) -> list[Waiting]:
        """The requests of ``batch`` still waiting; the others give back their slots."""
        live = [waiting for waiting in batch if not waiting.future.done()]
        if len(live) < len(batch):
            self.plane.work.release(len(batch) - len(live))
        return live

    def _start(self, batch: list[Waiting]) -> None:
        """Compute ``batch`` where the data plane places work of its size."""
        plane, snapshot = self.plane, self.snapshot
        predictor = snapshot.predictor
        self.running += 1
        started = time.perf_counter()
        instances = sum(waiting.instances for waiting in batch)
        parts = {"instances": instances}
        text_chars = sum(waiting.text_chars for waiting in batch)
        if text_chars:
            parts["text_chars"] = text_chars
        explained = sum(waiting.instances for waiting in batch if waiting.call.explain)
        if explained:
            parts[EXPLAINED] = explained
        plane.metrics.batch_computed(
            snapshot.name, instances, len(batch), [started - w.arrived for w in batch]
        )
        calls = [waiting.call for waiting in batch]

        def work() -> tuple[list, float]:
            began = time.perf_counter()
            outcomes = predictor.classify_many(calls)
            return outcomes, time.perf_counter() - began

        serially = predictor.runs_serially(instances, explain=bool(explained))
        place = plane.placement(snapshot, parts, serially)
        if place is place.INLINE:
            try:
                outcome: Any = work()
            except Exception as error:
                outcome = error
            finally:
                plane.work.release(len(batch))
            self._finish(batch, parts, outcome)
            return
        try:
            future = plane.work.submit(plane.executor(place), work, slots=len(batch))
        except Exception as error:  # the executor is shut down: the server is stopping
            self._finish(batch, parts, error)
            return
        asyncio.wrap_future(future).add_done_callback(
            lambda done: self._finish(batch, parts, _outcome(done))
        )

    def _finish(self, batch: list[Waiting], parts: dict[str, int], outcome: Any) -> None:
        """Answer every request of a computed batch, and start the next."""
        self.running -= 1
        if isinstance(outcome, BaseException):
            if isinstance(outcome, ArtifactChangedError):
                self.plane.registry.recheck(self.snapshot.name)
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(outcome)
        else:
            outcomes, seconds = outcome
            if not all(isinstance(answer, BaseException) for answer in outcomes):
                self.plane.observe(self.snapshot, parts, seconds)
            for waiting, answer in zip(batch, outcomes, strict=True):
                if waiting.future.done():
                    continue
                if isinstance(answer, BaseException):
                    waiting.future.set_exception(answer)
                else:
                    waiting.future.set_result(answer)
        self._start_next()


def _outcome(done: asyncio.Future) -> Any:
    """A finished future's result, or its exception (cancelled: CancelledError)."""
    if done.cancelled():
        return ModelNotReadyError("the server is stopping: the batch was dropped")
    return done.exception() or done.result()
