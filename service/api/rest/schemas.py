"""Request and response bodies of the HTTP API.

The schemas check types and shapes of the JSON, strictly: ``"3"``, ``3.0`` or ``true`` is no
integer, ``"true"`` or ``1`` no boolean. Rules on values are checked in one place each:
what a request means by the model library (e.g. ``top_k`` at least 1, exactly one kind of
query), what this server allows by the data plane (e.g. ``MAX_SEARCH_TOP_K``); the schemas only
document them (``minimum``, ``maximum``) for clients.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.model.inputs.dense import MAX_INPUT_DISTANCE
from service.model.inputs.words import MAX_WORDS
from service.model.search.filters import MAX_ANY_VALUES

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
        strict=True,
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


VERSION_DESCRIPTION = (
    "The version that answered: the sha256 of its manifest (also in the X-Model-Version header)."
)


class ClassifyResponse(BaseModel):
    model: str = Field(..., description="Name of the model that answered.")
    model_version: str = Field(..., description=VERSION_DESCRIPTION)
    predictions: list[Prediction] = Field(..., description="One per instance, in order.")


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


class RepositoryIndexRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    ready: bool = Field(False, description="List only the models that are ready.")


class RepositoryModel(BaseModel):
    """A model of the repository (Open Inference Protocol repository extension)."""

    name: str
    version: str | None = None
    state: str = Field(..., description="loading, ready, failed or unloaded.")
    reason: str = Field("", description="Why the model is not ready (empty when it is).")


class Health(BaseModel):
    status: str
    detail: str | None = None


class ErrorBody(BaseModel):
    type: str = Field(..., description="Error class, e.g. invalid_input.")
    message: str = Field(..., description="What was wrong, in words.")
    details: list[dict[str, Any]] | None = Field(
        None, description="Per-field problems of a malformed request."
    )


class TrafficShare(BaseModel):
    """A model that gets a share of an alias's classifications."""

    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())

    model: str = Field(..., description="A model of the repository.")
    percent: float = Field(..., gt=0, le=100, description="Its share, in percent.")


class AliasRequest(BaseModel):
    """An alias's traffic policy (docs/operating/traffic.md)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {"model": "digits-1", "canary": {"model": "digits-2", "percent": 10}},
                {"model": "digits-2", "shadow": {"model": "digits-3", "percent": 100}},
            ]
        },
    )

    model: str = Field(..., description="The model (of the repository) that answers the alias.")
    canary: TrafficShare | None = Field(
        None, description="A second model answering this share of the classifications."
    )
    shadow: TrafficShare | None = Field(
        None,
        description="A model that gets a copy of this share of the classifications: its "
        "answers are compared with the served ones, never returned.",
    )


class ServedShare(TrafficShare):
    version: str | None = Field(None, description="The version it serves (None: not loaded).")


class AliasInfo(BaseModel):
    """An alias served, with the version each of its models serves."""

    model_config = ConfigDict(protected_namespaces=())

    name: str
    model: str
    version: str | None = Field(None, description="The version the model serves.")
    canary: ServedShare | None = None
    shadow: ServedShare | None = None
    previous: str | None = Field(None, description="The model rollback returns to.")
    reason: str | None = Field(
        None, description="Why the last change (of the file) was refused; the alias kept this."
    )


class RefusedAlias(BaseModel):
    name: str
    reason: str


class AliasList(BaseModel):
    """The traffic policies served."""

    file: str | None = Field(None, description="The traffic file (TRAFFIC_FILE).")
    problem: str | None = Field(
        None, description="Why the file was last not read (the policies in force stay)."
    )
    aliases: list[AliasInfo]
    refused: list[RefusedAlias] = Field(..., description="Aliases of the file not served, and why.")


class ErrorResponse(BaseModel):
    error: ErrorBody


Id = str | int


class CodeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    indices: list[int] = Field(..., description="Atom indices, distinct, each in 0..A-1.")
    values: list[float] = Field(..., description="The code's values at those atoms.")


Number = int | float


class MatchValue(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    value: str | Number = Field(..., description="The attribute equals this string or number.")


class MatchAny(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    any: list[str] | list[Number] = Field(
        ..., description=f"The attribute equals one of these (1 to {MAX_ANY_VALUES})."
    )


class RangeBounds(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    gt: Number | None = None
    gte: Number | None = None
    lt: Number | None = None
    lte: Number | None = None


class FieldCondition(BaseModel):
    """A condition on one attribute: ``match`` (a value, or any of values) or ``range``
    (numbers). An item without the attribute does not hold it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    key: str = Field(..., description="The attribute (GET /v1/models/{name}/catalogue lists them).")
    match: MatchValue | MatchAny | None = None
    range: RangeBounds | None = None


class SearchFilter(BaseModel):
    """Which items a search may return, in Qdrant's shape: ``must`` (every clause holds),
    ``must_not`` (none does), ``should`` (at least one does, when given). A clause is a
    condition or a nested filter. Applied inside the scan: ``top_k`` is exact among the items
    that pass."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "must": [{"key": "source", "match": {"value": "scan"}}],
                    "must_not": [{"key": "year", "range": {"lt": 2000}}],
                }
            ]
        },
    )

    must: list[FieldCondition | SearchFilter] | None = None
    must_not: list[FieldCondition | SearchFilter] | None = None
    should: list[FieldCondition | SearchFilter] | None = None


class SearchRequest(BaseModel):
    """Rank the catalogue for a class, a sparse code, or examples of something new."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        populate_by_name=True,
        json_schema_extra={
            "examples": [
                {"class": "7", "top_k": 5},
                {"code": {"indices": [3, 17], "values": [0.8, -0.2]}, "bias": 0.0, "top_k": 5},
                {"positives": ["test-3", "test-13"], "top_k": 5},
                {"class": "7", "top_k": 5, "strongest_atoms": 2},
            ]
        },
    )

    class_: Id | None = Field(
        None, alias="class", description="A class of the model: its learned code is the query."
    )
    code: CodeIn | None = Field(
        None, description="A sparse code over the dictionary's atoms, as returned by /search."
    )
    bias: float = Field(0.0, description="With code: added to every score.")
    positives: list[Id | list[Any] | dict[str, Any]] | None = Field(
        None,
        description="Examples of what to find: catalogue ids (strings or integers) or instances "
        "in the model's input shape (bounded as instances of /classify). A code is learned on "
        "the fly with the dictionary fixed (an l1 linear SVM on D^T x) and returned with the "
        "results, to reuse as code.",
    )
    negatives: list[Id | list[Any] | dict[str, Any]] | None = Field(
        None,
        description="With positives: counter-examples, ids or instances (default: the "
        "catalogue's fixed random sample of items, positives left out).",
    )
    top_k: int | None = Field(
        None,
        json_schema_extra={"minimum": 1},
        description="Items to return, best first (default 10; at most the server's "
        "MAX_SEARCH_TOP_K).",
    )
    sparsity: int | None = Field(
        None,
        json_schema_extra={"minimum": 1},
        description="Keep only this many of the code's strongest non-zeros (default: the class "
        "code or given code as is; learned codes keep the model's sparsity).",
    )
    exclude: list[Id] = Field(default_factory=list, description="Catalogue ids never returned.")
    exclude_positives: bool = Field(
        True, description="Leave out positives given as catalogue ids (default true)."
    )
    strongest_atoms: int = Field(
        0,
        json_schema_extra={"minimum": 0, "maximum": 100},
        description="Also report this many of the code's strongest atoms, each with the items "
        "it ranks highest on its own: the modes of a class.",
    )
    filter: SearchFilter | None = Field(
        None,
        description="Only items whose attributes pass this filter (Qdrant's shape); an "
        "unknown attribute or an operand of the wrong kind is a 422.",
    )
    offset: int | None = Field(
        None,
        json_schema_extra={"minimum": 0},
        description="Skip this many of the best items (default 0; at most the server's "
        "MAX_SEARCH_OFFSET): results are the ranking's items offset .. offset + top_k.",
    )
    cursor: str | None = Field(
        None,
        description="A previous answer's next_cursor, sent with the same query: the next page, "
        "after that answer's last item. Valid while its catalogue version is served (409 "
        "naming the new version once it is not).",
    )
    allow_partial: bool = Field(
        False,
        description="With a catalogue held by a cluster (SEARCH_CLUSTER): answer without the "
        "shards that miss their deadline (partial: true) instead of 503.",
    )


class SearchHit(BaseModel):
    id: str = Field(..., description="Catalogue id.")
    score: float = Field(..., description="z . (D^T x) + b.")


class CodeOut(BaseModel):
    indices: list[int] = Field(..., description="Atoms, strongest (largest |value|) first.")
    values: list[float]
    bias: float


class AtomHits(BaseModel):
    atom: int
    weight: float = Field(..., description="The code's value at this atom.")
    items: list[SearchHit] = Field(
        ..., description="Items ranked highest by this atom alone (lowest for negative weights)."
    )


class SearchResponse(BaseModel):
    model: str
    model_version: str = Field(..., description=VERSION_DESCRIPTION)
    search_version: str | None = Field(
        None,
        description="The search model and catalogue that answered: the sha256 of the "
        "catalogue's manifest, which records the checksums of the search model and model it "
        "was built from.",
    )
    query: str = Field(..., description="class, code or positives.")
    code: CodeOut = Field(..., description="The code that ranked the catalogue.")
    sparsity: int = Field(..., description="Non-zeros of the code: rows of X' read.")
    results: list[SearchHit] = Field(..., description="The top-k items, best first.")
    strongest_atoms: list[AtomHits] | None = None
    n_positives: int | None = Field(None, description="With positives: examples learned from.")
    n_negatives: int | None = Field(None, description="With positives: counter-examples used.")
    catalogue_version: int | None = Field(
        None, description="The catalogue version that answered (each update makes one)."
    )
    next_cursor: str | None = Field(
        None,
        description="Send as cursor, with the same query, for the next page; null once fewer "
        "than top_k items came back.",
    )
    partial: bool = Field(
        False, description="Some shards did not answer in time (allow_partial): see missing_shards."
    )
    missing_shards: list[str] = Field(
        default_factory=list, description="The shards a partial answer leaves out."
    )


class ClassWeight(BaseModel):
    label: str
    weight: float = Field(..., description="z_k at this atom.")


class AtomResponse(BaseModel):
    model: str
    model_version: str = Field(..., description=VERSION_DESCRIPTION)
    atom: int
    results: list[SearchHit] = Field(..., description="Items scoring highest on this atom.")
    classes: list[ClassWeight] = Field(
        ..., description="Classes whose code uses this atom, by decreasing |weight|."
    )


class CatalogueItemsRequest(BaseModel):
    """Items to add to a model's catalogue (upsert): an id that is there already is replaced."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "ids": ["scan-0001"],
                    "instances": [_DIGIT_SEVEN],
                    "attributes": [{"source": "scan", "year": 2024}],
                }
            ]
        },
    )

    ids: list[Id] = Field(
        ...,
        description="The items' ids: distinct, non-empty, at most 512 characters; at least one "
        "and at most MAX_BATCH_SIZE.",
    )
    instances: list[Any] = Field(
        ..., description="One instance per id, in the model's input shape (as /classify takes)."
    )
    attributes: list[dict[str, str | Number | None] | None] | None = Field(
        None,
        description="One object per id (or null): attribute keys to strings or numbers, which "
        "filters match. A key keeps one kind across the catalogue.",
    )


class CatalogueDeleteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    ids: list[Id] = Field(
        ...,
        description="Ids to remove (at least one, at most MAX_BATCH_SIZE); unknown ones are "
        "listed in the answer, not refused.",
    )


class CatalogueUpdateResponse(BaseModel):
    model: str
    model_version: str = Field(..., description=VERSION_DESCRIPTION)
    catalogue_version: int = Field(
        ...,
        description="The version written; on disk before this answer, served by this "
        "process from now on.",
    )
    n_items: int = Field(..., description="Live items in that version.")
    upserted: int = Field(0, description="Items written.")
    replaced: int = Field(0, description="Of those, ids that were in the catalogue.")
    deleted: int = Field(0, description="Items removed.")
    missing: list[str] = Field(
        default_factory=list, description="Ids to delete that were not there."
    )


class CatalogueInfo(BaseModel):
    model: str
    model_version: str = Field(..., description=VERSION_DESCRIPTION)
    search_version: str | None = Field(None, description="The catalogue manifest's sha256.")
    version: int = Field(..., description="The catalogue version served.")
    n_items: int = Field(..., description="Live items.")
    n_removed: int = Field(
        ..., description="Items removed (replaced or deleted) since the last compaction."
    )
    n_shards: int
    shard_sizes: list[int] = Field(..., description="Items of each shard, removed ones included.")
    attributes: dict[str, str] = Field(
        ..., description="Each attribute filters may name, and its kind (string or number)."
    )


class CatalogueItem(BaseModel):
    model: str
    catalogue_version: int
    id: str
    attributes: dict[str, str | float] = Field(..., description="The item's attributes.")
