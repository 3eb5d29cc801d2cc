r"""The linear SVM's solver: one-vs-rest L2-regularised squared-hinge problems (LinearSVC's
primal, ``liblinear -s 2``) solved on one shared feature matrix.

Two Newton methods solve them, one chosen per design (:func:`newton_method_for`): on dense
designs of at most :data:`EXACT_NEWTON_MAX_COLUMNS` columns, Newton's method with exact steps
(:func:`exact_newton`, each step a Cholesky solve with the Hessian of the problem's active items),
whose handful of steps does not depend on the features' conditioning; elsewhere trust-region
Newton-CG, which never forms a Hessian.

Newton-CG reads its data only through a :class:`SquaredHingeLoss`: the loss term's value and
gradient at some weights, and products of its generalised Hessian with a vector. The regulariser
and the Newton-CG iterations live here (:func:`minimize_squared_hinge`); where the data lives is
the loss's business. :class:`InMemorySquaredHinge` holds a feature matrix in this process, and
computes everything from the two products the method needs, the design times a block of weights
and the design transposed times a block of residuals, for every problem of a group at once.

:func:`fit_one_vs_rest` is the entry point of the estimator (:mod:`training.estimator.estimator`):
it makes the design (dense, or sparse around the column medians), solves the problems with the
method chosen for it, and folds the design's shift back into the intercepts.
"""

from __future__ import annotations

import itertools
import warnings
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from sklearn.exceptions import ConvergenceWarning

from service.model.threads import limit_threads
from training.estimator.hessian_kernels import dense_active_product, sparse_active_product

__all__ = [
    "EXACT_NEWTON_MAX_COLUMNS",
    "EXACT_NEWTON_ROWS",
    "MAX_ROW_BLOCKS",
    "ROWS_PER_BLOCK",
    "SPARSE_TRAINING_DENSITY",
    "TOLERANCE",
    "ExactNewton",
    "InMemorySquaredHinge",
    "Solution",
    "SquaredHingeLoss",
    "TrustRegionNewtonCG",
    "correct_predictions",
    "exact_newton",
    "fit_one_vs_rest",
    "liblinear_tolerance",
    "minimize_squared_hinge",
    "newton_method_for",
    "one_vs_rest_problems",
    "problem_signs",
    "problem_weights",
    "training_design",
]

# The SVM trains on sparse features when at most this fraction of them differ from their
# column's median (document measures: most pairs share no word): the solver's products then run
# several times faster (docs/measurements/benchmarks.md, "The SVM solver against LinearSVC"), on
# the same problem up to the intercept, which is folded back exactly.
SPARSE_TRAINING_DENSITY = 0.25
# Rows of the sample that tells dense features at once (see training_design).
DENSITY_SAMPLE_ROWS = 1024


def training_design(features: np.ndarray) -> tuple[np.ndarray | sp.csr_matrix, np.ndarray]:
    """The matrix the SVM trains on, and the shift that makes it from ``features``.

    When at most :data:`SPARSE_TRAINING_DENSITY` of the entries differ from their column's
    median, the features minus those medians, as a sparse matrix (``features`` is shifted in
    place); otherwise the features themselves and a zero shift. A linear model on shifted
    features is the same model with another intercept: the caller folds ``shift`` back in
    (``b - w . shift``).

    Returns
    -------
    design : ndarray or csr_matrix of shape (n_samples, n_features)
    shift : ndarray of shape (n_features,)
    """
    n_samples, n_features = features.shape
    # Evenly spaced rows first: where even they differ from their own medians twice as often as
    # the threshold, the features are dense, and the medians of every row (a partition of each
    # column, the slowest step after the products on large features) are not needed.
    sample = features[:: max(1, n_samples // DENSITY_SAMPLE_ROWS)]
    if np.count_nonzero(sample != np.median(sample, axis=0)) > 2 * SPARSE_TRAINING_DENSITY * (
        sample.size
    ):
        return features, np.zeros(n_features)
    median = np.empty(n_features)
    differing = 0
    # Column blocks of about 8 MiB: np.median copies what it reads.
    width = max(1, (1 << 20) // max(n_samples, 1))
    for start in range(0, n_features, width):
        block = features[:, start : start + width]
        median[start : start + width] = np.median(block, axis=0)
        differing += int(np.count_nonzero(block != median[start : start + width]))
    if differing > SPARSE_TRAINING_DENSITY * features.size:
        return features, np.zeros(n_features)
    features -= median
    return sp.csr_matrix(features), median


class SquaredHingeLoss(ABC):
    r"""The data term of K one-vs-rest squared-hinge problems, as the solver reads it.

    .. math:: L_k(w_k, b_k) = C \sum_i \max(0, 1 - y_{ik} (w_k \cdot x_i + b_k))^2

    Weights are blocks of columns, one per problem: the problem's weights, then its bias, so
    a block has ``n_features + 1`` rows. Every method takes the weights of some of the problems,
    ``W[:, j]`` those of problem ``problems[j]``, and answers for those only: the solver stops
    asking about a problem once it has converged. Implementations decide where the items live;
    a sum over shards held elsewhere serves as well as a matrix in memory, since every answer is
    a sum over items.

    The generalised Hessian of problem k at ``w_k`` is :math:`2C X_A^\top X_A` (with the bias
    column), A the items with positive slack there: implementations may keep the active sets
    of the points they were last asked about, per problem.

    Attributes
    ----------
    n_features : int
        Features of an item (the bias is not counted).
    n_problems : int
        K, the problems solved together.
    """

    n_features: int
    n_problems: int

    @abstractmethod
    def value_and_gradient(
        self, W: np.ndarray, problems: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """:math:`L_k` for each problem listed, and its gradient.

        Parameters
        ----------
        W : ndarray of shape (n_features + 1, len(problems))
        problems : ndarray of int

        Returns
        -------
        values : ndarray of shape (len(problems),)
        gradient : ndarray of shape (n_features + 1, len(problems))
        """

    @abstractmethod
    def hessian_product(self, W: np.ndarray, V: np.ndarray, problems: np.ndarray) -> np.ndarray:
        r"""Each listed problem's generalised Hessian at its column of ``W`` times its column of
        ``V`` (:math:`2C X_A^\top X_A v`, with the bias); an array of the shape of ``V``."""


# The in-memory loss sums over row blocks of about this many items (at most MAX_ROW_BLOCKS of them),
# computed in a pool of n_jobs threads and added in their order: the blocks depend only on the
# data, so a model is the same whatever the cores it was trained on, to the bit.
ROWS_PER_BLOCK = 4096
MAX_ROW_BLOCKS = 32


def row_blocks(n_samples: int) -> list[slice]:
    """The fixed row blocks of :class:`InMemorySquaredHinge` for ``n_samples`` items."""
    n_blocks = int(np.clip(-(-n_samples // ROWS_PER_BLOCK), 1, MAX_ROW_BLOCKS))
    bounds = np.linspace(0, n_samples, n_blocks + 1).astype(np.int64)
    return [slice(int(a), int(b)) for a, b in itertools.pairwise(bounds)]


def _rows_of(design, rows: slice):
    """A block of rows without copying the matrix's values (a CSR view shares them)."""
    if not sp.issparse(design):
        return design[rows]
    start, stop = design.indptr[rows.start], design.indptr[rows.stop]
    return sp.csr_matrix(
        (
            design.data[start:stop],
            design.indices[start:stop],
            design.indptr[rows.start : rows.stop + 1] - start,
        ),
        shape=(rows.stop - rows.start, design.shape[1]),
        copy=False,
    )


class InMemorySquaredHinge(SquaredHingeLoss):
    """:class:`SquaredHingeLoss` over a feature matrix held in this process.

    Every evaluation is a sum over fixed row blocks (:func:`row_blocks`), each block's term
    computed for all the problems asked about at once (matrix products, and the active-rows
    kernel of :func:`active_rows_product`), the blocks in a pool of ``n_threads`` threads
    (numpy and numba release the GIL). The items with positive slack are kept per problem, for
    the point last evaluated, and found again only for the problems whose point changed.

    Parameters
    ----------
    design : ndarray or csr_matrix of shape (n_samples, n_features)
    signs : ndarray of shape (n_samples, K)
        +1 for the problem's class, -1 for the others.
    C : float
    n_threads : int, default=1
        Threads computing the blocks' terms. The result does not depend on it.
    """

    def __init__(self, design, signs: np.ndarray, C: float, n_threads: int = 1):
        self.design = design if sp.issparse(design) else np.ascontiguousarray(design)
        self.signs, self.C = signs, C
        self.n_features, self.n_problems = design.shape[1], signs.shape[1]
        self.n_threads = n_threads
        self._blocks = [(rows, _rows_of(self.design, rows)) for rows in row_blocks(len(signs))]
        # Per problem: the point its active set was found at (NaN: none yet), and the set.
        self._point = np.full((self.n_features + 1, self.n_problems), np.nan)
        self._active = np.zeros(signs.shape, dtype=bool)

    def _each_block(self, term):
        """``term(rows, block)`` for every block, in block order."""
        if self.n_threads == 1 or len(self._blocks) == 1:
            return [term(rows, block) for rows, block in self._blocks]
        with ThreadPoolExecutor(min(self.n_threads, len(self._blocks))) as pool:
            return list(pool.map(lambda item: term(*item), self._blocks))

    def _remember(self, W: np.ndarray, problems: np.ndarray, active: np.ndarray) -> None:
        self._point[:, problems] = W
        self._active[:, problems] = active

    def _active_at(self, W: np.ndarray, problems: np.ndarray) -> np.ndarray:
        stale = np.flatnonzero((self._point[:, problems] != W).any(axis=0))
        if len(stale):
            some = problems[stale]
            parts = self._each_block(
                lambda rows, block: active_items(block, self.signs[rows][:, some], W[:, stale])
            )
            self._remember(W[:, stale], some, np.vstack(parts))
        return self._active[:, problems]

    def value_and_gradient(self, W, problems):
        parts = self._each_block(
            lambda rows, block: squared_hinge_terms(block, self.signs[rows][:, problems], W, self.C)
        )
        self._remember(W, problems, np.vstack([active for _, _, active in parts]))
        return _added([values for values, _, _ in parts]), _added([g for _, g, _ in parts])

    def hessian_product(self, W, V, problems):
        active = self._active_at(W, problems)
        return _added(
            self._each_block(
                lambda rows, block: squared_hinge_hessian_product(block, active[rows], V, self.C)
            )
        )


def _added(parts: list[np.ndarray]) -> np.ndarray:
    """The sum of the blocks' terms, in block order."""
    total = parts[0].copy()
    for part in parts[1:]:
        total += part
    return total


def _scores(design, W: np.ndarray) -> np.ndarray:
    scores = design @ W[:-1]
    scores += W[-1]
    return scores


def active_items(design, signs: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Which items have positive slack in each problem at its column of ``W``.

    Parameters
    ----------
    design : ndarray or csr_matrix of shape (n_samples, n_features)
    signs : ndarray of shape (n_samples, k)
    W : ndarray of shape (n_features + 1, k)

    Returns
    -------
    ndarray of shape (n_samples, k), bool
    """
    margins = _scores(design, W)
    margins *= signs
    return margins < 1.0


def squared_hinge_terms(
    design, signs: np.ndarray, W: np.ndarray, C: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The squared hinge's value and gradient for each problem, and its active items: what
    :meth:`SquaredHingeLoss.value_and_gradient` sums, over the items of ``design``.

    Parameters
    ----------
    design : ndarray or csr_matrix of shape (n_samples, n_features)
    signs : ndarray of shape (n_samples, k)
    W : ndarray of shape (n_features + 1, k)
    C : float

    Returns
    -------
    values : ndarray of shape (k,)
    gradient : ndarray of shape (n_features + 1, k)
    active : ndarray of shape (n_samples, k), bool
    """
    slack = _scores(design, W)
    slack *= signs
    np.subtract(1.0, slack, out=slack)  # 1 - y (w . x + b)
    active = slack > 0.0
    np.maximum(slack, 0.0, out=slack)
    values = C * np.einsum("ij,ij->j", slack, slack)
    slack *= signs
    slack *= -2.0 * C  # the loss's derivative by each score
    gradient = np.empty((W.shape[0], W.shape[1]))
    gradient[:-1] = design.T @ slack
    gradient[-1] = slack.sum(axis=0)
    return values, gradient, active


def squared_hinge_hessian_product(design, active: np.ndarray, V: np.ndarray, C: float):
    r"""The generalised Hessian products :math:`2C X_{A_k}^\top X_{A_k} v_k` (bias included)
    over the items of ``design``; ``active`` from :func:`active_items`. The shape of ``V``."""
    out = active_rows_product(design, active, V)
    out *= 2.0 * C
    return out


def active_rows_product(design, active: np.ndarray, V: np.ndarray) -> np.ndarray:
    r"""Each problem's :math:`X_{A_k}^\top X_{A_k} v_k`, the bias column included, reading only
    the active items' rows (:mod:`training.estimator.hessian_kernels`).

    Parameters
    ----------
    design : ndarray (C-contiguous) or csr_matrix of shape (n_samples, n_features)
    active : ndarray of shape (n_samples, k), bool
    V : ndarray of shape (n_features + 1, k)

    Returns
    -------
    ndarray of shape (n_features + 1, k)
    """
    out = np.zeros((V.shape[1], V.shape[0]))
    vectors = np.ascontiguousarray(V.T)
    active = np.ascontiguousarray(active)
    if sp.issparse(design):
        sparse_active_product(design.data, design.indices, design.indptr, active, vectors, out)
    else:
        dense_active_product(design, active, vectors, out)
    return out.T


# The solver's stopping rule is liblinear's, with LinearSVC's ``tol`` (see liblinear_tolerance),
# tighter than LinearSVC's default 1e-4 so that a model is LinearSVC's optimum rather than wherever
# a solver stopped, at little cost: Newton converges fast at the end (docs/measurements/
# benchmarks.md, the solver against LinearSVC).
TOLERANCE = 1e-8

# Trust-region Newton's constants, liblinear's (tron.cpp): a step is taken when the objective
# falls by more than ETA[0] of the quadratic model's prediction; the region shrinks or grows by
# the SIGMA factors as the ratio of the two falls passes ETA[1] and ETA[2].
ETA = (1e-4, 0.25, 0.75)
SIGMA = (0.25, 0.5, 4.0)
# The conjugate gradients of a Newton step stop when the residual is below this fraction of the
# gradient (liblinear's rule before 2.20; LinearSVC's liblinear), without preconditioning: the
# fastest of the rules measured (docs/measurements/benchmarks.md).
CG_TOLERANCE = 0.1


@dataclass(frozen=True)
class Solution:
    """What :func:`minimize_squared_hinge` found.

    Attributes
    ----------
    W : ndarray of shape (n_features + 1, K)
        Each problem's weights, then its bias.
    n_iter : ndarray of shape (K,), int
        Newton steps each problem took.
    converged : ndarray of shape (K,), bool
        False where a problem stopped at ``max_iter`` Newton steps before its tolerance.
    """

    W: np.ndarray
    n_iter: np.ndarray
    converged: np.ndarray


def liblinear_tolerance(positives: np.ndarray, n_samples: int, tol: float) -> np.ndarray:
    """liblinear's stopping tolerance of each problem (LinearSVC's ``tol``): ``tol`` scaled by
    the smaller side's share of the items, so that a small class is solved as precisely as a
    balanced problem; but never below ``n_samples`` machine epsilons.

    The gradient is a sum over the items, so its computed value is only known to about
    ``n_samples`` rounding errors of its norm at zero weights: a tolerance below that asks for
    digits the arithmetic does not have (a class of a few items in tens of thousands, scaled
    from the default ``tol``).

    Parameters
    ----------
    positives : ndarray of shape (K,), int
        Items on each problem's positive side.
    n_samples : int
    tol : float

    Returns
    -------
    ndarray of shape (K,)
        The fraction of its gradient's norm at zero weights below which a problem stops.
    """
    smaller = np.minimum(positives, n_samples - positives)
    scaled = tol * np.maximum(smaller, 1) / max(n_samples, 1)
    return np.maximum(scaled, max(n_samples, 1) * np.finfo(np.float64).eps)


def minimize_squared_hinge(
    loss: SquaredHingeLoss,
    max_iter: int,
    tolerance: float | np.ndarray = TOLERANCE,
    start: np.ndarray | None = None,
) -> Solution:
    """Minimise :math:`\\lVert w_k\\rVert^2 / 2 + L_k(w_k)` for each problem k by trust-region
    Newton-CG (liblinear's primal method, ``tron.cpp``).

    Each problem has its own trust region and its own conjugate gradients, and stops when it
    has converged; but the problems move in lockstep, so that each product the loss computes
    serves every problem still iterating (one pass over the data, however many problems).

    Parameters
    ----------
    loss : SquaredHingeLoss
    max_iter : int
        Newton steps per problem at most.
    tolerance : float or ndarray of shape (K,), default=TOLERANCE
        A problem stops when its gradient's norm is below this fraction of its norm at zero
        weights (:func:`liblinear_tolerance` makes LinearSVC's).
    start : ndarray of shape (n_features + 1, K), optional
        Weights to start from (a warm start: the solution at a nearby C); default zero. The
        stopping rule still measures the gradient against its norm at zero, as liblinear's does
        with an initial model, so a warm start stops where a cold one would.

    Returns
    -------
    Solution
    """
    K = loss.n_problems
    W = np.zeros((loss.n_features + 1, K))
    f, G = loss.value_and_gradient(W, np.arange(K))
    stop_at = np.asarray(tolerance, dtype=float) * np.linalg.norm(G, axis=0)
    if start is not None:
        W = np.array(start, dtype=np.float64)
        f, G = loss.value_and_gradient(W, np.arange(K))
        G += W
        f = f + 0.5 * _dots(W, W)
    gradient_norm = np.linalg.norm(G, axis=0)
    radius = gradient_norm.copy()
    first_step = np.ones(K, dtype=bool)
    n_iter = np.zeros(K, dtype=np.int64)
    running = gradient_norm > stop_at
    converged = ~running
    while running.any():
        problems = np.flatnonzero(running)
        W_now, G_now = W[:, problems], G[:, problems]
        S, R, on_boundary = _conjugate_gradients(loss, W_now, G_now, radius[problems], problems)
        W_new = W_now + S
        values, G_new = loss.value_and_gradient(W_new, problems)
        G_new += W_new
        f_new = values + 0.5 * _dots(W_new, W_new)
        gs = _dots(G_now, S)
        predicted = -0.5 * (gs - _dots(S, R))
        actual = f[problems] - f_new
        step = np.sqrt(_dots(S, S))
        r = radius[problems]
        r = np.where(first_step[problems], np.minimum(r, step), r)
        first_step[problems] = False
        radius[problems] = _new_radius(
            r, step, actual, predicted, gs, f_new - f[problems] - gs, on_boundary
        )
        taken = actual > ETA[0] * predicted
        moved = problems[taken]
        W[:, moved], G[:, moved], f[moved] = W_new[:, taken], G_new[:, taken], f_new[taken]
        n_iter[moved] += 1
        reached = np.linalg.norm(G[:, problems], axis=0) <= stop_at[problems]
        converged[problems[reached]] = True
        # liblinear's safeguards: a model that predicts no fall, or falls too small to see in
        # the objective's digits, end the problem where it is (converged as far as it can).
        stalled = (predicted <= 0) | (
            (np.abs(actual) <= 1e-12 * np.abs(f[problems]))
            & (np.abs(predicted) <= 1e-12 * np.abs(f[problems]))
        )
        converged[problems[stalled]] = True
        running[problems[reached | stalled | (n_iter[problems] >= max_iter)]] = False
    return Solution(W, n_iter, converged)


# Dense designs of at most this many columns (the bias included) are solved by Newton's method
# with exact steps (ExactNewton); wider ones, and sparse ones, by trust-region Newton-CG. Up to
# about a thousand columns the exact method is as fast on well-conditioned features and many
# times faster on badly conditioned ones (its steps do not depend on the conditioning); a little
# wider, on well-conditioned features of many classes, its Hessians already cost more than
# Newton-CG's products (docs/measurements/model-selection.md, the solver stall, fixed).
EXACT_NEWTON_MAX_COLUMNS = 1024
# Rows of the design read at a time for a Hessian (its active rows are copied: 32 MiB at most).
EXACT_NEWTON_ROWS = 4096


def exact_newton(
    design: np.ndarray,
    signs: np.ndarray,
    C: float,
    max_iter: int,
    tolerance: float | np.ndarray = TOLERANCE,
    start: np.ndarray | None = None,
    n_threads: int = 1,
) -> Solution:
    r"""Minimise each problem's objective by Newton's method with exact steps and an exact line
    search (the finite Newton method of Keerthi and DeCoste, 2005, for LinearSVC's problem).

    Each step solves :math:`(I + 2C X_A^\top X_A) s = -g` by Cholesky, :math:`A` the items with
    positive slack, and moves to the minimum of the objective along :math:`s`. The objective is
    piecewise quadratic, so the steps end once the active set stops changing: a handful, however
    badly conditioned the features, where the conjugate gradients of the trust-region method
    need more products the worse they are conditioned.

    Parameters
    ----------
    design : ndarray of shape (n_samples, n_features)
        Dense.
    signs : ndarray of shape (n_samples, K)
    C : float
    max_iter : int
        Newton steps per problem at most.
    tolerance : float or ndarray of shape (K,), default=TOLERANCE
        :func:`minimize_squared_hinge`'s stopping rule.
    start : ndarray of shape (n_features + 1, K), optional
        Weights to start from; default zero.
    n_threads : int, default=1
        Problems solved side by side; where they are fewer than the threads, each problem's
        Hessians are summed over blocks of rows in its share of them. The result does not depend
        on it.

    Returns
    -------
    Solution
    """
    design = np.ascontiguousarray(design)
    K = signs.shape[1]
    W = np.zeros((design.shape[1] + 1, K)) if start is None else np.array(start, dtype=np.float64)
    tolerance = np.broadcast_to(np.asarray(tolerance, dtype=float), (K,))
    n_iter = np.zeros(K, dtype=np.int64)
    converged = np.zeros(K, dtype=bool)

    # From zero weights every item has slack 1: every problem's first Hessian is the Gram
    # matrix of all the items, computed once.
    every_item = None if start is not None else _rows_gram(design, slice(None), n_threads)
    threads_each = max(1, n_threads // K)

    def solve(k: int) -> None:
        W[:, k], n_iter[k], converged[k] = _exact_newton_problem(
            design,
            np.ascontiguousarray(signs[:, k]),
            C,
            max_iter,
            tolerance[k],
            W[:, k],
            every_item,
            threads_each,
        )

    if n_threads == 1 or K == 1:
        for k in range(K):
            solve(k)
    else:
        with ThreadPoolExecutor(min(n_threads, K)) as pool:
            list(pool.map(solve, range(K)))
    return Solution(W, n_iter, converged)


def _exact_newton_problem(design, y, C, max_iter, tolerance, w, gram=None, n_threads=1):
    """One problem of :func:`exact_newton`: its weights, Newton steps and whether it converged.

    ``gram`` is the Gram matrix of the items active at ``w`` (None: computed here); each step
    after updates it by the items that entered or left the active set where they are fewer than
    the active items (late steps change a few)."""
    w = w.copy()
    was_active = np.ones(len(y), dtype=bool) if gram is not None else None
    data_term = np.empty_like(w)
    data_term[:-1], data_term[-1] = design.T @ y, y.sum()
    stop_at = tolerance * 2.0 * C * np.linalg.norm(data_term)  # the gradient's norm at zero
    for step in range(max_iter + 1):
        scores = design @ w[:-1]
        scores += w[-1]
        slack = 1.0 - y * scores
        active = slack > 0.0
        residual = np.where(active, y * slack, 0.0)
        gradient = w.copy()
        gradient[:-1] -= 2.0 * C * (design.T @ residual)
        gradient[-1] -= 2.0 * C * residual.sum()
        if np.linalg.norm(gradient) <= stop_at:
            return w, step, True
        if step == max_iter:
            return w, step, False
        gram = _updated_gram(design, gram, was_active, active, n_threads)
        was_active = active
        hessian = gram * (2.0 * C)
        hessian[np.diag_indices_from(hessian)] += 1.0
        direction = -_newton_direction(hessian, gradient)
        along = design @ direction[:-1]
        along += direction[-1]
        t = _line_minimum(w, direction, y, scores, along, C)
        if not t * np.linalg.norm(direction) > 1e-15 * (1.0 + np.linalg.norm(w)):
            return w, step, True  # no move the arithmetic can see: converged as far as it can
        w += t * direction
    return w, max_iter, False


def _newton_direction(hessian: np.ndarray, gradient: np.ndarray) -> np.ndarray:
    """``hessian`` solved for ``gradient``: by Cholesky, or where rounding leaves the Hessian of
    a huge C and nearly dependent features not numerically positive definite, by least squares
    (the pseudo-inverse's step is still a descent direction, and the line search takes what it
    gains)."""
    try:
        factor = scipy.linalg.cho_factor(hessian, check_finite=False)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(hessian, gradient, rcond=None)[0]
    return scipy.linalg.cho_solve(factor, gradient, check_finite=False)


def _updated_gram(design, gram, was_active, active, n_threads) -> np.ndarray:
    """The Gram matrix of the ``active`` items: ``gram`` (that of ``was_active``) plus the
    items that entered and minus those that left, where they are fewer than the active items;
    otherwise computed anew (also without a ``gram``)."""
    if gram is not None:
        entered, left = active & ~was_active, was_active & ~active
        if entered.sum() + left.sum() < active.sum():
            return (
                gram + _rows_gram(design, entered, n_threads) - _rows_gram(design, left, n_threads)
            )
    return _rows_gram(design, active, n_threads)


def _rows_gram(design: np.ndarray, rows, n_threads: int = 1) -> np.ndarray:
    r""":math:`[X_R, 1]^\top [X_R, 1]` of the items ``rows`` (a mask, or every item): a sum over
    fixed blocks of rows, ``n_threads`` blocks at a time, added in their order (the same sum
    whatever the threads)."""
    d = design.shape[1]

    def term(start: int) -> np.ndarray:
        block = design[start : start + EXACT_NEWTON_ROWS]
        if not isinstance(rows, slice):
            block = block[rows[start : start + EXACT_NEWTON_ROWS]]
        out = np.zeros((d + 1, d + 1))
        out[:d, :d] = block.T @ block
        out[:d, d] = block.sum(axis=0)
        out[d, d] = len(block)
        return out

    starts = range(0, len(design), EXACT_NEWTON_ROWS)
    gram = np.zeros((d + 1, d + 1))
    if n_threads == 1 or len(starts) == 1:
        for start in starts:
            gram += term(start)
    else:
        with ThreadPoolExecutor(n_threads) as pool:
            for first in range(0, len(starts), n_threads):
                for part in pool.map(term, starts[first : first + n_threads]):
                    gram += part
    gram[d, :d] = gram[:d, d]
    return gram


def _line_minimum(w, direction, y, scores, along, C) -> float:
    r"""The step :math:`t \ge 0` that minimises the objective along ``direction``:

    .. math:: \phi(t) = \tfrac12 \lVert w + t s\rVert^2 + C \sum_i \max(0, 1 - y_i (o_i + t
       d_i))^2

    (``scores`` :math:`o`, ``along`` :math:`d`), convex and piecewise quadratic with a
    continuous slope: Newton's method on the slope, kept inside a bracket of a negative and a
    positive slope (bisection where a Newton point leaves it)."""
    ws, ss = float(w @ direction), float(direction @ direction)
    margin_change = y * along

    def slope_and_curvature(t):
        slack = 1.0 - y * scores - t * margin_change
        active = slack > 0.0
        slope = ws + t * ss - 2.0 * C * float(margin_change[active] @ slack[active])
        return slope, ss + 2.0 * C * float(along[active] @ along[active])

    low, high = 0.0, 1.0
    slope_high, curvature = slope_and_curvature(high)
    while slope_high < 0.0 and high < 1e12:  # the Newton step falls short: reach further
        low, high = high, 2.0 * high
        slope_high, curvature = slope_and_curvature(high)
    if slope_high <= 0.0:
        return high
    t, slope = high, slope_high
    for _ in range(100):
        newton = t - slope / curvature
        t = newton if low < newton < high else 0.5 * (low + high)
        slope, curvature = slope_and_curvature(t)
        if slope < 0.0:
            low = t
        elif slope > 0.0:
            high = t
        else:
            break
        if high - low <= 1e-12 * high:
            break
    return t


@dataclass(frozen=True)
class TrustRegionNewtonCG:
    """The one-vs-rest problems by trust-region Newton-CG over the in-memory loss
    (:func:`minimize_squared_hinge`): sparse designs, and dense ones too wide for
    :class:`ExactNewton`."""

    name = "trust-region Newton-CG"

    def solve(self, design, signs, C, max_iter, tolerance, start, n_threads) -> Solution:
        loss = InMemorySquaredHinge(design, signs, C, n_threads=n_threads)
        return minimize_squared_hinge(loss, max_iter, tolerance, start)


@dataclass(frozen=True)
class ExactNewton:
    """The one-vs-rest problems by Newton's method with exact steps (:func:`exact_newton`):
    dense designs of at most :data:`EXACT_NEWTON_MAX_COLUMNS` columns."""

    name = "exact Newton"

    def solve(self, design, signs, C, max_iter, tolerance, start, n_threads) -> Solution:
        return exact_newton(design, signs, C, max_iter, tolerance, start, n_threads)


def newton_method_for(design) -> TrustRegionNewtonCG | ExactNewton:
    """The method that solves the problems on ``design``: :class:`ExactNewton` where a
    problem's Hessian is a small dense matrix, :class:`TrustRegionNewtonCG` elsewhere."""
    if sp.issparse(design) or design.shape[1] + 1 > EXACT_NEWTON_MAX_COLUMNS:
        return TrustRegionNewtonCG()
    return ExactNewton()


def _dots(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """The dot product of each column of ``A`` with the same column of ``B``."""
    return np.einsum("ij,ij->j", A, B)


def _new_radius(radius, step, actual, predicted, gs, curvature, on_boundary):
    """liblinear's trust-region update, for each problem (``tron.cpp``)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = np.where(curvature <= 0, SIGMA[2], np.maximum(SIGMA[0], -0.5 * gs / curvature))
    scaled = alpha * step
    return np.select(
        [
            actual < ETA[0] * predicted,
            actual < ETA[1] * predicted,
            actual < ETA[2] * predicted,
            on_boundary,
        ],
        [
            np.minimum(scaled, SIGMA[1] * radius),
            np.maximum(SIGMA[0] * radius, np.minimum(scaled, SIGMA[1] * radius)),
            np.maximum(SIGMA[0] * radius, np.minimum(scaled, SIGMA[2] * radius)),
            SIGMA[2] * radius,
        ],
        np.maximum(radius, np.minimum(scaled, SIGMA[2] * radius)),
    )


def _conjugate_gradients(loss, W, G, radius, problems):
    """Conjugate gradients on each problem's Newton system inside its trust region
    (liblinear's ``trcg``), the Hessian products of all problems still iterating in one call.

    Returns
    -------
    S : ndarray of shape (n_features + 1, k)
        The steps.
    R : ndarray of shape (n_features + 1, k)
        The residuals ``-g - H s``.
    on_boundary : ndarray of shape (k,), bool
        Whether the step reached the trust region's boundary.
    """
    n, k = G.shape
    S = np.zeros((n, k))
    R = -G
    D = R.copy()
    rr = _dots(R, R)
    stop_at = CG_TOLERANCE * np.sqrt(rr)
    on_boundary = np.zeros(k, dtype=bool)
    going = np.ones(k, dtype=bool)
    iterations = 0
    while going.any() and iterations < max(n, 5):
        iterations += 1
        c = np.flatnonzero(going)
        Dc = D[:, c]
        HD = loss.hessian_product(W[:, c], Dc, problems[c])
        HD += Dc
        dHd = _dots(Dc, HD)
        flat = dHd <= 1e-16  # no curvature left along D: stop where it is
        with np.errstate(divide="ignore", invalid="ignore"):
            alpha = np.where(flat, 0.0, rr[c] / dHd)
        S_try = S[:, c] + alpha * Dc
        out = ~flat & (_dots(S_try, S_try) > radius[c] ** 2)
        if out.any():
            # From S along D to the boundary: the positive root of |S + t D| = radius.
            o, So, Do = c[out], S[:, c[out]], Dc[:, out]
            sd, ss, dd = _dots(So, Do), _dots(So, So), _dots(Do, Do)
            squared = radius[o] ** 2
            root = np.sqrt(sd**2 + dd * (squared - ss))
            with np.errstate(divide="ignore", invalid="ignore"):
                t = np.where(sd >= 0, (squared - ss) / (sd + root), (root - sd) / dd)
            S[:, o] = So + t * Do
            R[:, o] -= t * HD[:, out]
            on_boundary[o] = True
        inside = ~flat & ~out
        i = c[inside]
        S[:, i] = S_try[:, inside]
        R[:, i] -= alpha[inside] * HD[:, inside]
        rr_new = _dots(R[:, i], R[:, i])
        done = np.sqrt(rr_new) <= stop_at[i]
        going[c[~inside]] = False
        going[i[done]] = False
        more, rr_more = i[~done], rr_new[~done]
        D[:, more] = R[:, more] + (rr_more / rr[more]) * D[:, more]
        rr[more] = rr_more
    return S, R, on_boundary


def fit_one_vs_rest(
    features: np.ndarray,
    codes: np.ndarray,
    n_classes: int,
    *,
    C: float,
    max_iter: int,
    n_jobs: int,
    tol: float = TOLERANCE,
    start: tuple[np.ndarray, np.ndarray] | None = None,
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
    features : ndarray of shape (n_samples, n_features)
        May be shifted in place (see :func:`training_design`).
    codes : ndarray of shape (n_samples,), int
        Class index of each sample, in ``range(n_classes)``.
    n_classes : int
        At least 2. Two classes make one problem (class 1 against class 0).
    C : float
    max_iter : int
        Newton steps per problem at most.
    n_jobs : int
        Cores, at least 1. The result does not depend on it.
    tol : float, default=TOLERANCE
        LinearSVC's ``tol`` (see :func:`liblinear_tolerance`).
    start : (coef, intercept), optional
        A model to start from (a warm start: the solution at a nearby C).

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
    design, shift = training_design(features)
    problems = one_vs_rest_problems(n_classes)
    signs = problem_signs(codes, problems)
    tolerance = liblinear_tolerance((signs > 0).sum(axis=0), len(signs), tol)
    # A model of the features starts the design's problems with the shift folded in.
    start_W = None if start is None else problem_weights(start[0], start[1] + start[0] @ shift)
    method = newton_method_for(design)
    with limit_threads(blas_threads=1):
        solution = method.solve(design, signs, C, max_iter, tolerance, start_W, n_jobs)
    del signs
    warn_unconverged([solution], max_iter)
    coef, intercept = one_vs_rest_weights(solution.W, n_classes)
    train_accuracy = correct_predictions(design, codes, coef, intercept) / len(codes)
    intercept -= coef @ shift  # the design's shift folded back: the model scores the features
    return coef, intercept, int(solution.n_iter.max()), train_accuracy


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
    """One ConvergenceWarning if a problem stopped at ``max_iter`` before its tolerance."""
    if not all(solution.converged.all() for solution in solutions):
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
