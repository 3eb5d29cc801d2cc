r"""Input normalisation (BE-SVM paper, section 3.1).

Dense inputs are centred by the training mean and divided by the mean L2 norm of the centred
training vectors:

.. math:: \hat x = \frac{x - \mu}{\frac{1}{n}\sum_i \lVert x_i - \mu \rVert_2}

One scalar scale for all features keeps the geometry of the input space (unlike a z-score), so
``rbf(gamma=1)`` is a sensible default on any data set.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

# The farthest a client's instance may lie from the training mean, in units of the scale (the
# training items' mean distance from it, so they lie near 1). Beyond about 1e6 a code learned
# from such an example keeps one atom (the example's direction alone counts), beyond about 1e13
# learning it takes seconds; up to 1e5 the answers are those of the instance's direction, and
# inputs on another scale than the training data's still fit (0..65535 images for a model of
# 0..16 digits lie at about 8,000).
MAX_INPUT_DISTANCE = 1e5


class InputNormalizer(OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
    """Centre inputs and scale them by the mean norm of the centred training inputs.

    Attributes
    ----------
    mean_ : ndarray of shape (n_features,)
        Training mean.
    scale_ : float
        Mean L2 norm of the centred training vectors (1.0 if every training vector is the same).
    n_features_in_ : int
    """

    def fit(self, X, y=None):
        """Learn the mean and the scale.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        self
        """
        X = validate_data(self, X, dtype=np.float64)
        self.mean_ = X.mean(axis=0)
        scale = float(np.linalg.norm(X - self.mean_, axis=1).mean())
        self.scale_ = scale if scale > 0.0 else 1.0
        return self

    def transform(self, X):
        """Normalise inputs.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        X_hat : ndarray of shape (n_samples, n_features), float64
        """
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return normalize_inputs(X, self.mean_, self.scale_)


def normalize_inputs(X: np.ndarray, mean: np.ndarray, scale: float) -> np.ndarray:
    """``(X - mean) / scale`` as a new C-contiguous float64 array: the serving path's step."""
    out = np.subtract(X, mean, dtype=np.float64)
    out /= scale
    return out
