"""The kernel SVM's own grid, cross-validated on the whole training split, after the basis ladder
(:func:`search_kernel_grid`).

On a split of a few thousand items selected on a sample, the basis ladder and its large-basis
search decide on one stratified hold-out of a fifth of the split. There a kernel SVM's gain is
often within the noise (spambase, seed 0: the best kernel's map at every item +0.73 points on the
hold-out, standard error 0.78), and the ladder keeps its cheaper choice (there 1.65 points below
the kernel SVM this stage takes, on the test split). A user tuning an SVC would cross-validate it
on every item. This stage does the same: the ladder's choice and the kernel's own map at every
training item (``nystroem(clip)``, with every item as the basis the linear SVM is the kernel SVM,
squared hinge) over a grid of widths, input normalisations and C
(:func:`~training.selection.space.large_basis_candidates`), scored on :data:`KERNEL_GRID_FOLDS`
stratified folds of the whole split with the selection's racing and its rule
(:func:`~training.selection.state.take`: a candidate costlier to predict replaces the ladder's
choice only on a gain beyond ``min_gain_se`` standard errors unless the preference is
``accuracy``), within a time budget of the selection's size.

It runs where the kernel's map at every item is affordable
(:attr:`~training.selection.space.KindRules.kernel_grid_max_items`: dense inputs up to a few
thousand items, whose features fit the memory budget), for kernels only (the map of an indefinite
measure is not a kernel's): docs/how-it-works/model-selection.md, "The kernel SVM's grid".
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.model.similarity import parse_spec
from training.selection.folds import FoldScorer, make_folds
from training.selection.memory import basis_items, feature_bytes
from training.selection.space import (
    DENSE_RULES,
    KERNEL_MAP_NORMALIZATION,
    LARGE_BASIS_C,
    RBF_SCALE,
    START_MEASURE,
    Candidate,
    KindRules,
    basis_weight,
    held_square_matrices,
    large_basis_candidates,
    measure_scale,
    measures,
)
from training.selection.state import SelectionState

# Folds of the whole split: a kernel SVM's grid search as a user runs it (scikit-learn's
# default), every item validated once.
KERNEL_GRID_FOLDS = 5

# The candidates offered: an rbf's whole coarse grid on dense inputs (widths x input
# normalisations x C; word counts, under global inputs only, get half), as a user's grid search
# of an SVC covers gamma and C. The budget, not this bound, ends the stage under the default one
# (2 cores: 15 to 20 of them scored or raced out on spambase and phoneme); the bound keeps a
# generous budget's cost to one kernel's grid.
KERNEL_GRID_CANDIDATES = (
    len(RBF_SCALE.coarse) * len(DENSE_RULES.input_normalizations) * len(LARGE_BASIS_C)
)


@dataclass
class KernelGridResult:
    """What the kernel grid chose (``params``: None, the ladder's choice kept) and its record."""

    params: dict[str, Any] | None = None
    compared_with: dict[str, Any] = field(default_factory=dict)  # the ladder's choice
    stopped: str = ""
    folds: int = 0
    items: int = 0
    budget_s: float = 0.0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    budget_used_s: float = 0.0  # what the budget counts: cpu_seconds per core
    fits: int = 0
    jobs: int = 0  # fold fits side by side
    path: list[dict[str, Any]] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {
            "method": f"the ladder's choice against the kernel's map at every item, "
            f"{self.folds}-fold stratified cross-validation on the whole split, a candidate "
            "taken by the selection's rule",
            "items": self.items,
            "compared_with": self.compared_with,
            "chosen": self.params,
            "stopped": self.stopped,
            "budget_s": self.budget_s,
            "seconds": round(self.seconds, 2),
            "cpu_seconds": round(self.cpu_seconds, 2),
            "budget_used_s": round(self.budget_used_s, 2),
            "fits": self.fits,
            "jobs": self.jobs,
            "path": self.path,
            "stages": self.stages,
        }


def kernel_grid_candidates(
    params: dict[str, Any], rules: KindRules, per_class: int
) -> list[Candidate]:
    """The kernel's map at ``per_class`` basis items a class: the large-basis search's
    candidates (the coarse grid's widths, the input normalisations and C) under
    :data:`~training.selection.space.KERNEL_MAP_NORMALIZATION`, for the first positive definite
    measure of ``params`` with a width, alone (the map of an indefinite measure is not a
    kernel's; an SVC's grid is of one kernel); where it has none, for the starting rbf.

    Width by width and input normalisation by input normalisation: each pair at the smaller C,
    in the large-basis search's order of widths (from one coarse step narrower than ``params``'
    out) and the chosen input normalisation first at each, then each pair at the larger C, so
    that a budget that ends the racing within its first chunk has scored nearly every width
    under both input normalisations. The kernel's map at every item needs its own width and
    inputs, which the ladder's choice, under another normalisation and often joined to a
    partner, need not share; on spambase's seed 0 one run's ladder chose ``rbf(gamma=16) +
    linear`` and another's ``rbf(gamma=0.0625) + linear`` on global inputs, and the map needs
    ``rbf(gamma=0.25)`` on per-feature inputs. The smaller C first: at every item it won where
    the stage changed the choice, and at narrow widths it costs a third of the larger's fits
    (docs/measurements/model-selection.md, "The kernel SVM's grid, width by width")."""
    kernel = next(
        (
            measure
            for measure in measures(params["similarity"])
            if parse_spec(measure).kind.positive_definite and measure_scale(measure) is not None
        ),
        START_MEASURE,
    )
    by_pair: dict[tuple[str, str], list[Candidate]] = {}
    for candidate in large_basis_candidates(
        {**params, "similarity": kernel},
        rules,
        per_class,
        normalizations=(KERNEL_MAP_NORMALIZATION,),
    ):
        pair = (candidate.params["similarity"], candidate.params["input_normalization"])
        by_pair.setdefault(pair, []).append(candidate)
    for configurations in by_pair.values():
        configurations.sort(key=lambda candidate: candidate.params["C"])
    rounds = itertools.zip_longest(*by_pair.values())
    ordered = [candidate for round_ in rounds for candidate in round_ if candidate is not None]
    return ordered[:KERNEL_GRID_CANDIDATES]


def search_kernel_grid(
    estimator,
    params: dict[str, Any],
    X,
    y,
    *,
    rules: KindRules,
    site,
    jobs: int,
    threads: int,
    budget_s: float,
    memory_budget: int,
    min_gain_se: float,
    prefer: str,
    work: Callable[[dict[str, Any]], float],
    random_state: int = 0,
    verbose: bool = False,
) -> KernelGridResult:
    """Cross-validate ``params`` (the ladder's choice) against
    :func:`kernel_grid_candidates` at every training item on (X, y), the whole split.

    Parameters
    ----------
    estimator : BasisExpandingSVC
        Cloned for every fold fit.
    params : dict
        The configuration chosen so far (its basis per class for the whole split).
    X : ndarray of shape (n_samples, ...)
    y : ndarray of shape (n_samples,)
    rules : KindRules
    site : ThisMachine
        Where the fold fits run (:mod:`training.selection.sites`), in ``jobs`` processes of
        ``threads`` numba threads (fewer processes where the memory budget holds fewer fits).
    jobs, threads : int
    budget_s : float
        The fold fits' CPU seconds per core
        (:class:`~training.selection.budget.SelectionBudget`); no candidate starts once they
        are spent.
    memory_budget : int
        Bytes the training features may take: a candidate whose final fit (every item of the
        split) would exceed it is not offered, and no more fold fits run side by side than it
        holds.
    min_gain_se : float
    prefer : {"accuracy", "cost"}
    work : callable
        A configuration's prediction work, for the rule's ties.
    random_state : int, default=0
        Seed of the folds.
    verbose : bool, default=False
        A progress bar on a terminal.

    Returns
    -------
    KernelGridResult
        ``params`` is the candidate taken (None: ``params`` kept); ``stopped`` says why the
        stage ended or was skipped.
    """
    started = time.monotonic()
    y = np.asarray(y)
    result = KernelGridResult(items=len(y), budget_s=float(budget_s), compared_with=dict(params))
    X_folds, folds, n_items = make_folds(X, y, KERNEL_GRID_FOLDS, 1, random_state, len(y))
    result.folds = len(folds)
    split_counts = np.unique(y, return_counts=True)[1]
    candidates = kernel_grid_candidates(params, rules, int(split_counts.max()))
    # Every item is a candidate's basis item: its final fit holds the split's items squared
    # (times the measures' weight), which must fit the memory budget.
    affordable = [c for c in candidates if _fit_bytes(split_counts, c.params) <= memory_budget]
    if not affordable:
        result.stopped = "skipped: every item's features exceed the memory budget"
        return result
    # As many fold fits side by side as the memory budget holds (the ladder's choice is scored
    # on the folds too), the cores they leave to the threads of those that run.
    fold_counts = np.unique(max((f.y_train for f in folds), key=len), return_counts=True)[1]
    largest = max(_fit_bytes(fold_counts, p) for p in [params, *(c.params for c in affordable)])
    cores = jobs * threads
    jobs = result.jobs = max(1, min(jobs, memory_budget // largest))
    threads = max(threads, cores // jobs)
    scorer = FoldScorer.at(
        site,
        estimator,
        X_folds,
        folds,
        n_items,
        jobs=jobs,
        threads=threads,
        budget_s=budget_s,
        progress=verbose,
    )
    budget = scorer.budget
    state = SelectionState(scorer, params, min_gain_se, started, work, prefer)
    taken = state.step("kernel grid", affordable)
    result.params = state.current if taken else None
    result.path, result.stages = state.path, state.stages
    result.stopped = (
        budget.describe() if scorer.out_of_time else "every candidate scored or raced out"
    )
    result.seconds = time.monotonic() - started
    result.cpu_seconds = budget.cpu_seconds
    result.budget_used_s = budget.used_s
    result.fits = scorer.fits
    return result


def _fit_bytes(class_counts: np.ndarray, params: dict[str, Any]) -> int:
    """Bytes of the training features of a fit of ``params`` on items of ``class_counts``
    (:func:`~training.selection.memory.feature_bytes`: its basis items times the measures'
    weight, and the square matrices its normalisation holds)."""
    basis = basis_items(params["basis_per_class"], class_counts)
    n_features = math.ceil(basis * basis_weight(params["similarity"]))
    return feature_bytes(int(class_counts.sum()), n_features, held_square_matrices(params))


def describe_kernel_grid(record: dict[str, Any]) -> str:
    """The kernel grid's record (:meth:`KernelGridResult.record`) in one line: the ladder's
    choice and the candidate taken with their cross-validated accuracies, or why it did not
    run."""
    path = record["path"]
    if not path:
        return record["stopped"]
    start = f"the ladder's choice CV {100 * path[0]['cv_accuracy']:.2f}%"
    if not record["chosen"]:
        return f"{start}; not taken ({record['stopped']})"
    taken = path[-1]
    return (
        f"{start}; taken: {taken['change']} CV {100 * taken['cv_accuracy']:.2f}% "
        f"({100 * taken['gain']:+.2f} ± {100 * taken['standard_error']:.2f}; "
        f"{record['stopped']})"
    )
