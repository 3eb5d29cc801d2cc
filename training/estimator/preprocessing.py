r"""Fitting the input normalisation of dense inputs (BE-SVM paper, section 3.1): the mean and
the scale a model stores, by the rules of :mod:`service.model.inputs.dense`, which applies them.

``global`` (the paper's): the mean L2 norm of the centred training vectors; ``per-feature``:
each feature's standard deviation times the mean norm of the z-scores, so that the mean norm is
1 under both and the same rbf widths mean the same.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from service.model.inputs.dense import (
    GLOBAL_NORMALIZATION,
    INPUT_NORMALIZATIONS,
    PER_FEATURE_NORMALIZATION,
    normalize_inputs,
)


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

    @classmethod
    def from_statistics(cls, scaling: str, mean: np.ndarray, scale) -> InputNormalizer:
        """A fitted normaliser from statistics computed elsewhere (by a Dask cluster's
        reductions, :mod:`training.estimator.cluster_fit`), the same as :meth:`fit` learns.

        Parameters
        ----------
        scaling : {"global", "per-feature"}
        mean : ndarray of shape (n_features,)
        scale : float or ndarray of shape (n_features,)

        Returns
        -------
        InputNormalizer
        """
        normalizer = cls(scaling=scaling)
        normalizer.mean_ = np.asarray(mean, dtype=np.float64)
        normalizer.scale_ = scale
        normalizer.n_features_in_ = len(normalizer.mean_)
        return normalizer
