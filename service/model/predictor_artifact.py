"""A Basis Expanding SVM's artifact form: what its manifest and arrays hold, written by
:meth:`PredictorArtifact.save` and read back, verified, by :meth:`PredictorArtifact.load` (the
files themselves: :mod:`service.model.artifact`).
"""

from __future__ import annotations

import os
from typing import Any, Self

import numpy as np

from service.model.artifact import FORMAT_KEYS, manifest_fields, read_typed_artifact
from service.model.artifact_writing import write_artifact
from service.model.inputs.base import MANIFEST_KEYS
from service.model.inputs.kinds import input_arrays, read_inputs
from service.model.similarity import parse_specs

MODEL_TYPE = "besvm"


class PredictorArtifact:
    """The artifact form of :class:`~service.model.predictor.Predictor`: its ``save`` and
    ``load``."""

    def save(self, path: str | os.PathLike, overwrite: bool = False):
        """Write this model as an artifact directory; see :mod:`service.model.artifact`."""
        manifest = {
            "model_type": MODEL_TYPE,
            "name": self.name,
            **self.inputs.manifest(),
            "classes": list(self.classes),
            "similarities": self.similarity_names,
            "normalization": self.normalization,
            **{k: v for k, v in self.metadata.items() if k not in _RESERVED},
        }
        arrays = {
            **self.inputs.arrays(),
            "basis_labels": self.basis_labels.astype(np.int64),
            "feature_offset": self.feature_offset,
            "feature_scale": self.feature_scale,
            "coef": self.coef,
            "intercept": self.intercept,
        }
        if self.feature_projection is not None:
            arrays["feature_projection"] = self.feature_projection
        if self.basis_ids is not None:
            arrays["basis_ids"] = np.asarray(self.basis_ids, dtype=np.int64)
        return write_artifact(path, manifest, arrays, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Self:
        """Load and verify an artifact written by :meth:`save`.

        Raises
        ------
        ArtifactError
            Missing, tampered, truncated, inconsistent or newer-schema artifacts.
        """
        artifact = read_typed_artifact(path, MODEL_TYPE, _required_arrays, _RESERVED)
        m, arrays = artifact.manifest, artifact.arrays
        with manifest_fields(artifact.path):
            inputs = read_inputs(m, arrays, artifact.path)
            specs = parse_specs(m["similarities"])
            classes = tuple(str(c) for c in m["classes"])
            normalization = m["normalization"]
        return cls(
            name=str(m.get("name", artifact.path.name)),
            inputs=inputs,
            classes=classes,
            specs=specs,
            normalization=normalization,
            basis_labels=arrays["basis_labels"],
            feature_offset=arrays["feature_offset"],
            feature_scale=arrays["feature_scale"],
            coef=arrays["coef"],
            intercept=arrays["intercept"],
            feature_projection=arrays.get("feature_projection"),
            basis_ids=arrays.get("basis_ids"),
            metadata=artifact.metadata,
        )


def _required_arrays(manifest: dict[str, Any]) -> frozenset[str]:
    """Every array a BE-SVM artifact with this manifest must hold."""
    return _ARRAY_NAMES | input_arrays(manifest)


_ARRAY_NAMES = frozenset({"basis_labels", "feature_offset", "feature_scale", "coef", "intercept"})
# Manifest keys the model reads itself (with its input kind's): never metadata.
_RESERVED = (
    frozenset({"name", "classes", "similarities", "normalization"}) | MANIFEST_KEYS | FORMAT_KEYS
)
