"""A large basis expansion step by step, beside the numpy matrix products it needs (issue 34).

    .venv/bin/python benchmarks/bench_expansion.py [--n 60000] [--d 784] [--basis 8000]
        [--classes 10] [--gamma 1] [--threads N] [--json out.json]

Random inputs of the issue's shape (by default 60,000 items of 784 numbers, as the 28 x 28 image
sets), scaled as the default's global input normalisation leaves them (centred, mean norm 1),
expanded against a basis of ``--basis`` items (``--classes`` random labels, the same number of
basis items from each) under ``rbf(gamma=1)`` with the normalisation the default chooses for a
kernel, ``nystroem(square)``: :class:`training.expansion.BasisExpansion` ``fit_transform``, what
``fit`` runs, with its own step timings (``timings_``), then the solver's design check
(:func:`training.solver.training_design`) and the eigenvalue diagnostics the artifact records.

In the same run, before and after it (the lower of the two counts, the machine being shared),
the numpy operations those steps need:

- ``X @ basis.T`` (n x d x B) and ``np.exp`` over the n x B result: the similarities;
- ``F @ P`` (n x B x B): the projection of the features;
- ``np.linalg.eigh`` of the B x B basis Gram matrix: the eigenproblem Nystroem needs (not a
  product, but shown beside the normalisation step it is part of);
- a B x B x B product: the projection made of the eigenvectors, ``(V w) @ V.T`` (the
  normalisation's other part; timed as the Gram matrix times itself, the same shapes).

Printed: each step's seconds, its reference's, their ratio, and the whole expansion against the
sum of the products (similarities and projection) and against everything it needs (those, one
eigenproblem and the B x B x B product).
Memory: about 3 n x B x 8 bytes (the features, a reference's output and the projection's
chunks), 11 GB at the default shape; ``--n 20000 --basis 4000`` needs about 1 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from training.estimator.diagnostics import eigen_diagnostics
from training.estimator.expansion import BasisExpansion
from training.estimator.solver import training_design


def _seconds(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def _references(X: np.ndarray, basis: np.ndarray, gram: np.ndarray, out: np.ndarray) -> dict:
    """The numpy operations the expansion needs, timed one by one (``out``: an n x B buffer)."""
    projection = np.ascontiguousarray(np.eye(len(basis)) + gram * 1e-3)
    chunk = 4096
    scratch = np.empty((chunk, len(basis)))

    def project() -> None:
        # By row chunks, as the expansion does it (a chunk's product, then copied back).
        for start in range(0, len(out), chunk):
            rows = out[start : start + chunk]
            np.matmul(rows, projection, out=scratch[: len(rows)])
            rows[...] = scratch[: len(rows)]

    return {
        "similarities (X @ basis.T)": _seconds(lambda: np.matmul(X, basis.T, out=out)),
        "similarities (exp)": _seconds(lambda: np.exp(out, out=out)),
        "projection (F @ P)": _seconds(project),
        "eigenproblem (eigh)": _seconds(lambda: np.linalg.eigh(gram)),
        "projection matrix (B x B x B)": _seconds(lambda: np.matmul(gram, gram)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--d", type=int, default=784)
    parser.add_argument("--basis", type=int, default=8_000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="BLAS and numba")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.n, args.d))
    X -= X.mean(axis=0)
    X /= np.linalg.norm(X, axis=1).mean()
    per_class = args.basis // args.classes
    y = np.arange(args.n) % args.classes
    print(
        f"# {args.n:,} x {args.d} against {per_class * args.classes:,} basis items, "
        f"{args.threads} threads; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    expansion = BasisExpansion(
        f"rbf(gamma={args.gamma:g})", n_basis_per_class=per_class, normalization="nystroem(square)"
    )
    with threadpool_limits(args.threads):
        import numba

        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        # The index strategy takes each class's first items: with labels 0, 1, ... in turn,
        # the first B items. Their rbf Gram matrix is the eigenproblem's input.
        basis = np.ascontiguousarray(X[: per_class * args.classes])
        norms = np.einsum("ij,ij->i", basis, basis)
        distances = np.maximum(norms[:, None] + norms[None, :] - 2 * basis @ basis.T, 0)
        gram = np.exp(-args.gamma * distances)
        del distances
        buffer = np.empty((args.n, len(basis)))
        before = _references(X, basis, gram, buffer)
        del buffer
        whole = time.perf_counter()
        features = expansion.fit_transform(X, y)
        whole = time.perf_counter() - whole
        steps = dict(expansion.timings_)
        steps["design check (training_design)"] = _seconds(lambda: training_design(features))
        gram_0 = expansion.basis_gram_[0]
        eigenvalues = expansion.basis_eigenvalues_[0]
        steps["diagnostics (eigenvalues kept)"] = _seconds(
            lambda: eigen_diagnostics(gram_0, eigenvalues)
        )
        steps["diagnostics (solved again, before)"] = _seconds(lambda: eigen_diagnostics(gram_0))
        buffer = features
        after = _references(X, basis, gram, buffer)
    reference = {name: min(before[name], after[name]) for name in before}
    similarities = reference["similarities (X @ basis.T)"] + reference["similarities (exp)"]
    products = similarities + reference["projection (F @ P)"]
    normalization = reference["eigenproblem (eigh)"] + reference["projection matrix (B x B x B)"]
    rows = [
        ("similarities", steps["similarities"], similarities),
        ("normalization", steps["normalization"], normalization),
        ("projection", steps["projection"], reference["projection (F @ P)"]),
        ("whole fit_transform", whole, products + normalization),
    ]
    print(f"\n{'step':<36} {'seconds':>9} {'numpy':>9} {'ratio':>7}")
    for name, seconds, ref in rows:
        print(f"{name:<36} {seconds:>9.2f} {ref:>9.2f} {seconds / ref:>7.2f}")
    for name in (
        "design check (training_design)",
        "diagnostics (eigenvalues kept)",
        "diagnostics (solved again, before)",
    ):
        print(f"{name:<36} {steps[name]:>9.2f}")
    print("\nnumpy, before and after:")
    for name in before:
        print(f"  {name:<34} {before[name]:>9.2f} {after[name]:>9.2f}")
    print(
        f"\nwhole / (similarity and projection products) = {whole / products:.2f}; "
        f"whole / (products + one eigh + the B x B x B product) = "
        f"{whole / (products + normalization):.2f}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"steps": steps, "whole": whole, "before": before, "after": after}, indent=2)
        )


if __name__ == "__main__":
    main()
