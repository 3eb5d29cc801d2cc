"""``python -m service.model.warmup``: compile every numba kernel into the on-disk cache.

Run at image build time so that a container starts without compiling anything.
"""

import numpy as np
import scipy.sparse as sp

from service.model.inputs.bof import BagOfFeatures
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import parse_transform
from service.model.inputs.words import CellDocuments, Documents, canonical_counts, smooth_idf
from service.model.kernels import bof as bof_kernels
from service.model.kernels.hog import hog_cells, hog_cells_serial
from service.model.kernels.inputs import all_finite, normalize_rows
from service.model.kernels.scores import affine_rows
from service.model.kernels.search import (
    ShardSet,
    kernel_query,
    search_shards_many,
    search_top_k,
)
from service.model.search.codes import sparse_svm_code
from service.model.similarity import SIMILARITY_KINDS
from service.model.threads import SEARCH_PARALLEL_MIN_ENTRIES


def compile_kernels() -> list[str]:
    """Call every similarity driver (serial, parallel, and BLAS where a measure has one) on
    inputs of the predictor's dtypes (dense arrays, and bag-of-words documents for the measures
    that read them)."""
    rng = np.random.default_rng(0)
    basis, X = rng.normal(size=(3, 4)), rng.normal(size=(2, 4))
    counts = canonical_counts(sp.csr_matrix(rng.integers(0, 3, size=(5, 4)).astype(float)))
    idf = smooth_idf(counts)
    basis_documents, documents = Documents(counts[:3], idf), Documents(counts[3:], idf)
    # Images as bags of visual words: the same counts as 3 and 2 images of one cell each.
    weights = np.ones(1)
    basis_cells, cells = CellDocuments(basis_documents, weights), CellDocuments(documents, weights)
    wide = np.empty((2, 6))
    names = []
    for kind in SIMILARITY_KINDS.values():
        args = [int(p.default) if p.integer else float(p.default) for p in kind.parameters]
        if kind.documents is not None:
            for driver in (kind.documents.serial, kind.documents.parallel):
                driver(basis_documents, documents, *args, np.empty((2, 3)))
                driver(basis_documents, documents, *args, wide[:, :3])
        if kind.cells is not None:
            for driver in (kind.cells.serial, kind.cells.parallel):
                driver(basis_cells, cells, *args, np.empty((2, 3)))
                driver(basis_cells, cells, *args, wide[:, :3])
        if kind.documents_only:
            names.append(kind.name)
            continue
        # The argument types of SimilaritySpec.compute: Python ints for integer parameters and
        # grid dimensions (a 2 x 2 grid of one-number cells here), floats otherwise.
        if kind.needs_grid:
            args = [2, 2, 1, *args]
        drivers = (kind.dense.parallel, kind.dense.serial, kind.dense.blas)
        for driver in filter(None, drivers):
            driver(basis, X, *args, np.empty((2, 3)))  # one measure: a C-contiguous output
            driver(basis, X, *args, wide[:, :3])  # several measures: a strided output block
        names.append(kind.name)
    return (
        names
        + compile_inputs()
        + compile_scores()
        + compile_search()
        + compile_codes()
        + compile_hog()
        + compile_bof()
    )


def compile_inputs() -> list[str]:
    """The dense inputs' check and normalisation, on a client batch's types (float64, C order,
    writable)."""
    X = np.zeros((2, 4))
    all_finite(X)
    normalize_rows(X, np.zeros(4), np.ones(4), np.empty((2, 4)), np.empty(2))
    return ["inputs"]


def compile_scores() -> list[str]:
    """The linear layer of a few inputs, on the scorer's types (float64, C order, writable)."""
    affine_rows(np.zeros((2, 6)), np.zeros((6, 3)), np.zeros(3), np.empty((2, 3)))
    return ["scores"]


def compile_search() -> list[str]:
    """The /search kernel, serial (a small catalogue) and parallel (one row long enough), for
    one query and a batch (one query filtered and with exclusions, one not)."""
    atom, weight = np.zeros(1, dtype=np.int64), np.ones(1)
    excluded = np.zeros(1, dtype=np.int64)
    for n_items in (8, SEARCH_PARALLEL_MIN_ENTRIES):
        catalogue = np.zeros((2, n_items), dtype=np.float32)
        search_top_k(catalogue, atom, weight, 0.0, 3)
        search_top_k(catalogue, atom, weight, 0.0, 3, excluded)
        shards = ShardSet([catalogue])
        batch = [
            kernel_query(shards, atom, weight, 3),
            kernel_query(shards, atom, weight, 3, excluded, shards.empty_bitmap() + 1),
        ]
        search_shards_many(shards, batch)
    return ["search"]


def compile_codes() -> list[str]:
    """The path solver of codes learned from examples (service.model.kernels.l1svm)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 3))
    sparse_svm_code(X, np.r_[np.ones(2), -np.ones(4)], 2)
    return ["l1 svm path"]


def compile_hog() -> list[str]:
    """The HOG transform's drivers, serial and parallel, on grey and colour images, with the
    argument types of :meth:`service.model.inputs.transforms.BoundTransform.apply` (Python ints)."""
    rng = np.random.default_rng(0)
    for channels in (1, 3):
        X = rng.uniform(0, 16, size=(2, 4 * 4 * channels))
        for driver in (hog_cells, hog_cells_serial):
            driver(X, 4, 4, channels, 2, 9, np.empty((2, 2 * 2 * 9)))
    return ["hog"]


def compile_bof() -> list[str]:
    """The bof transform's serving drivers (words, serial and parallel, and the pyramid counts)
    on grey and colour images, with the argument types of
    :class:`service.model.inputs.bof.BoundBagOfFeatures` (Python ints). The descriptors alone
    are for training (the visual words), which compiles them when it needs them."""
    rng = np.random.default_rng(0)
    transform = parse_transform("bof(patch=4, step=1, words=2, levels=1)")
    bag = BagOfFeatures(transform, rng.uniform(size=(2, 128)), np.ones(2))
    for channels in (1, 3):
        bound = bag.bind(InputSpec("grid", (5, 5, channels)))
        X = rng.uniform(0, 16, size=(2, 5 * 5 * channels))
        n_patches = bound.layout.n_patches
        words = np.empty((2, n_patches), dtype=np.int64)
        for driver in (bof_kernels.bof_words, bof_kernels.bof_words_serial):
            driver(X, *bound.geometry, bag.centres, words, np.empty(2, dtype=np.bool_))
        bound.cells_of(words)
    return ["bof"]


if __name__ == "__main__":
    print("compiled:", ", ".join(compile_kernels()))
