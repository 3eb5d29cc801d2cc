"""The selection's time budget: how much it may spend, counted so that other processes' load
does not cut it.

By default the budget grows with the items cross-validated (:func:`budget_for`), and the basis
ladder's with the whole split, at a rate of the input's kind (:func:`ladder_budget_for`); each
counts the fits' CPU time per core they use, with a wall-clock backstop
(:class:`SelectionBudget`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

# The selection's time budget grows with the items it cross-validates: digits (1,000 training
# images) gets 40 s, a sample of 3,000 items 120 s (docs/how-it-works/model-selection.md;
# docs/measurements/model-selection.md has what such budgets reach).
BUDGET_S_PER_1000_ITEMS = 40.0

# The budget counts the fold fits' CPU time per core the selection uses, which other processes'
# load does not change (on a loaded machine a fold fit takes many times its CPU time in wall
# time, and a wall-clock budget would score a fraction of the selection,
# docs/measurements/model-selection.md); past this many times the budget in wall time the
# selection stops all the same.
WALL_BACKSTOP = 10.0


# The basis ladder fits its rungs on the whole training split, so its budget grows with the
# split, where the selection's grows with the items it cross-validates (a sample of at most
# 3,000): at 100,000 items a budget of the selection's 120 s stopped the ladder after its first
# rung, before its hold-out decided anything (docs/measurements/model-selection.md, "The ladder's
# budget grows with the split").
LADDER_BUDGET_S_PER_1000_ITEMS = 3.0

# A rung on documents costs many times a dense one per item: on fortunes (11,018 training quotes)
# the first rung, 551 a class of the ladder's 8,814 fit items, took 189 CPU seconds, 21 s per
# 1,000 items fitted, against about 1 s on the synthetic set at 100,000 items. The dense rate
# (120 s there, the selection's floor) let it fit that rung alone, and the budget, not the
# hold-out, ended the climb short of every quote. At this rate the ladder holds two such rungs
# (about 441 s at 11,018 quotes), and the hold-out decides
# (docs/measurements/model-selection.md, "The ladder's budget for documents (30 November)").
DOCUMENT_LADDER_BUDGET_S_PER_1000_ITEMS = 40.0


def fit_cpu_clock(threads: int) -> Callable[[], float]:
    """The CPU clock a fit on ``threads`` numba threads is counted by.

    On one thread the fit runs on the calling thread: the similarities' drivers stay serial
    there (:meth:`service.model.similarity.BoundSimilarity.driver_for`; under numba's
    ``workqueue`` layer a parallel region would run on the pool's thread), and BLAS and a bag
    of visual words' k-means (OpenMP), held to the estimator's ``n_jobs``, run on their caller.
    Its thread's clock then counts it alone: another thread of the same process computing
    meanwhile (a Dask worker's other tasks, each a fit of its own, or
    whatever else the calling process runs) is not counted, where the process's clock counted
    every thread. On more threads the process's clock counts the fit's numba threads, which
    the calling thread's does not see.

    Parameters
    ----------
    threads : int
        The fit's numba threads.

    Returns
    -------
    callable
        ``time.thread_time`` for one thread, else ``time.process_time``.
    """
    return time.thread_time if threads == 1 else time.process_time


def budget_for(n_items: int) -> float:
    """The default time budget in seconds of a selection that cross-validates ``n_items`` items:
    :data:`BUDGET_S_PER_1000_ITEMS` per 1,000, at least that much."""
    return BUDGET_S_PER_1000_ITEMS * max(1.0, n_items / 1000)


def ladder_budget_for(
    n_split_items: int,
    selection_budget_s: float,
    s_per_1000_items: float = LADDER_BUDGET_S_PER_1000_ITEMS,
) -> float:
    """The default time budget in seconds of the basis ladder on a split of ``n_split_items``
    items after a selection whose budget was ``selection_budget_s``: ``s_per_1000_items`` per
    1,000 items of the split (the kind's rate: :data:`LADDER_BUDGET_S_PER_1000_ITEMS` for dense
    inputs, 120 s up to 40,000 items and 300 s at 100,000;
    :data:`DOCUMENT_LADDER_BUDGET_S_PER_1000_ITEMS` for documents), at least the selection's."""
    return max(float(selection_budget_s), s_per_1000_items * n_split_items / 1000)


class SelectionBudget:
    """A selection's budget: ``seconds`` of its fold fits' CPU time per core it uses (what an idle
    machine spends in about as many seconds of wall time), so that other processes' load does
    not cut the selection; and :data:`WALL_BACKSTOP` times ``seconds`` of wall time at most.

    Parameters
    ----------
    seconds : float
    cores : int
        The cores the fold fits run on at once (processes or cluster threads x each fit's
        threads).
    """

    def __init__(self, seconds: float, cores: int) -> None:
        self.seconds = float(seconds)
        self.cores = max(1, int(cores))
        self.started = time.monotonic()
        self.cpu_seconds = 0.0

    def add(self, cpu_seconds: float) -> None:
        self.cpu_seconds += cpu_seconds

    @property
    def used_s(self) -> float:
        """CPU seconds of the fits so far, per core."""
        return self.cpu_seconds / self.cores

    @property
    def left_s(self) -> float:
        """CPU seconds per core the fits may still spend (negative once overrun)."""
        return self.seconds - self.used_s

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def spent(self) -> bool:
        return self.used_s >= self.seconds or self.wall_s >= WALL_BACKSTOP * self.seconds

    def describe(self) -> str:
        """Why the selection stopped, when the budget stopped it."""
        if self.used_s >= self.seconds:
            return f"budget of {self.seconds:g} s spent"
        return (
            f"budget of {self.seconds:g} s cut by the wall clock ({self.wall_s:.0f} s, "
            f"{WALL_BACKSTOP:g} times the budget; {self.used_s:.1f} s of CPU a core)"
        )
