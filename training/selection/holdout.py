"""The hold-out of the basis ladder (:mod:`training.selection.basis_ladder`): the whole training
split less a stratified share, and the scoring of a configuration fitted on the rest, within
what is left of a time budget; the fit part's last expansion kept for the configurations that
differ from it only in C.
"""

from __future__ import annotations

import time
import warnings
from typing import Any, NamedTuple

import numpy as np
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import StratifiedKFold, train_test_split

from service.model.threads import limit_threads
from training.estimator.solver import cpu_time_limit
from training.selection.budget import SelectionBudget, fit_cpu_clock
from training.selection.folds import FOLD_MAX_ITER

# The share of the training split held out to score each rung (stratified), at most
# MAX_HOLDOUT_ITEMS: 2,000 held-out items give a paired standard error of about 0.3 points.
HOLDOUT_SHARE = 0.2

MAX_HOLDOUT_ITEMS = 10_000

# A gain within the hold-out's noise is tested on at most this many more hold-outs of its size.
MAX_MORE_HOLDOUTS = 4


class Scored(NamedTuple):
    """What :meth:`HoldOut.score` measured of one fit."""

    correct: np.ndarray  # shape (1, n_held): each held-out item predicted right
    model: Any
    seconds: float  # wall
    cost: float  # CPU seconds per core, added to the budget
    truncated: bool  # the solver stopped where the budget ran out: not a finished fit
    unconverged: bool  # the solver stopped at its Newton-step cap (``max_iter``) unconverged
    expanded: bool  # the fit expanded the training set (else it reused the last expansion)
    own_cost: float  # as a fit of its own: with the expansion it reused, CPU seconds per core


class HoldOut:
    """The whole split less a stratified :data:`HOLDOUT_SHARE` (at most
    :data:`MAX_HOLDOUT_ITEMS`; a class of a single item always in the fit part), and the
    scoring of a configuration fitted on the rest.

    The fit part's last expansion is kept
    (:class:`~training.estimator.estimator.ExpandedTrainingSet`): a configuration that differs
    from the one before only in C is fitted on it, without expanding again (on spambase's
    every-item basis under ``nystroem(clip)`` the expansion is most of a fit's cost).

    Attributes
    ----------
    fit, held : ndarray of int
        Positions of the fit part and of the hold-out in the split.
    fit_counts : ndarray of int, shape (n_classes,)
        Items of each class in the fit part (a basis of k a class holds min(k, n_c) of each).
    fit_largest : int
        Items of the fit part's largest class.
    """

    def __init__(self, X: np.ndarray, y: np.ndarray, random_state: int) -> None:
        _, codes, counts = np.unique(y, return_inverse=True, return_counts=True)
        single = counts[codes] < 2
        splittable = np.flatnonzero(~single)
        n_split_classes = int(np.sum(counts >= 2))
        holdout = min(MAX_HOLDOUT_ITEMS, max(n_split_classes, round(HOLDOUT_SHARE * len(y))))
        fit, held = train_test_split(
            splittable, test_size=holdout, stratify=y[splittable], random_state=random_state
        )
        self.fit = np.concatenate([fit, np.flatnonzero(single)])
        self.held = held
        self.X, self.y = X, y
        self.fit_counts = np.unique(y[self.fit], return_counts=True)[1]  # of each class
        self.fit_largest = int(self.fit_counts.max())
        self.random_state = random_state
        self._expanded = None  # the fit part's last expansion
        self.expansion_cost = 0.0  # its expansion's CPU seconds per core

    def holds(self, estimator, params: dict[str, Any]) -> bool:
        """Whether a fit of ``estimator`` with ``params`` on the fit part reuses the last
        expansion: whether it costs a solve, not an expansion and a solve."""
        return self._keeps(clone(estimator).set_params(**params))

    def _keeps(self, model) -> bool:
        """Whether the kept expansion is ``model``'s."""
        return self._expanded is not None and self._expanded.parameters == (
            model.feature_parameters()
        )

    def score(
        self,
        estimator,
        params: dict[str, Any],
        budget: SelectionBudget,
        fit: np.ndarray | None = None,
        held: np.ndarray | None = None,
        bounded: bool = True,
        reserve: float = 0.0,
        max_iter: int = FOLD_MAX_ITER,
    ) -> Scored:
        """``estimator`` with ``params`` fitted on the fit part (or the ``fit`` positions) and
        scored on the hold-out (or the ``held`` positions), on ``budget.cores`` threads; its CPU
        seconds (:func:`~training.selection.budget.fit_cpu_clock`'s) are added to ``budget``.

        Unless not ``bounded`` (the ladder's first rung, which everything after it is compared
        with), the solver stops where ``budget`` (less ``reserve`` seconds) runs out
        (:func:`~training.estimator.solver.cpu_time_limit`): a fit's cost is not known before it
        runs (on adult a large-basis candidate took four times the cost the rung before
        predicted, docs/measurements/model-selection.md). Such a fit is ``truncated``: scored
        as it stands, for the record, and never taken, compared with or confirmed. A fit on
        the fit part reuses its last expansion where only C differs (:meth:`holds`).

        The solver takes ``max_iter`` Newton steps at most (as a fold fit, :data:`FOLD_MAX_ITER`,
        by default; or the estimator's ``max_iter``, if lower); a fit stopped there before its
        tolerance is ``unconverged``, unless ``truncated`` (the solver's ConvergenceWarning says
        so: a fit may converge at its last step)."""
        on_the_fit_part = fit is None
        fit = self.fit if fit is None else fit
        held = self.held if held is None else held
        # The fit runs on the budget's cores, BLAS, numba and the prediction alike, so that its
        # clock counts what it spends (on one core, its thread's: no other thread's work).
        clock = fit_cpu_clock(budget.cores)
        cpu, wall = clock(), time.monotonic()
        model = clone(estimator).set_params(**params, n_jobs=budget.cores)
        # Scored as a fold fit is: an ill-conditioned basis (nystroem's at a large size) can
        # keep the solver for thousands of iterations, scored as it stands after max_iter
        # (the final fit keeps the estimator's max_iter).
        model.set_params(max_iter=min(model.max_iter, max_iter))
        # what is left of the budget, in the fit's CPU seconds
        left = None
        if bounded:
            left = max(0.0, budget.left_s - reserve) * budget.cores
        expanded = not (on_the_fit_part and self._keeps(model))
        caught: list[warnings.WarningMessage] = []
        with limit_threads(numba_threads=budget.cores, blas_threads=budget.cores):
            try:
                with warnings.catch_warnings(record=True) as caught, cpu_time_limit(left, clock):
                    warnings.simplefilter("always", ConvergenceWarning)
                    if expanded:
                        self._expanded = None  # its memory freed before the next expansion's
                    if not on_the_fit_part:
                        model.fit(self.X[fit], self.y[fit])
                    else:
                        if expanded:
                            started = clock()
                            self._expanded = model.expand(self.X[fit], self.y[fit])
                            self.expansion_cost = (clock() - started) / budget.cores
                        model.fit_expanded(self._expanded)
            finally:
                solver_unconverged = _solver_stopped_unconverged(caught)
            # The solver stops only once the fit's CPU time has passed the limit.
            truncated = left is not None and clock() - cpu >= left
            predicted = model.predict(self.X[held])
        unconverged = solver_unconverged and not truncated
        correct = (predicted == self.y[held])[np.newaxis, :]
        cpu = clock() - cpu
        budget.add(cpu)
        cost = cpu / budget.cores
        own_cost = cost if expanded else cost + self.expansion_cost
        seconds = time.monotonic() - wall
        return Scored(correct, model, seconds, cost, truncated, unconverged, expanded, own_cost)

    def folds_of_the_fit_part(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """More hold-outs of the hold-out's size: (fit, held) positions, each held part a
        stratified share of the fit part, fitted on everything else; with the hold-out they
        score every item once (up to :data:`MAX_MORE_HOLDOUTS` of them: on splits larger
        than about 60,000 items, a share of the items). A class with fewer items than there
        are parts stays in every fit part; none when the fit part's classes are all that
        small."""
        n_parts = round(len(self.fit) / max(1, len(self.held)))
        if n_parts < 2:
            return []
        y_fit = self.y[self.fit]
        labels, counts = np.unique(y_fit, return_counts=True)
        splittable = self.fit[np.isin(y_fit, labels[counts >= n_parts])]
        if len(np.unique(self.y[splittable])) < 2:
            return []
        parts = StratifiedKFold(
            n_splits=n_parts, shuffle=True, random_state=self.random_state
        ).split(splittable, self.y[splittable])
        everything = np.arange(len(self.y))
        held_parts = [splittable[part] for _, part in parts][:MAX_MORE_HOLDOUTS]
        return [(np.setdiff1d(everything, part), part) for part in held_parts]


def _solver_stopped_unconverged(caught: list[warnings.WarningMessage]) -> bool:
    """Whether the warnings recorded during a fit say its solver stopped before its tolerance
    (the solver's ConvergenceWarning, :func:`~training.estimator.solver.warn_unconverged`);
    the other warnings are shown, as they would have been outside the recording (they have
    passed the filters already)."""
    unconverged = False
    for warning in caught:
        if issubclass(warning.category, ConvergenceWarning):
            unconverged = True
        else:
            warnings.showwarning(
                warning.message,
                warning.category,
                warning.filename,
                warning.lineno,
                warning.file,
                warning.line,
            )
    return unconverged
