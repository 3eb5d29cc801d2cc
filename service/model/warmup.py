"""``python -m service.model.warmup``: compile every numba kernel into the on-disk cache.

Run at image build time so that a container starts without compiling anything.
"""

import numpy as np

from service.model.similarity import SIMILARITY_KINDS


def compile_kernels() -> list[str]:
    """Call every similarity driver, serial and parallel, on inputs of the predictor's dtypes."""
    rng = np.random.default_rng(0)
    basis, X = rng.normal(size=(3, 4)), rng.normal(size=(2, 4))
    wide = np.empty((2, 6))
    names = []
    for kind in SIMILARITY_KINDS.values():
        # The argument types of SimilaritySpec.compute: Python ints for integer parameters and
        # grid dimensions (a 2 x 2 grid of one-number cells here), floats otherwise.
        args = [int(p.default) if p.integer else float(p.default) for p in kind.parameters]
        if kind.needs_grid:
            args = [2, 2, 1, *args]
        for driver in (kind.driver, kind.serial_driver):
            driver(basis, X, *args, np.empty((2, 3)))  # one measure: a C-contiguous output
            driver(basis, X, *args, wide[:, :3])  # several measures: a strided output block
        names.append(kind.name)
    return names


if __name__ == "__main__":
    print("compiled:", ", ".join(compile_kernels()))
