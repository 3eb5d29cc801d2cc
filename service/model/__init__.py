"""The pure inference library, shared by the trainer and the server.

No web framework is imported here: training and serving compute features with the same code.
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
from service.model.expansion import BasisExpansion
from service.model.inputs import InputSpec
from service.model.predictor import Predictor
from service.model.preprocessing import InputNormalizer
from service.model.similarity import SimilaritySpec, parse_spec, parse_specs

__all__ = [
    "ArtifactChangedError",
    "ArtifactError",
    "ArtifactIntegrityError",
    "ArtifactVersionError",
    "BasisExpansion",
    "BatchTooLargeError",
    "InputNormalizer",
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
