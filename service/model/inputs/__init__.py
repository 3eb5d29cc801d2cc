"""What a model's inputs are: one module per input kind, and what the kinds share.

- :mod:`~service.model.inputs.spec`: :class:`InputSpec`, what one client instance is
  (``vector(d)``, ``grid(H, W, C)``, ``counts(W)``, ``text``), and checking client payloads
  against it;
- :mod:`~service.model.inputs.base`: the :class:`InputKind` strategy a model holds, chosen once;
- :mod:`~service.model.inputs.dense`: vectors and grids (transformed, then normalised);
- :mod:`~service.model.inputs.documents`: bags of words over a vocabulary;
- :mod:`~service.model.inputs.kinds`: which kind reads a spec, and reading one from an artifact;
- :mod:`~service.model.inputs.transforms`: the input transforms (none, pixels, HOG cells, bof);
- :mod:`~service.model.inputs.bof`: the fitted bof transform (images as bags of visual words on
  a spatial pyramid) and its space in a model;
- :mod:`~service.model.inputs.words`: word counts, their views and the document measures'
  drivers;
- :mod:`~service.model.inputs.spaces`: items in several transformed spaces at once.

Each kind module holds its parsing, its arrays in the artifact and its rules of which transforms
and measures apply (:meth:`InputKind.settle_transforms`): training and serving read the same
rules.
"""
