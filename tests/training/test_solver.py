"""The one-vs-rest squared-hinge solver against scikit-learn's LinearSVC and finite differences."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.optimize import check_grad
from sklearn.datasets import make_classification
from sklearn.svm import LinearSVC

from training.solver import (
    InMemorySquaredHinge,
    fit_one_vs_rest,
    squared_hinge_objective,
    training_design,
)


@pytest.fixture(scope="module")
def problem():
    X, y = make_classification(
        n_samples=300, n_features=12, n_informative=8, n_classes=4, random_state=0
    )
    return X, y


def _signs(y: np.ndarray, classes) -> np.ndarray:
    return np.where(y[:, None] == np.asarray(classes)[None, :], 1.0, -1.0)


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
    _, g0 = loss.value_and_gradient(W)
    _, g1 = loss.value_and_gradient(W + step * V)
    np.testing.assert_allclose((g1 - g0) / step, loss.hessian_product(W, V), rtol=1e-4, atol=1e-6)


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
    design, shift = training_design(features.copy())
    assert sp.issparse(design)
    np.testing.assert_allclose(shift, 0.25)
    coef, intercept, _, _ = fit_one_vs_rest(features.copy(), y, 3, C=1.0, max_iter=1000, n_jobs=1)
    shifted = features - 0.25
    reference = LinearSVC(C=1.0, dual=False, tol=1e-10, max_iter=100_000).fit(shifted, y)
    np.testing.assert_allclose(
        features @ coef.T + intercept, reference.decision_function(shifted), atol=1e-4
    )
