"""``python -m service.model.warmup``: compile every numba kernel into the on-disk cache.

Run at image build time so that a container starts without compiling anything.
"""

import numpy as np

from service.model.similarity import SIMILARITY_KINDS, SimilaritySpec


def compile_kernels() -> list[str]:
    """Call every similarity driver once on tiny inputs of the dtypes the predictor uses."""
    rng = np.random.default_rng(0)
    basis, X = rng.normal(size=(3, 4)), rng.normal(size=(2, 4))
    wide = np.empty((2, 6))
    names = []
    for kind in SIMILARITY_KINDS.values():
        spec = SimilaritySpec(kind.name, tuple((p.name, p.default) for p in kind.parameters))
        spec.compute(basis, X)  # a C-contiguous output: one measure
        spec.compute(basis, X, wide[:, :3])  # a strided output block: several measures
        names.append(str(spec))
    return names


if __name__ == "__main__":
    print("compiled:", ", ".join(compile_kernels()))
