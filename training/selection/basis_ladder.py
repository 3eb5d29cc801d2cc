"""The basis path on the full training split: after a selection on a sample, the chosen
configuration's basis grows along a ladder of sizes, each validated on items held out of the whole
split (:func:`climb_basis_ladder`), instead of growing by a fixed share: for dense inputs and for
documents alike.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from training.estimator.estimator import SOLVER_PARAMETERS
from training.selection.budget import SelectionBudget
from training.selection.folds import RACE_Z, paired_gain
from training.selection.holdout import HOLDOUT_SHARE, HoldOut, Scored
from training.selection.memory import (
    basis_items,
    basis_per_class_within,
    default_memory_budget,
)
from training.selection.space import Candidate, held_square_matrices, neighbour_candidates
from training.selection.state import DEFAULT_PREFERENCE, take

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


def scaled_fit_cost(cost: float, per_class: int, to_per_class: int, class_counts) -> float:
    """A fit's cost at a basis of ``to_per_class`` a class, from its ``cost`` at ``per_class``:
    it grows about as the features, n x B, with B the basis's real items
    (:func:`~training.selection.memory.basis_items`), so a rung capped at the largest class, or
    one past the small classes, costs less than the sizes' ratio.

    Parameters
    ----------
    cost : float
        The fit's cost at ``per_class`` (CPU seconds per core).
    per_class : int
        Its basis per class.
    to_per_class : int
        The basis per class whose cost is wanted.
    class_counts : array-like of int, shape (n_classes,)
        Items of each class of the items fitted.
        (``per_class`` at least 1, so that its basis holds an item.)

    Returns
    -------
    float
        The cost at ``to_per_class``, in the unit of ``cost``.
    """
    return cost * basis_items(to_per_class, class_counts) / basis_items(per_class, class_counts)


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
    budget_s: float = 0.0
    budget_used_s: float = 0.0  # what the budget counts: the rungs' CPU seconds per core
    seconds: float = 0.0  # wall time, the large-basis search's included
    # the large-basis search after the ladder: the configuration it chose (None: the ladder's),
    # every candidate it scored, and why it ended
    params: dict[str, Any] | None = None
    large_basis: list[dict[str, Any]] = field(default_factory=list)
    large_basis_stopped: str = ""
    large_basis_budget_s: float = 0.0  # its own budget, and what it counted of it
    large_basis_budget_used_s: float = 0.0
    confirmation: dict[str, Any] | None = None  # a gain within the noise, tested on every item
    # the configuration taken, at smaller bases: halved while as accurate on the hold-out
    shrink: list[dict[str, Any]] = field(default_factory=list)
    shrink_stopped: str = ""

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
            "budget_s": self.budget_s,
            "budget_used_s": round(self.budget_used_s, 2),
            "seconds": round(self.seconds, 2),
            "path": self.path,
            **(
                {
                    "large_basis": {
                        "chosen": self.params,
                        "stopped": self.large_basis_stopped,
                        "budget_s": self.large_basis_budget_s,
                        "budget_used_s": round(self.large_basis_budget_used_s, 2),
                        "candidates": self.large_basis,
                        "confirmation": self.confirmation,
                        "shrink": self.shrink,
                        "shrink_stopped": self.shrink_stopped,
                    }
                }
                if self.large_basis_stopped
                else {}
            ),
        }


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
    large_basis: Callable[[int], list[Candidate]] | None = None,
    large_basis_budget: SelectionBudget | None = None,
    work: Callable[[dict[str, Any]], float] | None = None,
    prefer: str = DEFAULT_PREFERENCE,
    search_at_the_rung: bool = False,
) -> LadderResult:
    """Grow the basis of ``params`` on (X, y) along :func:`ladder_sizes` from ``start``; then,
    given ``large_basis``, search the configurations it offers at the top of the ladder.

    Parameters
    ----------
    estimator : BasisExpandingSVC
        Cloned for every rung, with ``params`` and the rung's ``basis_per_class`` set.
    params : dict
        The selected parameters.
    X : ndarray of shape (n_samples, ...)
        The whole training split: dense rows, or documents as a 1-d object array of str (a
        list of texts would become a fixed-width string array).
    y : ndarray of shape (n_samples,)
    start : int
        The first rung's basis per class (the size the folds chose).
    weight : float
        The measures' work per basis item (:func:`~training.selection.space.basis_weight`).
    min_gain_se : float
        A rung is taken when its gain exceeds this many standard errors of the paired
        difference on the hold-out over the last rung taken; within them, as ``prefer`` says.
    budget : SelectionBudget
        The rungs' CPU seconds per core are added to it; no rung starts once it is spent, nor
        one that would spend it at the cost of the rung before scaled by its basis
        (:func:`scaled_fit_cost`).
    random_state : int, default=0
        Seed of the hold-out.
    memory_budget : int or None
        Bytes the training features may take (:mod:`training.selection.memory`; None: the
        default, a share of the memory available now): it bounds the top rung, with the square
        matrices of ``params``' normalisation
        (:func:`~training.selection.space.held_square_matrices`).
    large_basis : callable or None
        Given a basis size per class, the candidate configurations of the large-basis search
        (:func:`~training.selection.space.large_basis_candidates`): each is scored on the
        hold-out at the ladder's top (every item of the fit part's largest class, or the
        memory bound; halved while one fit would not fit ``large_basis_budget`` at the cost of
        the last rung, scaled by its basis; with ``search_at_the_rung``, at least the rung taken,
        if one fit there fits the budget), the best taken by the selection's rule
        (:func:`~training.selection.state.take`) over the last rung taken, then its width and
        C refined (:func:`~training.selection.space.neighbour_candidates`).
    large_basis_budget : SelectionBudget or None
        The large-basis search's time budget (required with ``large_basis``).
    work : callable or None
        A configuration's prediction work, for the rule's ties (None: all equal).
    prefer : {"accuracy", "cost"}
        What wins within the noise, on the rungs and in the large-basis search
        (:data:`~training.selection.state.PREFERENCES`; the rule,
        :func:`~training.selection.state.take`): a rung, never cheaper to predict than the one
        before, is taken within the noise only under "accuracy", when it scores better.
    search_at_the_rung : bool, default=False
        Search ``large_basis`` at the ladder's top even when that is the rung taken
        (:attr:`~training.selection.space.KindRules.search_at_the_rung`: documents, whose
        candidates are the other measures, not a larger basis).

    Returns
    -------
    LadderResult
        ``basis_per_class`` is the last rung taken, or the split's largest class when that
        rung held every item of the fit part's largest class; ``params``, the configuration
        the large-basis search chose, or None.
    """
    started = time.monotonic()
    work = work or (lambda _: 0.0)  # no work given: every configuration costs the same
    X = np.asarray(X)
    y = np.asarray(y)
    holdout = HoldOut(X, y, random_state)
    fit_largest = holdout.fit_largest
    class_counts = np.unique(y, return_counts=True)[1]
    split_largest = int(class_counts.max())
    budget_bytes = default_memory_budget() if memory_budget is None else memory_budget
    # The large-basis search's candidates (besvm for dense inputs) hold no more square matrices
    # than the ladder's configuration (nystroem's, or besvm's for documents): its bound holds.
    bound = basis_per_class_within(class_counts, weight, budget_bytes, held_square_matrices(params))
    top = min(fit_largest, bound)
    result = LadderResult(
        basis_per_class=min(start, bound),
        every_item=False,
        holdout_items=len(holdout.held),
        fit_items=len(holdout.fit),
        memory_bound_per_class=bound,
        budget_s=budget.seconds,
    )
    taken: np.ndarray | None = None  # the correctness of the last rung taken
    previous_accuracy = -1.0
    untaken = 0
    last_cost, last_size = 0.0, 1
    sizes = ladder_sizes(min(start, top), top)

    def rung_work(per_class: int) -> float:
        return work({**params, "basis_per_class": per_class})

    def cost_at(per_class: int) -> float:
        # from the last rung fitted: last_cost and last_size as they stand when it is called
        return scaled_fit_cost(last_cost, last_size, per_class, holdout.fit_counts)

    for size in sizes:
        # the first rung has no fit to go by, and is fitted whatever it costs
        predicted = None if taken is None else cost_at(size)
        if budget.spent or (predicted is not None and budget.used_s + predicted > budget.seconds):
            result.stopped = "time budget spent"
            break
        scored = holdout.score(
            estimator, {**params, "basis_per_class": size}, budget, bounded=taken is not None
        )
        if scored.truncated:
            gain_error = paired_gain(scored.correct, taken)
            result.path.append(_entry(scored, *gain_error, False, size, predicted))
            result.stopped = "time budget spent"
            break
        correct, last_cost = scored.correct, scored.cost
        last_size = size
        gain, error = (0.0, 0.0) if taken is None else paired_gain(correct, taken)
        # the search's own rule: a larger basis is never cheaper to predict, so within the
        # noise it is taken only where ``prefer`` is "accuracy" and it scores better
        take_rung = taken is None or (
            take(
                taken,
                rung_work(result.basis_per_class),
                [(correct, rung_work(size))],
                min_gain_se,
                prefer,
            )
            is not None
        )
        accuracy = float(correct.mean())
        result.path.append(_entry(scored, gain, error, take_rung, size, predicted))
        rising = accuracy > previous_accuracy
        previous_accuracy = accuracy
        if take_rung:
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
    if large_basis is not None and taken is not None:
        if large_basis_budget is None:
            raise ValueError("a large-basis search needs its own large_basis_budget")
        result.large_basis_budget_s = large_basis_budget.seconds
        size = top
        while size > result.basis_per_class and cost_at(size) > large_basis_budget.seconds:
            size //= 2
        rung = result.basis_per_class
        if size <= rung and not search_at_the_rung:
            result.large_basis_stopped = "no larger basis fits its time budget"
        elif size <= rung and cost_at(rung) > large_basis_budget.seconds:
            result.large_basis_stopped = "no basis fits its time budget"
        else:
            size = max(size, rung)  # at the rung: the candidates differ in more than the size
            rule = {
                "budget": large_basis_budget,
                "min_gain_se": min_gain_se,
                "work": work,
                "prefer": prefer,
            }
            correct, cost = _search_large_basis(
                holdout,
                estimator,
                {**params, "basis_per_class": rung},
                taken,
                large_basis(size),
                result,
                **rule,
            )
            if result.params is not None:
                size = _shrink_large_basis(
                    holdout, estimator, result, correct, cost, floor=rung, **rule
                )
                result.basis_per_class = size
                result.every_item = size >= fit_largest
        result.large_basis_budget_used_s = large_basis_budget.used_s
    if result.every_item:
        result.basis_per_class = min(split_largest, bound)
    result.budget_used_s = budget.used_s
    result.seconds = time.monotonic() - started
    return result


# Rounds of width-and-C refinement after the large-basis search took a configuration.
LARGE_BASIS_REFINEMENTS = 2

# Newton steps of a large-basis candidate's solver at most. One that has not converged by then is
# recorded as unconverged and never taken, and the search goes on. Measured under besvm with
# every training item as the basis (benchmarks/bench_solver_steps.py; docs/measurements/
# model-selection.md, "Stalled candidates"): the fits that converge took 14 to 67 steps on
# spambase's seed 1 and 16 to 105 on phoneme's seed 0 (its best, rbf(gamma=32) at C = 100: 105);
# on spambase rbf(gamma=1) + rbf(gamma=16) at C = 100 took 452 steps (115 CPU seconds of solver,
# where the search's budget is 120 s) and scored below rbf(gamma=1) alone (92.35% against
# 93.57%). A candidate taken must be fitted again on the whole split, where the final fit keeps
# the estimator's max_iter: hundreds of steps there too.
LARGE_BASIS_MAX_ITER = 250

# The share of the large-basis search's budget its first round leaves, from its second fit on,
# for testing a gain within the hold-out's noise on the whole split (_confirm_on_the_split: the
# best candidate and the ladder's choice fitted four more times each).
CONFIRMATION_SHARE = 0.3

# A candidate is confirmed only if its own fits, times this (for the ladder's choice, a smaller
# basis and cheaper), fit in what is left of the budget.
CONFIRMATION_OVERHEAD = 1.5


def _search_large_basis(
    holdout: HoldOut,
    estimator,
    current: dict[str, Any],
    reference: np.ndarray,
    candidates: list[Candidate],
    result: LadderResult,
    *,
    budget: SelectionBudget,
    min_gain_se: float,
    work: Callable[[dict[str, Any]], float],
    prefer: str,
) -> tuple[np.ndarray, float]:
    """Score ``candidates`` on the hold-out while ``budget`` lasts and take the best by the
    selection's rule over ``current`` (whose correctness is ``reference``); then refine the
    width and C of the one taken. Sets ``result.params`` when a candidate was taken; returns
    the correctness on the hold-out of the configuration kept (``current`` when none was
    taken) and the CPU seconds per core of its fit at the large size, as a fit of its own
    (with the expansion it reused; 0 when none was taken)."""
    # the last fit's cost as a fit of its own, and of its solve on a kept expansion, CPU
    # seconds per core
    last_own_cost = 0.0
    last_solve: float | None = None
    taken_cost = 0.0  # the configuration taken's, as a fit of its own
    rounds = fits = 0
    while candidates:
        scored: list[tuple[Candidate, np.ndarray]] = []
        entries: list[int] = []  # each one's line in result.large_basis
        costs: list[float] = []  # each one's fit on its own, CPU seconds per core
        gains: list[float] = []  # each one's over the reference, on the hold-out
        for candidate in _grouped_by_features(candidates):
            # the first round leaves a share of the budget to confirm its best on the split,
            # once its first fit is in: a first fit cut short learns nothing and ends the search
            # (at 100,000 items one fit of the kernel's map takes most of the budget)
            reserve = CONFIRMATION_SHARE * budget.seconds if rounds == 0 and fits else 0.0
            expected = last_own_cost
            if last_solve is not None and holdout.holds(estimator, candidate.params):
                expected = last_solve
            if budget.spent or budget.used_s + expected > budget.seconds - reserve:
                result.large_basis_stopped = "time budget spent"
                break
            if _raced_out(scored, _normalisation_pair(candidate)):
                continue
            fitted = holdout.score(
                estimator, candidate.params, budget, reserve=reserve, max_iter=LARGE_BASIS_MAX_ITER
            )
            fits += 1
            gain, error = paired_gain(fitted.correct, reference)
            # An unconverged or truncated fit is recorded, never taken; an unconverged one's cost
            # is the cap's, so the next fit is predicted from the last finished one.
            if not (fitted.unconverged or fitted.truncated):
                last_own_cost = fitted.own_cost
                last_solve = fitted.own_cost - holdout.expansion_cost
                scored.append((candidate, fitted.correct))
                entries.append(len(result.large_basis))
                costs.append(fitted.own_cost)  # the confirmation's fits expand
                gains.append(gain)
            predicted = expected if expected > 0 else None  # the first: no fit to go by
            result.large_basis.append(
                {"change": candidate.change, **_entry(fitted, gain, error, False, None, predicted)}
            )
            if fitted.truncated:
                result.large_basis_stopped = "time budget spent"
                break
        chosen = take(
            reference,
            work(current),
            [(correct, work(candidate.params)) for candidate, correct in scored],
            min_gain_se,
            prefer,
        )
        if chosen is None and rounds == 0:
            chosen = _confirm_on_the_split(
                holdout,
                estimator,
                current,
                reference,
                scored,
                gains,
                costs,
                result,
                budget,
                min_gain_se,
            )
        if chosen is None:
            result.large_basis_stopped = result.large_basis_stopped or (
                "refined" if rounds else "no candidate gained"
            )
            return reference, taken_cost
        index = chosen[0]
        candidate, reference = scored[index]
        taken_cost = costs[index]
        current = candidate.params
        result.params = current
        result.large_basis[entries[index]]["taken"] = True
        if result.large_basis_stopped or rounds == LARGE_BASIS_REFINEMENTS:
            result.large_basis_stopped = result.large_basis_stopped or "refined"
            return reference, taken_cost
        rounds += 1
        candidates = neighbour_candidates(current)
    result.large_basis_stopped = result.large_basis_stopped or "refined"
    return reference, taken_cost


def _shrink_large_basis(
    holdout: HoldOut,
    estimator,
    result: LadderResult,
    reference: np.ndarray,
    cost: float,
    *,
    floor: int,
    budget: SelectionBudget,
    min_gain_se: float,
    work: Callable[[dict[str, Any]], float],
    prefer: str,
) -> int:
    """The configuration the large-basis search took (``result.params``, whose correctness
    on the hold-out is ``reference`` and whose fit cost ``cost`` CPU seconds per core), its
    basis halved while the selection's rule takes the smaller over the larger (with
    ``prefer="cost"``: at least as accurate on the hold-out, and cheaper to predict), down to
    ``floor`` a class (the ladder's rung), while the next fit, at the last one's cost scaled
    by its basis's items (:func:`scaled_fit_cost`: about half, up to the whole where the small
    classes are whole already), fits in ``budget``.
    A large basis is chosen for its settings as much as for its size (spambase: the every-item
    configuration scores as well at a quarter of the items), and prediction costs the basis.
    Returns the basis per class kept; ``result.params``, ``result.shrink`` and
    ``result.shrink_stopped`` say the rest."""
    current = result.params
    size = current["basis_per_class"]
    while True:
        if size // 2 < max(1, floor):
            result.shrink_stopped = "the ladder's rung"
            break
        predicted = scaled_fit_cost(cost, size, size // 2, holdout.fit_counts)
        if budget.spent or budget.used_s + predicted > budget.seconds:
            result.shrink_stopped = "time budget spent"
            break
        smaller = {**current, "basis_per_class": size // 2}
        fitted = holdout.score(estimator, smaller, budget)
        if fitted.truncated:
            gain, error = paired_gain(fitted.correct, reference)
            result.shrink.append(_entry(fitted, gain, error, False, size // 2, predicted))
            result.shrink_stopped = "time budget spent"
            break
        correct, cost = fitted.correct, fitted.cost
        chosen = take(reference, work(current), [(correct, work(smaller))], min_gain_se, prefer)
        gain, error = paired_gain(correct, reference)
        result.shrink.append(_entry(fitted, gain, error, chosen is not None, size // 2, predicted))
        if chosen is None:
            result.shrink_stopped = "the larger kept by the selection's rule"
            break
        current, reference, size = smaller, correct, size // 2
    result.params = current
    return size


def _grouped_by_features(candidates: list[Candidate]) -> list[Candidate]:
    """``candidates`` in their order, each followed by the later ones that differ from it
    only in :data:`~training.estimator.estimator.SOLVER_PARAMETERS` (C): those are fitted on
    its expansion (:class:`HoldOut`), which only the last fit's is kept of."""
    groups: dict[tuple, list[Candidate]] = {}
    for candidate in candidates:
        key = tuple(
            sorted(
                (name, repr(value))
                for name, value in candidate.params.items()
                if name not in SOLVER_PARAMETERS
            )
        )
        groups.setdefault(key, []).append(candidate)
    return [candidate for group in groups.values() for candidate in group]


def _normalisation_pair(candidate: Candidate) -> tuple[Any, Any]:
    """The normalisations a candidate is under: candidates that differ in width and C only
    share one."""
    return candidate.params.get("normalization"), candidate.params.get("input_normalization")


def _raced_out(scored: list[tuple[Candidate, np.ndarray]], group: tuple[Any, Any]) -> bool:
    """Whether the candidates of ``group`` scored so far (two at least) are all more than
    :data:`~training.selection.folds.RACE_Z` standard errors behind the best scored: such a
    pair of normalisations (spambase's global inputs under besvm, 20 points behind) is not
    tried at the other widths."""
    mine = [correct for candidate, correct in scored if _normalisation_pair(candidate) == group]
    if len(mine) < 2:
        return False
    best = max((correct for _, correct in scored), key=lambda correct: correct.mean())
    gain, error = paired_gain(best, max(mine, key=lambda correct: correct.mean()))
    return gain > RACE_Z * error


def _confirm_on_the_split(
    holdout: HoldOut,
    estimator,
    current: dict[str, Any],
    reference: np.ndarray,
    scored: list[tuple[Candidate, np.ndarray]],
    gains: list[float],
    costs: list[float],
    result: LadderResult,
    budget: SelectionBudget,
    min_gain_se: float,
) -> tuple[int] | None:
    """A gain on the hold-out within its standard error, tested on more items: the best
    candidate and ``current`` fitted again on the rest of the split in more hold-outs of the
    same size (:meth:`HoldOut.folds_of_the_fit_part`: four, on splits of up to about 60,000
    items every item), so that the paired difference is over five times the items, with
    about half the hold-out's standard error. The candidate tested is the best on the
    hold-out (``gains``) of those whose fits (``costs``, CPU seconds per core) the rest of
    ``budget`` affords. Its index in ``scored`` when its gain over those items exceeds
    ``min_gain_se`` standard errors, else None; ``result.confirmation`` records the test, or
    why none ran."""
    if not scored:
        result.confirmation = {"stopped": "no candidate finished"}
        return None
    folds = holdout.folds_of_the_fit_part()
    if not folds:
        result.confirmation = {"stopped": "no class large enough to hold out again"}
        return None
    left = budget.left_s
    # the candidate's fits and as many of the ladder's choice, each costing a fraction more
    affordable = [
        (gains[i], i)
        for i in range(len(scored))
        if len(folds) * costs[i] * CONFIRMATION_OVERHEAD <= left
    ]
    if not affordable:
        result.confirmation = {"stopped": "no candidate's fits within the time budget"}
        return None
    # the best gain; among equals the earlier (more promising) candidate
    gain, index = max(affordable, key=lambda entry: (entry[0], -entry[1]))
    if gain <= 0:
        result.confirmation = {"stopped": "no candidate gained on the hold-out"}
        return None
    candidate, correct = scored[index]
    started = time.monotonic()
    ours, theirs = [correct[0]], [reference[0]]
    for fit, held in folds:
        for params, into in ((candidate.params, ours), (current, theirs)):
            if budget.spent:
                result.confirmation = {"change": candidate.change, "stopped": "time budget spent"}
                return None
            scored_fit = holdout.score(estimator, params, budget, fit, held)
            if scored_fit.truncated:
                result.confirmation = {"change": candidate.change, "stopped": "time budget spent"}
                return None
            into.append(scored_fit.correct[0])
    gain, error = paired_gain(np.concatenate(ours)[None, :], np.concatenate(theirs)[None, :])
    confirmed = gain > 0 and gain > min_gain_se * error
    result.confirmation = {
        "change": candidate.change,
        "items": int(sum(len(part) for part in ours)),
        "gain": gain,
        "standard_error": error,
        "taken": confirmed,
        "seconds": round(time.monotonic() - started, 2),
    }
    return (index,) if confirmed else None


def _entry(
    scored: Scored,
    gain: float,
    error: float,
    taken: bool,
    size: int | None = None,
    predicted: float | None = None,
) -> dict[str, Any]:
    """A fit's line in the ladder's record: its basis per class and basis items (rungs and
    halvings: a large-basis candidate's change names its size), its held-out accuracy, its gain
    over the reference with that gain's standard error, whether it was taken, ``truncated``
    where the budget cut it short (:attr:`Scored.truncated`), ``unconverged`` where the solver's
    step cap did (:attr:`Scored.unconverged`), its wall seconds, its cost (CPU seconds per
    core, ``cost_s``) and, where the budget was asked with it before the fit started, the cost
    predicted for it (``predicted_cost_s``: a rung's or a halving's by
    :func:`scaled_fit_cost`, a large-basis candidate's the last finished one's)."""
    entry: dict[str, Any] = {}
    if size is not None:
        entry["basis_per_class"] = size
        entry["n_basis"] = int(scored.model.expansion_.basis_.shape[0])
    entry.update(
        held_out_accuracy=float(scored.correct.mean()),
        gain=gain,
        standard_error=error,
        taken=taken,
    )
    if scored.truncated:
        entry["truncated"] = True
    if scored.unconverged:
        entry["unconverged"] = True
    entry["seconds"] = round(scored.seconds, 2)
    entry["cost_s"] = round(scored.cost, 4)
    if predicted is not None:
        entry["predicted_cost_s"] = round(predicted, 4)
    return entry


def describe_large_basis(record: dict[str, Any]) -> str:
    """The large-basis search's record (:meth:`LadderResult.record`'s ``large_basis``) in one
    line: how many candidates were scored (and how many of them did not converge), the best
    finished fit on the hold-out, whether one was taken and why the search ended, and its
    budget used (records written before 30 November have none)."""
    scored = record["candidates"]
    unconverged = sum(1 for entry in scored if entry.get("unconverged"))
    finished = [
        entry for entry in scored if not (entry.get("unconverged") or entry.get("truncated"))
    ]
    best = max(finished, key=lambda entry: entry["held_out_accuracy"], default=None)
    shrunk = [entry for entry in record.get("shrink", []) if entry["taken"]]
    return (
        f"{len(scored)} scored"
        + (f" ({unconverged} unconverged)" if unconverged else "")
        + (f", best {best['change']} {100 * best['held_out_accuracy']:.2f}%" if best else "")
        + ("; taken" if record["chosen"] else "; not taken")
        + f" ({record['stopped']})"
        + (
            f", {record['budget_used_s']:.0f} of {record['budget_s']:g} CPU s a core"
            if "budget_used_s" in record
            else ""
        )
        + (f"; shrunk to {shrunk[-1]['basis_per_class']} bases per class" if shrunk else "")
    )
