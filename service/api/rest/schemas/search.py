"""The bodies of /search: a query (a class, a code or examples, with a filter), a batch of
them, and their ranked items; and of an atom's items."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.api.rest.schemas.common import VERSION_DESCRIPTION, Id, Number, strict_body
from service.model.search.filters import MAX_ANY_VALUES


class CodeIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    indices: list[int] = Field(..., description="Atom indices, distinct, each in 0..A-1.")
    values: list[float] = Field(..., description="The code's values at those atoms.")


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


class SearchBatchRequest(BaseModel):
    """Several searches of one model's catalogue in one request, answered in order: each
    exactly what it answers alone, from one catalogue version. Queries by code (class, code or
    learned) are ranked together in one pass over the catalogue's rows. One query that is not
    valid refuses the whole batch (the error names it: ``searches[3]: ...``)."""

    model_config = strict_body(
        {
            "searches": [
                {"class": "7", "top_k": 5},
                {"code": {"indices": [3, 17], "values": [0.8, -0.2]}, "top_k": 3},
                {
                    "class": "1",
                    "top_k": 5,
                    "filter": {"must": [{"key": "source", "match": {"value": "scan"}}]},
                },
            ]
        }
    )

    searches: list[SearchRequest] = Field(
        ...,
        description="The queries (at least one, at most MAX_BATCH_SIZE), each with the fields "
        "of one search. The batch counts toward the limits as one request: positives and "
        "negatives together at most MAX_BATCH_SIZE, offset + top_k of all queries together at "
        "most MAX_SEARCH_TOP_K + MAX_SEARCH_OFFSET.",
    )


class SearchBatchResponse(BaseModel):
    model: str
    model_version: str = Field(..., description=VERSION_DESCRIPTION)
    searches: list[SearchResponse] = Field(
        ..., description="Each query's answer, in the order of the request's searches."
    )


class SearchBody:
    """A /search body: one query (:class:`SearchRequest`) or a batch
    (:class:`SearchBatchRequest`), told apart by the batch's ``searches`` field (which one query
    never has), read as :func:`service.api.machinery.responses.read_body` reads a schema."""

    @staticmethod
    def model_validate_json(raw: bytes) -> SearchRequest | SearchBatchRequest:
        if b'"searches"' not in raw:  # one query: the hot path, one validation as before
            return SearchRequest.model_validate_json(raw)
        try:
            return SearchBatchRequest.model_validate_json(raw)
        except ValidationError as batch_error:
            try:  # "searches" was only a value inside one query (an id, say)
                return SearchRequest.model_validate_json(raw)
            except ValidationError:
                raise batch_error from None
