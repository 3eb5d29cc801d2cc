"""Request and response bodies of the HTTP API."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Item 1,009 of scikit-learn's digits (held out from the default model's training split): a 7.
_DIGIT_SEVEN = [
    [0, 0, 4, 15, 16, 13, 13, 10],
    [0, 0, 12, 13, 10, 15, 14, 2],
    [0, 2, 16, 6, 2, 14, 6, 0],
    [0, 1, 5, 0, 9, 11, 0, 0],
    [0, 0, 7, 12, 16, 14, 6, 0],
    [0, 0, 8, 15, 15, 11, 2, 0],
    [0, 0, 2, 16, 8, 0, 0, 0],
    [0, 0, 7, 15, 4, 0, 0, 0],
]


class ClassifyRequest(BaseModel):
    """A batch of instances, or of texts for a bag-of-words model, to classify."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"instances": [_DIGIT_SEVEN], "top_k": 3},
                {"texts": ["A computer lets you make more mistakes faster."], "top_k": 3},
                {"instances": [{"indices": [17, 4023], "counts": [2, 1]}]},
            ]
        },
    )

    instances: list[Any] | None = Field(
        None,
        description="Instances in the model's input shape (see GET /v1/models): a vector(d) is "
        "[d numbers]; a grid(H, W, C) is H x W x C numbers, or H x W when C = 1; a counts(W) "
        'document is {"indices": [word indices in 0..W-1], "counts": [whole numbers >= 0]}. '
        "At least one; at most the server's MAX_BATCH_SIZE. Send this or texts.",
    )
    texts: list[str] | None = Field(
        None,
        description="Raw documents, for counts(W) models with a vocabulary: lower-cased, cut "
        "into words and counted; words not in the vocabulary are dropped. A text with no known "
        "word is still answered, as an empty document (known_words = 0): every such text gets "
        "the same answer, the model's answer to no evidence. Send this or instances.",
    )
    top_k: int | None = Field(
        None, ge=1, description="Classes to return per instance, best first (default: 3)."
    )

    @model_validator(mode="after")
    def _one_batch(self) -> ClassifyRequest:
        if (self.instances is None) == (self.texts is None):
            raise ValueError("send either instances or texts (exactly one of them)")
        return self


class ClassScore(BaseModel):
    label: str = Field(..., description="Class label.")
    score: float = Field(..., description="One-vs-rest SVM score w_k . phi(x) + b_k.")


class Prediction(BaseModel):
    label: str = Field(..., description="The predicted class: the one with the highest score.")
    top_k: list[ClassScore] = Field(..., description="The best classes, best first.")
    known_words: int | None = Field(
        None,
        description="counts(W) models only: the document's word total over the vocabulary; "
        "0 means no known word, and the answer is the model's answer to an empty document.",
    )


class ClassifyResponse(BaseModel):
    model: str = Field(..., description="Name of the model that answered.")
    predictions: list[Prediction] = Field(..., description="One per instance, in order.")


class InputInfo(BaseModel):
    kind: str = Field(..., description="vector, grid or counts.")
    shape: list[int] = Field(..., description="(d,), (H, W, C) or (W,): W words.")
    spec: str = Field(..., description="The input kind as text, e.g. grid(8, 8, 1).")
    accepts_texts: bool = Field(
        False, description="Whether /classify takes raw texts (counts models with a vocabulary)."
    )


class ModelInfo(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    name: str
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


class VocabularyInfo(BaseModel):
    size: int = Field(..., description="W, the number of words.")
    lowercase: bool = Field(..., description="Whether texts are lower-cased before cutting.")
    token_pattern: str = Field(..., description="Regular expression whose matches are words.")
    terms: list[str] = Field(
        ..., description="The words; the index of a word is its position here (counts indices)."
    )


class ModelList(BaseModel):
    models: list[ModelInfo]


class Health(BaseModel):
    status: str
    detail: str | None = None


class ErrorBody(BaseModel):
    type: str = Field(..., description="Error class, e.g. invalid_input.")
    message: str = Field(..., description="What was wrong, in words.")
    details: list[dict[str, Any]] | None = Field(
        None, description="Per-field problems of a malformed request."
    )


class ErrorResponse(BaseModel):
    error: ErrorBody
