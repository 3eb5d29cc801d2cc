"""Service configuration, read from the environment (or a ``.env`` file)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_MODEL_DIR = Path("models/digits")


class Settings(BaseSettings):
    """Settings of the HTTP service; each field is read from the variable of its upper-case name.

    Example: ``MODEL_REPOSITORY=models WORKERS=2 PORT=9000 python -m service.api``.
    """

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", protected_namespaces=())

    model_repository: Path | None = Field(
        None,
        description="A directory whose sub-directories are model artifacts, all served "
        "(MODEL_REPOSITORY). Each sub-directory's name is its model's name.",
    )
    model_dir: Path | None = Field(
        None,
        description="One artifact directory to serve (MODEL_DIR), the one-model shorthand; "
        "default models/digits when MODEL_REPOSITORY is not set either.",
    )
    default_model: str | None = Field(
        None,
        description="The model that POST /classify and POST /search answer for (DEFAULT_MODEL); "
        "default: the only model; with several and none named, those routes answer 404 and "
        "ask for a model name.",
    )
    host: str = Field("127.0.0.1", description="Interface to listen on (HOST).")
    port: int = Field(8000, ge=1, le=65535, description="TCP port (PORT).")
    workers: int = Field(1, ge=1, le=64, description="Server processes sharing the port (WORKERS).")
    max_batch_size: int = Field(
        1000,
        ge=1,
        description="Most instances in one /classify request, and positives plus negatives in "
        "one /search; more get 413.",
    )
    max_request_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Largest request body; larger bodies get 413."
    )
    default_top_k: int = Field(3, ge=1, description="Classes returned per instance by default.")
    default_search_top_k: int = Field(10, ge=1, description="Items /search returns by default.")
    max_search_top_k: int = Field(
        1000, ge=1, description="Most items one /search may ask for; more get 422."
    )
    inline_budget_ms: float = Field(
        0.5,
        ge=0,
        description="Requests whose model time is estimated below this run on the event loop; "
        "longer ones on worker threads, so that no request blocks the loop for long "
        "(INLINE_BUDGET_MS; 0 sends every request to a thread).",
    )
    admin_token: SecretStr | None = Field(
        None,
        description="Bearer token of the repository routes (ADMIN_TOKEN): POST "
        "/v2/repository/index, .../models/{name}/load and .../unload. Unset: they answer 403.",
    )
    reload_interval_s: float = Field(
        0.0,
        ge=0,
        description="Poll the repository for new, changed and removed models every this many "
        "seconds (RELOAD_INTERVAL_S; 0: only on SIGHUP or the repository routes).",
    )
    log_level: str = Field(
        "info", description="Level of the server's and the service's logs (LOG_LEVEL)."
    )
    access_log: bool = Field(
        True,
        description="Log one line per request (ACCESS_LOG), health probes and scrapes at "
        "debug level.",
    )
    log_format: Literal["json", "text"] = Field(
        "json",
        description="Log lines as JSON objects, one a line, or as text (LOG_FORMAT); both "
        "carry the request id.",
    )

    @field_validator("model_repository", "model_dir", "default_model", "admin_token", mode="before")
    @classmethod
    def _empty_is_unset(cls, value):
        # compose's ${VAR:-} passes unset variables as empty strings
        return None if value == "" else value

    @model_validator(mode="after")
    def _one_source(self) -> Settings:
        if self.model_repository is not None and self.model_dir is not None:
            raise ValueError("set MODEL_REPOSITORY or MODEL_DIR, not both")
        return self
