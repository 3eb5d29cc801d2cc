"""Which input kind reads an input spec, and reading one from an artifact."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from service.model.errors import ArtifactIntegrityError, SpecError
from service.model.inputs.base import InputKind
from service.model.inputs.dense import DenseInputs
from service.model.inputs.documents import DocumentInputs
from service.model.inputs.spec import InputSpec

_ALL_ARRAYS = DenseInputs.ARRAYS | DocumentInputs.ARRAYS


def _refuse_foreign_arrays(cls: type[InputKind], spec: InputSpec, arrays, path) -> None:
    foreign = sorted((arrays.keys() & _ALL_ARRAYS) - cls.ARRAYS)
    if foreign:
        raise ArtifactIntegrityError(f"{path}: {spec} inputs have no {', '.join(foreign)}")


_KINDS: dict[str, type[InputKind]] = {
    "vector": DenseInputs,
    "grid": DenseInputs,
    "counts": DocumentInputs,
}


def input_kind_for(spec: InputSpec) -> type[InputKind]:
    """The strategy class of a model's input spec.

    Raises
    ------
    SpecError
        No model reads such inputs (``text``: a vocabulary turns it into ``counts(W)``).
    """
    try:
        return _KINDS[spec.kind]
    except KeyError:
        raise SpecError(
            f"a model reads vector, grid or counts(W) inputs, not {spec}"
            + ("; text needs a vocabulary" if spec.kind == "text" else "")
        ) from None


def input_kind_for_data(spec: InputSpec) -> type[InputKind]:
    """The strategy class of the model that a trainer builds for data of ``spec``: raw texts
    (``text``) make a documents model, whose vocabulary turns them into ``counts(W)``."""
    return DocumentInputs if spec.kind == "text" else input_kind_for(spec)


def input_spec_of(manifest: dict[str, Any]) -> InputSpec:
    """The input spec a manifest records.

    Raises
    ------
    KeyError, TypeError, SpecError
        A malformed ``input`` entry.
    """
    return InputSpec(manifest["input"]["kind"], tuple(manifest["input"]["shape"]))


def input_arrays(manifest: dict[str, Any]) -> frozenset[str]:
    """The arrays of its input kind an artifact with this manifest must hold.

    Raises
    ------
    KeyError, TypeError, ModelError
        A malformed ``input`` entry.
    """
    return input_kind_for(input_spec_of(manifest)).array_names(manifest)


def read_inputs(
    manifest: dict[str, Any], arrays: dict[str, np.ndarray], path: str | os.PathLike
) -> InputKind:
    """The input kind of an artifact, from its manifest and verified arrays.

    Raises
    ------
    ArtifactIntegrityError
        The arrays do not form valid inputs of the kind.
    KeyError, TypeError, ModelError
        A malformed manifest entry (see :func:`service.model.artifact.manifest_fields`).
    """
    spec = input_spec_of(manifest)
    kind = input_kind_for(spec)
    _refuse_foreign_arrays(kind, spec, arrays, path)
    return kind.from_artifact(spec, manifest, arrays, path)
