"""Trust-region Newton-CG (liblinear's ``tron``) for the one-vs-rest squared-hinge problems over
any :class:`~training.estimator.squared_hinge.SquaredHingeLoss`, and the stopping rule every
method shares (:func:`liblinear_tolerance`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from training.estimator.squared_hinge import SquaredHingeLoss

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
        False where a problem stopped at ``max_iter`` Newton steps, or at its time limit,
        before its tolerance.
    out_of_time : bool
        The time limit stopped a problem (``out_of_time`` of the solvers).
    """

    W: np.ndarray
    n_iter: np.ndarray
    converged: np.ndarray
    out_of_time: bool = False


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
    out_of_time: Callable[[], bool] | None = None,
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
    out_of_time : callable, optional
        Asked after every Newton step: once it answers True the problems still iterating stop
        where they are, not converged (:func:`training.estimator.solver.cpu_time_limit`).

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
    timed_out = False
    while running.any():
        if out_of_time is not None and out_of_time():
            timed_out = True
            break
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
    return Solution(W, n_iter, converged, timed_out)


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
