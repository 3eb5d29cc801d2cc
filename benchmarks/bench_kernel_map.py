"""A kernel's ``nystroem(clip)`` map from a pivoted Cholesky factor against the eigenvector map.

    .venv/bin/python benchmarks/bench_kernel_map.py --set spambase --seed 0 \\
        --gamma 0.25 --threads 1 --repeats 3

The basis Gram matrix of ``rbf(gamma=...)`` between every training item of the set's split,
its inputs normalised ``per-feature`` (z-scores divided by their mean norm, as the product does;
the basis ladder's large-basis search at every item), projected two
ways: ``nystroem_projection(K, "clip")`` (an eigendecomposition, then ``(V w) @ V.T``) and
``kernel_map_projection(K)`` (a pivoted Cholesky factorisation and the triangular factor's
inverse). Printed: the median CPU seconds of each (``--repeats`` runs; the process's CPU time,
so that other load counts less), their ratio, the rank the factor keeps, and how far apart the
features' inner products on the test split are (the two maps differ by a rotation: zero up to
rounding, relative to the largest inner product). ``--size`` takes the first items instead of
all.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from sklearn.metrics.pairwise import rbf_kernel
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from training.data.datasets import load_dataset
from training.estimator.normalization import kernel_map_projection, nystroem_projection


def _cpu_median(work, repeats: int):
    seconds, result = [], None
    for _ in range(repeats):
        started = time.process_time()
        result = work()
        seconds.append(time.process_time() - started)
    return statistics.median(seconds), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="spambase")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gamma", type=float, default=0.25)
    parser.add_argument("--size", type=int, default=None, help="basis items (default: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data = load_dataset(args.set, test_fraction=0.25, seed=args.seed)
    scaler = StandardScaler().fit(data.X_train)
    mean_norm = np.linalg.norm(scaler.transform(data.X_train), axis=1).mean()
    basis = scaler.transform(data.X_train)[: args.size] / mean_norm
    test = scaler.transform(data.X_test) / mean_norm
    gram = rbf_kernel(basis, gamma=args.gamma)
    towards = rbf_kernel(test, basis, gamma=args.gamma)
    with threadpool_limits(args.threads):
        eigen_s, eigen = _cpu_median(lambda: nystroem_projection(gram, "clip"), args.repeats)
        factor_s, factor = _cpu_median(lambda: kernel_map_projection(gram), args.repeats)
    inner = [(towards @ P) @ (towards @ P).T for P in (eigen, factor)]
    gap = np.abs(inner[0] - inner[1]).max() / np.abs(inner[0]).max()
    rank = int(np.count_nonzero(np.abs(factor).sum(axis=0) > 0))
    print(
        f"{args.set} seed {args.seed}, B = {len(basis)}, rbf(gamma={args.gamma:g}), "
        f"{args.threads} thread(s), median of {args.repeats}"
    )
    print(f"eigenvector map: {eigen_s:.2f} CPU s")
    print(f"Cholesky map:    {factor_s:.2f} CPU s (rank {rank}), {eigen_s / factor_s:.1f}x faster")
    print(f"largest difference of the test items' inner products, relative: {gap:.1e}")


if __name__ == "__main__":
    main()
