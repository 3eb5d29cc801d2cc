"""POST /search through a real server on a synthetic catalogue of N items (default 1,000,000).

Builds, in a temporary directory, a model on synthetic 128-d vectors (10 Gaussian classes), its
US-SVM search model (A = 256 atoms) and a catalogue of N items written through the real
``build_catalogue`` path (chunked, memory-mapped: about 1 GB at the defaults), serves it with
``python -m service.api`` and measures, in the same run:

- the in-process :meth:`SearchIndex.run` for a code with 10 non-zeros, top 100;
- POST /search with the same code through the server (keep-alive client, sequential);
- POST /search for a class and for 5 positives given as ids (a code learned on the fly).

Medians and p90 are printed; the difference between HTTP and in-process is what the HTTP layer
adds. Run: ``.venv/bin/python benchmarks/bench_search_http.py [--n 1000000]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from serving import latencies, running_server

from service.model import Predictor
from service.model.inputs.spec import InputSpec
from service.model.search import SearchIndex, SearchQuery, search_dir
from training.data.datasets import Dataset
from training.fitting import fit_dataset
from training.retrieval.catalogue import build_catalogue
from training.retrieval.search_model import estimator_for, fit_search_model


def _synthetic(n_train: int, n_test: int, dim: int, seed: int) -> Dataset:
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(10, dim))
    y_train, y_test = rng.integers(0, 10, n_train), rng.integers(0, 10, n_test)
    X_train = means[y_train] + rng.normal(scale=2.0, size=(n_train, dim))
    X_test = means[y_test] + rng.normal(scale=2.0, size=(n_test, dim))
    spec = InputSpec("vector", (dim,))
    return Dataset("synthetic", spec, X_train, y_train.astype(str), X_test, y_test.astype(str))


def _write_items(path: Path, n: int, dim: int, seed: int, chunk: int = 1 << 16) -> np.ndarray:
    items = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    rng = np.random.default_rng(seed + 1)
    for start in range(0, n, chunk):
        stop = min(start + chunk, n)
        items[start:stop] = rng.normal(size=(stop - start, dim))
    items.flush()
    return np.load(path, mmap_mode="r")


def _report(name: str, seconds: np.ndarray) -> float:
    median = float(np.median(seconds))
    print(f"{name:48s} p50 {1e3 * median:8.3f} ms   p90 {1e3 * np.percentile(seconds, 90):8.3f} ms")
    return median


@dataclass
class SearchFixture:
    """A served-ready model directory with a search model and catalogue, and one code query."""

    model_dir: Path
    predictor: Predictor
    search_model: object
    index: SearchIndex
    code_query: SearchQuery
    body: dict  # the same query as a POST /search body

    def run_in_process(self):
        """The query through :meth:`SearchIndex.run`, as the server runs it."""
        return self.index.run(self.code_query)


def build_search_fixture(
    work: Path,
    n: int = 1_000_000,
    atoms: int = 256,
    dim: int = 128,
    nnz: int = 10,
    top_k: int = 100,
    seed: int = 0,
) -> SearchFixture:
    """Train the synthetic model and its search model in ``work``, write a catalogue of ``n``
    items (about 1 GB at the defaults) and draw a code query with ``nnz`` non-zeros."""
    model_dir = work / "model"
    data = _synthetic(2000, 500, dim, seed)
    started = time.perf_counter()
    fit_dataset(data, "synthetic", similarity="linear").predictor.save(model_dir)
    predictor = Predictor.load(model_dir)
    estimator = estimator_for(n_atoms=atoms, n_epochs=2, random_state=seed)
    search_model = fit_search_model(predictor, data, estimator, sparsity=nnz)
    search_model.save(search_dir(model_dir), model_dir)
    print(f"model and {atoms}-atom search model trained in {time.perf_counter() - started:.1f} s")
    items = _write_items(work / "items.npy", n, dim, seed)
    build_catalogue(model_dir, predictor, search_model, items, np.arange(n), chunk_size=1 << 16)
    del items

    index = SearchIndex.load(model_dir, predictor)
    rng = np.random.default_rng(seed + 2)
    code_atoms = rng.choice(atoms, size=nnz, replace=False)
    values = rng.normal(size=nnz)
    code_query = SearchQuery(code=(code_atoms.tolist(), values.tolist()), top_k=top_k)
    body = {"code": {"indices": code_atoms.tolist(), "values": values.tolist()}, "top_k": top_k}
    print(f"catalogue: {n:,} items x {atoms} atoms "
          f"({4 * n * atoms / 1e9:.2f} GB float32, memory-mapped)")  # fmt: skip
    return SearchFixture(model_dir, predictor, search_model, index, code_query, body)


def check_http_matches(fixture: SearchFixture, client) -> None:
    """The server's top-k ids for the fixture's query are the in-process ones."""
    expected = fixture.index.run(fixture.code_query).items
    answer = client.post("/search", json=fixture.body).json()["results"]
    assert [h["id"] for h in answer] == [i for i, _ in expected], "HTTP differs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="catalogue items")
    parser.add_argument("--atoms", type=int, default=256, help="dictionary atoms")
    parser.add_argument("--dim", type=int, default=128, help="raw feature dimensions")
    parser.add_argument("--nnz", type=int, default=10, help="non-zeros of the code query")
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        fixture = build_search_fixture(
            Path(work), args.n, args.atoms, args.dim, args.nnz, args.top_k, args.seed
        )
        index, code_query, body = fixture.index, fixture.code_query, fixture.body
        in_process = latencies(lambda: index.run(code_query), args.requests)
        label = fixture.predictor.classes[0]
        positives = {"positives": [str(i) for i in range(5)], "top_k": args.top_k}
        print()
        with running_server(fixture.model_dir) as client:
            check_http_matches(fixture, client)

            def post(json_body) -> None:
                client.post("/search", json=json_body).raise_for_status()

            base = _report(f"in process: code, {args.nnz} nnz, top {args.top_k}", in_process)
            http = _report(
                f"HTTP POST /search: code, {args.nnz} nnz, top {args.top_k}",
                latencies(lambda: post(body), args.requests),
            )
            n_nonzero = fixture.search_model.metadata["n_nonzero"]
            _report(
                f"HTTP POST /search: class {label!r} ({n_nonzero} nnz)",
                latencies(lambda: post({"class": label, "top_k": args.top_k}), args.requests),
            )
            _report(
                "HTTP POST /search: 5 positives (learned code)",
                latencies(lambda: post(positives), max(args.requests // 10, 5), warm_up=3),
            )
        print(f"\nthe HTTP layer adds {1e3 * (http - base):.3f} ms at p50 "
              f"({http / base:.2f}x the in-process time)")  # fmt: skip


if __name__ == "__main__":
    main()
