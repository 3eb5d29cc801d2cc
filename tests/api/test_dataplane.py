"""The data plane's scheduling: what runs on the event loop, on the compute thread and on the
thread pool, and what the cost estimates learn from."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from service.api import Settings
from service.api.dataplane import DataPlane, Placement
from service.api.registry import ModelRegistry, Repository
from service.model import InvalidInputError
from service.model.search import SearchQuery


def _plane(model_dir, budget_ms: float = 0.5) -> tuple[ModelRegistry, DataPlane]:
    registry = ModelRegistry(Repository(model_dir, single=True))
    settings = Settings(_env_file=None, model_dir=model_dir, inline_budget_ms=budget_ms)
    return registry, DataPlane(registry, settings)


def _compute_threads() -> int:
    return sum(t.name.startswith("besvm-compute") for t in threading.enumerate())


def test_small_serial_work_goes_inline_once_its_cost_is_known(search_model_dir, digits):
    image = digits.X_test[0].reshape(8, 8).tolist()

    # A budget far above one digit's cost (about 0.02 ms), so that a loaded machine cannot
    # push the measured cost past it: what is tested is the placement, not the speed.
    budget_s = 50e-3

    async def scenario():
        registry, plane = _plane(search_model_dir, budget_ms=1e3 * budget_s)
        await registry.sync()
        snapshot = plane.snapshot(None)
        predictor = snapshot.predictor
        # Unknown cost: off the loop, onto the pool (the work is serial).
        assert predictor.runs_serially(1)
        assert plane.placement(snapshot, "classify", 1, True) is Placement.THREAD_POOL
        _, answers = await plane.classify(None, [image], None, 3)
        assert answers[0].label == str(digits.y_test[0])
        per_instance = plane.estimate(snapshot, "classify")
        assert 0 < per_instance < budget_s
        assert plane.placement(snapshot, "classify", 1, True) is Placement.INLINE
        # A batch whose estimate passes the budget leaves the loop, serial or not.
        too_many = int(budget_s / per_instance) + 1
        assert plane.placement(snapshot, "classify", too_many, True) is Placement.THREAD_POOL
        # Parallel kernels always run on the one compute thread, never on the loop.
        assert not predictor.runs_serially(200)
        assert plane.placement(snapshot, "classify", 1, False) is Placement.COMPUTE_THREAD
        await plane.classify(None, digits.X_test[:200].reshape(200, 8, 8).tolist(), None, 3)
        assert _compute_threads() == 1
        # Failed requests teach the estimate nothing.
        learned = plane.estimate(snapshot, "classify")
        with pytest.raises(InvalidInputError):
            await plane.classify(None, [[[1.0]]] * 500, None, 3)
        assert plane.estimate(snapshot, "classify") == learned
        # Codes learned from examples are never placed inline, whatever is known.
        query = SearchQuery(positives=["test-0", "test-1"], top_k=3)
        assert not snapshot.search.runs_serially(query)
        plane.observe(snapshot, "search", 1e-9)
        assert plane.placement(snapshot, None, 1, True) is Placement.THREAD_POOL
        # A new snapshot (a reload) learns its own costs.
        await registry.load(snapshot.name, force=True)
        assert plane.snapshot(None) is not snapshot
        assert plane.estimate(plane.snapshot(None), "classify") is None
        plane.close()  # does not wait for the thread: it ends once idle
        deadline = time.monotonic() + 10
        while _compute_threads() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert _compute_threads() == 0

    asyncio.run(scenario())


def test_a_zero_budget_keeps_everything_off_the_loop(digits_model_dir):
    async def scenario():
        registry, plane = _plane(digits_model_dir, budget_ms=0)
        await registry.sync()
        snapshot = plane.snapshot(None)
        plane.observe(snapshot, "classify", 1e-6)
        assert plane.placement(snapshot, "classify", 1, True) is Placement.THREAD_POOL

    asyncio.run(scenario())


def test_one_preempted_request_does_not_send_the_next_ones_off_the_loop(digits_model_dir):
    async def scenario():
        registry, plane = _plane(digits_model_dir, budget_ms=0.5)
        await registry.sync()
        snapshot = plane.snapshot(None)
        plane.observe(snapshot, "classify", 30e-6)
        plane.observe(snapshot, "classify", 5e-3)  # a busy host parked the thread for 5 ms
        assert plane.placement(snapshot, "classify", 1, True) is Placement.INLINE
        # Work that really costs more still leaves the loop after a few requests.
        for _ in range(10):
            plane.observe(snapshot, "classify", 5e-3)
        assert plane.placement(snapshot, "classify", 1, True) is Placement.THREAD_POOL

    asyncio.run(scenario())
