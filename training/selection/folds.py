"""Cross-validation folds and their scoring: stratified k-fold, repeated with other shuffles
when the set is small (:func:`repeats_for`), each candidate's correctness on every validation
item, and the paired comparison of two candidates (:func:`paired_gain`).

Stages of many candidates race them (:class:`FoldScorer`), the most promising first,
:data:`RACE_CHUNK` at a time: after a first pass, those clearly behind the best so far
(:data:`RACE_Z` standard errors) are dropped, and at most :data:`RACE_SHARE` go on. Scoring stops
when the budget is spent (:mod:`training.selection.budget`): a candidate whose folds are not all
scored by then is not considered.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from joblib import Parallel, delayed
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import RepeatedStratifiedKFold, train_test_split

from service.model.threads import limit_threads
from training.selection.budget import SelectionBudget, fit_cpu_clock
from training.selection.space import Candidate

# Sets smaller than this are cross-validated with several shuffles of the folds (at most
# MAX_REPEATS), so that about this many validations back every comparison.
MIN_VALIDATIONS = 1000

MAX_REPEATS = 3

# Racing, from RACE_FROM candidates, RACE_CHUNK at a time: after a first pass, a candidate this
# many standard errors behind the best so far is dropped, and at most a third of a chunk goes on
# to the other folds.
RACE_FROM = 5

RACE_CHUNK = 9

RACE_Z = 2.0

RACE_SHARE = 1 / 3

# The solver's iterations in a fold fit at most (the final fit keeps the estimator's max_iter).
FOLD_MAX_ITER = 500


def repeats_for(n_items: int) -> int:
    """Shuffles of the folds for a set of ``n_items``: enough for about
    :data:`MIN_VALIDATIONS` validations, at most :data:`MAX_REPEATS`."""
    return int(min(MAX_REPEATS, max(1, math.ceil(MIN_VALIDATIONS / max(1, n_items)))))


@dataclass(frozen=True)
class Fold:
    """One fold, as positions among the items cross-validated (``train_index``, ``valid_index``) and
    their labels; ``repeat`` is the shuffle the fold belongs to. A fold carries no items: the
    items cross-validated travel to each process (or cluster worker) once, and its tasks carry only
    these positions."""

    train_index: np.ndarray
    y_train: np.ndarray
    valid_index: np.ndarray
    y_valid: np.ndarray
    repeat: int


def make_folds(X, y: np.ndarray, n_splits: int, repeats: int, random_state: int, max_items: int):
    """The training set as ``repeats`` shuffles of ``n_splits`` stratified folds, on a
    stratified sample of at most ``max_items`` items; the items cross-validated, the folds and how
    many items they share."""
    if len(y) > max_items:
        X, _, y, _ = train_test_split(
            X, y, train_size=max_items, stratify=y, random_state=random_state
        )
    smallest = min(np.unique(y, return_counts=True)[1])
    n_splits = max(2, min(n_splits, int(smallest)))
    splitter = RepeatedStratifiedKFold(
        n_splits=n_splits, n_repeats=repeats, random_state=random_state
    )
    folds = [
        Fold(train, y[train], valid, y[valid], i // n_splits)
        for i, (train, valid) in enumerate(splitter.split(np.zeros(len(y)), y))
    ]
    return X, folds, len(y)


def _score_fold(
    X, estimator, params: dict[str, Any], fold: Fold, threads: int
) -> tuple[np.ndarray, float]:
    """Which validation items of a fold are predicted right, trained on the fold's rest
    (``X``: the items cross-validated, which the fold's positions index); and the CPU seconds
    the fit and prediction took (:func:`~training.selection.budget.fit_cpu_clock`'s)."""
    model = clone(estimator).set_params(**params, n_jobs=threads, verbose=False)
    # A candidate whose features are ill-conditioned (a wide rbf on one dominant feature) can
    # keep the solver for thousands of iterations, where others converge in hundreds at most:
    # scored as it stands after FOLD_MAX_ITER.
    model.set_params(max_iter=min(model.max_iter, FOLD_MAX_ITER))
    # BLAS gets one thread: its work here is small (eigh of a B x B Gram matrix), and its
    # threads spin-wait, which costs far more than they save when another process holds a core
    # (docs/measurements/model-selection.md#the-selections-constants-measured).
    clock = fit_cpu_clock(threads)
    started = clock()
    with limit_threads(numba_threads=threads, blas_threads=1), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(X[fold.train_index], fold.y_train)
        predicted = model.predict(X[fold.valid_index])
    return np.asarray(predicted == fold.y_valid), clock() - started


def paired_gain(candidate: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """The gain in accuracy of ``candidate`` over ``reference``, validated on the same items,
    and its standard error.

    Parameters
    ----------
    candidate, reference : ndarray of shape (n_repeats, n_items), bool
        Whether each item was predicted right in each shuffle of the folds.

    Returns
    -------
    gain, standard_error : float
        The mean over the items of their difference in correctness (averaged over the
        repeats), and the standard error of that mean (items as the independent units).
    """
    differences = (candidate.astype(np.float64) - reference).mean(axis=0)
    if differences.size < 2:
        return float(differences.mean()), math.inf
    return float(differences.mean()), float(differences.std(ddof=1) / math.sqrt(differences.size))


@dataclass
class Scored:
    """What a stage's scoring gave: each candidate's correctness matrix (None if not every
    fold was scored), and how many were raced out."""

    correct: list[np.ndarray | None]
    raced_out: int


class FoldScorer:
    """Scores candidates on the folds, in parallel, within a budget, racing them."""

    def __init__(
        self,
        estimator,
        X,
        folds: list[Fold],
        n_items: int,
        parallel: Parallel,
        threads: int,
        budget: SelectionBudget,
        progress,
    ):
        self.estimator = estimator
        self.X = X
        self.folds = folds
        self.n_items = n_items
        self.repeats = 1 + max(fold.repeat for fold in folds)
        self.threads = threads
        self.budget = budget
        self.progress = progress
        self.fits = 0
        self.out_of_time = False
        self.parallel = parallel

    @classmethod
    def at(
        cls,
        site,
        estimator,
        X,
        folds: list[Fold],
        n_items: int,
        *,
        jobs: int,
        threads: int,
        budget_s: float,
        progress,
    ) -> FoldScorer:
        """A scorer whose fold fits run where ``site`` runs them
        (:mod:`training.selection.sites`), in ``jobs`` processes of ``threads`` threads each,
        within ``budget_s`` CPU seconds per core they use."""
        return cls(
            estimator,
            X,
            folds,
            n_items,
            site.parallel(X, jobs),
            site.threads(threads),
            SelectionBudget(budget_s, site.cores(jobs, threads)),
            progress,
        )

    def __call__(
        self, stage: str, candidates: Sequence[Candidate], reference: np.ndarray | None
    ) -> Scored:
        """Score every candidate on every fold, or race them when there are many, in chunks of
        :data:`RACE_CHUNK` in the order given (the most promising first, so that a stage the
        budget cuts still leaves its first chunks scored): a first pass (the first shuffle's
        folds when the folds are repeated, else the first fold), then the other folds for the
        chunk's candidates not clearly behind the best so far and ``reference`` (the current
        configuration's correctness) on that pass, at most a third of the chunk."""
        results: list[dict[int, np.ndarray]] = [{} for _ in candidates]
        folds = range(len(self.folds))
        first = [f for f in folds if self.folds[f].repeat == 0] if self.repeats > 1 else [0]
        if len(candidates) < RACE_FROM or len(first) == len(self.folds):
            tasks = [(i, f) for i in range(len(candidates)) for f in folds]
            self._run(stage, tasks, candidates, results)
            return Scored([self._matrix(done) for done in results], 0)
        raced_out = 0
        for start in range(0, len(candidates), RACE_CHUNK):
            chunk = range(start, min(start + RACE_CHUNK, len(candidates)))
            self._run(stage, [(i, f) for i in chunk for f in first], candidates, results)
            if self.out_of_time:
                break
            alive = self._survivors(results, reference, first, chunk)
            raced_out += len(chunk) - len(alive)
            rest = [(i, f) for i in alive for f in folds if f not in first]
            self._run(stage, rest, candidates, results)
            if self.out_of_time:
                break
        return Scored([self._matrix(done) for done in results], raced_out)

    def _matrix(self, done: dict[int, np.ndarray]) -> np.ndarray | None:
        if len(done) < len(self.folds):
            return None
        correct = np.zeros((self.repeats, self.n_items), dtype=bool)
        for f, right in done.items():
            fold = self.folds[f]
            correct[fold.repeat, fold.valid_index] = right
        return correct

    def _survivors(
        self,
        results: list[dict[int, np.ndarray]],
        reference: np.ndarray | None,
        first: list[int],
        chunk: range,
    ) -> list[int]:
        """The candidates of ``chunk`` not :data:`RACE_Z` standard errors behind the best so
        far on the ``first`` folds, the best first, at most :data:`RACE_SHARE` of the chunk."""
        index = np.concatenate([self.folds[f].valid_index for f in first])
        on_pass = {
            i: np.concatenate([done[f] for f in first])[None, :]
            for i, done in enumerate(results)
            if all(f in done for f in first)
        }
        contenders = list(on_pass.values())
        if reference is not None:
            contenders.append(reference[0, index][None, :])
        best = max(contenders, key=lambda right: right.mean())
        kept = [i for i in chunk if _not_behind(best, on_pass[i])]
        # Stable: among equals the earlier (more promising) candidate goes on.
        kept.sort(key=lambda i: -on_pass[i].mean())
        return sorted(kept[: math.ceil(RACE_SHARE * len(chunk))])

    def _run(
        self,
        stage: str,
        tasks: list[tuple[int, int]],
        candidates: Sequence[Candidate],
        results: list[dict[int, np.ndarray]],
    ) -> None:
        if not tasks:
            return
        if self.budget.spent:
            self.out_of_time = True
            return
        jobs = (
            delayed(_indexed)(
                (i, f),
                _score_fold,
                self.X,
                self.estimator,
                candidates[i].params,
                self.folds[f],
                self.threads,
            )
            for i, f in tasks
        )
        bar = _progress_bar(len(tasks), stage, self.progress)
        # Cancelling the fits left when the budget is spent is the point, not a mistake.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*tasks which were still being processed")
            outcomes = self.parallel(jobs)
            try:
                for (i, f), (right, cpu_seconds) in outcomes:
                    results[i][f] = right
                    self.fits += 1
                    self.budget.add(cpu_seconds)
                    bar.update(1)
                    if self.budget.spent:
                        self.out_of_time = True
                        break
            finally:
                # Closing the generator cancels the fits not yet started.
                outcomes.close()
                bar.close()


def _not_behind(best: np.ndarray, right: np.ndarray) -> bool:
    gain, error = paired_gain(best, right)
    return gain <= RACE_Z * error


def _indexed(index, function, *args):
    return index, function(*args)


def _progress_bar(total: int, stage: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        desc=f"selection: {stage}",
        unit="fit",
        leave=False,
        disable=not enabled or not sys.stderr.isatty(),
    )
