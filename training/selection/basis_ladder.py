"""The basis path on the full training split: after a selection on a sample, the chosen
configuration's basis grows along a ladder of sizes, each validated on items held out of the whole
split (:func:`climb_basis_ladder`), instead of growing by a fixed share.

The folds of a selection on a sample hold at most 2,000 items, so the basis size they choose is
the best for 2,000 items, not for the split. The ladder starts at that size and doubles it, each
rung fitted on the split less a stratified hold-out (:data:`HOLDOUT_SHARE`) and scored on the
hold-out; a rung is taken only when its gain over the rung before exceeds ``min_gain_se``
standard errors of the paired difference (the selection's own rule, :func:`paired_gain`) over
the last rung taken. It stops when a rung's gain is within its standard error and held-out
accuracy falls (or :data:`MAX_UNTAKEN_RUNGS` rungs in a row gain within their error), at every
item of the largest class, at the memory budget (:mod:`training.selection.memory`), or when its
time budget is spent. Every rung fitted is in the path, for the training record.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split

from training.selection.budget import SelectionBudget
from training.selection.folds import FOLD_MAX_ITER, paired_gain
from training.selection.memory import basis_per_class_within, default_memory_budget

# The share of the training split held out to score each rung (stratified), at most
# MAX_HOLDOUT_ITEMS: 2,000 held-out items give a paired standard error of about 0.3 points.
HOLDOUT_SHARE = 0.2

MAX_HOLDOUT_ITEMS = 10_000

# Each rung has this many times the basis of the rung before.
RUNG_FACTOR = 2

# The ladder climbs past a rung whose gain over the last rung taken is within its standard error
# while held-out accuracy still rises, for at most this many rungs in a row: one doubling's gain
# is often within the error of a hold-out of a few thousand items where two doublings' is not.
MAX_UNTAKEN_RUNGS = 2


def ladder_sizes(start: int, top: int, factor: int = RUNG_FACTOR) -> list[int]:
    """Basis sizes per class from ``start``, each ``factor`` times the one before, the last
    ``top`` (``start`` alone when it is at least ``top``)."""
    sizes = [max(1, start)]
    while sizes[-1] < top:
        sizes.append(min(top, sizes[-1] * factor))
    return sizes


@dataclass
class LadderResult:
    """What the ladder chose and the path it took (plain data for the record)."""

    basis_per_class: int  # for the whole split
    every_item: bool  # the rung taken holds every item of the largest class
    path: list[dict[str, Any]] = field(default_factory=list)
    stopped: str = ""
    holdout_items: int = 0
    fit_items: int = 0
    memory_bound_per_class: int = 0
    seconds: float = 0.0

    def record(self) -> dict[str, Any]:
        return {
            "method": f"basis doubled on the training split less a stratified "
            f"{HOLDOUT_SHARE:.0%} hold-out, a rung taken on a gain above min_gain_se standard "
            "errors of the paired difference on the hold-out",
            "fit_items": self.fit_items,
            "holdout_items": self.holdout_items,
            "memory_bound_per_class": self.memory_bound_per_class,
            "chosen_basis_per_class": self.basis_per_class,
            "stopped": self.stopped,
            "seconds": round(self.seconds, 2),
            "path": self.path,
        }


def _hold_out(y: np.ndarray, random_state: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions to fit on and to hold out: a stratified :data:`HOLDOUT_SHARE` of the items
    (at most :data:`MAX_HOLDOUT_ITEMS`), a class of a single item always in the fit part."""
    _, codes, counts = np.unique(y, return_inverse=True, return_counts=True)
    single = counts[codes] < 2
    splittable = np.flatnonzero(~single)
    n_split_classes = int(np.sum(counts >= 2))
    holdout = min(MAX_HOLDOUT_ITEMS, max(n_split_classes, round(HOLDOUT_SHARE * len(y))))
    fit, held = train_test_split(
        splittable, test_size=holdout, stratify=y[splittable], random_state=random_state
    )
    return np.concatenate([fit, np.flatnonzero(single)]), held


def climb_basis_ladder(
    estimator,
    params: dict[str, Any],
    X,
    y,
    *,
    start: int,
    weight: float,
    min_gain_se: float,
    budget: SelectionBudget,
    random_state: int = 0,
    memory_budget: int | None = None,
) -> LadderResult:
    """Grow the basis of ``params`` on (X, y) along :func:`ladder_sizes` from ``start``.

    Parameters
    ----------
    estimator : BasisExpandingSVC
        Cloned for every rung, with ``params`` and the rung's ``basis_per_class`` set.
    params : dict
        The selected parameters.
    X : ndarray of shape (n_samples, ...)
        The whole training split, dense.
    y : ndarray of shape (n_samples,)
    start : int
        The first rung's basis per class (the size the folds chose).
    weight : float
        The measures' work per basis item (:func:`~training.selection.space.basis_weight`).
    min_gain_se : float
        A rung is taken when its gain exceeds this many standard errors of the paired
        difference on the hold-out.
    budget : SelectionBudget
        The rungs' CPU seconds per core are added to it; no rung starts once it is spent, nor
        one that would spend it at twice the cost of the rung before.
    random_state : int, default=0
        Seed of the hold-out.
    memory_budget : int or None
        Bytes the training features may take, which bound the top rung
        (:mod:`training.selection.memory`; None: its default now).

    Returns
    -------
    LadderResult
        ``basis_per_class`` is the last rung taken, or the split's largest class when that
        rung held every item of the fit part's largest class.
    """
    started = time.monotonic()
    X = np.asarray(X)
    y = np.asarray(y)
    fit_positions, held_positions = _hold_out(y, random_state)
    n_classes = len(np.unique(y))
    y_fit, y_held = y[fit_positions], y[held_positions]
    fit_largest = int(np.unique(y_fit, return_counts=True)[1].max())
    split_largest = int(np.unique(y, return_counts=True)[1].max())
    budget_bytes = default_memory_budget() if memory_budget is None else memory_budget
    bound = basis_per_class_within(len(y), n_classes, weight, budget_bytes)
    top = min(fit_largest, bound)
    result = LadderResult(
        basis_per_class=min(start, bound),
        every_item=False,
        holdout_items=len(held_positions),
        fit_items=len(fit_positions),
        memory_bound_per_class=bound,
    )
    taken: np.ndarray | None = None  # the correctness of the last rung taken
    previous_accuracy = -1.0
    untaken = 0
    last_cost = 0.0
    sizes = ladder_sizes(min(start, top), top)
    for size in sizes:
        if budget.spent or (taken is not None and budget.used_s + 2 * last_cost > budget.seconds):
            result.stopped = "time budget spent"
            break
        cpu, wall = time.process_time(), time.monotonic()
        model = clone(estimator).set_params(**{**params, "basis_per_class": size})
        # A rung is a validation fit, as a fold fit is: an ill-conditioned basis (nystroem's at
        # a large size) can keep the solver for thousands of iterations, scored as it stands
        # after FOLD_MAX_ITER (the final fit keeps the estimator's max_iter).
        model.set_params(max_iter=min(model.max_iter, FOLD_MAX_ITER))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model.fit(X[fit_positions], y_fit)
        correct = (model.predict(X[held_positions]) == y_held)[np.newaxis, :]
        cpu = time.process_time() - cpu
        budget.add(cpu)
        last_cost = cpu / budget.cores
        gain, error = (0.0, 0.0) if taken is None else paired_gain(correct, taken)
        take = taken is None or (gain > 0 and gain > min_gain_se * error)
        accuracy = float(correct.mean())
        result.path.append(
            {
                "basis_per_class": size,
                "n_basis": int(model.expansion_.basis_.shape[0]),
                "held_out_accuracy": accuracy,
                "gain": gain,
                "standard_error": error,
                "taken": take,
                "seconds": round(time.monotonic() - wall, 2),
            }
        )
        rising = accuracy > previous_accuracy
        previous_accuracy = accuracy
        if take:
            taken, untaken = correct, 0
            result.basis_per_class = size
            result.every_item = size >= fit_largest
            continue
        untaken += 1
        if not rising or untaken >= MAX_UNTAKEN_RUNGS:
            result.stopped = "gain below min_gain_se standard errors, " + (
                "no longer rising" if not rising else f"{untaken} rungs in a row"
            )
            break
    else:
        if sizes[-1] >= fit_largest:
            result.stopped = "every item of the largest class"
        else:
            result.stopped = "memory bound"
    if result.every_item:
        result.basis_per_class = min(split_largest, bound)
    result.seconds = time.monotonic() - started
    return result
