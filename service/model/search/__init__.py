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
            catalogue/         a manifest naming the version's shards, its tombstones and
                               negatives sample; shards/ (each X' of a range of items, A x n
                               float32, with ids, labels and attributes)

Each level records the checksum of the level it derives from and refuses to load over another.

Modules
-------
layout
    Where the artifacts live (:func:`search_dir`, :func:`catalogue_dir`) and the parent check.
codes
    :class:`SparseCode` and :func:`sparse_svm_code`, which learns one from examples.
model
    :class:`UnionOfSubspacesModel` (``D``, the class codes, biases) and its feature space.
shards
    :class:`~service.model.search.shards.Shard`: one shard's rows, ids and attributes.
catalogue
    :class:`Catalogue` (one version: shards, tombstones, negatives sample),
    :func:`read_catalogue`.
store
    Writing versions: :func:`build_catalogue` (a whole build), :class:`CatalogueUpdate`
    (upserts, deletions, compaction), under one writer lock, acknowledged once on disk.
versions
    What every writer shares: the writer lock, checked ids, a shard's items, one version's
    files written.
copies
    Whole versions copied file by file against their checksums, and restored.
filters
    Item attributes and :class:`Filter` (Qdrant's shape), applied in the kernel as bitmaps;
    the counts and facets they allow.
pages
    :class:`~service.model.search.pages.Cursor`: pages of a ranking within a version.
snapshots
    Snapshots of a catalogue version (checksummed copies) and their restore.
queries
    :class:`SearchQuery`, :class:`SearchResult`: a search as a client asks it, and its answer.
index
    :class:`SearchIndex` (answers queries, one or a batch, writes updates, takes and restores
    snapshots).
"""

from service.model.search.catalogue import (
    CATALOGUE_TYPE,
    DEFAULT_NEGATIVES,
    Catalogue,
    Ranking,
    read_catalogue,
)
from service.model.search.codes import LEARN_C_FACTOR, LEARN_C_STEPS, SparseCode, sparse_svm_code
from service.model.search.filters import Filter
from service.model.search.index import ITEMS_PER_ATOM, SearchIndex
from service.model.search.layout import CATALOGUE_DIR, SEARCH_DIR, catalogue_dir, search_dir
from service.model.search.model import (
    FEATURE_SPACES,
    MODEL_TYPE,
    UnionOfSubspacesModel,
    feature_space_for,
    search_features,
)
from service.model.search.queries import AtomReport, SearchQuery, SearchResult
from service.model.search.store import DEFAULT_SHARD_ITEMS, CatalogueUpdate, build_catalogue
from service.model.search.versions import ShardItems, UpdateResult, rows_filler

__all__ = [
    "CATALOGUE_DIR",
    "CATALOGUE_TYPE",
    "DEFAULT_NEGATIVES",
    "DEFAULT_SHARD_ITEMS",
    "FEATURE_SPACES",
    "ITEMS_PER_ATOM",
    "LEARN_C_FACTOR",
    "LEARN_C_STEPS",
    "MODEL_TYPE",
    "SEARCH_DIR",
    "AtomReport",
    "Catalogue",
    "CatalogueUpdate",
    "Filter",
    "Ranking",
    "SearchIndex",
    "SearchQuery",
    "SearchResult",
    "ShardItems",
    "SparseCode",
    "UnionOfSubspacesModel",
    "UpdateResult",
    "build_catalogue",
    "catalogue_dir",
    "feature_space_for",
    "read_catalogue",
    "rows_filler",
    "search_dir",
    "search_features",
    "sparse_svm_code",
]
