"""The bodies of /classify: the instances or texts asked about, and each one's predicted classes
and explanation."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.api.rest.schemas.common import DIGIT_SEVEN, VERSION_DESCRIPTION
from service.model.inputs.dense import MAX_INPUT_DISTANCE
from service.model.inputs.words import MAX_WORDS


class ClassifyRequest(BaseModel):
    """A batch of instances, or of texts for a bag-of-words model, to classify."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {"instances": [DIGIT_SEVEN], "top_k": 3},
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
        "At least one; at most the server's MAX_BATCH_SIZE. Send this or texts. A vector or "
        f"grid more than {MAX_INPUT_DISTANCE:,.0f} times farther from the training data's mean "
        "than its items are on average (after the model's transform and normalisation) is "
        f"refused (422); a document counts at most {MAX_WORDS:,} words (2**53).",
    )
    texts: list[str] | None = Field(
        None,
        description="Raw documents, for counts(W) models with a vocabulary: lower-cased, cut "
        "into words and counted; words not in the vocabulary are dropped. A text with no known "
        "word is still answered, as an empty document (known_words = 0): every such text gets "
        "the same answer, the model's answer to no evidence. Send this or instances.",
    )
    top_k: int | None = Field(
        None,
        json_schema_extra={"minimum": 1},
        description="Classes to return per instance, best first (default: 3).",
    )
    explain: int | None = Field(
        None,
        json_schema_extra={"minimum": 0, "maximum": 100},
        description="With k >= 1, each prediction also says why: the k basis items that added "
        "most to the predicted class's score, with their ids, labels, contributions and shares "
        "(k clipped to the basis size; at most 100). Default: none.",
    )


class ClassScore(BaseModel):
    label: str = Field(..., description="Class label.")
    score: float = Field(..., description="One-vs-rest SVM score w_k . phi(x) + b_k.")


class BasisContribution(BaseModel):
    """What one basis item added to the explained class's score."""

    basis_index: int = Field(..., description="Its row in the model's basis.")
    id: int | None = Field(
        None,
        description="Its id as the artifact keeps it: the row of the training set it was "
        "chosen from (null for models trained before ids were kept).",
    )
    label: str = Field(..., description="Its class.")
    contribution: float = Field(
        ...,
        description="What it added to the score: over the measures, (its similarity to the "
        "instance - the normalisation's offset) x the class's weight folded through the "
        "normalisation. Every basis item's contributions add up to score - intercept.",
    )
    share: float | None = Field(
        None,
        description="contribution / (score - intercept): every basis item's shares add up to "
        "1 (null when score = intercept).",
    )
    measures: list[float] = Field(
        ..., description="Its contribution through each measure, in the model's order."
    )


class Explanation(BaseModel):
    """Why the predicted class got its score: score = intercept + the items' contributions +
    rest."""

    label: str = Field(..., description="The class explained: the predicted one.")
    score: float
    intercept: float = Field(..., description="The class's SVM intercept b_k.")
    items: list[BasisContribution] = Field(
        ..., description="The basis items that added most, largest contribution first."
    )
    rest: float = Field(..., description="The contributions of every other basis item, summed.")


class Prediction(BaseModel):
    label: str = Field(..., description="The predicted class: the one with the highest score.")
    top_k: list[ClassScore] = Field(..., description="The best classes, best first.")
    known_words: int | None = Field(
        None,
        description="counts(W) models only: the document's word total over the vocabulary; "
        "0 means no known word, and the answer is the model's answer to an empty document.",
    )
    explanation: Explanation | None = Field(
        None, description="With explain in the request: why the predicted class won."
    )


class ClassifyResponse(BaseModel):
    model: str = Field(..., description="Name of the model that answered.")
    model_version: str = Field(..., description=VERSION_DESCRIPTION)
    predictions: list[Prediction] = Field(..., description="One per instance, in order.")
