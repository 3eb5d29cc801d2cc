"""The l1 squared-hinge SVM solver and its path against scikit-learn's LinearSVC(penalty="l1")
and Lasso at the same regularisation, on synthetic and on real (digits) problems."""

import warnings

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Lasso
from sklearn.svm import LinearSVC, l1_min_c

from service.model import Predictor
from service.model.kernels.l1svm import (
    first_entry_c,
    l1_svm_path,
    lasso_qp,
    lasso_qp_value,
    solve_l1_svm,
)
from service.model.search import SearchIndex
from service.model.search.codes import (
    LEARN_C_FACTOR,
    LEARN_MAX_NEWTON_STEPS,
    LEARN_TOLERANCE,
    svm_problem,
)


def synthetic(n_positive=40, n_negative=260, n_features=20, seed=0):
    """Well-conditioned data: independent features, the first four informative."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_positive + n_negative, n_features))
    y = np.r_[np.ones(n_positive), -np.ones(n_negative)]
    X[:n_positive, :4] += [1.5, -1.0, 0.8, 0.5]
    return X, y


def reference_svm(X, y, C):
    """scikit-learn's solution at C: (coefficients with the bias last)."""
    svm = LinearSVC(
        penalty="l1",
        dual=False,
        C=C,
        class_weight="balanced",
        tol=1e-12,
        max_iter=100_000,
        random_state=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        svm.fit(X, y)
    return np.r_[svm.coef_[0], svm.intercept_[0]]


def objective(Z, weights, C, w):
    """||w||_1 + C sum_i c_i max(0, 1 - w.z_i)^2, in numpy."""
    slack = np.maximum(1.0 - Z.T @ w, 0.0)
    return np.abs(w).sum() + C * (weights * slack**2).sum()


def solve(Z, weights, C, w=None, tolerance=1e-12):
    w = np.zeros(Z.shape[0]) if w is None else w.copy()
    slack = 1.0 - Z.T @ w
    solve_l1_svm(Z, weights, Z @ weights, C, tolerance, 200, w, slack)
    np.testing.assert_allclose(slack, 1.0 - Z.T @ w, atol=1e-9)  # kept up to date
    return w


@pytest.fixture(scope="module")
def digits_problems(search_model_dir):
    """Projected digits problems as /search poses them: 1 and 5 positives of a class against
    the catalogue's negatives sample."""
    index = SearchIndex.load(search_model_dir, Predictor.load(search_model_dir))
    catalogue = index.catalogue
    problems = []
    for label, n_positive in (("2", 1), ("7", 5), ("9", 5)):
        positions = np.flatnonzero(catalogue.labels == label)[:n_positive]
        positives = catalogue.rows(positions)
        negatives = catalogue.negative_rows(positions)
        X = np.vstack([positives, negatives])
        y = np.r_[np.ones(len(positives)), -np.ones(len(negatives))]
        problems.append((X, y))
    return problems


def test_the_first_entry_is_scikit_learns_l1_min_c():
    X, y = synthetic()
    Z, weights = svm_problem(X, y)
    assert first_entry_c(Z, np.ones_like(weights)) == pytest.approx(
        l1_min_c(X, y, loss="squared_hinge"), rel=1e-12
    )
    # Below it (with the balanced weights' own start) the solution is zero; just above, one
    # weight has left zero.
    start = first_entry_c(Z, weights)
    assert not solve(Z, weights, 0.999 * start).any()
    assert np.count_nonzero(solve(Z, weights, 1.05 * start)) == 1


@pytest.mark.parametrize(("seed", "scale"), [(0, 1.2), (0, 4.0), (0, 10.0), (1, 30.0), (0, 1000.0)])
def test_solution_equals_linear_svc_at_the_same_c(seed, scale):
    # Problems liblinear solves to its tolerance (with random_state=0), from one non-zero
    # weight to all of them.
    X, y = synthetic(seed=seed)
    Z, weights = svm_problem(X, y)
    C = scale * first_entry_c(Z, weights)
    expected = reference_svm(X, y, C)
    w = solve(Z, weights, C)
    np.testing.assert_allclose(w, expected, rtol=0, atol=1e-9 * np.abs(expected).max())
    assert set(np.flatnonzero(w)) == set(np.flatnonzero(expected))
    assert objective(Z, weights, C, w) == pytest.approx(objective(Z, weights, C, expected),
                                                        rel=1e-12)  # fmt: skip


@pytest.mark.parametrize("seed", range(3))
def test_never_worse_than_linear_svc(seed):
    # Where liblinear's coordinate descent stops short (here at 100,000 sweeps), the solution
    # is better than its, and by little: the same problem.
    X, y = synthetic(seed=seed)
    Z, weights = svm_problem(X, y)
    for scale in (10.0, 30.0, 100.0):
        C = scale * first_entry_c(Z, weights)
        expected = reference_svm(X, y, C)
        ours = objective(Z, weights, C, solve(Z, weights, C))
        theirs = objective(Z, weights, C, expected)
        assert theirs * (1 - 0.01) <= ours <= theirs * (1 + 1e-12)


def test_a_warm_start_reaches_the_same_solution():
    X, y = synthetic(seed=1)
    Z, weights = svm_problem(X, y)
    C = 20 * first_entry_c(Z, weights)
    cold = solve(Z, weights, C)
    for start in (solve(Z, weights, C / 8), np.full(Z.shape[0], 0.3)):
        np.testing.assert_allclose(solve(Z, weights, C, start), cold, rtol=0, atol=1e-8)


def test_on_digits_no_worse_than_linear_svc(digits_problems):
    # Real, correlated atoms: liblinear's coordinate descent stops short of the optimum here,
    # so the solver must reach an objective at least as low, and the same support where
    # liblinear's is clear.
    for X, y in digits_problems:
        Z, weights = svm_problem(X, y)
        for scale in (2.0, 16.0, 128.0):
            C = scale * first_entry_c(Z, np.ones_like(weights))
            expected = reference_svm(X, y, C)
            w = solve(Z, weights, C, tolerance=LEARN_TOLERANCE)
            ours, theirs = objective(Z, weights, C, w), objective(Z, weights, C, expected)
            assert ours <= theirs * (1 + 1e-6), (scale, ours, theirs)
            assert ours >= theirs * (1 - 0.05)  # the same problem, not a looser one


def test_the_path_keeps_the_last_point_within_the_sparsity():
    X, y = synthetic(n_features=30, seed=2)
    Z, weights = svm_problem(X, y)
    start = first_entry_c(Z, np.ones_like(weights))
    for n_nonzero in (1, 3, 6):
        # The reference: LinearSVC at every point of the same path.
        kept = None
        for t in range(24):
            coefficients = reference_svm(X, y, start * LEARN_C_FACTOR**t)
            count = np.count_nonzero(np.abs(coefficients[:-1]) > 1e-9)
            if count > n_nonzero:
                break
            if count:
                kept = coefficients
        w = np.zeros(Z.shape[0])
        status, points = l1_svm_path(
            Z, weights, start, LEARN_C_FACTOR, 24, n_nonzero, 1e-12, LEARN_MAX_NEWTON_STEPS, w
        )
        assert status == 1
        assert points <= 24
        assert 1 <= np.count_nonzero(w[:-1]) <= n_nonzero
        np.testing.assert_allclose(w, kept, rtol=0, atol=1e-6 * np.abs(kept).max())


def test_a_path_whose_first_point_is_too_dense_says_so():
    # Started well past the first entry, the first point already holds several weights: with a
    # budget of one, it is returned for the caller to prune.
    X, y = synthetic(seed=3)
    Z, weights = svm_problem(X, y)
    w = np.zeros(Z.shape[0])
    start = first_entry_c(Z, weights)
    status, points = l1_svm_path(Z, weights, start * 10, 2.0, 24, 1, 1e-9, 50, w)
    assert (status, points) == (2, 1)
    np.testing.assert_allclose(w, solve(Z, weights, start * 10), atol=1e-8)
    assert np.count_nonzero(w[:-1]) >= 2


def test_a_path_that_never_leaves_zero_keeps_nothing():
    X, y = synthetic()
    Z, weights = svm_problem(X, y)
    w = np.zeros(Z.shape[0])
    status, points = l1_svm_path(Z, weights, 1e-3 * first_entry_c(Z, weights), 1.01, 3, 5,
                                 1e-9, 50, w)  # fmt: skip
    assert (status, points) == (0, 3)
    assert not w.any()


@pytest.mark.parametrize("seed", range(4))
def test_lasso_qp_equals_scikit_learns_lasso(seed):
    # 1/2 u'Hu + q'u + |u|_1 with H = A'A, q = -A'b is 1/2 |Au - b|^2 + |u|_1 less a constant:
    # Lasso's objective times n with alpha = 1/n.
    rng = np.random.default_rng(seed)
    n, m = 50, 12
    A = rng.normal(size=(n, m))
    b = A[:, :3] @ [3.0, -2.0, 1.0] + rng.normal(size=n)
    H, q = A.T @ A, -A.T @ b
    lasso = Lasso(alpha=1.0 / n, fit_intercept=False, tol=1e-14, max_iter=1_000_000).fit(A, b)
    for start in (np.zeros(m), rng.normal(size=m)):
        u = start.copy()
        assert lasso_qp(H, q, u, 1e-10, 10 * m + 10) >= 0
        np.testing.assert_allclose(u, lasso.coef_, rtol=0, atol=1e-7)
        assert lasso_qp_value(H, q, u) <= lasso_qp_value(H, q, lasso.coef_) + 1e-9
