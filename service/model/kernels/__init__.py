r"""Every numba kernel of the model, one module per kind of item:

- :mod:`~service.model.kernels.dense`: linear and rbf on vectors (pair kernels, their serial and
  parallel drivers, and BLAS drivers for batches);
- :mod:`~service.model.kernels.grid`: rigid and deformable matching of cell grids;
- :mod:`~service.model.kernels.sparse`: the sensing kernels and tf-idf measures on bags of words;
- :mod:`~service.model.kernels.inputs`: the dense inputs' finiteness check and their
  normalisation (centred, scaled and measured in one pass);
- :mod:`~service.model.kernels.scores`: the linear layer of a few inputs (similarities times
  weights, plus intercepts);
- :mod:`~service.model.kernels.hog`: the HOG transform's cells;
- :mod:`~service.model.kernels.bof`: the bof transform's descriptors, visual words and pyramid
  counts (images as bags of visual words);
- :mod:`~service.model.kernels.search`: the top-k scan of a catalogue for a sparse code;
  its steps in :mod:`~service.model.kernels.search_scan` (a chunk scored and fed),
  :mod:`~service.model.kernels.search_heap` (the bounded top-k) and
  :mod:`~service.model.kernels.search_bitmap` (filters), its drivers in
  :mod:`~service.model.kernels.search_single` (one query) and
  :mod:`~service.model.kernels.search_batch` (many queries in one pass);
- :mod:`~service.model.kernels.l1svm`: the l1 squared-hinge SVM path that learns a code from
  examples (a solver: Newton steps on small dense problems, no parallel driver).

Each module keeps the same layout: small pure kernels on one pair (or one input row) with a
``.. math::`` docstring, then one loop over the rows of a batch, written once with
``numba.prange`` and compiled twice by :func:`row_drivers`: a parallel driver and a serial one,
both writing into a preallocated output. Accumulators are float64 and everything compiles with
``cache=True``. (A driver taking the row kernel as an argument would serve every measure, but
numba caches such a driver only for an explicit signature, one dtype and layout per kernel:
without one it would recompile at every process start.) The search kernel's serial
and parallel drivers are two algorithms (one heap, or a heap per range then a merge), not one
loop. Callers never pick a driver themselves: :class:`service.model.similarity.
BoundSimilarity` (measures), :class:`service.model.inputs.transforms.BoundTransform` (HOG),
:class:`service.model.inputs.bof.BoundBagOfFeatures` (bof) and
:func:`service.model.kernels.search.search_shards` choose by the size of the call, with the
thresholds of :mod:`service.model.threads`.

A measure's drivers on one kind of item are one :class:`Drivers` record: the dense modules give
theirs (``dense.LINEAR``, ``grid.RIGID``, ...), the documents' come from
:mod:`service.model.inputs.words`, and :data:`service.model.similarity.SIMILARITY_KINDS` names
them side by side, one table for every kind of item.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass

import numba


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


def row_drivers(rows: Callable[..., None], *, fastmath: bool = False):
    """The parallel and the serial driver of one loop over a batch written with ``numba.prange``.

    The loop is compiled with ``parallel=True`` (rows side by side) and, from a copy named
    ``<name>_serial``, without it (``prange`` is then ``range``: the calling thread alone, for
    small batches, where starting a parallel region costs more than the work). numba's on-disk
    cache is keyed by a function's qualified name: the copy's name keeps both compilations.

    Parameters
    ----------
    rows : function
        The loop, pure Python source that numba compiles.
    fastmath : bool, default=False
        As the module's kernels (:data:`service.model.threads.FASTMATH`).

    Returns
    -------
    parallel, serial : numba dispatchers
    """
    if rows.__closure__ or rows.__kwdefaults__:
        raise TypeError(f"{rows.__name__}: a row loop is a module-level function, no closure")
    options = {"cache": True, "nogil": True, "fastmath": fastmath}
    copy = types.FunctionType(
        rows.__code__, rows.__globals__, f"{rows.__name__}_serial", rows.__defaults__
    )
    copy.__qualname__ = f"{rows.__qualname__}_serial"
    copy.__module__ = rows.__module__
    copy.__doc__ = f":func:`{rows.__name__}` on the calling thread, for small batches."
    return numba.njit(parallel=True, **options)(rows), numba.njit(**options)(copy)
