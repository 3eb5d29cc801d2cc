"""The image build's warm-up (``python -m service.model.warmup``) fills numba's on-disk cache with
every kernel and signature that serving runs: a fresh process that serves from that cache, as a
container does, compiles nothing.

Two fresh interpreters share an empty ``NUMBA_CACHE_DIR``: the first runs the warm-up, the second
serves (loads models, warms them up, answers requests, and calls every similarity measure and the
search kernel the way serving does, serially and in parallel, alone and as a block of several
measures) while recording numba's ``numba:compile`` events and each dispatcher's cache hits and
misses. Fresh interpreters, because this one has long compiled everything in memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from numba.core.dispatcher import Dispatcher

from service.model.kernels import bof as bof_kernels
from service.model.kernels import dense as dense_kernels
from service.model.kernels import hog as hog_kernels
from service.model.kernels import inputs as inputs_kernels
from service.model.kernels import l1svm as l1svm_kernels
from service.model.kernels import scores as scores_kernels
from service.model.kernels import search_batch as search_batch_kernels
from service.model.kernels import search_single as search_single_kernels
from service.model.kernels import sparse as sparse_kernels
from service.model.similarity import SIMILARITY_KINDS
from service.model.threads import SIMILARITY_PARALLEL_MIN_THREADS_OVER_BLAS

REPO = Path(__file__).resolve().parents[2]

# The serving process. argv[1]: JSON with the model directories and a scratch directory.
# Prints JSON: the compilations seen, and every service dispatcher's cache hits and misses.
SERVE = r"""
import json
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from numba.core import event
from numba.core.dispatcher import Dispatcher

args = json.loads(sys.argv[1])
rng = np.random.default_rng(0)

with event.install_recorder("numba:compile") as recorder:
    from service.model import Predictor
    from service.model.inputs.words import CellDocuments, Documents, canonical_counts, smooth_idf
    from service.model.inputs.spec import InputSpec
    from service.model.search import SearchIndex, SearchQuery
    from service.model.kernels.search import (
        ShardSet, kernel_query, search_shards_many, search_top_k
    )
    from service.model.similarity import SIMILARITY_KINDS, parse_spec
    from service.model.threads import (
        DOCUMENT_PAIR_MULTIPLY_ADDS,
        HOG_PARALLEL_MIN_VALUES,
        SEARCH_PARALLEL_MIN_ENTRIES,
        SIMILARITY_BLAS_MIN_SAMPLES,
        SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS,
    )
    from service.model.inputs.transforms import parse_transform

    # What a server does with its models: load, warm up, answer one item and a large batch.
    for model_dir in args["models"]:
        predictor = Predictor.load(model_dir)
        predictor.warm_up()
        for n in (1, 64):
            if predictor.vocabulary is not None:
                terms = list(predictor.vocabulary.terms)
                texts = [" ".join(rng.choice(terms, size=12)) for _ in range(n)]
                predictor.classify(texts=texts, top_k=2)
            else:
                shape = predictor.input_spec.shape
                predictor.classify(rng.uniform(0, 16, size=(n, *shape)).tolist(), top_k=2)
        index = SearchIndex.load(model_dir, predictor)
        if index is not None:
            index.warm_up()
            first = str(index.catalogue.ids[0])
            index.run(SearchQuery(class_label=predictor.classes[0], top_k=5, strongest_atoms=2))
            index.run(SearchQuery(code=([1, 2], [1.0, -0.5]), top_k=5, exclude=[first]))
            if predictor.input_spec.is_documents:
                instance = {"indices": [0, 1], "counts": [2, 1]}
            else:
                instance = rng.uniform(0, 16, size=predictor.input_spec.shape).tolist()
            index.run(SearchQuery(positives=[first, instance], top_k=5))
            index.atom_items(3, 5)
            index.run_many([SearchQuery(class_label=predictor.classes[0], top_k=5),
                            SearchQuery(code=([1, 2], [1.0, -0.5]), top_k=5, exclude=[first])])

    # Every measure through SimilaritySpec.compute, on items made as the predictor makes them
    # (C-contiguous float64 arrays; fresh canonical Documents per batch): alone (a C-contiguous
    # output) and beside another measure (a strided block), on one item (the serial driver) and
    # on a batch past the parallel threshold.
    def dense(n):
        return rng.normal(size=(n, 12))

    def documents(n):
        counts = sp.csr_matrix(rng.integers(0, 3, size=(n, 30)).astype(float))
        return Documents(canonical_counts(counts), idf)

    def cells(n):  # images as bags of visual words, 2 cells each
        return CellDocuments(documents(2 * n), np.array([0.5, 0.5]))

    idf = smooth_idf(canonical_counts(sp.csr_matrix(np.ones((2, 30)))))
    for kind in SIMILARITY_KINDS.values():
        spec = parse_spec(kind.name)
        grid_shape = (2, 3, 2) if kind.needs_grid else None
        for make, pair_work, applies in (
            (dense, spec.work(1, 1, 12), not kind.documents_only),
            (documents, DOCUMENT_PAIR_MULTIPLY_ADDS, kind.documents is not None),
            (cells, 2 * DOCUMENT_PAIR_MULTIPLY_ADDS, kind.cells is not None),
        ):
            if not applies:
                continue
            parallel = int(SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS // (4 * pair_work)) + 1
            for n in (1, SIMILARITY_BLAS_MIN_SAMPLES, parallel):
                spec.compute(make(4), make(n), None, grid_shape)
                spec.compute(make(4), make(n), np.empty((n, 8))[:, 4:], grid_shape)

    # The HOG transform as a model's inputs apply it, on grey and colour images: one image (the
    # serial driver) and a batch past the parallel threshold.
    for channels in (1, 3):
        spec = InputSpec("grid", (8, 8, channels))
        bound = parse_transform("hog(2, 6)").bind(spec)
        for n in (1, HOG_PARALLEL_MIN_VALUES // spec.n_features + 1):
            bound.apply(rng.uniform(0, 16, size=(n, spec.n_features)))

    # The search kernel as Catalogue.top calls it, on a memory-mapped catalogue long enough for
    # the parallel driver (the models' catalogues above take the serial one), with and without
    # excluded positions.
    path = Path(args["scratch"]) / "projected.npy"
    np.save(path, rng.normal(size=(2, SEARCH_PARALLEL_MIN_ENTRIES + 1)).astype(np.float32))
    projected = np.load(path, mmap_mode="r")
    search_top_k(projected, np.array([1]), np.array([2.0]), 0.5, 3)
    search_top_k(projected, np.array([1]), np.array([2.0]), 0.5, 3, np.array([0, 5]))
    shards = ShardSet([projected])
    alive = shards.empty_bitmap() + 1
    search_shards_many(shards, [kernel_query(shards, [1], [2.0], 3),
                                kernel_query(shards, [0, 1], [1.0, 1.0], 3, [0, 5], alive)])

compiled = sorted(
    {f"{e.data['dispatcher'].py_func.__qualname__}{e.data['args']}" for _, e in recorder.buffer}
)
dispatchers = {}
for name, module in list(sys.modules.items()):
    if name == "service" or name.startswith("service."):
        for obj in vars(module).values():
            if isinstance(obj, Dispatcher):
                dispatchers[id(obj)] = obj
stats = {
    f"{d.py_func.__module__}.{d.py_func.__qualname__}": {
        "hits": sum(d.stats.cache_hits.values()),
        "misses": [str(sig) for sig in d.stats.cache_misses],
    }
    for d in dispatchers.values()
}
print(json.dumps({"compiled": compiled, "stats": stats}))
"""


def serve_from_a_warmed_cache(
    cache_dir: Path, scratch: Path, models: list[Path], warm_up: list[str]
) -> dict:
    """Run ``warm_up`` (an argv) then :data:`SERVE` in fresh interpreters on one numba cache."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    env.pop("NUMBA_DISABLE_JIT", None)
    run = {"cwd": REPO, "env": env, "capture_output": True, "text": True, "timeout": 600}
    warmed = subprocess.run(warm_up, check=False, **run)
    assert warmed.returncode == 0, warmed.stderr
    payload = json.dumps({"models": [str(m) for m in models], "scratch": str(scratch)})
    # Enough numba threads that large batches take the parallel drivers, as on a bigger machine
    # (below SIMILARITY_PARALLEL_MIN_THREADS_OVER_BLAS threads linear and rbf stay on BLAS).
    threads = max(SIMILARITY_PARALLEL_MIN_THREADS_OVER_BLAS, os.cpu_count() or 1)
    run["env"] = {**env, "NUMBA_NUM_THREADS": str(threads)}
    served = subprocess.run([sys.executable, "-c", SERVE, payload], check=False, **run)
    assert served.returncode == 0, served.stderr
    return json.loads(served.stdout.strip().splitlines()[-1])


def _name(dispatcher: Dispatcher) -> str:
    return f"{dispatcher.py_func.__module__}.{dispatcher.py_func.__qualname__}"


def serving_drivers() -> list[str]:
    """The dispatchers that serving calls from Python: the dense drivers of every measure, the
    documents and cells drivers, the search drivers and the HOG and bof transforms', each serial
    and parallel."""
    names = [
        _name(driver)
        for kind in SIMILARITY_KINDS.values()
        if kind.dense is not None
        for driver in (kind.dense.parallel, kind.dense.serial)
    ]
    names += [
        _name(obj)
        for name, obj in vars(sparse_kernels).items()
        if isinstance(obj, Dispatcher) and name.endswith(("_similarities", "_similarities_serial"))
    ]
    names += [_name(dense_kernels.rbf_exponent_from_products)]  # inside the rbf BLAS driver
    names += [_name(inputs_kernels.all_finite), _name(inputs_kernels.normalize_rows)]
    names += [_name(scores_kernels.affine_rows)]
    names += [_name(search_single_kernels.search_shards_serial)]
    names += [_name(search_single_kernels.search_shards_parallel)]
    names += [_name(search_batch_kernels.search_shards_many_serial)]
    names += [_name(search_batch_kernels.search_shards_many_parallel)]
    names += [_name(l1svm_kernels.l1_svm_path)]
    names += [_name(hog_kernels.hog_cells), _name(hog_kernels.hog_cells_serial)]
    names += [_name(bof_kernels.bof_words), _name(bof_kernels.bof_words_serial)]
    names += [_name(bof_kernels.pyramid_counts)]
    return names


@pytest.fixture(scope="module")
def served(
    tmp_path_factory, digits_model_dir, search_model_dir, text_model_dir, bof_model_dir
) -> dict:
    return serve_from_a_warmed_cache(
        tmp_path_factory.mktemp("numba-cache"),
        tmp_path_factory.mktemp("serve"),
        [digits_model_dir, search_model_dir, text_model_dir, bof_model_dir],
        [sys.executable, "-m", "service.model.warmup"],
    )


def test_serving_from_the_warmed_cache_compiles_nothing(served):
    assert served["compiled"] == [], "compiled while serving: " + ", ".join(served["compiled"])
    misses = {name: s["misses"] for name, s in served["stats"].items() if s["misses"]}
    assert misses == {}


def test_every_serving_driver_was_loaded_from_the_cache(served):
    # Not vacuous: the serving process called each driver, serial and parallel, and numba found
    # it in the cache that the warm-up wrote.
    assert {"rigid", "deformable", "sensing0", "sensing1", "sensing2"} <= set(SIMILARITY_KINDS)
    unused = [
        name for name in serving_drivers() if served["stats"].get(name, {}).get("hits", 0) == 0
    ]
    assert unused == []
