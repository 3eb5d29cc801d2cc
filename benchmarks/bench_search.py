"""Cost of one /search query (search_top_k) against dense numpy and FAISS, in the same run.

    .venv/bin/python benchmarks/bench_search.py [--n 1000000] [--atoms 256] [--dim 128]
        [--top-k 100] [--nnz 5,10,20] [--repeats 30] [--seed 0]

Builds a synthetic catalogue: raw features X (n x dim, float32, standard normal), a dictionary D
(dim x atoms, unit-norm columns) and the stored projection X' = D^T X^T (atoms x n, float32,
atom-major, about 1 GB at the defaults), computed in blocks of items. For each sparse code z with
``nnz`` non-zeros (random atoms, standard normal weights) it times, warm, medians over
``--repeats`` calls (the codes' calls interleaved, round by round, within each method):

- search: ``search_top_k(X', atoms, weights, 0, k)``, reading only the nnz rows of X';
- dense numpy: ``s = X @ (D z)`` on the raw features, ``argpartition`` and a sort of the k best;
- FAISS: ``IndexFlatIP(dim)`` over X, ``index.search((D z)[None], k)`` (skipped without faiss);

and the read bandwidth (a numba ``prange`` sum over the whole of X', and numpy's ``X'.sum()``
for reference), from which the bound of a search that reads nnz rows: ``nnz * n * 4`` bytes /
bandwidth. search_top_k's result is checked once against a numpy ranking of X' before timing.
The numba parts run with BLAS limited to one thread (as the server does); the dense numpy
baseline runs with BLAS's default threads. The machine may be shared: compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numba
import numpy as np
from threadpoolctl import threadpool_info

from service.model.kernels.search import search_top_k
from service.model.threads import FASTMATH, SEARCH_PARALLEL_MIN_ENTRIES, limit_threads
from training.evaluation.held_out import median_seconds


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _block_sum(block):
    """Sum of a 1-D float32 array with a float64 accumulator (vectorised)."""
    acc = 0.0
    for i in range(block.shape[0]):
        acc += block[i]
    return acc


@numba.njit(parallel=True, cache=True)
def _parallel_sum(flat, n_blocks):
    """Sum of a 1-D float32 array in ``n_blocks`` blocks summed in parallel.

    The block sums are written to an array: a scalar ``+=`` reduction inside the ``prange``
    body vectorised worse here (8-9 GB/s against 14-15 GB/s over the same 1 GB).
    """
    n = flat.shape[0]
    partial = np.empty(n_blocks)
    for b in numba.prange(n_blocks):
        partial[b] = _block_sum(flat[b * n // n_blocks : (b + 1) * n // n_blocks])
    return partial.sum()


def interleaved_medians(calls: dict, repeats: int) -> dict:
    """Median wall time of each of ``calls`` (name -> function), timed in turn, one call of each
    per round for ``repeats`` rounds after one untimed round: a burst of load from another
    process then hits every method alike instead of one of them."""
    for run in calls.values():
        run()
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, run in calls.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def build_catalogue(n: int, n_atoms: int, dim: int, seed: int, block: int = 65536):
    """(X, D, projected): features, dictionary and X' = D^T X^T, built in blocks of items."""
    rng = np.random.default_rng(seed)
    X = np.empty((n, dim), dtype=np.float32)
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        X[lo:hi] = rng.standard_normal((hi - lo, dim), dtype=np.float32)
    D = rng.standard_normal((dim, n_atoms)).astype(np.float32)
    D /= np.linalg.norm(D, axis=0)
    projected = np.empty((n_atoms, n), dtype=np.float32)
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        projected[:, lo:hi] = (X[lo:hi] @ D).T
    return X, D, projected


def dense_top_k(X: np.ndarray, w: np.ndarray, k: int) -> np.ndarray:
    """The k best rows of X for w, best first: one gemv, argpartition, a sort of k."""
    s = X @ w
    k = min(k, s.shape[0])
    best = np.argpartition(-s, k - 1)[:k]
    return best[np.argsort(-s[best], kind="stable")]


def reference_top_k(projected, atoms, weights, k):
    """Numpy ranking of the stored projection: float64 scores, stable order by (-score, j)."""
    scores = weights @ projected[atoms].astype(np.float64)
    return np.argsort(-scores, kind="stable")[:k]


def read_bandwidth(projected: np.ndarray, repeats: int = 7) -> tuple[float, float]:
    """Bytes per second of a numba prange sum over ``projected`` and of numpy's ``sum``."""
    flat = projected.reshape(-1)
    n_blocks = 128 * numba.get_num_threads()
    numba_s = median_seconds(lambda: _parallel_sum(flat, n_blocks), repeats)
    numpy_s = median_seconds(lambda: projected.sum(), max(3, repeats // 2))
    return projected.nbytes / numba_s, projected.nbytes / numpy_s


def faiss_index(X: np.ndarray):
    """An IndexFlatIP over X, or (None, reason) when faiss cannot be imported."""
    try:
        import faiss
    except ImportError as error:
        return None, f"{type(error).__name__}: {error}"
    index = faiss.IndexFlatIP(X.shape[1])
    index.add(X)
    return index, f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} OpenMP threads"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="catalogue items")
    parser.add_argument("--atoms", type=int, default=256, help="dictionary atoms (rows of X')")
    parser.add_argument("--dim", type=int, default=128, help="raw feature dimension")
    parser.add_argument("--top-k", type=int, default=100, help="k best items per query")
    parser.add_argument("--nnz", default="5,10,20", help="non-zeros of the codes, comma-separated")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per method")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    nnzs = list(dict.fromkeys(int(v) for v in args.nnz.split(",")))
    if any(v < 1 or v > args.atoms for v in nnzs):
        parser.error("every --nnz must be in 1..--atoms")
    k = args.top_k

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    X, D, projected = build_catalogue(args.n, args.atoms, args.dim, args.seed)
    index, faiss_note = faiss_index(X)
    print(
        f"catalogue: n = {args.n:,}, atoms = {args.atoms}, dim = {args.dim}, k = {k}; "
        f"X' {projected.nbytes / 1e9:.2f} GB, X {X.nbytes / 1e9:.2f} GB "
        f"(built in {time.perf_counter() - started:.1f} s)"
    )
    blas = ", ".join(f"{i['internal_api']} {i['num_threads']}" for i in threadpool_info())
    print(
        f"cores {os.cpu_count()}, numba {numba.__version__} threads {numba.get_num_threads()} "
        f"(layer chosen at first parallel call), BLAS threads: {blas or 'none'}; "
        f"search goes parallel at nnz * n >= {SEARCH_PARALLEL_MIN_ENTRIES:,}"
    )
    print(f"FAISS: {faiss_note if index is not None else 'skipped (' + faiss_note + ')'}")

    rng = np.random.default_rng(args.seed + 1)
    codes = []
    for nnz in nnzs:
        atoms = np.sort(rng.choice(args.atoms, size=nnz, replace=False)).astype(np.int64)
        weights = rng.standard_normal(nnz)
        codes.append((nnz, atoms, weights, (D[:, atoms] @ weights).astype(np.float32)))

    with limit_threads(blas_threads=1):
        for nnz, atoms, weights, _ in codes:
            positions, _ = search_top_k(projected, atoms, weights, 0.0, k)
            expected = reference_top_k(projected, atoms, weights, k)
            if not np.array_equal(positions, expected):
                raise SystemExit(f"search_top_k disagrees with numpy at nnz = {nnz}")
        print(f"check: search_top_k equals numpy's top {k} on X' for nnz = {args.nnz}")
        print(f"numba layer: {numba.threading_layer()}")

        numba_bw, numpy_bw = read_bandwidth(projected)
        print(
            f"read bandwidth over X' (median): numba prange sum {numba_bw / 1e9:.1f} GB/s, "
            f"numpy sum {numpy_bw / 1e9:.1f} GB/s; bound = nnz * n * 4 B / numba bandwidth"
        )
        search_s = interleaved_medians(
            {
                nnz: lambda a=atoms, w=weights: search_top_k(projected, a, w, 0.0, k)
                for nnz, atoms, weights, _ in codes
            },
            args.repeats,
        )
    queries = {nnz: np.ascontiguousarray(w[None]) for nnz, _, _, w in codes}
    dense_s = interleaved_medians(
        {nnz: lambda w=w: dense_top_k(X, w, k) for nnz, _, _, w in codes}, args.repeats
    )
    faiss_s = {}
    if index is not None:
        faiss_s = interleaved_medians(
            {nnz: lambda q=q: index.search(q, k) for nnz, q in queries.items()}, args.repeats
        )
    recall = {}
    for nnz, atoms, weights, w in codes:
        exact = set(search_top_k(projected, atoms, weights, 0.0, k)[0].tolist())
        recall[nnz] = len(exact & set(dense_top_k(X, w, k).tolist())) / len(exact)
        if index is not None:
            found = set(index.search(queries[nnz], k)[1][0].tolist())
            recall[nnz] = min(recall[nnz], len(exact & found) / len(exact))

    print()
    print(
        f"median ms of one query over {args.repeats} calls, each method's codes timed in turn "
        "(ratios dense/search and faiss/search above 1: search is faster)"
    )
    header = (
        f"{'nnz':>4} {'search':>8} {'dense np':>9} {'faiss':>8} {'bound':>7} "
        f"{'dense/search':>13} {'faiss/search':>13} {'search/bound':>13} {'overlap':>8}"
    )
    print(header)
    for nnz, *_ in codes:
        bound_ms = 1e3 * nnz * args.n * 4 / numba_bw
        s, d = 1e3 * search_s[nnz], 1e3 * dense_s[nnz]
        f = 1e3 * faiss_s[nnz] if nnz in faiss_s else None
        print(
            f"{nnz:>4} {s:>8.2f} {d:>9.2f} "
            f"{f'{f:.2f}' if f is not None else '-':>8} {bound_ms:>7.2f} "
            f"{d / s:>13.1f} {f'{f / s:.1f}' if f is not None else '-':>13} "
            f"{s / bound_ms:>13.2f} {recall[nnz]:>8.2f}"
        )
    print(
        "overlap: the least share of search_top_k's top k that dense numpy and FAISS also return "
        "(they rank the float32 raw features, so a near-tie at the k-th place may differ)"
    )
    print(
        f"1-minute load average: {load_before:.2f} at the start, {os.getloadavg()[0]:.2f} at the "
        f"end, on {os.cpu_count()} cores (other processes' load makes the timings noisy)"
    )


if __name__ == "__main__":
    main()
