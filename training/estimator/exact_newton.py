"""Newton's method with exact steps for the one-vs-rest squared-hinge problems on small dense
designs (:func:`exact_newton`): each step a Cholesky solve with the Hessian of the problem's
active items, whose handful of steps does not depend on the features' conditioning.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import scipy.linalg

from training.estimator.newton_cg import TOLERANCE, Solution

# Dense designs of at most this many columns (the bias included) are solved by Newton's method
# with exact steps (ExactNewton); wider ones (but tall ones, below), and sparse ones, by
# trust-region Newton-CG. Up to
# about a thousand columns the exact method is as fast on well-conditioned features and many
# times faster on badly conditioned ones (its steps do not depend on the conditioning); a little
# wider, on well-conditioned features of many classes, its Hessians already cost more than
# Newton-CG's products (docs/measurements/model-selection.md, the solver stall, fixed).
EXACT_NEWTON_MAX_COLUMNS = 1024
# Wider dense designs too where they are tall, at least this many items a column (so that a
# step's factorisation is small beside its Gram matrices' products), memory permitting
# (training.estimator.solver.newton_method_for), up to EXACT_NEWTON_TALL_COLUMNS: on a tall
# design the first Hessian (the Gram matrix of every item, shared by the problems) costs what a
# few hundred conjugate gradients' products of all the problems cost, and the steps after it
# little more.
EXACT_NEWTON_ROWS_PER_COLUMN = 24
# ... up to these columns, by C (the smallest C each holds from; below the last, the narrow
# designs' EXACT_NEWTON_MAX_COLUMNS alone): the exact method's cost against Newton-CG's grows
# with the columns (its Hessians are d x d where CG's products are d long) and falls as C grows
# (CG's steps and products grow with C), and on tall designs it does not depend on the items
# (both are linear in them). Measured on the kernel's map of an rbf and a linear measure, 2,057
# columns (the bias's included), 10 classes, 2 threads (docs/measurements/model-selection.md,
# the exact method on tall designs, by C), the exact solver's seconds against Newton-CG's: 1.31
# at C = 0.1 (50,000 items), 0.79 at C = 1 (100,000), 0.58 at C = 10 (50,000), 0.34 at C = 100
# (50,000; 0.33 at 100,000). So the break-even is near 1,600 columns at C = 0.1, 2,600 at
# C = 1, 3,500 at C = 10 and 6,000 at C = 100; each range takes its lower end's.
EXACT_NEWTON_TALL_COLUMNS = ((100.0, 5120), (10.0, 3072), (1.0, 2560))
# Rows of the design read at a time for a Hessian (its active rows are copied: 32 MiB at most).
EXACT_NEWTON_ROWS = 4096


def exact_newton_tall_columns(C: float) -> int:
    """The columns (the bias's included) up to which a tall design is solved by the exact
    method at ``C``: those of :data:`EXACT_NEWTON_TALL_COLUMNS`' first entry whose C is at most
    it; below them (and for a C that is not a number), :data:`EXACT_NEWTON_MAX_COLUMNS`."""
    return next(
        (columns for smallest, columns in EXACT_NEWTON_TALL_COLUMNS if smallest <= C),
        EXACT_NEWTON_MAX_COLUMNS,
    )


def exact_newton(
    design: np.ndarray,
    signs: np.ndarray,
    C: float,
    max_iter: int,
    tolerance: float | np.ndarray = TOLERANCE,
    start: np.ndarray | None = None,
    n_threads: int = 1,
    out_of_time: Callable[[], bool] | None = None,
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
    out_of_time : callable, optional
        Asked before every Newton step: once it answers True each problem stops where it is,
        not converged (:func:`training.estimator.solver.cpu_time_limit`).

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
            out_of_time,
        )

    if n_threads == 1 or K == 1:
        for k in range(K):
            solve(k)
    else:
        with ThreadPoolExecutor(min(n_threads, K)) as pool:
            list(pool.map(solve, range(K)))
    # a problem left unconverged before max_iter steps was stopped by the time limit
    return Solution(W, n_iter, converged, bool((~converged & (n_iter < max_iter)).any()))


def _exact_newton_problem(
    design, y, C, max_iter, tolerance, w, gram=None, n_threads=1, out_of_time=None
):
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
        if step == max_iter or (out_of_time is not None and out_of_time()):
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
