"""The dense inputs' normalisation kernel against numpy: the items to the bit, the norms and
the largest within rounding, NaN and overflow as numpy would have them (without its warnings)."""

import warnings

import numpy as np
import pytest

from service.model.kernels.inputs import all_finite, normalize_rows


@pytest.mark.parametrize(("n", "d"), [(1, 1), (1, 64), (7, 3), (40, 17)])
def test_items_and_norms_equal_numpys(n, d):
    rng = np.random.default_rng(n * 100 + d)
    X, mean = rng.normal(3, 5, size=(n, d)), rng.normal(size=d)
    scale = rng.uniform(0.5, 2, size=d)
    out, norms = np.full((n, d), np.nan), np.full(n, np.nan)
    largest = normalize_rows(X, mean, scale, out, norms)
    expected = (X - mean) / scale
    np.testing.assert_array_equal(out, expected)  # one subtraction and one division each
    np.testing.assert_allclose(norms, np.linalg.norm(expected, axis=1), rtol=1e-14)
    assert largest == pytest.approx(norms.max(), rel=1e-15)


def test_a_nan_norm_makes_the_largest_nan_wherever_it_is():
    mean, scale = np.zeros(2), np.ones(2)
    for row in range(3):
        X = np.ones((3, 2))
        X[row, 1] = np.nan
        out, norms = np.empty((3, 2)), np.empty(3)
        largest = normalize_rows(X, mean, scale, out, norms)
        assert np.isnan(largest)
        assert np.isnan(norms[row])
        assert np.isfinite(np.delete(norms, row)).all()


def test_values_too_large_to_centre_come_out_infinite_without_warnings():
    X = np.array([[1.7e308, 0.0]])
    mean, scale = np.array([-1.7e308, 0.0]), np.array([1.0, 1.0])
    out, norms = np.empty((1, 2)), np.empty(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        largest = normalize_rows(X, mean, scale, out, norms)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, (X - mean) / scale)
    assert largest == np.inf


def test_all_finite_finds_any_nan_or_infinity_and_no_overflow():
    X = np.full((3, 4), 1e308)  # a sum would overflow; every value is finite
    assert all_finite(X)
    for bad in (np.nan, np.inf, -np.inf):
        for i, j in ((0, 0), (2, 3), (1, 2)):
            Y = X.copy()
            Y[i, j] = bad
            assert not all_finite(Y)
