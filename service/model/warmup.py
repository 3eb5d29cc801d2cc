"""``python -m service.model.warmup``: compile every numba kernel into the on-disk cache.

Run at image build time so that a container starts without compiling anything.
"""

import numpy as np
import scipy.sparse as sp

from service.model.inputs.words import Documents, canonical_counts, smooth_idf
from service.model.kernels.hog import hog_cells, hog_cells_serial
from service.model.kernels.search import search_top_k
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
    wide = np.empty((2, 6))
    names = []
    for kind in SIMILARITY_KINDS.values():
        args = [int(p.default) if p.integer else float(p.default) for p in kind.parameters]
        if kind.documents is not None:
            for driver in (kind.documents.serial, kind.documents.parallel):
                driver(basis_documents, documents, *args, np.empty((2, 3)))
                driver(basis_documents, documents, *args, wide[:, :3])
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
    return names + compile_search() + compile_codes() + compile_hog()


def compile_search() -> list[str]:
    """The /search kernel, serial (a small catalogue) and parallel (one row long enough)."""
    atom, weight = np.zeros(1, dtype=np.int64), np.ones(1)
    excluded = np.zeros(1, dtype=np.int64)
    for n_items in (8, SEARCH_PARALLEL_MIN_ENTRIES):
        catalogue = np.zeros((2, n_items), dtype=np.float32)
        search_top_k(catalogue, atom, weight, 0.0, 3)
        search_top_k(catalogue, atom, weight, 0.0, 3, excluded)
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


if __name__ == "__main__":
    print("compiled:", ", ".join(compile_kernels()))
