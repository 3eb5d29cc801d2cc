r"""Input normalisation (BE-SVM paper, section 3.1), globally or per feature.

``global`` (the paper's): dense inputs are centred by the training mean and divided by the mean
L2 norm of the centred training vectors:

.. math:: \hat x = \frac{x - \mu}{\frac{1}{n}\sum_i \lVert x_i - \mu \rVert_2}

One scalar scale for all features keeps the geometry of the input space (unlike a z-score), so
``rbf(gamma=1)`` is a sensible default on data whose features share a unit (pixels).

``per-feature``: each feature is first divided by its training standard deviation (a z-score),
then the z-scores by their mean norm, so that the mean norm is 1 here too and the same gammas
mean the same:

.. math:: \hat x_j = \frac{x_j - \mu_j}{\sigma_j\, m}, \qquad
          m = \frac{1}{n}\sum_i \Bigl\lVert \frac{x_i - \mu}{\sigma} \Bigr\rVert_2

It wins where features have unrelated units (``load_wine``: one feature in the hundreds would
otherwise dominate every distance). Either way the model stores a mean and a scale (a scalar, or
one per feature) and the service applies ``(x - mean) / scale``.
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

# The input normalisations a dense model may use (the manifest's ``input_normalization``).
GLOBAL_NORMALIZATION = "global"
PER_FEATURE_NORMALIZATION = "per-feature"
INPUT_NORMALIZATIONS = (GLOBAL_NORMALIZATION, PER_FEATURE_NORMALIZATION)


class InputNormalizer(OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
    """Centre inputs and scale them so that the mean norm of the training inputs is 1.

    Parameters
    ----------
    scaling : {"global", "per-feature"}, default="global"
        ``global``: one scale, the mean L2 norm of the centred training vectors.
        ``per-feature``: each feature's standard deviation times the mean norm of the z-scores
        (see the module docstring).

    Attributes
    ----------
    mean_ : ndarray of shape (n_features,)
        Training mean.
    scale_ : float or ndarray of shape (n_features,)
        A float for ``global``; one positive scale per feature for ``per-feature`` (a constant
        feature's standard deviation counts as 1). 1.0 if every training vector is the same.
    n_features_in_ : int
    """

    def __init__(self, scaling=GLOBAL_NORMALIZATION):
        self.scaling = scaling

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
        if self.scaling not in INPUT_NORMALIZATIONS:
            raise ValueError(
                f"scaling must be one of {', '.join(INPUT_NORMALIZATIONS)}, got {self.scaling!r}"
            )
        X = validate_data(self, X, dtype=np.float64)
        self.mean_ = X.mean(axis=0)
        centred = X - self.mean_
        if self.scaling == PER_FEATURE_NORMALIZATION:
            std = centred.std(axis=0)
            std[std <= 0.0] = 1.0
            centred /= std
        scale = float(np.linalg.norm(centred, axis=1).mean())
        scale = scale if scale > 0.0 else 1.0
        self.scale_ = std * scale if self.scaling == PER_FEATURE_NORMALIZATION else scale
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


def normalize_inputs(X: np.ndarray, mean: np.ndarray, scale: float | np.ndarray) -> np.ndarray:
    """``(X - mean) / scale`` as a new C-contiguous float64 array: the serving path's step.

    ``scale`` is a float (global normalisation) or an array of shape (n_features,).
    """
    out = np.subtract(X, mean, dtype=np.float64)
    out /= scale
    return out


def input_normalization_of(scale: float | np.ndarray) -> str:
    """The normalisation a stored scale belongs to: a scalar is ``global``, a vector
    ``per-feature``."""
    return GLOBAL_NORMALIZATION if np.ndim(scale) == 0 else PER_FEATURE_NORMALIZATION
