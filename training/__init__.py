"""Offline training of Basis Expanding SVMs: data sets, fitting, model selection, the /search
model's build, evaluation, the command line.

The Python API: :class:`BasisExpandingSVC`, a scikit-learn classifier whose ``save`` writes the
artifact the service loads; :class:`ForwardSelectionCV`, the wrapper (like ``GridSearchCV``)
that chooses its configuration by cross-validation, what the command line's ``--similarity
auto`` runs; and :func:`open_shards`, training data in shards that ``fit`` reads on a cluster.
"""

from training.cluster.shards import ShardedData, open_shards
from training.estimator.estimator import BasisExpandingSVC
from training.selection.forward_selection import ForwardSelectionCV

__all__ = ["BasisExpandingSVC", "ForwardSelectionCV", "ShardedData", "open_shards"]
