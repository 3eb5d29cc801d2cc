"""Service configuration, read from the environment (or a ``.env`` file)."""

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Settings of the HTTP service; each field is read from the variable of its upper-case name.

    Example: ``MODEL_DIR=models/digits PORT=9000 python -m service.api``.
    """

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", protected_namespaces=())

    model_dir: Path = Field(
        Path("models/digits"), description="Artifact directory to serve (MODEL_DIR)."
    )
    host: str = Field("127.0.0.1", description="Interface to listen on (HOST).")
    port: int = Field(8000, ge=1, le=65535, description="TCP port (PORT).")
    max_batch_size: int = Field(
        1000, ge=1, description="Most instances in one /classify request; more get 413."
    )
    max_request_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Largest request body; larger bodies get 413."
    )
    default_top_k: int = Field(3, ge=1, description="Classes returned per instance by default.")
    default_search_top_k: int = Field(10, ge=1, description="Items /search returns by default.")
    max_search_top_k: int = Field(
        1000, ge=1, description="Most items one /search may ask for; more get 422."
    )
    log_level: str = Field("info", description="uvicorn log level (LOG_LEVEL).")
    access_log: bool = Field(True, description="Log one line per request (ACCESS_LOG).")
