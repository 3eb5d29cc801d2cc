"""The linear layer's compiled loop against numpy's product, and the predictor's scores on
either side of the batch size where BLAS takes over."""

import numpy as np
import pytest

from service.model.kernels.scores import affine_rows
from service.model.threads import SCORES_BLAS_MIN_SAMPLES


@pytest.mark.parametrize(("n", "columns", "classes"), [(1, 1, 1), (1, 250, 10), (7, 33, 4)])
def test_rows_equal_numpys_product_plus_intercepts(n, columns, classes):
    rng = np.random.default_rng(n * 1000 + columns)
    S, W, b = (
        rng.normal(size=(n, columns)),
        rng.normal(size=(columns, classes)),
        rng.normal(size=classes),
    )
    out = np.full((n, classes), np.nan)
    assert affine_rows(S, W, b, out) is None  # written in place
    # Another summation order than BLAS's: within rounding of the sum of the terms' sizes.
    tolerance = 1e-13 * (np.abs(S) @ np.abs(W) + np.abs(b)).max()
    np.testing.assert_allclose(out, S @ W + b, rtol=0, atol=tolerance)


def test_a_nan_similarity_makes_its_row_nan_only():
    S, W, b = np.ones((3, 2)), np.ones((2, 2)), np.zeros(2)
    S[1, 0] = np.nan
    out = np.empty((3, 2))
    affine_rows(S, W, b, out)
    assert np.isnan(out[1]).all()
    np.testing.assert_array_equal(out[[0, 2]], 2.0)


@pytest.mark.parametrize("n", [1, SCORES_BLAS_MIN_SAMPLES - 1, SCORES_BLAS_MIN_SAMPLES, 40])
def test_scores_of_a_batch_equal_the_expanded_features_times_the_svms_weights(
    digits_predictor, digits, n
):
    # Either path (the loop below the threshold, BLAS from it) against the features the
    # training code computes, times the model's coefficients: nothing folded.
    X = digits.X_test[:n]
    features = digits_predictor.features(X)
    expected = features @ digits_predictor.coef.T + digits_predictor.intercept
    scores = digits_predictor.decision_function(X)
    assert scores.shape == (n, len(digits_predictor.classes))
    np.testing.assert_allclose(scores, expected, rtol=1e-9, atol=1e-9)
