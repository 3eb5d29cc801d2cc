"""The numba similarity kernels against independent numpy and scikit-learn references."""

import numpy as np
import pytest
from sklearn.metrics.pairwise import rbf_kernel

from service.model.kernels import dense as dense_kernels


@pytest.fixture
def rng():
    return np.random.default_rng(42)


SHAPES = [(1, 1, 1), (1, 7, 3), (5, 1, 4), (13, 9, 64), (40, 25, 17)]


LINEAR = [
    dense_kernels.linear_similarities,
    dense_kernels.linear_similarities_serial,
    dense_kernels.linear_similarities_blas,
]
RBF = [
    dense_kernels.rbf_similarities,
    dense_kernels.rbf_similarities_serial,
    dense_kernels.rbf_similarities_blas,
]


@pytest.mark.parametrize("driver", LINEAR)
@pytest.mark.parametrize(("n", "n_basis", "d"), SHAPES)
def test_linear_similarities_equal_matrix_product(rng, driver, n, n_basis, d):
    X, basis = rng.normal(size=(n, d)), rng.normal(size=(n_basis, d))
    out = np.full((n, n_basis), np.nan)
    driver(basis, X, out)
    np.testing.assert_allclose(out, X @ basis.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("driver", RBF)
@pytest.mark.parametrize(("n", "n_basis", "d"), SHAPES)
@pytest.mark.parametrize("gamma", [1e-3, 0.5, 1.0, 7.0])
def test_rbf_similarities_equal_sklearn(rng, driver, n, n_basis, d, gamma):
    X, basis = rng.normal(size=(n, d)), rng.normal(size=(n_basis, d))
    out = np.full((n, n_basis), np.nan)
    driver(basis, X, gamma, out)
    np.testing.assert_allclose(out, rbf_kernel(X, basis, gamma=gamma), rtol=1e-10, atol=1e-14)


def test_pair_kernels_equal_numpy(rng):
    b, x = rng.normal(size=11), rng.normal(size=11)
    assert dense_kernels.linear_pair(b, x) == pytest.approx(float(np.dot(b, x)), rel=1e-13)
    assert dense_kernels.squared_euclidean_pair(b, x) == pytest.approx(float(np.sum((b - x) ** 2)))
    assert dense_kernels.rbf_pair(b, x, 0.3) == pytest.approx(np.exp(-0.3 * np.sum((b - x) ** 2)))
    assert dense_kernels.rbf_pair(b, b, 5.0) == 1.0


@pytest.mark.parametrize(("linear", "rbf"), list(zip(LINEAR, RBF, strict=True)))
def test_drivers_write_into_a_strided_block_and_nowhere_else(rng, linear, rbf):
    X, basis = rng.normal(size=(6, 5)), rng.normal(size=(4, 5))
    wide = np.full((6, 12), -99.0)
    linear(basis, X, wide[:, 4:8])
    rbf(basis, X, 1.0, wide[:, 8:12])
    np.testing.assert_allclose(wide[:, 4:8], X @ basis.T, rtol=1e-12)
    np.testing.assert_allclose(wide[:, 8:12], rbf_kernel(X, basis, gamma=1.0), rtol=1e-10)
    assert (wide[:, :4] == -99.0).all()


def test_accumulation_is_float64_on_large_values():
    # float32 accumulation would lose the +1 against 1e8-sized terms.
    b = np.array([1e8, 1.0, -1e8])
    x = np.array([1.0, 1.0, 1.0])
    assert dense_kernels.linear_pair(b, x) == 1.0


def test_rbf_through_blas_is_near_one_on_an_item_itself_and_never_above():
    # Distances from norms and products round (here by about 1e-8 on norms of 6e7); the clip at
    # zero keeps them from going negative, which would give similarities above 1.
    rng = np.random.default_rng(3)
    basis = rng.normal(size=(30, 64)) * 1e3
    X = np.vstack([basis, basis + 1e-9])
    out = np.empty((60, 30))
    dense_kernels.rbf_similarities_blas(basis, X, 1e-6, out)
    assert (out <= 1.0).all()
    np.testing.assert_allclose(np.diag(out[:30]), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out, rbf_kernel(X, basis, gamma=1e-6), rtol=1e-8, atol=1e-14)
