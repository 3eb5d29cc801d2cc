"""The bodies of the admin routes: the repository's models (list, load, unload) and the
aliases' traffic policies."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RepositoryIndexRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    ready: bool = Field(False, description="List only the models that are ready.")


class RepositoryModel(BaseModel):
    """A model of the repository (Open Inference Protocol repository extension)."""

    name: str
    version: str | None = None
    state: str = Field(..., description="loading, ready, failed or unloaded.")
    reason: str = Field("", description="Why the model is not ready (empty when it is).")


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
