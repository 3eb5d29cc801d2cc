r"""Search over a precomputed catalogue with Union-of-Subspaces SVM codes (US-SVM paper).

Every class classifier is :math:`w_k = D z_k` with a sparse code :math:`z_k` over the dictionary
:math:`D` (d x A). For a catalogue X (N items) the trainer stores :math:`X' = D^T X` once, atom
major (A x N float32, memory-mapped), so that

.. math:: s_j = z_k^T x'_j + b_k

reads only the rows of :math:`X'` where :math:`z_k` is non-zero. A new class costs no pass over
the catalogue either: :math:`w^T x = z^T (D^T x)`, so a code is learned on the precomputed rows of
the positives and of a fixed sample of catalogue items as negatives (a small sparse SVM in A
dimensions).

The artifact lives inside the model's directory, so retraining the model retires it::

    model-dir/                 the Basis Expanding SVM (see service.model.predictor)
        search/                the dictionary, the class codes and biases (manifest + .npy)
            catalogue/         projected.npy (A x N float32), ids, negatives sample, labels

Each level records the checksum of the level it derives from and refuses to load over another.

Modules
-------
layout
    Where the artifacts live (:func:`search_dir`, :func:`catalogue_dir`) and the parent check.
codes
    :class:`SparseCode` and :func:`sparse_svm_code`, which learns one from examples.
model
    :class:`UnionOfSubspacesModel` (``D``, the class codes, biases) and its feature space.
catalogue
    :class:`Catalogue` (``X'``, ids, negatives sample), :func:`write_catalogue`,
    :func:`read_catalogue`.
index
    :class:`SearchQuery`, :class:`SearchResult`, :class:`SearchIndex` (answers queries).
"""

from service.model.search.catalogue import (
    CATALOGUE_TYPE,
    DEFAULT_NEGATIVES,
    Catalogue,
    read_catalogue,
    write_catalogue,
)
from service.model.search.codes import LEARN_C_FACTOR, LEARN_C_STEPS, SparseCode, sparse_svm_code
from service.model.search.index import (
    ITEMS_PER_ATOM,
    AtomReport,
    SearchIndex,
    SearchQuery,
    SearchResult,
)
from service.model.search.layout import CATALOGUE_DIR, SEARCH_DIR, catalogue_dir, search_dir
from service.model.search.model import (
    FEATURE_SPACES,
    MODEL_TYPE,
    UnionOfSubspacesModel,
    feature_space_for,
    search_features,
)

__all__ = [
    "CATALOGUE_DIR",
    "CATALOGUE_TYPE",
    "DEFAULT_NEGATIVES",
    "FEATURE_SPACES",
    "ITEMS_PER_ATOM",
    "LEARN_C_FACTOR",
    "LEARN_C_STEPS",
    "MODEL_TYPE",
    "SEARCH_DIR",
    "AtomReport",
    "Catalogue",
    "SearchIndex",
    "SearchQuery",
    "SearchResult",
    "SparseCode",
    "UnionOfSubspacesModel",
    "catalogue_dir",
    "feature_space_for",
    "read_catalogue",
    "search_dir",
    "search_features",
    "sparse_svm_code",
    "write_catalogue",
]
