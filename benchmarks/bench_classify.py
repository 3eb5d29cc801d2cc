"""Prediction cost of the default digits model against SVC(RBF), in the same run.

    .venv/bin/python benchmarks/bench_classify.py [--model models/digits] [--repeats 200]
        [--http]

Prints medians per sample at batch 1 and batch 1,000 (inputs drawn from the digits test split,
tiled to 1,000), and the ratio SVC / BE-SVM (above 1: BE-SVM is faster). Both include input
normalisation. With ``--http`` it also starts ``python -m service.api`` on a free port and
reports p50/p90 latency of POST /classify with one instance (the HTTP path end to end).

Then the similarity drivers on one thread, rbf against 1,000 bases of 64 numbers for 1,000
inputs: the serial pair kernels (``rbf_similarities_serial``, the baseline) against the BLAS
driver (``rbf_similarities_blas``: one matrix product and numpy's vectorised exp), with the
ratio (above 1: BLAS is faster).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from serving import latencies, running_server
from sklearn.svm import SVC

from service.model import Predictor
from service.model.kernels import dense as dense_kernels
from service.model.threads import limit_threads
from training.data.datasets import load_digits_dataset
from training.estimator.preprocessing import InputNormalizer
from training.evaluation.held_out import median_seconds


def _http_latencies(model: Path, instance: list, requests: int) -> list[float]:
    with running_server(model) as client:
        body = {"instances": [instance]}
        client.post("/classify", json=body).raise_for_status()
        return list(latencies(lambda: client.post("/classify", json=body), requests))


def _drivers(repeats: int) -> None:
    rng = np.random.default_rng(0)
    basis, X = rng.normal(size=(1000, 64)) / 8, rng.normal(size=(1000, 64)) / 8
    out = np.empty((1000, 1000))
    with limit_threads(numba_threads=1, blas_threads=1):
        dense_kernels.rbf_similarities_blas(basis, X, 1.0, out)
        pairs = median_seconds(
            lambda: dense_kernels.rbf_similarities_serial(basis, X, 1.0, out), repeats
        )
        blas = median_seconds(
            lambda: dense_kernels.rbf_similarities_blas(basis, X, 1.0, out), repeats
        )
    print(
        f"rbf, 1,000 x 1,000 bases of 64, one thread: pair kernels {1e3 * pairs:.2f} ms, "
        f"BLAS {1e3 * blas:.2f} ms, pairs / BLAS {pairs / blas:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=Path("models/digits"))
    parser.add_argument("--repeats", type=int, default=200, help="timing runs at batch 1")
    parser.add_argument("--http", action="store_true", help="also time POST /classify")
    args = parser.parse_args()

    predictor = Predictor.load(args.model)
    data = load_digits_dataset()
    normalizer = InputNormalizer().fit(data.X_train)
    svc = SVC(kernel="rbf", gamma=1.0, C=1.0).fit(normalizer.transform(data.X_train), data.y_train)
    predictor.warm_up()

    batch = np.resize(data.X_test, (1000, data.X_test.shape[1]))
    single = data.X_test[:1]
    print(
        f"model {predictor.name}: {' + '.join(predictor.similarity_names)}, "
        f"B={predictor.n_basis}; SVC(RBF): {svc.support_vectors_.shape[0]} support vectors"
    )
    print(f"{'batch':>6} {'BE-SVM µs/sample':>17} {'SVC µs/sample':>14} {'SVC / BE-SVM':>13}")
    for X, repeats in ((single, args.repeats), (batch, max(args.repeats // 20, 5))):
        ours = median_seconds(lambda X=X: predictor.decision_function(X), repeats)
        theirs = median_seconds(lambda X=X: svc.decision_function(normalizer.transform(X)), repeats)
        n = len(X)
        print(f"{n:>6} {1e6 * ours / n:>17.2f} {1e6 * theirs / n:>14.2f} {theirs / ours:>13.2f}")

    _drivers(max(args.repeats // 20, 5))

    if args.http:
        instance = data.X_test[0].reshape(8, 8).tolist()
        latencies = sorted(_http_latencies(args.model, instance, 500))
        p50, p90 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.9)]
        print(f"HTTP POST /classify, 1 instance: p50 {1e3 * p50:.2f} ms, p90 {1e3 * p90:.2f} ms")


if __name__ == "__main__":
    main()
