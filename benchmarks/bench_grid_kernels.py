"""Cost of the grid similarity kernels against linear and rbf on real digits, in the same run.

    .venv/bin/python benchmarks/bench_grid_kernels.py [--repeats 30] [--basis 250]
        [--inputs 1000] [--hog] [--hog-transform]

Inputs are the digits (8 x 8 x 1), normalised as the models do (centred, divided by the mean
norm of the centred rows); the basis is their first ``--basis`` rows, the inputs the first
``--inputs``. Prints the median time of one call of each driver, parallel and serial, and its
ratio to the linear driver of the same kind. With ``--hog`` it also times random 4 x 4 x 9
grids, the shape of HOG cells. Each driver is called once, compiling it, before it is timed.
With ``--hog-transform`` it also times the ``hog(2, 9)`` and ``hog(4, 9)`` transforms of the
``--inputs`` raw digits (8 x 8 pixels): scikit-image's ``hog`` called image by image (what the
transform did before, the baseline) against the compiled serial driver, one thread each, with
their ratio.
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.datasets import load_digits

from service.model.kernels import dense as dense_kernels
from service.model.kernels import grid as grid_kernels
from service.model.kernels import hog as hog_kernels
from service.model.threads import limit_threads
from training.evaluation.held_out import median_seconds


def _normalised_digits() -> np.ndarray:
    X = load_digits().data.astype(np.float64)
    X -= X.mean(axis=0)
    return np.ascontiguousarray(X / np.linalg.norm(X, axis=1).mean())


def _measures(shape: tuple[int, int, int]) -> list[tuple[str, object, object, tuple]]:
    """(name, parallel driver, serial driver, arguments after ``basis, X``) of each measure."""
    return [
        ("linear", dense_kernels.linear_similarities, dense_kernels.linear_similarities_serial, ()),
        ("rbf(1)", dense_kernels.rbf_similarities, dense_kernels.rbf_similarities_serial, (1.0,)),
        *(
            (
                f"rigid({h})",
                grid_kernels.rigid_similarities,
                grid_kernels.rigid_similarities_serial,
                (*shape, h),
            )
            for h in (1, 2)
        ),
        *(
            (
                f"deformable({h_r},{h_l})",
                grid_kernels.deformable_similarities,
                grid_kernels.deformable_similarities_serial,
                (*shape, h_r, h_l),
            )
            for h_r, h_l in ((1, 1),)
        ),
    ]


def _report(title: str, basis: np.ndarray, X: np.ndarray, shape, repeats: int) -> None:
    out = np.empty((X.shape[0], basis.shape[0]))
    print(f"{title}: {basis.shape[0]} basis items, {X.shape[0]} inputs, d = {X.shape[1]}")
    print(f"{'measure':>16} {'parallel ms':>12} {'x linear':>9} {'serial ms':>10} {'x linear':>9}")
    linear = None
    for name, driver, serial, args in _measures(shape):
        times = (
            median_seconds(lambda d=driver, a=args: d(basis, X, *a, out), repeats),
            median_seconds(lambda d=serial, a=args: d(basis, X, *a, out), repeats),
        )
        linear = times if linear is None else linear
        print(
            f"{name:>16} {1e3 * times[0]:>12.2f} {times[0] / linear[0]:>9.1f} "
            f"{1e3 * times[1]:>10.2f} {times[1] / linear[1]:>9.1f}"
        )


def _report_hog_transform(X: np.ndarray, repeats: int, cell: int = 2, n_bins: int = 9) -> None:
    """scikit-image's HOG image by image against the compiled serial driver, one thread each."""
    from skimage.feature import hog

    def loop() -> np.ndarray:
        return np.array(
            [
                hog(
                    image.reshape(8, 8),
                    orientations=n_bins,
                    pixels_per_cell=(cell, cell),
                    cells_per_block=(1, 1),
                    block_norm="L2-Hys",
                    feature_vector=False,
                ).ravel()
                for image in X
            ]
        )

    out = np.empty((X.shape[0], (8 // cell) ** 2 * n_bins))
    with limit_threads(numba_threads=1, blas_threads=1):
        hog_kernels.hog_cells_serial(X, 8, 8, 1, cell, n_bins, out)
        assert np.array_equal(out, loop())
        baseline = median_seconds(loop, max(3, repeats // 10))
        driver = median_seconds(
            lambda: hog_kernels.hog_cells_serial(X, 8, 8, 1, cell, n_bins, out), repeats
        )
    print(f"hog({cell}, {n_bins}) transform of {X.shape[0]} digits 8 x 8, one thread")
    print(f"{'scikit-image loop ms':>22} {'compiled ms':>12} {'speed-up':>9}")
    print(f"{1e3 * baseline:>22.2f} {1e3 * driver:>12.3f} {baseline / driver:>9.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per driver")
    parser.add_argument("--basis", type=int, default=250, help="basis items")
    parser.add_argument("--inputs", type=int, default=1000, help="inputs per call")
    parser.add_argument("--hog", action="store_true", help="also time 4 x 4 x 9 grids")
    parser.add_argument("--hog-transform", action="store_true", help="also time the HOG transform")
    args = parser.parse_args()

    digits = _normalised_digits()
    basis, X = digits[: args.basis], digits[: args.inputs]
    _report("digits 8 x 8 x 1", basis, X, (8, 8, 1), args.repeats)
    if args.hog:
        rng = np.random.default_rng(0)
        hog = rng.normal(size=(max(args.basis, args.inputs), 4 * 4 * 9))
        print()
        _report("random 4 x 4 x 9", hog[: args.basis], hog[: args.inputs], (4, 4, 9), args.repeats)
    if args.hog_transform:
        print()
        raw = np.ascontiguousarray(load_digits().data[: args.inputs], dtype=np.float64)
        for cell in (2, 4):
            _report_hog_transform(raw, args.repeats, cell)


if __name__ == "__main__":
    main()
