"""The bodies that describe the models served (the listing, one model's metadata and
vocabulary) and the server's health."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.api.rest.schemas.admin import AliasInfo


class MeasureInfo(BaseModel):
    """One similarity measure of a model and the input transform it reads."""

    similarity: str = Field(..., description="The measure, canonical text, e.g. rbf(gamma=1).")
    transform: str = Field(..., description="The transform of the raw input it compares.")


class InputInfo(BaseModel):
    kind: str = Field(..., description="vector, grid or counts.")
    shape: list[int] = Field(..., description="(d,), (H, W, C) or (W,): W words.")
    spec: str = Field(..., description="The input kind as text, e.g. grid(8, 8, 1).")
    accepts_texts: bool = Field(
        False, description="Whether /classify takes raw texts (counts models with a vocabulary)."
    )


class SearchInfo(BaseModel):
    feature_space: str = Field(
        ..., description="What the codes' classifiers read: inputs (normalised) or besvm."
    )
    n_atoms: int = Field(..., description="A, the dictionary's atoms: code indices are 0..A-1.")
    n_features: int = Field(..., description="d, the dictionary's rows.")
    n_nonzero: int | None = Field(None, description="Non-zeros kept per class code.")
    catalogue_size: int | None = Field(None, description="N, items in the catalogue (or none).")
    catalogue_version: int | None = Field(
        None, description="The catalogue version served (GET /v1/models/{name}/catalogue)."
    )
    estimator: dict[str, Any] = Field(default_factory=dict, description="Hyper-parameters.")
    training: dict[str, Any] = Field(default_factory=dict, description="Training summary.")


class ModelStatus(BaseModel):
    """A model of the repository and its state, loaded or not."""

    name: str
    state: str = Field(
        ...,
        description="loading (its first version), ready (serving a version), failed (no version "
        "could be loaded: reason says why) or unloaded.",
    )
    version: str | None = Field(
        None, description="The version served: the sha256 of its manifest (none if not ready)."
    )
    reason: str | None = Field(
        None,
        description="Why the model is not ready; for a ready model, why its newest version on "
        "disk was refused (the old version keeps serving).",
    )


class ModelInfo(ModelStatus):
    """A ready model: its state and what it serves."""

    model_config = ConfigDict(protected_namespaces=())

    model_type: str
    created: str | None = Field(None, description="When the artifact was written (UTC).")
    input: InputInfo
    classes: list[str]
    transform: str = Field(
        ...,
        description="What the service computes from each raw instance first: none, pixels or "
        "hog(cell_size, orientations). Clients always send raw instances.",
    )
    similarities: list[str] = Field(..., description="Similarity measures, canonical text.")
    measures: list[MeasureInfo] = Field(
        ...,
        description="Each similarity measure (in the order of similarities) with the input "
        "transform it reads: the model's transform, or its own for 'transform: measure' terms.",
    )
    vocabulary: dict[str, Any] | None = Field(
        None,
        description="counts models: size, lowercase and token_pattern of the vocabulary that "
        "turns texts into counts (words are indexed in its order).",
    )
    normalization: str
    basis_size: int
    n_features: int = Field(..., description="Dimensions of the expanded feature space.")
    diagnostics: dict[str, dict[str, float | None]] = Field(
        default_factory=dict,
        description="Per similarity measure: NgRat and NgEng (negative eigenvalues of the "
        "basis Gram matrix), 0 for kernels.",
    )
    training: dict[str, Any] = Field(default_factory=dict, description="Training summary.")
    versions: dict[str, str] = Field(default_factory=dict, description="Library versions.")
    search: SearchInfo | None = Field(
        None, description="The US-SVM search model and catalogue, when the model has one."
    )
    search_problem: str | None = Field(
        None,
        description="Why the model's search model or catalogue could not be loaded: /search "
        "answers 503 with this reason while /classify keeps serving.",
    )


class VocabularyInfo(BaseModel):
    size: int = Field(..., description="W, the number of words.")
    lowercase: bool = Field(..., description="Whether texts are lower-cased before cutting.")
    token_pattern: str = Field(..., description="Regular expression whose matches are words.")
    terms: list[str] = Field(
        ..., description="The words; the index of a word is its position here (counts indices)."
    )


class ModelList(BaseModel):
    models: list[ModelInfo | ModelStatus] = Field(
        ..., description="Every model of the repository, by name; details for ready ones."
    )
    aliases: list[AliasInfo] = Field(
        default_factory=list,
        description="The names that are aliases (docs/operating/traffic.md), by name: the model "
        "each answers from, its canary and shadow with their shares, and the version each "
        "serves; as GET /v2/repository/aliases lists them, without an admin key.",
    )


class Health(BaseModel):
    status: str
    detail: str | None = None
