"""Offline training of Basis Expanding SVMs: data sets, fitting, evaluation, the command line.

The Python API: :class:`BasisExpandingSVC`, a scikit-learn classifier whose ``save`` writes the
artifact the service loads.
"""

from training.estimator import BasisExpandingSVC

__all__ = ["BasisExpandingSVC"]
