"""Service configuration, read from the environment (or a ``.env`` file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.model.search.filters import DEFAULT_CATALOGUE_ATTRIBUTES, DEFAULT_ITEM_ATTRIBUTES

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
        description="Most instances in one /classify request, positives plus negatives in one "
        "/search, and searches in one batch of searches (their positives and negatives in all "
        "too); more get 413.",
    )
    max_request_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Largest request body; larger bodies get 413."
    )
    default_top_k: int = Field(3, ge=1, description="Classes returned per instance by default.")
    default_search_top_k: int = Field(10, ge=1, description="Items /search returns by default.")
    max_search_top_k: int = Field(
        1000, ge=1, description="Most items one /search may ask for; more get 422."
    )
    max_search_offset: int = Field(
        10_000,
        ge=0,
        description="Largest offset one /search may ask for (offset + top_k items are ranked); "
        "more get 422: page further with next_cursor (MAX_SEARCH_OFFSET).",
    )
    max_item_attributes: int = Field(
        DEFAULT_ITEM_ATTRIBUTES,
        ge=1,
        description="Most attribute keys one catalogue item may have; an upsert with more gets "
        "422 (MAX_ITEM_ATTRIBUTES).",
    )
    max_catalogue_attributes: int = Field(
        DEFAULT_CATALOGUE_ATTRIBUTES,
        ge=1,
        description="Most distinct attribute keys a catalogue may hold; an upsert adding keys "
        "beyond gets 422, keys it has stay welcome (MAX_CATALOGUE_ATTRIBUTES). Compaction "
        "(index --compact) drops keys no item has any more.",
    )
    search_cluster: str | None = Field(
        None,
        description="A Dask scheduler (tcp://host:port) whose workers hold the catalogues' "
        "shards (SEARCH_CLUSTER): searches fan out to them and this process maps no shard. "
        "Needs the cluster extra (dask, distributed).",
    )
    search_shard_timeout_s: float = Field(
        2.0,
        gt=0,
        description="With SEARCH_CLUSTER: seconds a shard has to answer a search; later, the "
        "search answers 503, or partial if the request allows it (SEARCH_SHARD_TIMEOUT_S).",
    )
    snapshots_dir: Path | None = Field(
        None,
        description="Where POST /v1/models/{name}/catalogue/snapshots writes catalogue "
        "snapshots, one directory per model (SNAPSHOTS_DIR; unset: the snapshot routes answer "
        "404). Restores read them from there; the records of snapshots and restores (their "
        "status routes) are kept there too, in <model>/.jobs.",
    )
    # -- limits and timeouts (docs/operating/limits.md) --------------------------------------------
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Seconds from a connection's start (or a request's first byte) until the "
        "request's headers are complete; later, 408 and the connection closes (HEADER_TIMEOUT_S).",
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Seconds for a request's whole body to arrive after its headers; later, 408 "
        "and the connection closes (BODY_TIMEOUT_S).",
    )
    keep_alive_s: float = Field(
        30.0,
        gt=0,
        description="Seconds an idle keep-alive connection stays open between requests "
        "(KEEP_ALIVE_S).",
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="Open connections per server process; one more is answered 503 and closed "
        "(MAX_CONNECTIONS). Keep it under the process's file descriptor limit.",
    )
    request_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Seconds a request's model work may take, waiting for a thread included; "
        "later, 504 (REQUEST_TIMEOUT_S). The work itself finishes in the background. A catalogue "
        "snapshot or restore is waited for this long, then answers 202 with its status route.",
    )
    max_concurrent_requests: int | None = Field(
        None,
        ge=1,
        description="Requests whose model work may be under way or waiting at once, per "
        "process; more get 503 with Retry-After (MAX_CONCURRENT_REQUESTS; default 64 per CPU).",
    )
    shutdown_timeout_s: float = Field(
        30.0,
        gt=0,
        description="On SIGTERM, seconds to let requests in flight finish before they are "
        "cancelled (SHUTDOWN_TIMEOUT_S).",
    )
    # -- memory and hostile clients (docs/operating/limits.md, "Memory") ---------------------------
    max_buffered_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024 * 1024,
        description="Request bytes this process holds at once, over all requests: bodies as "
        "they arrive (counted twice: the chunks and the joined body) and what they decode into "
        "(MAX_BUFFERED_BYTES). A request beyond it gets 503 with Retry-After; the first 64 KiB "
        "of each request are not counted. Bounds the process's memory: see "
        "docs/operating/limits.md#memory.",
    )
    max_json_values: int = Field(
        262_144,
        ge=1024,
        description="Most JSON values (numbers, strings, arrays, objects) one request body may "
        "hold, counted before it is decoded; more get 413 (MAX_JSON_VALUES). 1,000 digits "
        "nested 8 x 8 are 73,000 values; larger tensors travel as binary data (/v2).",
    )
    inline_body_bytes: int = Field(
        16 * 1024,
        ge=0,
        description="Bodies up to this size are decoded on the event loop, larger ones on a "
        "worker thread (INLINE_BODY_BYTES).",
    )
    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        description="Largest request head (request line and headers); larger get 431 and the "
        "connection closes (MAX_HEADER_BYTES).",
    )
    send_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Seconds an answer may wait for a client that reads none of it; then the "
        "connection is dropped (SEND_TIMEOUT_S).",
    )
    load_timeout_s: float = Field(
        300.0,
        gt=0,
        description="Seconds loading and warming up one model version may take; a version that "
        "takes longer is refused, the old one keeps serving (LOAD_TIMEOUT_S).",
    )
    allow_external_symlinks: bool = Field(
        False,
        description="Serve model directories and artifact files that are symbolic links to "
        "places outside the repository (ALLOW_EXTERNAL_SYMLINKS); by default they are refused "
        "with a logged reason.",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins allowed to call the API from a browser, comma-separated or a JSON "
        "list, '*' for any (CORS_ORIGINS); empty: no CORS headers at all.",
    )
    inline_budget_ms: float = Field(
        0.5,
        ge=0,
        description="Requests whose model time is estimated below this run on the event loop; "
        "longer ones on worker threads, so that no request blocks the loop for long "
        "(INLINE_BUDGET_MS; 0 sends every request to a thread).",
    )
    dynamic_batch_max_instances: int = Field(
        0,
        ge=0,
        description="Dynamic batching (DYNAMIC_BATCH_MAX_INSTANCES): classification requests "
        "for one model version that wait together are computed as one batch of up to this many "
        "instances. A request never waits for others: it runs at once when the model is idle, "
        "and those that arrive while a batch computes gather for the next. 0 or 1: off. A "
        "model's serving.json may set its own (docs/operating/batching.md).",
    )
    dynamic_batch_max_delay_ms: float = Field(
        0.0,
        ge=0,
        description="With dynamic batching: how long a batch that has gathered fewer than "
        "DYNAMIC_BATCH_MAX_INSTANCES may wait for more once the model is free, counted from "
        "the arrival of its oldest request (DYNAMIC_BATCH_MAX_DELAY_MS; 0: never waits).",
    )
    admin_token: SecretStr | None = Field(
        None,
        description="Bearer token of the repository routes (ADMIN_TOKEN): POST "
        "/v2/repository/index, .../models/{name}/load and .../unload. Unset: they answer 403.",
    )
    traffic_file: Path | None = Field(
        None,
        description="The traffic policies: aliases, canaries and shadows over the repository's "
        "models (TRAFFIC_FILE; default traffic.json in MODEL_REPOSITORY). Re-read at every "
        "rescan; the admin routes /v2/repository/aliases/... write it (docs/operating/traffic.md).",
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
    prometheus_multiproc_dir: Path | None = Field(
        None,
        description="prometheus-client's multi-process directory, where every worker writes "
        "its metrics and /metrics reads them all (PROMETHEUS_MULTIPROC_DIR: the library reads "
        "the same variable). Unset: none for one worker, a private one per run for several.",
    )
    payload_log_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of inference requests (classify, search, /v2 infer, gRPC ModelInfer) "
        "written with their answers as CloudEvents JSON lines (PAYLOAD_LOG_RATE; 0: none, 1: "
        "all) (docs/operating/observability.md).",
    )
    payload_log: str = Field(
        "stdout",
        min_length=1,
        description="Where payload records go: 'stdout', or a file appended to, '{pid}' in its "
        "name replaced by the process's id (PAYLOAD_LOG).",
    )
    payload_log_max_bytes: int = Field(
        64 * 1024,
        ge=0,
        description="A request or answer body larger than this is recorded without its data "
        "(PAYLOAD_LOG_MAX_BYTES).",
    )
    payload_log_queue: int = Field(
        1000,
        ge=1,
        description="Payload records waiting to be written at most; beyond, records are dropped "
        "and counted (besvm_payload_records_dropped_total), never waited for (PAYLOAD_LOG_QUEUE).",
    )
    log_format: Literal["json", "text"] = Field(
        "json",
        description="Log lines as JSON objects, one a line, or as text (LOG_FORMAT); both "
        "carry the request id.",
    )

    # -- who may call, and over what (docs/operating/security.md) ----------------------------------
    api_keys_file: Path | None = Field(
        None,
        description="A file of API keys, one '<key> <scope>' a line ('#' comments; the key may "
        "be given as sha256:<64 hex digits>), scope 'read' (classify, search, metadata) or "
        "'admin' (also the repository routes). Set, every route but the probes (and /metrics, "
        "unless METRICS_REQUIRE_KEY) needs a key: 'Authorization: Bearer <key>' or "
        "'X-API-Key: <key>'. Re-read on SIGHUP and on each rescan (API_KEYS_FILE).",
    )
    metrics_require_key: bool = Field(
        False,
        description="GET /metrics needs a key too (any scope) (METRICS_REQUIRE_KEY).",
    )
    tls_cert_file: Path | None = Field(
        None,
        description="PEM certificate chain: serve HTTPS (and gRPC over TLS) (TLS_CERT_FILE). "
        "Re-read, with the key and the client CA, on SIGHUP.",
    )
    tls_key_file: Path | None = Field(
        None,
        description="PEM private key of TLS_CERT_FILE (TLS_KEY_FILE; default: in that file).",
    )
    tls_client_ca_file: Path | None = Field(
        None,
        description="PEM certificates of the authorities whose client certificates are "
        "accepted: every client must present one (mutual TLS) (TLS_CLIENT_CA_FILE).",
    )
    grpc_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Serve the Open Inference Protocol over gRPC on this port too, on HOST "
        "(GRPC_PORT; unset: off; MLServer's is 8081). Every worker serves it.",
    )

    probe_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Answer the health probes (/healthz, /readyz, /v2/health/live, "
        "/v2/health/ready) on this port too, on PROBE_HOST, from a process of their own that "
        "holds no model and shares no lock with the workers, so that they are answered at once "
        "under any load (PROBE_PORT; unset: off; plain HTTP). Point the orchestrator's probes "
        "here (docs/operating/limits.md#health-probes-under-load).",
    )
    probe_host: str | None = Field(
        None,
        description="The interface of PROBE_PORT (PROBE_HOST; default: HOST), e.g. one only "
        "the orchestrator reaches.",
    )
    probe_stale_s: float = Field(
        20.0,
        ge=1.0,
        description="On PROBE_PORT, a worker whose event loop has not written its heartbeat "
        "(every 0.25 s) for this long is stuck: not live, not ready (PROBE_STALE_S). Longer "
        "than the 15 s in which the supervisor (WORKERS > 1) replaces a worker that does not "
        "answer it, so that it acts first.",
    )
    probe_heartbeat_dir: Path | None = Field(
        None,
        description="Where the workers write their heartbeats for the probe process "
        "(PROBE_HEARTBEAT_DIR): set by the server for its workers when PROBE_PORT is; leave it "
        "unset.",
    )

    grpc_max_streams: int = Field(
        100,
        ge=1,
        description="Streams (calls) one gRPC connection may have open at once, HTTP/2's "
        "SETTINGS_MAX_CONCURRENT_STREAMS; a client opens more as others end "
        "(GRPC_MAX_STREAMS).",
    )

    @field_validator(
        "model_repository",
        "model_dir",
        "default_model",
        "admin_token",
        "search_cluster",
        "api_keys_file",
        "tls_cert_file",
        "tls_key_file",
        "tls_client_ca_file",
        "grpc_port",
        "probe_port",
        "probe_host",
        "probe_heartbeat_dir",
        "prometheus_multiproc_dir",
        "traffic_file",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value):
        # compose's ${VAR:-} passes unset variables as empty strings
        return None if value == "" else value

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins_list(cls, value):
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [origin.strip() for origin in text.split(",") if origin.strip()]
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Settings:
        if self.model_repository is not None and self.model_dir is not None:
            raise ValueError("set MODEL_REPOSITORY or MODEL_DIR, not both")
        if self.max_buffered_bytes < 2 * self.max_request_bytes:
            raise ValueError(
                "MAX_BUFFERED_BYTES must be at least twice MAX_REQUEST_BYTES: a body is held "
                "twice while it is read"
            )
        if self.tls_cert_file is None and (self.tls_key_file or self.tls_client_ca_file):
            raise ValueError("TLS_KEY_FILE and TLS_CLIENT_CA_FILE need TLS_CERT_FILE")
        if self.metrics_require_key and self.api_keys_file is None and self.admin_token is None:
            raise ValueError("METRICS_REQUIRE_KEY needs keys: set API_KEYS_FILE (or ADMIN_TOKEN)")
        if self.grpc_port is not None and self.grpc_port == self.port:
            raise ValueError(f"GRPC_PORT must differ from PORT ({self.port})")
        if self.probe_port is not None and self.probe_port in (self.port, self.grpc_port):
            raise ValueError(f"PROBE_PORT must differ from PORT and GRPC_PORT ({self.probe_port})")
        return self
