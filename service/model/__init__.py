"""The model runtime: loading a model's artifact and computing its answers, for the service and
for the trainer alike.

No web framework is imported here, and nothing of training: the trainer (``training/``) fits
models and writes artifacts through this package, the service (``service/api``) loads and serves
them. The rooms: :mod:`~service.model.kernels` (every numba kernel), :mod:`~service.model.inputs`
(what an input is, one module per kind), :mod:`~service.model.similarity` (the measures),
:mod:`~service.model.features` (the feature map), :mod:`~service.model.predictor` (a loaded
model), :mod:`~service.model.artifact` (the files), :mod:`~service.model.search` (the catalogue
search) and :mod:`~service.model.threads` (every thread setting).
"""

from service.model.errors import (
    ArtifactChangedError,
    ArtifactError,
    ArtifactIntegrityError,
    ArtifactVersionError,
    BatchTooLargeError,
    InvalidInputError,
    ModelError,
    ModelNotReadyError,
    NotFoundError,
    SpecError,
)
from service.model.inputs.spec import InputSpec
from service.model.predictor import Predictor
from service.model.similarity import SimilaritySpec, parse_spec, parse_specs

__all__ = [
    "ArtifactChangedError",
    "ArtifactError",
    "ArtifactIntegrityError",
    "ArtifactVersionError",
    "BatchTooLargeError",
    "InputSpec",
    "InvalidInputError",
    "ModelError",
    "ModelNotReadyError",
    "NotFoundError",
    "Predictor",
    "SimilaritySpec",
    "SpecError",
    "parse_spec",
    "parse_specs",
]
