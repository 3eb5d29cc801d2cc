r"""Every numba kernel of the model, one module per kind of item:

- :mod:`~service.model.kernels.dense`: linear and rbf on vectors (pair kernels, their serial and
  parallel drivers, and BLAS drivers for batches);
- :mod:`~service.model.kernels.grid`: rigid and deformable matching of cell grids;
- :mod:`~service.model.kernels.sparse`: the sensing kernels and tf-idf measures on bags of words;
- :mod:`~service.model.kernels.hog`: the HOG transform's cells;
- :mod:`~service.model.kernels.search`: the top-k scan of a catalogue for a sparse code.

Each module keeps the same layout: small pure kernels on one pair (or one input row) with a
``.. math::`` docstring, then a parallel driver over rows and a serial one beside it, both
writing into a preallocated output; accumulators are float64 and everything compiles with
``cache=True``. Callers never pick a driver themselves: :class:`service.model.similarity.
BoundSimilarity` (measures), :class:`service.model.inputs.transforms.BoundTransform` (HOG) and
:func:`service.model.kernels.search.search_top_k` choose by the size of the call, with the
thresholds of :mod:`service.model.threads`.

A measure's drivers on one kind of item are one :class:`Drivers` record: the dense modules give
theirs (``dense.LINEAR``, ``grid.RIGID``, ...), the documents' come from
:mod:`service.model.inputs.words`, and :data:`service.model.similarity.SIMILARITY_KINDS` names
them side by side, one table for every kind of item.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Drivers:
    """The drivers of a measure on one kind of item, all called ``(basis, X, *args, out)``.

    Attributes
    ----------
    serial : callable
        On the calling thread, for small batches.
    parallel : callable
        In a numba parallel region, rows side by side (the caller serialises the regions).
    blas : callable or None
        Through BLAS on the calling thread, for measures that are a matrix product at heart.
    """

    serial: Callable[..., None]
    parallel: Callable[..., None]
    blas: Callable[..., None] | None = None
