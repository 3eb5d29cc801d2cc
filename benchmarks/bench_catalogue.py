"""A live, sharded catalogue at scale: code queries over 1, 4 and 16 shards in process and over a
2-worker Dask cluster, with and without a filter that matches 1% of the items; what the Dask hop
adds; and an upsert of 1,000 items through the server, from request to searchable.

    .venv/bin/python benchmarks/bench_catalogue.py [--n 10000000] [--atoms 64]
        [--shards 1,4,16] [--requests 200] [--nnz 10] [--top-k 100] [--dir PATH]

Trains a model on synthetic 128-d vectors (10 Gaussian classes) and its US-SVM search model with
--atoms atoms, then for each shard count writes a catalogue of --n items through the real writer
(:func:`service.model.search.build_catalogue`: shards staged, checksummed and renamed into
place; 4 * n * atoms bytes of float32, 2.56 GB at the defaults): X' is synthetic (standard
normal, seeded by global position, so every layout holds the same items), each item has a
numeric attribute ``bucket`` (0..99, drawn at random), and ids are the positions. One layout is
on disk at a time.

For each layout, :meth:`SearchIndex.run` of code queries (--nnz random atoms, standard normal
weights, a fresh code each request, top --top-k) is timed, interleaved without and with the
filter ``bucket == 7`` (1% of the items): in this process (the shards memory-mapped here, the
kernel's parallel driver on this process's cores), then with the same index over a 2-worker
``LocalCluster`` (one thread a worker: each worker's actors hold half the shards, and the
searches fan out from an asynchronous client on an event loop, as in the server). The first
answers of both are checked equal. p50 and p99 in ms.

The Dask hop: the same code queries on a small catalogue (--hop-n items in 2 shards), where the
search itself costs little: cluster p50 minus in-process p50.

The upsert: the last layout served by ``python -m service.api`` (ADMIN_TOKEN set); 1,000 new
items (128-d vectors) POSTed to /v1/models/{name}/catalogue/items, timed from the request to
the answer, which comes once the new version is on disk and served by that process; each
upsert's items are then fetched to check they are searchable.

The machine may be shared: compare within a run, and read the load printed at the start.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numba
import numpy as np
from bench_search_http import _synthetic
from serving import HOST, service_env, serving

from service.model import Predictor
from service.model.kernels.search import search_top_k
from service.model.search import (
    CatalogueUpdate,
    SearchIndex,
    SearchQuery,
    ShardItems,
    build_catalogue,
    catalogue_dir,
    search_dir,
)
from service.model.search.filters import NumberColumn
from service.model.search.remote import CatalogueSource, SearchCluster
from training.fitting import fit_dataset
from training.retrieval.search_model import estimator_for, fit_search_model

DIM = 128
BLOCK = 1 << 16  # items generated per seed: every layout holds the same X'
ONE_PERCENT = {"must": [{"key": "bucket", "match": {"value": 7}}]}
TOKEN = "bench"


def train(work: Path, atoms: int, seed: int) -> tuple[Path, Predictor]:
    model_dir = work / "model"
    data = _synthetic(2000, 500, DIM, seed)
    fit_dataset(data, "synthetic", similarity="linear").predictor.save(model_dir)
    predictor = Predictor.load(model_dir)
    estimator = estimator_for(n_atoms=atoms, n_epochs=2, random_state=seed)
    fit_search_model(predictor, data, estimator, sparsity=10).save(search_dir(model_dir), model_dir)
    return model_dir, predictor


def synthetic_fill(n_atoms: int, first: int):
    """A shard fill writing X' columns from ``first``: standard normal float32, each block of
    BLOCK global positions from its own seed."""

    def fill(block: np.ndarray, start: int) -> None:
        lo, hi = first + start, first + start + block.shape[1]
        for b in range(lo // BLOCK, (hi - 1) // BLOCK + 1):
            values = np.random.default_rng(b).standard_normal((n_atoms, BLOCK), dtype=np.float32)
            a, z = max(lo, b * BLOCK), min(hi, (b + 1) * BLOCK)
            block[:, a - lo : z - lo] = values[:, a - b * BLOCK : z - b * BLOCK]

    return fill


def write_layout(model_dir: Path, n: int, n_atoms: int, n_shards: int) -> float:
    """The catalogue of ``n`` items in ``n_shards`` shards; seconds it took."""
    started = time.perf_counter()
    buckets = np.random.default_rng(12345).integers(0, 100, n).astype(np.float64)
    ids = np.arange(n).astype(f"<U{len(str(n - 1))}")
    bounds = np.linspace(0, n, n_shards + 1).astype(int)
    shards = [
        ShardItems(
            ids[lo:hi], synthetic_fill(n_atoms, lo), {"bucket": NumberColumn(buckets[lo:hi])}
        )
        for lo, hi in itertools.pairwise(bounds)
    ]
    build_catalogue(catalogue_dir(model_dir), search_dir(model_dir), n_atoms, shards,
                    overwrite=True)  # fmt: skip
    return time.perf_counter() - started


def queries(atoms: int, nnz: int, top_k: int, count: int, seed: int) -> list[SearchQuery]:
    rng = np.random.default_rng(seed)
    return [
        SearchQuery(
            code=(rng.choice(atoms, nnz, replace=False).tolist(), rng.normal(size=nnz).tolist()),
            top_k=top_k,
        )
        for _ in range(count)
    ]


def timed(index: SearchIndex, plain: list[SearchQuery]) -> dict[str, tuple[float, float]]:
    """p50 and p99 (ms) of the queries, without and with the 1% filter, interleaved."""
    filtered = [SearchQuery(code=q.code, top_k=q.top_k, filter=ONE_PERCENT) for q in plain]
    seconds: dict[str, list[float]] = {"no filter": [], "1% filter": []}
    for i, (a, b) in enumerate(zip(plain, filtered, strict=True)):
        for name, query in (("no filter", a), ("1% filter", b)):
            started = time.perf_counter()
            index.run(query)
            if i >= 3:  # warm-up
                seconds[name].append(time.perf_counter() - started)
    return {k: (1e3 * np.median(v), 1e3 * np.percentile(v, 99)) for k, v in seconds.items()}


class LoopThread:
    """An event loop on a thread of its own: the benchmark's stand-in for the server's loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def over_cluster(address: str, loop: LoopThread, model_dir: Path, predictor: Predictor):
    """The model's search index with its shards held by the cluster's workers."""
    cluster = loop.run(SearchCluster(address, deadline_s=60.0).start())
    index = SearchIndex.load(model_dir, predictor, source=CatalogueSource(cluster))
    return cluster, index


def bare_round_trip(cluster: SearchCluster, catalogue, requests: int) -> float:
    """p50 (ms) of a call to every shard's actor that does almost nothing (telling it again of
    the version it knows), from a thread as a search is: Dask's own round trip."""

    async def call_all():
        await asyncio.gather(*(
            cluster.call(shard, "prepare", catalogue.digest, np.zeros(0, dtype=np.int64))
            for shard in catalogue.shards
        ))  # fmt: skip

    seconds = []
    for i in range(requests + 3):
        started = time.perf_counter()
        cluster.run(call_all, 60.0)
        if i >= 3:
            seconds.append(time.perf_counter() - started)
    return 1e3 * float(np.median(seconds))


def upserts(model_dir: Path, rounds: int, seed: int) -> list[float]:
    """Seconds from request to answer of ``rounds`` upserts of 1,000 items through the server;
    each answer's items are then checked searchable."""
    rng = np.random.default_rng(seed)
    seconds = []
    env = service_env(model_dir, ADMIN_TOKEN=TOKEN, MAX_BATCH_SIZE="1000")
    env["MAX_REQUEST_BYTES"] = str(64 * 1024 * 1024)
    with serving([sys.executable, "-m", "service.api"], env, ready_timeout=900) as port:
        url = f"http://{HOST}:{port}"
        with httpx.Client(base_url=url, timeout=600) as client:
            name = client.get("/v1/models").json()["models"][0]["name"]
            for r in range(rounds + 1):
                ids = [f"new-{r}-{j}" for j in range(1000)]
                body = {"ids": ids, "instances": rng.normal(size=(1000, DIM)).tolist(),
                        "attributes": [{"bucket": 7} for _ in ids]}  # fmt: skip
                started = time.perf_counter()
                response = client.post(f"/v1/models/{name}/catalogue/items", json=body,
                                       headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
                elapsed = time.perf_counter() - started
                assert response.status_code == 200, response.text
                for item in (ids[0], ids[-1]):
                    found = client.get(f"/v1/models/{name}/catalogue/items/{item}")
                    assert found.status_code == 200, found.text
                if r:  # the first one warms the route up
                    seconds.append(elapsed)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000_000)
    parser.add_argument("--atoms", type=int, default=64)
    parser.add_argument("--shards", default="1,4,16")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--nnz", type=int, default=10)
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--hop-n", type=int, default=20_000)
    parser.add_argument("--upserts", type=int, default=5)
    parser.add_argument("--hop-only", action="store_true", help="only the Dask hop")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"{os.cpu_count()} cores")  # fmt: skip
    from distributed import LocalCluster

    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-catalogue-"))
    loop = LoopThread()
    env = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    try:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                          dashboard_address=None, env=env) as local:  # fmt: skip
            model_dir, predictor = train(work, args.atoms, args.seed)
            plain = queries(args.atoms, args.nnz, args.top_k, args.requests + 3, args.seed)
            rows = []
            layouts = [] if args.hop_only else sorted(int(s) for s in args.shards.split(","))
            search_top_k(np.zeros((1, 600_000), dtype=np.float32), [0], [1.0], 0.0, 1)
            print(f"numba: {numba.get_num_threads()} threads, {numba.threading_layer()} layer "
                  "in this process; workers: 1 thread each", flush=True)  # fmt: skip
            for n_shards in layouts:
                built = write_layout(model_dir, args.n, args.atoms, n_shards)
                print(f"{n_shards} shard(s): {args.n:,} items x {args.atoms} atoms written in "
                      f"{built:.1f} s", flush=True)  # fmt: skip
                here = SearchIndex.load(model_dir, predictor)
                cluster, there = over_cluster(local.scheduler_address, loop, model_dir, predictor)
                for query in (plain[0], SearchQuery(code=plain[0].code, top_k=args.top_k,
                                                    filter=ONE_PERCENT)):  # fmt: skip
                    assert here.run(query).items == there.run(query).items, "cluster differs"
                in_process, clustered = timed(here, plain), timed(there, plain)
                for where, result in (("in process", in_process), ("2 workers", clustered)):
                    for kind, (p50, p99) in result.items():
                        rows.append((n_shards, where, kind, p50, p99))
                        print(f"  {where:10s} {kind:9s} p50 {p50:8.2f} ms  p99 {p99:8.2f} ms",
                              flush=True)  # fmt: skip
                loop.run(cluster.close())
                del here, there
                if n_shards != layouts[-1]:
                    shutil.rmtree(catalogue_dir(model_dir))
            # The hop: a small catalogue of 2 shards, where a search costs little.
            hop_dir = work / "hop"
            shutil.copytree(model_dir, hop_dir, ignore=shutil.ignore_patterns("catalogue"))
            write_layout(hop_dir, args.hop_n, args.atoms, 2)
            here = SearchIndex.load(hop_dir, predictor)
            cluster, there = over_cluster(local.scheduler_address, loop, hop_dir, predictor)
            small_here, small_there = timed(here, plain), timed(there, plain)
            bare = bare_round_trip(cluster, there.catalogue, args.requests)
            loop.run(cluster.close())
        if layouts:
            seconds = upserts(model_dir, args.upserts, args.seed)
            with CatalogueUpdate(catalogue_dir(model_dir), search_dir(model_dir), args.atoms) as u:
                final = u.current.n_items
    finally:
        loop.stop()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"\ncode queries, {args.nnz} non-zeros, top {args.top_k}, N = {args.n:,}, "
          f"A = {args.atoms}; {args.requests} requests each (ms)")  # fmt: skip
    print("| shards | where | filter | p50 | p99 |")
    print("|---|---|---|---|---|")
    for n_shards, where, kind, p50, p99 in rows:
        print(f"| {n_shards} | {where} | {kind} | {p50:.2f} | {p99:.2f} |")
    hop = small_there["no filter"][0] - small_here["no filter"][0]
    print(f"\nthe Dask hop ({args.hop_n:,} items in 2 shards): in process p50 "
          f"{small_here['no filter'][0]:.3f} ms, over 2 workers {small_there['no filter'][0]:.3f} "
          f"ms: the hop adds {hop:.3f} ms at p50 (target: 2 ms or less); a bare actor call to "
          f"each shard: {bare:.3f} ms at p50")  # fmt: skip
    if not layouts:
        return
    print(f"upsert of 1,000 items, request to searchable (served, {final:,} items after): "
          f"median {1e3 * statistics.median(seconds):.0f} ms, each "
          f"{', '.join(f'{1e3 * s:.0f}' for s in seconds)} ms")  # fmt: skip


if __name__ == "__main__":
    main()
