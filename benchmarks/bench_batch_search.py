"""A batch of searches against the same searches one by one, at N = 1,000,000.

    .venv/bin/python benchmarks/bench_batch_search.py [--n 1000000] [--atoms 256]
        [--queries 32] [--nnz 10] [--sparsity 30] [--top-k 100] [--repeats 15] [--http]
        [--dir PATH]

Trains a model on synthetic 128-d vectors (10 Gaussian classes) and its US-SVM search model with
--atoms atoms and class codes of --sparsity non-zeros, then writes a catalogue of --n items
through the real writer (X' synthetic, standard normal; each item a numeric attribute
``bucket``, 0..99 at random; see bench_catalogue.py), memory-mapped as the service maps it.

Three sets of --queries code queries of --nnz non-zeros each, top --top-k:

- one class: each query --nnz atoms drawn at random from one class's code (its --sparsity
  non-zeros), with that code's weights, each scaled by a random factor in [0.5, 1.5]: the
  queries share their rows (the union is at most --sparsity rows);
- one class, filtered: the same, each with a filter of its own (``bucket`` equal to one value,
  1% of the items: most chunks are scored item by item);
- random atoms: each query --nnz atoms drawn from all --atoms: the union is most of the rows.

For each set, :meth:`SearchIndex.run_many` of the whole set is timed against
:meth:`SearchIndex.run` of each query in turn, interleaved, --repeats times; every answer of the
batch is first checked equal to the query's own (ids and scores, exactly). Printed: medians of
each and the median of the per-repeat ratios (singles / batch). With --http the first set is
also sent to ``python -m service.api``: one POST /search of the batch against --queries POSTs,
sequential on one keep-alive connection.

The machine may be shared: compare within a run, and read the load printed at the start and end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numba
import numpy as np
from bench_catalogue import write_layout
from bench_search_http import _synthetic
from serving import HOST, service_env, serving

from service.model import Predictor
from service.model.search import SearchIndex, SearchQuery, search_dir
from training.estimator import fit_dataset
from training.search import estimator_for, fit_search_model

DIM = 128


def train(work: Path, atoms: int, sparsity: int, seed: int) -> tuple[Path, Predictor]:
    model_dir = work / "model"
    data = _synthetic(2000, 500, DIM, seed)
    fit_dataset(data, "synthetic", similarity="linear").predictor.save(model_dir)
    predictor = Predictor.load(model_dir)
    estimator = estimator_for(n_atoms=atoms, n_epochs=2, random_state=seed)
    fit_search_model(predictor, data, estimator, sparsity=sparsity).save(
        search_dir(model_dir), model_dir
    )
    return model_dir, predictor


def query_sets(index: SearchIndex, args, rng) -> dict[str, list[SearchQuery]]:
    model = index.model
    # The class whose code has the most non-zeros (the codes are pruned to --sparsity).
    k = int(np.argmax((model.codes != 0).sum(axis=0)))
    support = np.flatnonzero(model.codes[:, k])
    weights = model.codes[:, k]

    def one_class(filtered: bool) -> list[SearchQuery]:
        queries = []
        for q in range(args.queries):
            atoms = rng.choice(support, min(args.nnz, support.size), replace=False)
            values = weights[atoms] * rng.uniform(0.5, 1.5, size=atoms.size)
            query_filter = None
            if filtered:
                query_filter = {"must": [{"key": "bucket", "match": {"value": q % 100}}]}
            queries.append(SearchQuery(code=(atoms.tolist(), values.tolist()),
                                       top_k=args.top_k, filter=query_filter))  # fmt: skip
        return queries

    random_atoms = []
    for _ in range(args.queries):
        atoms = rng.choice(args.atoms, args.nnz, replace=False)
        code = (atoms.tolist(), rng.normal(size=args.nnz).tolist())
        random_atoms.append(SearchQuery(code=code, top_k=args.top_k))
    print(f"class {model.classes[k]}: a code of {support.size} non-zeros; each query "
          f"{args.nnz} of them")  # fmt: skip
    return {
        "one class": one_class(False),
        "one class, filtered": one_class(True),
        "random atoms": random_atoms,
    }


def union_rows(queries: list[SearchQuery]) -> int:
    return len({atom for query in queries for atom in query.code[0]})


def check_equal(index: SearchIndex, queries: list[SearchQuery]) -> None:
    batch = index.run_many(queries)
    for query, answer in zip(queries, batch, strict=True):
        alone = index.run(query)
        assert answer.items == alone.items, "a batch answer differs from the query's own"
        assert answer.next_cursor == alone.next_cursor


def timed(index: SearchIndex, queries: list[SearchQuery], repeats: int) -> tuple[list, list]:
    """Seconds of the queries one by one and of the batch, interleaved (warm-up first)."""
    singles, batches = [], []
    for r in range(repeats + 2):
        started = time.perf_counter()
        for query in queries:
            index.run(query)
        middle = time.perf_counter()
        index.run_many(queries)
        ended = time.perf_counter()
        if r >= 2:
            singles.append(middle - started)
            batches.append(ended - middle)
    return singles, batches


def over_http(model_dir: Path, queries: list[SearchQuery], repeats: int) -> tuple[list, list]:
    """Seconds of --queries POSTs against one POST of the batch, interleaved."""
    bodies = [
        {"code": {"indices": q.code[0], "values": q.code[1]}, "top_k": q.top_k} for q in queries
    ]
    env = service_env(model_dir, MAX_BATCH_SIZE=str(max(1000, len(queries))))
    singles, batches = [], []
    command = [sys.executable, "-m", "service.api"]
    with (
        serving(command, env, ready_timeout=900) as port,
        httpx.Client(base_url=f"http://{HOST}:{port}", timeout=600) as client,
    ):
        name = client.get("/v1/models").json()["models"][0]["name"]
        for r in range(repeats + 2):
            started = time.perf_counter()
            alone = [client.post(f"/v1/models/{name}/search", json=b).json() for b in bodies]
            middle = time.perf_counter()
            batch = client.post(f"/v1/models/{name}/search", json={"searches": bodies})
            ended = time.perf_counter()
            assert batch.json()["searches"] == alone, "a batch answer differs over HTTP"
            if r >= 2:
                singles.append(middle - started)
                batches.append(ended - middle)
    return singles, batches


def summary(singles: list[float], batches: list[float]) -> tuple[float, float, float]:
    ratios = [s / b for s, b in zip(singles, batches, strict=True)]
    return (
        1e3 * statistics.median(singles),
        1e3 * statistics.median(batches),
        statistics.median(ratios),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    numbers = {
        "--n": (1_000_000, "catalogue items"),
        "--atoms": (256, "dictionary atoms (rows of X')"),
        "--queries": (32, "queries in a batch"),
        "--nnz": (10, "non-zeros of each query's code"),
        "--sparsity": (30, "non-zeros of a class code"),
        "--top-k": (100, "items each query asks for"),
        "--repeats": (15, "timed rounds of each set"),
        "--seed": (0, "of the model, the catalogue and the queries"),
    }
    for flag, (default, text) in numbers.items():
        parser.add_argument(flag, type=int, default=default, help=f"{text} (default: {default})")
    parser.add_argument("--http", action="store_true", help="also through a real server")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"{os.cpu_count()} cores, numba {numba.get_num_threads()} threads "
          f"({numba.config.THREADING_LAYER} layer requested)", flush=True)  # fmt: skip
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-batch-"))
    rng = np.random.default_rng(args.seed)
    rows = []
    try:
        model_dir, predictor = train(work, args.atoms, args.sparsity, args.seed)
        built = write_layout(model_dir, args.n, args.atoms, 1)
        print(f"{args.n:,} items x {args.atoms} atoms written in {built:.1f} s", flush=True)
        index = SearchIndex.load(model_dir, predictor)
        index.warm_up()
        for name, queries in query_sets(index, args, rng).items():
            check_equal(index, queries)
            single, batch, ratio = summary(*timed(index, queries, args.repeats))
            rows.append(("in process", name, union_rows(queries), single, batch, ratio))
            print(f"  {name:20s} union {union_rows(queries):3d} rows: {args.queries} singles "
                  f"{single:8.1f} ms, batch {batch:7.1f} ms, x{ratio:.2f}", flush=True)  # fmt: skip
        if args.http:
            queries = query_sets(index, args, np.random.default_rng(args.seed))["one class"]
            single, batch, ratio = summary(*over_http(model_dir, queries, args.repeats))
            rows.append(("HTTP", "one class", union_rows(queries), single, batch, ratio))
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"\n{args.queries} code queries of {args.nnz} non-zeros, top {args.top_k}, "
          f"N = {args.n:,}, A = {args.atoms}; medians of {args.repeats} interleaved rounds; "
          "every batch answer equal to the query's own")  # fmt: skip
    print(f"| where | queries | union of rows | {args.queries} singles (ms) | batch (ms) | "
          "singles / batch |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for where, name, union, single, batch, ratio in rows:
        print(f"| {where} | {name} | {union} | {single:.1f} | {batch:.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
