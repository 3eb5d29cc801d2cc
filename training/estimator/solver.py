r"""The linear SVM's solver: one-vs-rest L2-regularised squared-hinge problems (LinearSVC's
primal, ``liblinear -s 2``) solved on one shared feature matrix.

Two Newton methods solve them, one chosen per design and C (:func:`newton_method_for`): on
dense designs of at most ``EXACT_NEWTON_MAX_COLUMNS`` columns (more on tall ones, the more the
larger C), Newton's method
with exact steps (:mod:`training.estimator.exact_newton`: each step a Cholesky solve with the
Hessian of the problem's active items), whose handful of steps does not depend on the
features' conditioning; elsewhere trust-region Newton-CG (:mod:`training.estimator.newton_cg`),
which never forms a Hessian and reads its data only through a squared-hinge loss
(:mod:`training.estimator.squared_hinge`: the loss term's value and gradient at some weights,
and products of its generalised Hessian with a vector); where the data lives is the loss's
business. The in-memory loss computes everything from the two products the method needs, the
design times a block of weights and the design transposed times a block of residuals, for every
problem of a group at once.

:func:`training_design` makes the design (dense, or sparse around the column medians) and
:func:`solve_one_vs_rest` solves the problems on it with the method chosen for it and folds the
design's shift back into the intercepts: the estimator (:mod:`training.estimator.estimator`)
makes a design once and solves on it at every C asked; :func:`fit_one_vs_rest` does both once.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning

from service.model.threads import limit_threads
from training.estimator.exact_newton import (
    EXACT_NEWTON_MAX_COLUMNS,
    EXACT_NEWTON_ROWS_PER_COLUMN,
    exact_newton,
    exact_newton_tall_columns,
)
from training.estimator.newton_cg import (
    TOLERANCE,
    Solution,
    liblinear_tolerance,
    minimize_squared_hinge,
)
from training.estimator.squared_hinge import InMemorySquaredHinge

__all__ = [
    "SPARSE_TRAINING_DENSITY",
    "ExactNewton",
    "TrustRegionNewtonCG",
    "correct_predictions",
    "cpu_time_limit",
    "feature_weights",
    "fit_one_vs_rest",
    "newton_method_for",
    "one_vs_rest_problems",
    "problem_signs",
    "problem_weights",
    "solve_one_vs_rest",
    "training_design",
]

# The SVM trains on sparse features when at most this fraction of them differ from their
# column's median (document measures: most pairs share no word): the solver's products then run
# several times faster (docs/measurements/benchmarks.md, "The SVM solver against LinearSVC"), on
# the same problem up to the intercept, which is folded back exactly.
SPARSE_TRAINING_DENSITY = 0.25
# Rows of the sample that tells dense features at once (see training_design).
DENSITY_SAMPLE_ROWS = 1024


def training_design(
    features: np.ndarray,
) -> tuple[np.ndarray | sp.csr_matrix, np.ndarray, np.ndarray | None]:
    """The matrix the SVM trains on, the shift that makes it from ``features``, and the
    features' columns it holds.

    Columns that are zero on every item are found first: they get weight zero in every
    L2-regularised problem, so a design without them has the same optimum at a fraction of the
    cost (a Nystroem map of rank r below its B basis items writes B - r of them; a ``linear``
    measure of d < B input numbers has rank d at most). When at most
    :data:`SPARSE_TRAINING_DENSITY` of the other columns' entries differ from their column's
    median, the design is the features minus those medians, as a sparse matrix (``features``
    is shifted in place; the zero columns cost it nothing); otherwise the features themselves
    without the zero columns (written over ``features``' own memory where it is C-contiguous
    and writeable) and a zero shift. A linear model on shifted features is the same model with
    another intercept: the caller folds ``shift`` back in (``b - w . shift``).

    Returns
    -------
    design : ndarray or csr_matrix of shape (n_samples, n_columns)
    shift : ndarray of shape (n_features,)
    columns : ndarray of shape (n_columns,), int, or None
        The features' columns the design holds, in order; None: all of them.
    """
    n_samples, n_features = features.shape
    # Row blocks of about 8 MiB: a comparison makes a mask of what it reads.
    height = max(1, (1 << 20) // max(n_features, 1))
    nonzero = np.zeros(n_features, dtype=bool)
    for start in range(0, n_samples, height):
        nonzero |= (features[start : start + height] != 0).any(axis=0)
    columns = None if nonzero.all() else np.flatnonzero(nonzero)
    median = _sparse_medians(features, columns)
    if median is None:
        if columns is None:
            return features, np.zeros(n_features), None
        return _compact_columns(features, columns, height), np.zeros(n_features), columns
    features -= median
    return sp.csr_matrix(features), median, None


def _sparse_medians(features: np.ndarray, columns: np.ndarray | None) -> np.ndarray | None:
    """The column medians of ``features`` (zero off ``columns``; None: every column) where at
    most :data:`SPARSE_TRAINING_DENSITY` of those columns' entries differ from them; None where
    more do (the design is dense)."""
    n_samples, n_features = features.shape
    # Evenly spaced rows first: where even they differ from their own medians twice as often as
    # the threshold, the features are dense, and the medians of every row (a partition of each
    # column, the slowest step after the products on large features) are not needed.
    sample = features[:: max(1, n_samples // DENSITY_SAMPLE_ROWS)]
    if columns is not None:
        sample = sample[:, columns]
    if np.count_nonzero(sample != np.median(sample, axis=0)) > 2 * SPARSE_TRAINING_DENSITY * (
        sample.size
    ):
        return None
    median = np.zeros(n_features)
    differing = 0
    # Column blocks of about 8 MiB: np.median copies what it reads.
    width = max(1, (1 << 20) // max(n_samples, 1))
    n_kept = n_features if columns is None else len(columns)
    for start in range(0, n_kept, width):
        # every column: slices, views, where an index array copies
        block = slice(start, start + width) if columns is None else columns[start : start + width]
        values = features[:, block]
        median[block] = np.median(values, axis=0)
        differing += int(np.count_nonzero(values != median[block]))
    if differing > SPARSE_TRAINING_DENSITY * n_samples * n_kept:
        return None
    return median


def _compact_columns(features: np.ndarray, columns: np.ndarray, height: int) -> np.ndarray:
    """``features[:, columns]`` written over ``features``' own memory where it may be
    (C-contiguous and writeable), a copy elsewhere: the design needs no second training set.

    Row block by row block, in order: a block's columns are copied out, then written where
    the compact matrix keeps them, which ends before the next block's rows begin.

    Parameters
    ----------
    features : ndarray of shape (n_samples, n_features)
        Overwritten where the result is made in place.
    columns : ndarray of shape (n_columns,), int, increasing
    height : int
        Rows copied at a time.

    Returns
    -------
    ndarray of shape (n_samples, n_columns), C-contiguous
    """
    if not (features.flags.c_contiguous and features.flags.writeable):
        return np.ascontiguousarray(features[:, columns])
    n_samples, width = features.shape[0], len(columns)
    flat = features.reshape(-1)
    for start in range(0, n_samples, height):
        stop = min(n_samples, start + height)
        flat[start * width : stop * width] = features[start:stop, columns].ravel()
    return flat[: n_samples * width].reshape(n_samples, width)


# The CPU clock's reading past which the solver stops, and the clock: set by cpu_time_limit.
_CPU_DEADLINE: ContextVar[tuple[float, Callable[[], float]] | None] = ContextVar(
    "solver_cpu_deadline", default=None
)


@contextlib.contextmanager
def cpu_time_limit(
    seconds: float | None, clock: Callable[[], float] = time.process_time
) -> Iterator[None]:
    """Within the block, :func:`solve_one_vs_rest` stops its Newton steps once ``clock`` (by
    default this process's CPU time, all its threads) reads ``seconds`` more than at the
    block's start: the problems not converged by then are left where they are, as at
    ``max_iter``, and the warning says the time limit stopped them. What bounds a selection's
    fits on the whole split by what is left of its budget
    (:mod:`training.selection.basis_ladder`): a fit there costs what its features and C make
    it, and neither is known before it runs. None: no limit. A fit on one thread passes its
    thread's clock (``time.thread_time``), so that other threads of the process do not count;
    the check reads the clock on whichever thread runs it, so a thread's clock is for a solver
    on that one thread (``n_jobs=1``) only.

    The limit is a context variable, read by :func:`solve_one_vs_rest` in the thread that calls
    it, which hands the solver a check of its own (the solver's threads share that check). The
    check runs before each Newton step: a step under way finishes, and the exact method builds
    its first Hessian (the Gram matrix of every item) before its first check."""
    deadline = None if seconds is None else (clock() + max(0.0, seconds), clock)
    token = _CPU_DEADLINE.set(deadline)
    try:
        yield
    finally:
        _CPU_DEADLINE.reset(token)


def _out_of_time() -> Callable[[], bool] | None:
    limit = _CPU_DEADLINE.get()
    if limit is None:
        return None
    deadline, clock = limit
    return lambda: clock() >= deadline


@dataclass(frozen=True)
class TrustRegionNewtonCG:
    """The one-vs-rest problems by trust-region Newton-CG over the in-memory loss
    (:func:`minimize_squared_hinge`): sparse designs, and dense ones too wide for
    :class:`ExactNewton`."""

    name = "trust-region Newton-CG"

    def solve(
        self, design, signs, C, max_iter, tolerance, start, n_threads, out_of_time=None
    ) -> Solution:
        loss = InMemorySquaredHinge(design, signs, C, n_threads=n_threads)
        return minimize_squared_hinge(loss, max_iter, tolerance, start, out_of_time)


@dataclass(frozen=True)
class ExactNewton:
    """The one-vs-rest problems by Newton's method with exact steps (:func:`exact_newton`):
    dense designs whose Hessians are small beside them (:func:`newton_method_for`)."""

    name = "exact Newton"

    def solve(
        self, design, signs, C, max_iter, tolerance, start, n_threads, out_of_time=None
    ) -> Solution:
        return exact_newton(design, signs, C, max_iter, tolerance, start, n_threads, out_of_time)


def newton_method_for(
    design, C: float, n_threads: int = 1, n_problems: int = 1
) -> TrustRegionNewtonCG | ExactNewton:
    """The method that solves the problems on ``design`` at ``C``: :class:`ExactNewton` where
    a problem's Hessian is a dense matrix small beside the design, :class:`TrustRegionNewtonCG`
    elsewhere.

    Small: at most ``EXACT_NEWTON_MAX_COLUMNS`` columns; or, on a tall design (at least
    ``EXACT_NEWTON_ROWS_PER_COLUMN`` items a column), up to
    :func:`~training.estimator.exact_newton.exact_newton_tall_columns` at ``C``, while the
    exact method's square matrices, counted as two a thread and four a problem in flight (Gram
    matrices, a Hessian and its factor), hold no more than the design itself."""
    n_samples, columns = design.shape[0], design.shape[1] + 1  # the bias's column too
    squares = 2 * n_threads + 4 * min(n_threads, n_problems)
    tall = min(
        n_samples // EXACT_NEWTON_ROWS_PER_COLUMN,
        n_samples // squares,
        exact_newton_tall_columns(C),
    )
    if sp.issparse(design) or columns > max(EXACT_NEWTON_MAX_COLUMNS, tall):
        return TrustRegionNewtonCG()
    return ExactNewton()


def fit_one_vs_rest(
    features: np.ndarray, codes: np.ndarray, n_classes: int, **options: Any
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """:func:`solve_one_vs_rest` on the design :func:`training_design` makes of ``features``.

    Parameters
    ----------
    features : ndarray of shape (n_samples, n_features)
        May be overwritten: shifted, or compacted (see :func:`training_design`).
    codes : ndarray of shape (n_samples,), int
    n_classes : int
    **options
        :func:`solve_one_vs_rest`'s keywords: ``C``, ``max_iter`` and ``n_jobs``, and
        optionally ``tol`` and ``start``.

    Returns
    -------
    coef, intercept, n_iter, train_accuracy
        As :func:`solve_one_vs_rest` returns them.
    """
    design, shift, columns = training_design(features)
    return solve_one_vs_rest(design, shift, codes, n_classes, columns=columns, **options)


def solve_one_vs_rest(
    design: np.ndarray | sp.csr_matrix,
    shift: np.ndarray,
    codes: np.ndarray,
    n_classes: int,
    *,
    C: float,
    max_iter: int,
    n_jobs: int,
    tol: float = TOLERANCE,
    start: tuple[np.ndarray, np.ndarray] | None = None,
    columns: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """LinearSVC's one-vs-rest problems (L2-regularised squared hinge, regularised bias), solved
    on the one shared feature matrix by the Newton method chosen for it
    (:func:`newton_method_for`), in ``n_jobs`` threads with one BLAS thread each (BLAS threads
    spin-wait, which slows the products many times over on busy cores): Newton-CG's products
    are each one pass over the items for every class still iterating, its row blocks in the
    threads; the exact Newton method solves the classes' problems side by side. The one
    in-memory solve:
    one process's fit, and a cluster's where the features fit one worker
    (:mod:`training.estimator.distributed_solver`).

    liblinear copies its training matrix (16 bytes per entry, once per problem trained at the
    same time); this solver only reads the matrix (the exact method copies a block of rows and
    holds a Hessian per thread), so peak memory stays near the features' size.

    Parameters
    ----------
    design : ndarray or csr_matrix of shape (n_samples, n_columns)
        The features as :func:`training_design` made them: only read, so that one design
        serves fits at several C (the selection's candidates that differ in C alone,
        :meth:`~training.estimator.estimator.BasisExpandingSVC.fit_expanded`).
    shift : ndarray of shape (n_features,)
        What :func:`training_design` took from the features: folded back into the intercepts,
        so that the model scores the features.
    codes : ndarray of shape (n_samples,), int
        Class index of each sample, in ``range(n_classes)``.
    n_classes : int
        At least 2. Two classes make one problem (class 1 against class 0).
    C : float
    max_iter : int
        Newton steps per problem at most; within a :func:`cpu_time_limit` block, only as many
        as its time allows.
    n_jobs : int
        Cores, at least 1. The result does not depend on it.
    tol : float, default=TOLERANCE
        LinearSVC's ``tol`` (see :func:`liblinear_tolerance`).
    start : (coef, intercept), optional
        A model of the features to start from (a warm start: the solution at a nearby C).
    columns : ndarray of shape (n_columns,), int, optional
        The features' columns the design holds (:func:`training_design`); the others are zero
        on every item and get weight zero. None: every column.

    Returns
    -------
    coef : ndarray of shape (n_classes, n_features)
        One row per class, also for two classes (rows ``-w`` and ``w``), so that every model
        scores and ranks its classes the same way.
    intercept : ndarray of shape (n_classes,)
    n_iter : int
        The most Newton steps any problem took.
    train_accuracy : float
    """
    problems = one_vs_rest_problems(n_classes)
    signs = problem_signs(codes, problems)
    tolerance = liblinear_tolerance((signs > 0).sum(axis=0), len(signs), tol)
    # A model of the features starts the design's problems with the shift folded in.
    start_W = None if start is None else problem_weights(start[0], start[1] + start[0] @ shift)
    if start_W is not None and columns is not None:
        start_W = start_W[np.append(columns, len(shift))]
    method = newton_method_for(design, C, n_jobs, signs.shape[1])
    with limit_threads(blas_threads=1):
        solution = method.solve(
            design, signs, C, max_iter, tolerance, start_W, n_jobs, _out_of_time()
        )
    del signs
    warn_unconverged([solution], max_iter)
    coef, intercept = one_vs_rest_weights(solution.W, n_classes)
    train_accuracy = correct_predictions(design, codes, coef, intercept) / len(codes)
    coef = feature_weights(coef, columns, len(shift))
    intercept -= coef @ shift  # the design's shift folded back: the model scores the features
    return coef, intercept, int(solution.n_iter.max()), train_accuracy


def feature_weights(coef: np.ndarray, columns: np.ndarray | None, n_features: int) -> np.ndarray:
    """The weights of a model of a design (:func:`training_design`) as weights of the
    features: zero on the columns the design left out.

    Parameters
    ----------
    coef : ndarray of shape (n_classes, n_columns)
    columns : ndarray of shape (n_columns,), int, or None (every column: ``coef`` itself)
    n_features : int

    Returns
    -------
    ndarray of shape (n_classes, n_features)
    """
    if columns is None:
        return coef
    full = np.zeros((len(coef), n_features))
    full[:, columns] = coef
    return full


def correct_predictions(design, codes: np.ndarray, coef: np.ndarray, intercept: np.ndarray) -> int:
    """How many items the model classifies as their class: the training accuracy's count (a
    cluster adds it up over its blocks).

    Parameters
    ----------
    design : ndarray or csr_matrix of shape (n_samples, n_features)
    codes : ndarray of shape (n_samples,), int
    coef : ndarray of shape (n_classes, n_features)
    intercept : ndarray of shape (n_classes,)

    Returns
    -------
    int
    """
    scores = design @ coef.T + intercept
    return int((scores.argmax(axis=1) == codes).sum())


def warn_unconverged(solutions, max_iter: int) -> None:
    """One ConvergenceWarning if a problem stopped at ``max_iter``, or at the time limit
    (:func:`cpu_time_limit`), before its tolerance."""
    if any(solution.out_of_time for solution in solutions):
        warnings.warn(
            "the SVM solver stopped at its CPU time limit before converging",
            ConvergenceWarning,
            stacklevel=3,
        )
    elif not all(solution.converged.all() for solution in solutions):
        warnings.warn(
            f"the SVM solver stopped at max_iter={max_iter} iterations before converging: "
            "increase max_iter, or lower C",
            ConvergenceWarning,
            stacklevel=3,
        )


def one_vs_rest_problems(n_classes: int) -> np.ndarray:
    """The class each one-vs-rest problem takes as its positive side: every class, or for two
    classes one problem, class 1 against class 0."""
    return np.array([1] if n_classes == 2 else range(n_classes))


def problem_signs(codes: np.ndarray, problems: np.ndarray) -> np.ndarray:
    """+1 where an item is of the problem's class, -1 elsewhere: shape (n_samples, K)."""
    return np.where(codes[:, None] == problems[None, :], 1.0, -1.0)


def problem_weights(coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    """The problems' weight columns of a model (:func:`one_vs_rest_weights` undone): what
    :func:`minimize_squared_hinge` starts from to warm-start on the same problems.

    Returns
    -------
    ndarray of shape (n_features + 1, n_problems)
    """
    if len(coef) == 2:  # one problem, class 1 against class 0
        coef, intercept = coef[1:], intercept[1:]
    return np.vstack([coef.T, intercept[None, :]])


def one_vs_rest_weights(weights: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The model's coefficients and intercepts from the problems' weight columns: one row per
    class, also for two classes (one problem, class 1 against 0: rows ``-w`` and ``w``), so
    that every model scores and ranks its classes the same way.

    Parameters
    ----------
    weights : ndarray of shape (n_features + 1, n_problems)
    n_classes : int

    Returns
    -------
    coef : ndarray of shape (n_classes, n_features)
    intercept : ndarray of shape (n_classes,)
    """
    coef, intercept = np.ascontiguousarray(weights[:-1].T), weights[-1].copy()
    if n_classes == 2:
        coef, intercept = np.vstack([-coef, coef]), np.concatenate([-intercept, intercept])
    return coef, intercept
