r"""The l1-regularised squared-hinge linear SVM along its regularisation path: how /search
learns a sparse code from a few examples in about a millisecond.

The problem is liblinear's ``-s 5`` (scikit-learn's ``LinearSVC(penalty="l1", dual=False)``),
the bias being one more feature of value 1, penalised like the others:

.. math:: \min_w F_C(w) = \|w\|_1 + C \sum_{i=1}^{n} c_i \max(0,\ b_i)^2,
          \qquad b_i = 1 - w^\top z_i, \quad z_i = y_i\,[x_i, 1]

with per-sample weights :math:`c_i` (class weights). The data are stored feature major, ``Z``
of shape (p, n), row j holding :math:`z_{ij}` for every sample; the slacks :math:`b_i` are kept
up to date with ``w``.

**Solver** (:func:`solve_l1_svm`): Newton steps on an active set, each step's model solved
exactly, in the manner of newGLMNET (Yuan, Ho and Lin, JMLR 2012). At ``w``, with
:math:`I = \{i : b_i > 0\}`, the loss term has gradient and generalised Hessian

.. math:: g = -2C \sum_{i \in I} c_i b_i z_i, \qquad H = 2C \sum_{i \in I} c_i z_i z_i^\top.

The working set W holds the non-zero coordinates and those violating their optimality
condition (:func:`l1_violation`); the model :math:`\tfrac12 d^\top H_{WW} d + g_W^\top d +
\|w_W + d\|_1` is minimised exactly by feature-sign search (:func:`lasso_qp`, Lee et al.,
NIPS 2006), and an Armijo line search on :math:`F_C` takes the step. The squared hinge is
piecewise quadratic, so once the margin-violating samples stop changing a step is exact: 1 to 5
steps per point of the path on digits. Coordinate descent, liblinear's own method, needs
hundreds to tens of thousands of sweeps per point on the same problems (a 64-atom dictionary's
projections are strongly correlated; docs/measurements/benchmarks.md, "Codes from
examples").

**Path** (:func:`l1_svm_path`): :math:`C_t = C_0 f^t`, each point warm-started from the last,
keeping the last solution with at most k non-zero weights (the bias not counted), and
stopping at the first point with more.

Everything is deterministic: a code learned twice from the same examples is the same code.
"""

import numba
import numpy as np

# Armijo's sufficient decrease, and the most halvings of one Newton step.
ARMIJO_SIGMA = 0.01
MAX_LINE_SEARCH = 30
# Added to the Hessian's diagonal, relative to it (and once more, larger, if Cholesky fails): a
# working set wider than the violating samples makes H singular.
RIDGE = 1e-12
RIDGE_RETRY = 1e-8
# Optimality tolerance of the feature-sign search, in units of the l1 penalty's subgradient.
QP_TOLERANCE = 1e-7


@numba.njit(cache=True, nogil=True)
def l1_violation(G, w_j):
    r"""How far coordinate j is from optimality: the smallest subgradient of :math:`F_C`.

    .. math:: v_j = \begin{cases} |G_j + 1| & w_j > 0 \\ |G_j - 1| & w_j < 0 \\
              \max(0,\ |G_j| - 1) & w_j = 0 \end{cases}

    Parameters
    ----------
    G : float
        The loss term's derivative along j.
    w_j : float

    Returns
    -------
    float
    """
    if w_j > 0.0:
        return abs(G + 1.0)
    if w_j < 0.0:
        return abs(G - 1.0)
    return max(0.0, abs(G) - 1.0)


@numba.njit(cache=True, nogil=True)
def squared_hinge_objective(slack, weights, C, w):
    r"""The objective from the slacks.

    .. math:: F_C(w) = \|w\|_1 + C \sum_i c_i \max(0, b_i)^2

    Parameters
    ----------
    slack : ndarray of shape (n,), float64
    weights : ndarray of shape (n,), float64
    C : float
    w : ndarray of shape (p,), float64

    Returns
    -------
    float
    """
    loss = 0.0
    for i in range(slack.shape[0]):
        if slack[i] > 0.0:
            loss += weights[i] * slack[i] * slack[i]
    penalty = 0.0
    for j in range(w.shape[0]):
        penalty += abs(w[j])
    return C * loss + penalty


@numba.njit(cache=True, nogil=True)
def cholesky_solve(H, rhs, factor, out):
    r"""Solve :math:`H x = r` for a symmetric positive definite H (m x m); False if H is not
    numerically positive definite.

    .. math:: H = L L^\top, \quad L y = r, \quad L^\top x = y

    Parameters
    ----------
    H : ndarray of shape (m, m), float64
    rhs : ndarray of shape (m,), float64
    factor : ndarray of shape (m, m), float64
        Workspace for L.
    out : ndarray of shape (m,), float64
        x.

    Returns
    -------
    bool
    """
    m = H.shape[0]
    for a in range(m):
        for b in range(a + 1):
            s = H[a, b]
            for k in range(b):
                s -= factor[a, k] * factor[b, k]
            if a == b:
                if s <= 0.0:
                    return False
                factor[a, a] = np.sqrt(s)
            else:
                factor[a, b] = s / factor[b, b]
    for a in range(m):
        s = rhs[a]
        for k in range(a):
            s -= factor[a, k] * out[k]
        out[a] = s / factor[a, a]
    for a in range(m - 1, -1, -1):
        s = out[a]
        for k in range(a + 1, m):
            s -= factor[k, a] * out[k]
        out[a] = s / factor[a, a]
    return True


@numba.njit(cache=True, nogil=True)
def lasso_qp_value(H, q, u):
    r"""The l1-regularised quadratic's value.

    .. math:: \phi(u) = \tfrac12 u^\top H u + q^\top u + \|u\|_1

    Parameters
    ----------
    H : ndarray of shape (m, m)
    q, u : ndarray of shape (m,)

    Returns
    -------
    float
    """
    value = 0.0
    for a in range(u.shape[0]):
        if u[a] == 0.0:
            continue
        s = 0.0
        for b in range(u.shape[0]):
            s += H[a, b] * u[b]
        value += u[a] * (0.5 * s + q[a]) + abs(u[a])
    return value


@numba.njit(cache=True, nogil=True)
def lasso_qp(H, q, u, tolerance, max_steps):
    r"""Minimise :func:`lasso_qp_value` exactly by feature-sign search, from ``u`` (in place);
    return the steps taken (-1: a system was singular even with :data:`RIDGE_RETRY`).

    A step fixes the signs :math:`\theta` of the non-zero coordinates (adding the zero
    coordinate of largest :math:`|\nabla_a| > 1`, with the sign that lowers the objective, once
    the non-zero ones are optimal), solves :math:`H_{AA} x = -(q_A + \theta_A)` and moves to the
    best of x and the points on the way where a coordinate crosses zero. The objective
    decreases at every step and stops at the optimum:

    .. math:: (Hu + q)_a + \operatorname{sign}(u_a) = 0 \ (u_a \ne 0), \qquad
              |(Hu + q)_a| \le 1 \ (u_a = 0)

    Parameters
    ----------
    H : ndarray of shape (m, m), float64
        Symmetric positive semi-definite.
    q : ndarray of shape (m,), float64
    u : ndarray of shape (m,), float64
    tolerance : float
    max_steps : int

    Returns
    -------
    int
    """
    m = u.shape[0]
    theta = np.sign(u)
    gradient = np.empty(m)
    chosen = np.empty(m, dtype=np.int64)
    system = np.empty((m, m))
    factor = np.empty((m, m))
    rhs = np.empty(m)
    solution = np.empty(m)
    target = np.empty(m)
    trial = np.empty(m)
    best = np.empty(m)
    for step in range(max_steps):
        for a in range(m):
            s = q[a]
            for b in range(m):
                s += H[a, b] * u[b]
            gradient[a] = s
        nonzeros_optimal = True
        for a in range(m):
            if theta[a] != 0.0 and abs(gradient[a] + theta[a]) > tolerance:
                nonzeros_optimal = False
                break
        if nonzeros_optimal:
            entering = -1
            largest = 1.0 + tolerance
            for a in range(m):
                if theta[a] == 0.0 and abs(gradient[a]) > largest:
                    largest = abs(gradient[a])
                    entering = a
            if entering < 0:
                return step
            theta[entering] = -1.0 if gradient[entering] > 0.0 else 1.0
        k = 0
        for a in range(m):
            if theta[a] != 0.0:
                chosen[k] = a
                k += 1
        for a in range(k):
            for b in range(k):
                system[a, b] = H[chosen[a], chosen[b]]
            rhs[a] = -(q[chosen[a]] + theta[chosen[a]])
        if not cholesky_solve(system[:k, :k], rhs[:k], factor[:k, :k], solution[:k]):
            for a in range(k):
                system[a, a] += RIDGE_RETRY * (1.0 + system[a, a])
            if not cholesky_solve(system[:k, :k], rhs[:k], factor[:k, :k], solution[:k]):
                return -1
        target[:] = 0.0
        for a in range(k):
            target[chosen[a]] = solution[a]
        best[:] = target
        best_value = lasso_qp_value(H, q, target)
        for a in range(k):
            j = chosen[a]
            if u[j] * target[j] < 0.0:
                t = u[j] / (u[j] - target[j])
                for b in range(m):
                    trial[b] = u[b] + t * (target[b] - u[b])
                trial[j] = 0.0
                value = lasso_qp_value(H, q, trial)
                if value < best_value:
                    best_value = value
                    best[:] = trial
        u[:] = best
        for a in range(m):
            theta[a] = np.sign(u[a])
    return max_steps


@numba.njit(cache=True, nogil=True)
def solve_l1_svm(Z, weights, sums, C, tolerance, max_steps, w, slack):
    r"""Minimise :math:`F_C` from the given ``w`` (a warm start), in place; return the Newton
    steps taken.

    Stops when the summed violation :math:`\sum_j v_j` (:func:`l1_violation`) is at most
    ``tolerance`` times its value at :math:`w = 0`, where every sample violates its margin:
    :math:`\sum_j \max(0,\ 2C|s_j| - 1)` with :math:`s_j = \sum_i c_i z_{ij}` (liblinear's
    stopping rule, made independent of the start).

    Parameters
    ----------
    Z : ndarray of shape (p, n), float64, C-contiguous
    weights : ndarray of shape (n,), float64
    sums : ndarray of shape (p,), float64
        :math:`s_j`.
    C : float
    tolerance : float
    max_steps : int
    w : ndarray of shape (p,), float64
        The start; the solution on return.
    slack : ndarray of shape (n,), float64
        :math:`1 - Z^\top w` for the given ``w``; kept up to date.

    Returns
    -------
    int
    """
    p, n = Z.shape
    at_zero = 0.0
    for j in range(p):
        at_zero += max(0.0, 2.0 * C * abs(sums[j]) - 1.0)
    if at_zero == 0.0:
        # No coordinate can leave zero at this C: w = 0 is the solution.
        w[:] = 0.0
        slack[:] = 1.0
        return 0
    residual = np.empty(n)
    working = np.empty(p, dtype=np.int64)
    trial_w = np.empty(p)
    trial_slack = np.empty(n)
    for step in range(max_steps):
        n_violating = 0
        for i in range(n):
            if slack[i] > 0.0:
                residual[i] = weights[i] * slack[i]
                n_violating += 1
            else:
                residual[i] = 0.0
        gradient = np.dot(Z, residual)
        total = 0.0
        m = 0
        for j in range(p):
            gradient[j] *= -2.0 * C
            v = l1_violation(gradient[j], w[j])
            total += v
            if w[j] != 0.0 or v > 0.0:
                working[m] = j
                m += 1
        if total <= tolerance * at_zero:
            return step
        # The Hessian on the working set, from the violating samples' rows scaled by
        # sqrt(2 C c_i): one matrix product.
        rows = np.empty((m, n_violating))
        k = 0
        for i in range(n):
            if slack[i] > 0.0:
                scale = np.sqrt(2.0 * C * weights[i])
                for a in range(m):
                    rows[a, k] = Z[working[a], i] * scale
                k += 1
        H = np.dot(rows, rows.T)
        for a in range(m):
            H[a, a] += RIDGE * (1.0 + H[a, a])
        # The model in u = w_W + d: 1/2 u'Hu + (g - H w_W)'u + |u|_1.
        u = np.empty(m)
        for a in range(m):
            u[a] = w[working[a]]
        q = np.empty(m)
        for a in range(m):
            s = gradient[working[a]]
            for b in range(m):
                s -= H[a, b] * u[b]
            q[a] = s
        if lasso_qp(H, q, u, QP_TOLERANCE, 10 * m + 10) < 0:
            return step
        decrease = 0.0
        for a in range(m):
            j = working[a]
            decrease += gradient[j] * (u[a] - w[j]) + abs(u[a]) - abs(w[j])
        if decrease >= 0.0:
            return step
        before = squared_hinge_objective(slack, weights, C, w)
        t = 1.0
        accepted = False
        for _ in range(MAX_LINE_SEARCH):
            trial_w[:] = w
            trial_slack[:] = slack
            for a in range(m):
                j = working[a]
                move = t * (u[a] - w[j])
                if move != 0.0:
                    trial_w[j] = w[j] + move
                    for i in range(n):
                        trial_slack[i] -= move * Z[j, i]
            if (
                squared_hinge_objective(trial_slack, weights, C, trial_w)
                <= before + ARMIJO_SIGMA * t * decrease
            ):
                accepted = True
                break
            t *= 0.5
        if not accepted:
            return step
        w[:] = trial_w
        slack[:] = trial_slack
    return max_steps


@numba.njit(cache=True, nogil=True)
def first_entry_c(Z, weights):
    r"""The smallest C at which a coordinate leaves zero, or 0.0 if none ever does.

    At :math:`w = 0` every sample violates its margin, the loss term's derivative along j is
    :math:`-2C\sum_i c_i z_{ij}`, and coordinate j leaves zero once it exceeds 1 in magnitude:

    .. math:: C_0 = \frac{1}{2 \max_j |\sum_i c_i z_{ij}|}

    With unit weights this is scikit-learn's ``l1_min_c(X, y, loss="squared_hinge")``.

    Parameters
    ----------
    Z : ndarray of shape (p, n), float64
    weights : ndarray of shape (n,), float64

    Returns
    -------
    float
    """
    largest = 0.0
    for j in range(Z.shape[0]):
        s = 0.0
        for i in range(Z.shape[1]):
            s += weights[i] * Z[j, i]
        largest = max(largest, abs(s))
    if largest == 0.0:
        return 0.0
    return 0.5 / largest


@numba.njit(cache=True, nogil=True)
def l1_svm_path(Z, weights, C_start, factor, max_points, n_nonzero, tolerance, max_steps, out_w):
    r"""Walk the path :math:`C_t = C_0 f^t` (t < ``max_points``), each point warm-started from
    the last, and keep in ``out_w`` the last solution with 1 to ``n_nonzero`` non-zero weights
    among the first p - 1 coordinates (the last one is the bias).

    .. math:: w^\star = w_{C_{t^\star}}, \quad
              t^\star = \max \{t : 1 \le \|w_{C_t}\|_0 \le k\}

    The walk stops at the first point with more than ``n_nonzero`` non-zeros.

    Parameters
    ----------
    Z : ndarray of shape (p, n), float64, C-contiguous
        Last row: the labels (the bias's feature times y).
    weights : ndarray of shape (n,), float64
    C_start, factor : float
        :math:`C_0 > 0` and :math:`f > 1`.
    max_points, n_nonzero, max_steps : int
    tolerance : float
        See :func:`solve_l1_svm`.
    out_w : ndarray of shape (p,), float64
        The kept solution; when the first non-empty point is already denser, that one (for the
        caller to prune).

    Returns
    -------
    status : int
        1: a solution within ``n_nonzero`` was kept; 2: the first non-empty point was denser
        (it is in ``out_w``); 0: no point had a non-zero weight (``out_w`` untouched).
    points : int
        Points of the path solved.
    """
    p, n = Z.shape
    sums = np.zeros(p)
    for j in range(p):
        for i in range(n):
            sums[j] += weights[i] * Z[j, i]
    w = np.zeros(p)
    slack = np.ones(n)
    status = 0
    C = C_start
    points = 0
    for _ in range(max_points):
        solve_l1_svm(Z, weights, sums, C, tolerance, max_steps, w, slack)
        points += 1
        nonzeros = 0
        for j in range(p - 1):
            if w[j] != 0.0:
                nonzeros += 1
        if nonzeros > n_nonzero:
            if status == 0:
                out_w[:] = w
                status = 2
            break
        if nonzeros > 0:
            out_w[:] = w
            status = 1
        C *= factor
    return status, points
