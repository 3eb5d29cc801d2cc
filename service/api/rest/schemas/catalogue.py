"""The bodies of the catalogue routes: items upserted and deleted, the catalogue described,
items counted and faceted, and its snapshots and restores."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.api.rest.schemas.common import (
    DIGIT_SEVEN,
    VERSION_DESCRIPTION,
    ErrorBody,
    Id,
    Number,
    strict_body,
)
from service.api.rest.schemas.search import SearchFilter


class CatalogueItemsRequest(BaseModel):
    """Items to add to a model's catalogue (upsert): an id that is there already is replaced."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "ids": ["scan-0001"],
                    "instances": [DIGIT_SEVEN],
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


class CountRequest(BaseModel):
    """Count the live items a filter allows."""

    model_config = strict_body(
        {"filter": {"must": [{"key": "source", "match": {"value": "scan"}}]}}, {}
    )

    filter: SearchFilter | None = Field(
        None, description="Count only items whose attributes pass it (default: every item)."
    )


class CountResponse(BaseModel):
    model: str
    model_version: str = Field(..., description=VERSION_DESCRIPTION)
    catalogue_version: int = Field(..., description="The catalogue version counted.")
    count: int = Field(..., description="Live items the filter allows, exact.")


class FacetRequest(BaseModel):
    """Count the live items per value of one attribute (Qdrant's facet)."""

    model_config = strict_body(
        {"key": "source"},
        {"key": "year", "limit": 3, "filter": {"must": [{"key": "year", "range": {"gte": 2020}}]}},
    )

    key: str = Field(..., description="The attribute (GET /v1/models/{name}/catalogue lists them).")
    filter: SearchFilter | None = Field(
        None, description="Count only items whose attributes pass it (default: every item)."
    )
    limit: int | None = Field(
        None,
        json_schema_extra={"minimum": 1},
        description="Values to return, those with the most items first (default 10).",
    )


class FacetHit(BaseModel):
    value: str | float = Field(..., description="A value of the attribute.")
    count: int = Field(..., description="Live items the filter allows that have it.")


class FacetResponse(BaseModel):
    model: str
    model_version: str = Field(..., description=VERSION_DESCRIPTION)
    catalogue_version: int = Field(..., description="The catalogue version counted.")
    key: str
    hits: list[FacetHit] = Field(
        ..., description="The values with the most items, most first (ties by value), exact."
    )
    n_values: int = Field(
        ..., description="Distinct values among the items counted (more than hits: cut at limit)."
    )


# -- snapshots ---------------------------------------------------------------------------------


class SnapshotInfo(BaseModel):
    name: str = Field(..., description="Its name under SNAPSHOTS_DIR/<model>/.")
    catalogue_version: int = Field(..., description="The catalogue version it holds.")
    n_items: int = Field(..., description="Live items of that version.")
    n_shards: int
    n_files: int = Field(..., description="Files, each listed with its sha256.")
    n_bytes: int
    created: str = Field(..., description="When it was taken (UTC, ISO 8601).")


class SnapshotList(BaseModel):
    model: str
    snapshots: list[SnapshotInfo] = Field(..., description="Oldest first.")
    unreadable: list[str] = Field(
        default_factory=list,
        description="Directories there that hold no readable snapshot document, each with why.",
    )


class SnapshotResponse(SnapshotInfo):
    model: str
    model_version: str = Field(..., description=VERSION_DESCRIPTION)


class RestoreResponse(CatalogueUpdateResponse):
    snapshot: SnapshotInfo = Field(..., description="The snapshot restored, every file verified.")


class JobProgress(BaseModel):
    stage: str = Field(
        ...,
        description="copying (a snapshot); verifying, then restoring (a restore): each stage "
        "counts its own files and bytes.",
    )
    files_done: int
    n_files: int
    bytes_done: int
    n_bytes: int


class JobStatus(BaseModel):
    """A snapshot or a restore: started by a request, finished whatever the request's time."""

    model: str
    kind: str = Field(..., description="snapshot or restore.")
    name: str = Field(..., description="The snapshot's name (a restore's: the one restored).")
    state: str = Field(
        ...,
        description="in_progress; done (result: what the route answers when it finishes in "
        "time); failed (error: what it would have answered; type interrupted when the process "
        "running it ended first).",
    )
    started: str | None = Field(None, description="UTC, ISO 8601.")
    finished: str | None = Field(None, description="UTC, ISO 8601.")
    progress: JobProgress | None = Field(
        None,
        description="While in progress: the stage and how far it is (updated every second); "
        "null once the job has finished.",
    )
    error: ErrorBody | None = None


class SnapshotStatus(JobStatus):
    result: SnapshotResponse | None = Field(None, description="Done: the snapshot taken.")


class RestoreStatus(JobStatus):
    result: RestoreResponse | None = Field(None, description="Done: the restore's answer.")
