r"""The linear SVM's solver: one-vs-rest L2-regularised squared-hinge problems (LinearSVC's
primal, ``liblinear -s 2``) solved on one shared feature matrix.

The solver reads its data only through a :class:`SquaredHingeLoss`: the loss term's value and
gradient at some weights, and products of its generalised Hessian with a vector. The regulariser
and the Newton-CG iterations live here (:func:`minimize_squared_hinge`); where the data lives is
the loss's business. :class:`InMemorySquaredHinge` holds a feature matrix in this process, and
computes everything from the two products the method needs, the design times a block of weights
and the design transposed times a block of residuals, for every problem of a group at once.

:func:`fit_one_vs_rest` is the entry point of the estimator (:mod:`training.estimator`): it
makes the design (dense, or sparse around the column medians), splits the classes into groups
that each read the matrix once per product, solves the groups side by side, and folds the
design's shift back into the intercepts.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod

import numpy as np
import scipy.sparse as sp
from joblib import Parallel, delayed
from scipy.optimize import minimize
from sklearn.exceptions import ConvergenceWarning

from service.model.threads import limit_threads

__all__ = [
    "GRADIENT_TOLERANCE",
    "PROBLEM_GROUPS",
    "SPARSE_TRAINING_DENSITY",
    "WORK_PER_GROUP",
    "InMemorySquaredHinge",
    "SquaredHingeLoss",
    "fit_one_vs_rest",
    "minimize_squared_hinge",
    "squared_hinge_objective",
    "training_design",
]

# The SVM trains on sparse features when at most this fraction of them differ from their
# column's median (document measures: most pairs share no word): the solver's products then run
# several times faster (3.7x at 10% density on 11,000 x 800, one thread), on the same problem
# up to the intercept, which is folded back exactly.
SPARSE_TRAINING_DENSITY = 0.25


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

    .. math:: L(W) = C \sum_k \sum_i \max(0, 1 - y_{ik} (w_k \cdot x_i + b_k))^2

    Weights are a ``(n_features + 1, K)`` block: each column one problem's weights, then its
    bias. Implementations decide where the items live; the solver only asks for the two numbers
    below, so a sum over shards held elsewhere serves as well as a matrix in memory.

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
    def value_and_gradient(self, W: np.ndarray) -> tuple[float, np.ndarray]:
        """:math:`L(W)` and its gradient, an array of the shape of ``W``."""

    @abstractmethod
    def hessian_product(self, W: np.ndarray, V: np.ndarray) -> np.ndarray:
        r"""The generalised Hessian of :math:`L` at ``W`` times ``V``:
        :math:`2C X_A^\top X_A V` with the bias column, A the items with positive slack at
        ``W``, for each problem; an array of the shape of ``V``."""


class InMemorySquaredHinge(SquaredHingeLoss):
    """:class:`SquaredHingeLoss` over a feature matrix held in this process.

    Every evaluation is two products for all K problems at once (``design @ W`` and
    ``design.T @ R``), a matrix product rather than K matrix-vector products. The items with
    positive slack are found again only when the point of a Hessian product changes.

    Parameters
    ----------
    design : ndarray or csr_matrix of shape (n_samples, n_features)
    signs : ndarray of shape (n_samples, K)
        +1 for the problem's class, -1 for the others.
    C : float
    """

    def __init__(self, design, signs: np.ndarray, C: float):
        self.design, self.signs, self.C = design, signs, C
        self.n_features, self.n_problems = design.shape[1], signs.shape[1]
        self._point: np.ndarray | None = None
        self._active: np.ndarray | None = None

    def _scores(self, W: np.ndarray) -> np.ndarray:
        scores = self.design @ W[:-1]
        scores += W[-1]
        return scores

    def _back(self, residuals: np.ndarray) -> np.ndarray:
        out = np.empty((self.n_features + 1, self.n_problems))
        out[:-1] = self.design.T @ residuals
        out[-1] = residuals.sum(axis=0)
        return out

    def value_and_gradient(self, W: np.ndarray) -> tuple[float, np.ndarray]:
        margins = self._scores(W)
        margins *= self.signs
        np.subtract(1.0, margins, out=margins)  # now the slack 1 - y (w . x + b)
        np.maximum(margins, 0.0, out=margins)
        value = self.C * float(np.vdot(margins, margins))
        margins *= self.signs
        margins *= -2.0 * self.C  # the loss's derivative by each score
        return value, self._back(margins)

    def hessian_product(self, W: np.ndarray, V: np.ndarray) -> np.ndarray:
        if self._point is None or not np.array_equal(self._point, W):
            margins = self._scores(W)
            margins *= self.signs
            self._active = (margins < 1.0) * (2.0 * self.C)
            self._point = W.copy()
        products = self._scores(V)
        products *= self._active
        return self._back(products)


def squared_hinge_objective(
    weights: np.ndarray, design, signs: np.ndarray, C: float
) -> tuple[float, np.ndarray]:
    r"""liblinear's primal L2-regularised squared hinge loss of K one-vs-rest problems at once.

    .. math:: f(W) = \sum_k \tfrac12 \lVert w_k \rVert^2
                     + C \sum_i \max(0, 1 - y_{ik} (w_k \cdot x_i + b_k))^2

    with the bias :math:`b_k` regularised like a weight (liblinear's ``intercept_scaling=1``).

    Parameters
    ----------
    weights : ndarray of shape ((n_features + 1) * K,)
        Column-major (n_features + 1, K): each problem's weights, then its bias.
    design : ndarray or csr_matrix of shape (n_samples, n_features)
    signs : ndarray of shape (n_samples, K)
        +1 for the problem's class, -1 for the others.
    C : float

    Returns
    -------
    value : float
    gradient : ndarray of shape ((n_features + 1) * K,)
    """
    loss = InMemorySquaredHinge(design, signs, C)
    return _regularised(loss)(weights)


def _regularised(loss: SquaredHingeLoss):
    """The objective f(w) = |W|^2 / 2 + L(W) on flat weights, as scipy's minimize takes it."""
    shape = (loss.n_features + 1, loss.n_problems)

    def objective(weights: np.ndarray) -> tuple[float, np.ndarray]:
        W = weights.reshape(shape)
        value, gradient = loss.value_and_gradient(W)
        gradient += W
        return 0.5 * float(np.vdot(W, W)) + value, gradient.ravel()

    def hessian_product(weights: np.ndarray, vector: np.ndarray) -> np.ndarray:
        V = vector.reshape(shape)
        out = loss.hessian_product(weights.reshape(shape), V)
        out += V
        return out.ravel()

    objective.hessian_product = hessian_product
    return objective


# The solver stops when the gradient's norm is below this fraction of its norm at zero weights:
# liblinear's primal solver (LinearSVC, tol=1e-4) stops at 1e-4 and its scores on digits are then
# within 2e-3 of the optimum's (liblinear at tol=1e-8); here within 2e-7, in 18 Newton steps.
GRADIENT_TOLERANCE = 1e-8


def minimize_squared_hinge(
    loss: SquaredHingeLoss, max_iter: int, tolerance: float = GRADIENT_TOLERANCE
) -> tuple[np.ndarray, int]:
    """Minimise :math:`\\lVert W\\rVert^2 / 2 + L(W)` by trust-region Newton-CG (liblinear's
    primal method).

    Parameters
    ----------
    loss : SquaredHingeLoss
    max_iter : int
        Newton steps at most.
    tolerance : float, default=GRADIENT_TOLERANCE
        Stop when the gradient's norm is below this fraction of its norm at zero weights.

    Returns
    -------
    W : ndarray of shape (n_features + 1, K)
    n_iter : int
        Newton steps taken.
    """
    objective = _regularised(loss)
    start = np.zeros((loss.n_features + 1) * loss.n_problems)
    _, gradient = objective(start)
    gtol = tolerance * max(float(np.linalg.norm(gradient)), 1e-300)
    result = minimize(
        objective,
        start,
        jac=True,
        hessp=objective.hessian_product,
        method="trust-ncg",
        options={"maxiter": max_iter, "gtol": gtol},
    )
    return result.x.reshape(-1, loss.n_problems), int(result.nit)


# The one-vs-rest problems are solved in groups of classes, each one Newton-CG run whose products
# read the feature matrix once for all of its classes (a matrix product, not one matrix-vector
# product per class). Groups run side by side, one BLAS thread each (BLAS threads spinning on
# busy cores cost 50x here). How many groups depends on the problem, never on n_jobs, so that a
# model does not depend on the cores it was trained on: one per WORK_PER_GROUP multiply-adds of a
# product (n_samples * n_features * n_classes), at most PROBLEM_GROUPS. Measured on digits
# (1,000 x 250 features, 10 classes, 2.5M): one group 0.37 s, four 0.61 s, liblinear 0.29 s.
PROBLEM_GROUPS = 8
WORK_PER_GROUP = 50_000_000


def fit_one_vs_rest(
    features: np.ndarray,
    codes: np.ndarray,
    n_classes: int,
    *,
    C: float,
    max_iter: int,
    n_jobs: int,
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """LinearSVC's one-vs-rest problems (L2-regularised squared hinge, regularised bias), solved
    on the one shared feature matrix, in groups of classes side by side (see
    :data:`WORK_PER_GROUP`).

    liblinear copies its training matrix (16 bytes per entry, once per problem trained at the
    same time); this solver only reads the matrix, so peak memory stays near the features'
    size. Each group of classes is one Newton-CG run in a thread (numpy releases the GIL in its
    products), with one BLAS thread each.

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
        Newton steps per group at most.
    n_jobs : int
        Cores, at least 1. The result does not depend on it.

    Returns
    -------
    coef : ndarray of shape (n_classes, n_features)
        One row per class, also for two classes (rows ``-w`` and ``w``), so that every model
        scores and ranks its classes the same way.
    intercept : ndarray of shape (n_classes,)
    n_iter : int
        The most iterations any group took.
    train_accuracy : float
    """
    design, shift = training_design(features)
    problems = np.array([1] if n_classes == 2 else range(n_classes))
    work = design.shape[0] * design.shape[1] * len(problems)
    n_groups = int(np.clip(work // WORK_PER_GROUP, 1, min(PROBLEM_GROUPS, len(problems))))
    groups = np.array_split(problems, n_groups)
    workers = min(n_jobs, n_groups)

    def solve(group: np.ndarray):
        signs = np.where(codes[:, None] == group[None, :], 1.0, -1.0)
        return minimize_squared_hinge(InMemorySquaredHinge(design, signs, C), max_iter)

    with limit_threads(blas_threads=1):
        if workers == 1:
            solved = [solve(group) for group in groups]
        else:
            solved = Parallel(n_jobs=workers, backend="threading")(
                delayed(solve)(group) for group in groups
            )
    n_iter = max(nit for _, nit in solved)
    if n_iter >= max_iter:
        warnings.warn(
            f"the SVM solver stopped at max_iter={max_iter} iterations before converging: "
            "increase max_iter, or lower C",
            ConvergenceWarning,
            stacklevel=3,
        )
    weights = np.hstack([w for w, _ in solved])  # (n_features + 1, n_problems)
    coef, intercept = np.ascontiguousarray(weights[:-1].T), weights[-1].copy()
    scores = design @ coef.T + intercept
    intercept -= coef @ shift
    if n_classes == 2:
        coef, intercept = np.vstack([-coef, coef]), np.concatenate([-intercept, intercept])
        scores = np.hstack([-scores, scores])
    train_accuracy = float((scores.argmax(axis=1) == codes).mean())
    return coef, intercept, n_iter, train_accuracy
