r"""Every numba kernel of the model, one module per kind of item:

- :mod:`~service.model.kernels.dense`: linear and rbf on vectors (pair kernels, their serial and
  parallel drivers, and BLAS drivers for batches);
- :mod:`~service.model.kernels.grid`: rigid and deformable matching of cell grids;
- :mod:`~service.model.kernels.sparse`: the sensing kernels and tf-idf measures on bags of words;
- :mod:`~service.model.kernels.hog`: the HOG transform's cells;
- :mod:`~service.model.kernels.search`: the top-k scan of a catalogue for a sparse code;
- :mod:`~service.model.kernels.l1svm`: the l1 squared-hinge SVM path that learns a code from
  examples (a solver: Newton steps on small dense problems, no parallel driver).

Each module keeps the same layout: small pure kernels on one pair (or one input row) with a
``.. math::`` docstring, then a parallel driver over rows and a serial one beside it, both
writing into a preallocated output; accumulators are float64 and everything compiles with
``cache=True``. Callers never pick a driver themselves: :class:`service.model.similarity.
BoundSimilarity` (measures), :class:`service.model.transforms.BoundTransform` (HOG) and
:func:`service.model.kernels.search.search_top_k` choose by the size of the call, with the
thresholds of :mod:`service.model.threads`.
"""
