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
from training.estimator.block_statistics import BlockStatistics, Learned, learn_in_one_block


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
        learned = learn_in_one_block(InputStatistics(self.scaling), X)
        self.mean_, self.scale_ = learned["mean"], learned["scale"]
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
    def from_learned(cls, scaling: str, learned: Learned) -> InputNormalizer:
        """A fitted normaliser from what :class:`InputStatistics` learned elsewhere (from a
        Dask cluster's rows, :mod:`training.estimator.cluster_fit`), as :meth:`fit` learns it.

        Parameters
        ----------
        scaling : {"global", "per-feature"}
        learned : dict
            ``mean`` of shape (n_features,), ``scale`` a float or of shape (n_features,).

        Returns
        -------
        InputNormalizer
        """
        normalizer = cls(scaling=scaling)
        normalizer.mean_ = np.asarray(learned["mean"], dtype=np.float64)
        normalizer.scale_ = learned["scale"]
        normalizer.n_features_in_ = len(normalizer.mean_)
        return normalizer


class InputStatistics(BlockStatistics):
    """What the input normalisation learns, in passes over blocks of rows
    (:mod:`training.estimator.block_statistics`): the mean; for ``per-feature`` each
    feature's standard deviation around it (a constant feature's counts as 1); then the mean
    norm of the centred (and standardised) rows, 1 if every row is the mean.

    Parameters
    ----------
    scaling : {"global", "per-feature"}
    """

    def __init__(self, scaling: str = GLOBAL_NORMALIZATION):
        self.per_feature = scaling == PER_FEATURE_NORMALIZATION
        self.passes = 3 if self.per_feature else 2

    def sums(self, block, step, learned):
        if step == 0:
            return (block.sum(axis=0),)
        centred = block - learned["mean"]
        if step == 1 and self.per_feature:
            return ((centred * centred).sum(axis=0),)
        if self.per_feature:
            centred /= learned["std"]
        return (np.array(np.linalg.norm(centred, axis=1).sum()),)

    def finish(self, totals, step, learned, n_samples):
        if step == 0:
            return {"mean": totals[0] / n_samples}
        if step == 1 and self.per_feature:
            std = np.sqrt(totals[0] / n_samples)
            std[std <= 0.0] = 1.0
            return {**learned, "std": std}
        scale = float(totals[0]) / n_samples
        scale = scale if scale > 0.0 else 1.0
        return {**learned, "scale": learned["std"] * scale if self.per_feature else scale}
