"""The one-vs-rest squared-hinge solver against scikit-learn's LinearSVC and finite differences."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import check_grad
from sklearn.datasets import make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split
from sklearn.svm import LinearSVC

from training import BasisExpandingSVC
from training.estimator.exact_newton import (
    EXACT_NEWTON_MAX_COLUMNS,
    EXACT_NEWTON_ROWS,
    EXACT_NEWTON_ROWS_PER_COLUMN,
    exact_newton,
    exact_newton_tall_columns,
)
from training.estimator.newton_cg import liblinear_tolerance, minimize_squared_hinge
from training.estimator.solver import (
    ExactNewton,
    TrustRegionNewtonCG,
    cpu_time_limit,
    fit_one_vs_rest,
    newton_method_for,
    one_vs_rest_weights,
    problem_signs,
    problem_weights,
    training_design,
)
from training.estimator.squared_hinge import InMemorySquaredHinge


@pytest.fixture(scope="module")
def problem():
    X, y = make_classification(
        n_samples=300, n_features=12, n_informative=8, n_classes=4, random_state=0
    )
    return X, y


def _signs(y: np.ndarray, classes) -> np.ndarray:
    return np.where(y[:, None] == np.asarray(classes)[None, :], 1.0, -1.0)


def squared_hinge_objective(weights, X, signs, C):
    """liblinear's primal objective of K one-vs-rest problems (the regulariser, bias included,
    plus the loss's data term) at ``weights`` of shape ((n_features + 1) * K,), and its
    gradient."""
    loss = InMemorySquaredHinge(X, signs, C)
    W = weights.reshape(loss.n_features + 1, loss.n_problems)
    values, gradient = loss.value_and_gradient(W, np.arange(loss.n_problems))
    return 0.5 * float(np.vdot(W, W)) + float(values.sum()), (gradient + W).ravel()


def test_gradient_matches_finite_differences(problem):
    X, y = problem
    signs = _signs(y, [0, 2])
    rng = np.random.default_rng(0)
    weights = rng.normal(scale=0.1, size=(X.shape[1] + 1) * 2)

    def value(w):
        return squared_hinge_objective(w, X, signs, 0.7)[0]

    def gradient(w):
        return squared_hinge_objective(w, X, signs, 0.7)[1]

    assert check_grad(value, gradient, weights) < 1e-5 * np.linalg.norm(gradient(weights))


def test_hessian_product_matches_the_change_of_the_gradient(problem):
    """Away from the hinge's kinks the generalised Hessian is the Hessian: a small step's change
    of the gradient is the product with the step."""
    X, y = problem
    signs = _signs(y, [1, 3])
    loss = InMemorySquaredHinge(X, signs, C=0.5)
    rng = np.random.default_rng(1)
    W = rng.normal(scale=0.1, size=(X.shape[1] + 1, 2))
    V = rng.normal(size=W.shape)
    step = 1e-7
    both = np.arange(2)
    _, g0 = loss.value_and_gradient(W, both)
    _, g1 = loss.value_and_gradient(W + step * V, both)
    np.testing.assert_allclose(
        (g1 - g0) / step, loss.hessian_product(W, V, both), rtol=1e-4, atol=1e-6
    )


@pytest.mark.parametrize("C", [0.1, 1.0, 10.0])
def test_one_vs_rest_scores_as_linear_svc(problem, C):
    X, y = problem
    coef, intercept, n_iter, _ = fit_one_vs_rest(X.copy(), y, 4, C=C, max_iter=1000, n_jobs=1)
    reference = LinearSVC(C=C, dual=False, tol=1e-10, max_iter=100_000).fit(X, y)
    np.testing.assert_allclose(
        X @ coef.T + intercept, reference.decision_function(X), rtol=1e-4, atol=1e-4
    )
    assert 0 < n_iter < 1000


def test_two_classes_give_opposite_rows_and_sklearns_scores(problem):
    X, y = problem
    two = y < 2
    coef, intercept, _, accuracy = fit_one_vs_rest(
        X[two].copy(), y[two], 2, C=1.0, max_iter=1000, n_jobs=1
    )
    np.testing.assert_allclose(coef[0], -coef[1])
    reference = LinearSVC(C=1.0, dual=False, tol=1e-10, max_iter=100_000).fit(X[two], y[two])
    np.testing.assert_allclose(
        X[two] @ coef[1] + intercept[1], reference.decision_function(X[two]), atol=1e-4
    )
    assert accuracy == pytest.approx(reference.score(X[two], y[two]))


def test_sparse_design_around_the_medians_is_linear_svc_on_the_shifted_features():
    """Mostly-constant features train as a sparse matrix of their differences from the column
    medians; the model is LinearSVC's on those differences, with the shift folded back into
    the intercepts so that it scores the features as given."""
    rng = np.random.default_rng(2)
    features = np.full((400, 30), 0.25)
    mask = rng.random(features.shape) < 0.1
    features[mask] = rng.normal(size=mask.sum())
    y = rng.integers(0, 3, size=400)
    design, shift, _ = training_design(features.copy())
    assert sp.issparse(design)
    np.testing.assert_allclose(shift, 0.25)
    coef, intercept, _, _ = fit_one_vs_rest(features.copy(), y, 3, C=1.0, max_iter=1000, n_jobs=1)
    shifted = features - 0.25
    reference = LinearSVC(C=1.0, dual=False, tol=1e-10, max_iter=100_000).fit(shifted, y)
    np.testing.assert_allclose(
        features @ coef.T + intercept, reference.decision_function(shifted), atol=1e-4
    )


def test_dense_features_are_trained_on_as_they_are():
    """Features a sample of rows shows dense come back unshifted, the same array; features that
    differ from their column's median in a tenth of the entries still go sparse."""
    rng = np.random.default_rng(6)
    features = rng.normal(size=(5000, 30))
    design, shift, columns = training_design(features)
    assert design is features
    assert columns is None
    np.testing.assert_array_equal(shift, 0.0)
    features = np.full((5000, 30), 0.5)
    mask = rng.random(features.shape) < 0.1
    features[mask] = rng.normal(size=mask.sum())
    design, shift, _ = training_design(features.copy())
    assert sp.issparse(design)
    np.testing.assert_allclose(shift, 0.5)


def _with_zero_columns(X: np.ndarray, every: int = 3) -> np.ndarray:
    """``X`` with a column of zeros after every ``every`` of its columns, and one first."""
    n, d = X.shape
    widened = np.zeros((n, d + d // every + 1))
    kept = [j for j in range(widened.shape[1]) if j % (every + 1) != 0][:d]
    widened[:, kept] = X
    return widened


def test_columns_of_zeros_are_left_out_of_a_dense_design_in_its_own_memory(problem):
    """A dense design holds only the columns that are not zero on every item, written over the
    features' memory (no second training set); the others come back by their indices."""
    X, _ = problem
    features = _with_zero_columns(X)
    original = features.copy()
    design, shift, columns = training_design(features)
    np.testing.assert_array_equal(columns, np.flatnonzero(np.any(original != 0, axis=0)))
    assert design.shape == (len(X), X.shape[1])
    np.testing.assert_array_equal(design, original[:, columns])
    np.testing.assert_array_equal(shift, 0.0)
    assert design.flags.c_contiguous
    assert np.shares_memory(design, features)
    # taller than one block of rows: each block written before the next one's rows are read
    rng = np.random.default_rng(3)
    wide = _with_zero_columns(rng.normal(size=(2500, 900)))
    expected = wide[:, np.any(wide != 0, axis=0)]
    compact, _, _ = training_design(wide)
    assert (1 << 20) // wide.shape[1] < len(wide)
    np.testing.assert_array_equal(compact, expected)
    read_only = original.copy()
    read_only.flags.writeable = False
    copied, _, same = training_design(read_only)
    np.testing.assert_array_equal(same, columns)
    np.testing.assert_array_equal(copied, original[:, columns])
    np.testing.assert_array_equal(read_only, original)


def test_a_fit_without_the_columns_of_zeros_is_linear_svc_on_every_column(problem):
    """The model of a design without the columns of zeros scores the features as LinearSVC
    fitted on all of them scores them, its weights zero on the columns left out; a warm start
    given on every column reaches the same optimum, and from that optimum takes no step."""
    X, y = problem
    features = _with_zero_columns(X)
    zero = ~np.any(features != 0, axis=0)
    reference = LinearSVC(C=1.0, dual=False, tol=1e-10, max_iter=100_000).fit(features, y)
    coef, intercept, _, _ = fit_one_vs_rest(features.copy(), y, 4, C=1.0, max_iter=1000, n_jobs=1)
    at_three = fit_one_vs_rest(features.copy(), y, 4, C=3.0, max_iter=1000, n_jobs=1)
    warm = fit_one_vs_rest(
        features.copy(), y, 4, C=1.0, max_iter=1000, n_jobs=1, start=at_three[:2]
    )
    assert coef.shape == (4, features.shape[1])
    np.testing.assert_array_equal(coef[:, zero], 0.0)
    np.testing.assert_allclose(
        features @ coef.T + intercept, reference.decision_function(features), atol=1e-4
    )
    np.testing.assert_allclose(warm[0], coef, atol=1e-5)
    np.testing.assert_allclose(warm[1], intercept, atol=1e-5)
    at_the_optimum = fit_one_vs_rest(
        features.copy(), y, 4, C=1.0, max_iter=1000, n_jobs=1, start=(coef, intercept)
    )
    assert at_the_optimum[2] == 0


def _reference_hessian_product(X, signs, C, W, V):
    """2C [X 1]_A^T [X 1]_A v for each problem, A its items with positive slack, by numpy."""
    augmented = np.hstack([X, np.ones((len(X), 1))])
    out = np.empty_like(V)
    for k in range(W.shape[1]):
        active = signs[:, k] * (augmented @ W[:, k]) < 1
        rows = augmented[active]
        out[:, k] = 2 * C * rows.T @ (rows @ V[:, k])
    return out


@pytest.mark.parametrize("sparse", [False, True])
def test_hessian_products_read_the_active_items_of_each_problem_at_its_own_point(sparse):
    """The product reads only each problem's active rows (a kernel of its own), for any subset
    of the problems, and finds a problem's active set again when only its point moved."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 15))
    X[rng.random(X.shape) < 0.7] = 0.0
    signs = _signs(rng.integers(0, 4, size=200), [0, 1, 2, 3])
    design = sp.csr_matrix(X) if sparse else X
    loss = InMemorySquaredHinge(design, signs, C=0.3)
    W = rng.normal(scale=0.5, size=(16, 4))
    V = rng.normal(size=(16, 4))
    everyone = np.arange(4)
    loss.value_and_gradient(W, everyone)
    np.testing.assert_allclose(
        loss.hessian_product(W, V, everyone), _reference_hessian_product(X, signs, 0.3, W, V)
    )
    # Problems 1 and 3 move (a step taken), problem 2 stays; asked about 3 and 2 only.
    moved = W.copy()
    moved[:, [1, 3]] += rng.normal(scale=0.5, size=(16, 2))
    some = np.array([3, 2])
    expected = _reference_hessian_product(X, signs[:, some], 0.3, moved[:, some], V[:, :2])
    np.testing.assert_allclose(loss.hessian_product(moved[:, some], V[:, :2], some), expected)


def test_a_problem_reaches_the_same_optimum_alone_or_with_others(problem):
    """Each problem has its own trust region and conjugate gradients: solved with the others
    (their products shared) or alone, it converges to the same weights, within what the
    tolerance allows. f is 1-strongly convex (the regulariser), so a point whose gradient is g
    lies within |g| of the optimum: two solutions within the sum of their stopping norms."""
    X, y = problem
    signs = _signs(y, [0, 1, 2, 3])
    tolerance = 1e-8
    together = minimize_squared_hinge(InMemorySquaredHinge(X, signs, 1.0), 1000, tolerance)
    _, g0 = InMemorySquaredHinge(X, signs, 1.0).value_and_gradient(
        np.zeros((X.shape[1] + 1, 4)), np.arange(4)
    )
    bound = 2 * tolerance * np.linalg.norm(g0, axis=0)
    for k in range(4):
        alone = minimize_squared_hinge(InMemorySquaredHinge(X, signs[:, [k]], 1.0), 1000, tolerance)
        assert alone.converged.all()
        assert np.linalg.norm(alone.W[:, 0] - together.W[:, k]) <= bound[k] + 1e-12
    assert together.converged.all()


def test_liblinear_tolerance_stays_above_the_gradients_rounding():
    """A class of 5 items in 32,625 scaled the default tol (1e-8) to 1.5e-12, below what a sum
    of 32,625 terms can resolve (issue 34's stall): the floor is n machine epsilons."""
    n = 32_625
    floor = n * np.finfo(np.float64).eps
    tolerance = liblinear_tolerance(np.array([5, 7, 25_610]), n, 1e-8)
    np.testing.assert_allclose(tolerance[:2], [floor, floor])
    assert tolerance[2] == pytest.approx(1e-8 * (n - 25_610) / n)


def test_liblinear_tolerance_scales_by_the_smaller_side():
    np.testing.assert_allclose(
        liblinear_tolerance(np.array([10, 50, 95]), 100, 1e-4), [1e-5, 5e-5, 5e-6]
    )


def test_a_warm_start_reaches_the_cold_optimum_in_fewer_steps(problem):
    """Started from the solution at C = 1, the problem at C = 3 converges to the optimum a
    start from zero reaches (within the two stopping norms: f is 1-strongly convex), in fewer
    Newton steps; the stopping rule is measured at zero weights either way."""
    X, y = problem
    signs = _signs(y, [0, 1, 2, 3])
    tolerance = 1e-6
    at_one = minimize_squared_hinge(InMemorySquaredHinge(X, signs, 1.0), 1000, tolerance)
    cold = minimize_squared_hinge(InMemorySquaredHinge(X, signs, 3.0), 1000, tolerance)
    warm = minimize_squared_hinge(InMemorySquaredHinge(X, signs, 3.0), 1000, tolerance, at_one.W)
    assert cold.converged.all()
    assert warm.converged.all()
    _, g0 = InMemorySquaredHinge(X, signs, 3.0).value_and_gradient(
        np.zeros((X.shape[1] + 1, 4)), np.arange(4)
    )
    bound = 2 * tolerance * np.linalg.norm(g0, axis=0)
    assert (np.linalg.norm(warm.W - cold.W, axis=0) <= bound + 1e-12).all()
    assert warm.n_iter.sum() < cold.n_iter.sum()


def test_problem_weights_undo_one_vs_rest_weights():
    rng = np.random.default_rng(0)
    for n_classes, n_problems in ((4, 4), (2, 1)):
        W = rng.standard_normal((6, n_problems))
        np.testing.assert_array_equal(problem_weights(*one_vs_rest_weights(W, n_classes)), W)


def _gradient_norms_at_zero(X, signs, C):
    _, g0 = InMemorySquaredHinge(X, signs, C).value_and_gradient(
        np.zeros((X.shape[1] + 1, signs.shape[1])), np.arange(signs.shape[1])
    )
    return np.linalg.norm(g0, axis=0)


@pytest.mark.parametrize("method", [ExactNewton(), TrustRegionNewtonCG()], ids=lambda m: m.name)
@pytest.mark.parametrize("C", [0.1, 10.0, 1000.0])
def test_each_newton_method_scores_as_linear_svc(problem, method, C):
    """Either method, from zero or from another C's solution, is LinearSVC's optimum (liblinear
    to 1e-10) within what the stopping rules allow."""
    X, y = problem
    signs = _signs(y, [0, 1, 2, 3])
    reference = LinearSVC(C=C, dual=False, tol=1e-10, max_iter=1_000_000).fit(X, y)
    cold = method.solve(X, signs, C, 1000, 1e-10, None, 1)
    warm = method.solve(X, signs, C, 1000, 1e-10, cold.W * 0.5, 1)
    for solution in (cold, warm):
        assert solution.converged.all()
        coef, intercept = one_vs_rest_weights(solution.W, 4)
        np.testing.assert_allclose(
            X @ coef.T + intercept, reference.decision_function(X), rtol=1e-5, atol=1e-5
        )


def test_exact_newton_and_newton_cg_reach_the_same_optimum(problem):
    """f is 1-strongly convex, so two points whose gradients are below the stopping norms lie
    within their sum of each other; the exact method takes fewer steps."""
    X, y = problem
    signs = _signs(y, [0, 1, 2, 3])
    tolerance = 1e-8
    exact = exact_newton(X, signs, 3.0, 1000, tolerance)
    newton_cg = minimize_squared_hinge(InMemorySquaredHinge(X, signs, 3.0), 1000, tolerance)
    assert exact.converged.all()
    assert newton_cg.converged.all()
    bound = 2 * tolerance * _gradient_norms_at_zero(X, signs, 3.0)
    assert (np.linalg.norm(exact.W - newton_cg.W, axis=0) <= bound + 1e-12).all()
    assert exact.n_iter.max() < newton_cg.n_iter.max()


@pytest.mark.parametrize("classes", [[0, 1, 2, 3], [1]])
def test_exact_newton_does_not_depend_on_the_threads(classes):
    """Problems side by side (four), or one problem's Hessians over blocks of rows in threads
    (more blocks than threads), to the bit."""
    X, y = make_classification(
        n_samples=3 * EXACT_NEWTON_ROWS + 100,
        n_features=20,
        n_classes=4,
        n_informative=6,
        random_state=1,
    )
    signs = _signs(y, classes)
    one = exact_newton(X, signs, 1.0, 1000, n_threads=1)
    two = exact_newton(X, signs, 1.0, 1000, n_threads=2)
    assert one.converged.all()
    np.testing.assert_array_equal(one.W, two.W)
    np.testing.assert_array_equal(one.n_iter, two.n_iter)


def test_exact_newton_reports_a_problem_stopped_at_max_iter(problem):
    X, y = problem
    signs = _signs(y, [0, 1, 2, 3])
    stopped = exact_newton(X, signs, 100.0, 1)
    assert not stopped.converged.any()
    np.testing.assert_array_equal(stopped.n_iter, 1)
    with pytest.warns(ConvergenceWarning, match="max_iter=1"):
        fit_one_vs_rest(X.copy(), y, 4, C=100.0, max_iter=1, n_jobs=1)


@pytest.mark.parametrize("method", [ExactNewton(), TrustRegionNewtonCG()], ids=lambda m: m.name)
def test_a_time_limit_stops_each_method_where_it_is(problem, method):
    X, y = problem
    signs = _signs(y, [0, 1, 2, 3])
    checks = []

    def out_of_time() -> bool:  # the time runs out at the third check
        checks.append(True)
        return len(checks) > 2

    full = method.solve(X, signs, 100.0, 1000, 1e-10, None, 1)
    stopped = method.solve(X, signs, 100.0, 1000, 1e-10, None, 1, out_of_time)
    assert full.converged.all()
    assert not full.out_of_time
    assert stopped.out_of_time
    assert not stopped.converged.all()
    assert stopped.n_iter.max() <= 2 < full.n_iter.max()


def test_a_cpu_time_limit_stops_the_fit_and_says_so(problem):
    X, y = problem
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        _, _, n_iter, _ = fit_one_vs_rest(X.copy(), y, 4, C=100.0, max_iter=1000, n_jobs=1)
        with cpu_time_limit(None):  # no limit
            assert fit_one_vs_rest(X.copy(), y, 4, C=100.0, max_iter=1000, n_jobs=1)[2] == n_iter
        with cpu_time_limit(3600.0):  # a limit it stays within
            assert fit_one_vs_rest(X.copy(), y, 4, C=100.0, max_iter=1000, n_jobs=1)[2] == n_iter
    assert n_iter > 0
    with pytest.warns(ConvergenceWarning, match="CPU time limit"), cpu_time_limit(0.0):
        coef, intercept, stopped, _ = fit_one_vs_rest(
            X.copy(), y, 4, C=100.0, max_iter=1000, n_jobs=1
        )
    assert stopped == 0  # out of time before the first step: the zero weights
    assert not coef.any()
    assert not intercept.any()


def test_a_cpu_time_limit_reads_the_clock_it_is_given(problem):
    """The limit is on the clock given (a fit on one thread passes its thread's): a clock that
    stands still never stops the fit, one that has run past the limit stops it before its
    first step, whatever the process's CPU time says."""
    X, y = problem
    _, _, n_iter, _ = fit_one_vs_rest(X.copy(), y, 4, C=100.0, max_iter=1000, n_jobs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        with cpu_time_limit(1.0, clock=lambda: 0.0):  # a clock that never reaches the limit
            assert fit_one_vs_rest(X.copy(), y, 4, C=100.0, max_iter=1000, n_jobs=1)[2] == n_iter
    readings = iter([0.0, *[10.0] * 100])  # the limit set at 0; then 10 s later, every check
    with (
        pytest.warns(ConvergenceWarning, match="CPU time limit"),
        cpu_time_limit(5.0, clock=lambda: next(readings)),
    ):
        stopped = fit_one_vs_rest(X.copy(), y, 4, C=100.0, max_iter=1000, n_jobs=1)[2]
    assert stopped == 0 < n_iter


def test_the_method_is_chosen_by_the_design():
    """Exact Newton on narrow dense designs, and on wider ones of many more items, the wider
    the larger C; Newton-CG on wide and on sparse ones."""
    narrow = np.zeros((10, EXACT_NEWTON_MAX_COLUMNS - 1))
    wide = np.zeros((10, EXACT_NEWTON_MAX_COLUMNS))
    assert isinstance(newton_method_for(narrow, 1.0), ExactNewton)
    assert isinstance(newton_method_for(wide, 100.0), TrustRegionNewtonCG)
    assert isinstance(newton_method_for(sp.csr_matrix(narrow), 1.0), TrustRegionNewtonCG)
    columns = 2 * EXACT_NEWTON_MAX_COLUMNS  # with the bias's
    tall = np.broadcast_to(0.0, (EXACT_NEWTON_ROWS_PER_COLUMN * columns, columns - 1))
    shorter = tall[:-1]
    assert isinstance(newton_method_for(tall, 1.0, n_threads=2, n_problems=10), ExactNewton)
    assert isinstance(
        newton_method_for(shorter, 1.0, n_threads=2, n_problems=10), TrustRegionNewtonCG
    )
    # 16 threads' and 10 problems' square matrices would outweigh the design: Newton-CG
    assert isinstance(
        newton_method_for(tall, 1.0, n_threads=16, n_problems=10), TrustRegionNewtonCG
    )
    # one problem in flight however many threads: 8 threads' 16 and its 4
    assert isinstance(newton_method_for(tall, 1.0, n_threads=8, n_problems=1), ExactNewton)


@pytest.mark.parametrize(
    ("C", "columns"),
    [
        (0.1, 1024),
        (0.99, 1024),
        (1.0, 2560),
        (3.0, 2560),
        (10.0, 3072),
        (30.0, 3072),
        (100.0, 5120),
        (1e6, 5120),
    ],
)
def test_a_tall_design_is_solved_exactly_up_to_more_columns_the_larger_C(C, columns):
    # the break-even measured, by C: about 1,600 columns at C = 0.1, 2,600 at 1, 3,500 at 10,
    # 6,000 at 100; each range of C takes its lower end's, below C = 1 the narrow designs' cap
    assert exact_newton_tall_columns(C) == columns
    for width, method in ((columns, ExactNewton), (columns + 1, TrustRegionNewtonCG)):
        design = np.broadcast_to(0.0, (64 * width, width - 1))  # tall, memory no bound
        assert isinstance(newton_method_for(design, C, n_threads=2, n_problems=10), method)


def test_a_C_that_is_not_a_number_gets_the_narrow_designs_cap():
    assert exact_newton_tall_columns(float("nan")) == EXACT_NEWTON_MAX_COLUMNS


# Issue 34's stalled set, scaled down: one class 78% of the items, two of 6, separable, whole
# numbers on scales 1 to 100 (benchmarks/bench_solver.py's shuttle-like shape at a tenth).
SMALL_SHUTTLE_COUNTS = (3400, 6, 13, 670, 245, 6, 11)
# The kind of configuration the default chose on the full-size set (218 bases a class there).
SMALL_SHUTTLE_MODEL = {
    "similarity": "rbf(gamma=0.25)",
    "basis_per_class": 50,
    "input_normalization": "per-feature",
    "normalization": "nystroem(square)",
    "n_jobs": 1,
}


def _small_shuttle_like():
    rng = np.random.default_rng(0)
    scales = np.geomspace(1, 100, 9)
    centres = rng.normal(size=(len(SMALL_SHUTTLE_COUNTS), 9)) * 6
    X, y = [], []
    for label, count in enumerate(SMALL_SHUTTLE_COUNTS):
        clusters = centres[label] + rng.normal(size=(3, 9)) * 1.5
        X.append(clusters[rng.integers(0, 3, count)] + rng.normal(size=(count, 9)) * 0.5)
        y += [label] * count
    return np.round(np.vstack(X) * scales), np.asarray(y)


def test_a_separable_very_unbalanced_set_at_large_C_ends_in_few_steps():
    """Issue 34's stall: on nystroem(square) features of separable, very unbalanced data at
    C = 10, Newton-CG's steps shrink with its trust region (up to 30 steps here, 149 on the
    full-size set); the exact Newton method converges in at most 10, to the same optimum, and
    classifies the held-out items as well."""
    X, y = _small_shuttle_like()
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.25, random_state=0, stratify=y
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        # max_iter=1: only the expansion is wanted, its solver's warning ignored.
        expansion = BasisExpandingSVC(**SMALL_SHUTTLE_MODEL, max_iter=1).fit(X_train, y_train)
    features, test_features = (expansion.predictor_.features(x) for x in (X_train, X_test))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        coef, intercept, n_iter, train_accuracy = fit_one_vs_rest(
            features.copy(), y_train, 7, C=10.0, max_iter=15, n_jobs=1
        )
    assert n_iter <= 15
    assert train_accuracy == 1.0
    assert np.mean((test_features @ coef.T + intercept).argmax(axis=1) == y_test) == 1.0
    signs = problem_signs(y_train, np.arange(7))
    tolerance = liblinear_tolerance((signs > 0).sum(axis=0), len(signs), 1e-8)
    newton_cg = TrustRegionNewtonCG().solve(features, signs, 10.0, 1000, tolerance, None, 1)
    assert newton_cg.converged.all()
    assert newton_cg.n_iter.max() > 15
    np.testing.assert_allclose(
        features @ coef.T + intercept,
        features @ newton_cg.W[:-1] + newton_cg.W[-1],
        atol=1e-5 * np.abs(features @ coef.T).max(),
    )
