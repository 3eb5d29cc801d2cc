"""Offline training of Basis Expanding SVMs: data sets, fitting, selection, evaluation, the
command line.

The Python API: :class:`BasisExpandingSVC`, a scikit-learn classifier whose ``save`` writes the
artifact the service loads, and :class:`ForwardSelectionCV`, which chooses its configuration by
cross-validation (``BasisExpandingSVC(similarity="auto")`` delegates to it).
"""

from training.estimator.estimator import BasisExpandingSVC
from training.selection.forward_selection import ForwardSelectionCV

__all__ = ["BasisExpandingSVC", "ForwardSelectionCV"]
