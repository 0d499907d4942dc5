"""Service settings, read from the environment with the ``METALEDGER_`` prefix."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="METALEDGER_", extra="ignore")

    # Unset: `metaledger serve` starts its own private Postgres under `data_dir` (the embedded default).
    database_url: str | None = None
    data_dir: Path = PROJECT_ROOT / ".metaledger"
    embedded_pg_port: int = 55433

    registry_path: Path = PROJECT_ROOT / "entity_registry.yml"
    # DataHub trims unknown aspect fields silently; metaledger rejects them unless this is set.
    trim_unknown_fields: bool = False
    # DataHub's STRICT_URN_VALIDATION_ENABLED: reserved characters inside URN parts are errors, not warnings.
    strict_urn_validation: bool = True

    # History rows kept per aspect (row 0, the latest, is never deleted). Overrides per "entity/aspect",
    # "entity/*" or "*/aspect", e.g. METALEDGER_RETENTION_OVERRIDES='{"dataset/status": 1}'.
    retention_max_versions: int = 20
    retention_overrides: dict[str, int] = Field(default_factory=dict)

    # DataHub's ALWAYS_EMIT_CHANGE_LOG: also log no-op writes (as RESTATE).
    always_emit_change_log: bool = False

    max_request_bytes: int = 16_000_000
    # A request's head (request line and headers; app.http_server): more bytes or header lines answer 431 before more
    # is read, and the connection is closed. max_request_bytes bounds the body.
    max_header_bytes: int = Field(65_536, ge=1_024)
    max_headers: int = Field(100, ge=1)
    max_aspect_bytes: int = 16_000_000
    transaction_retries: int = 5
    db_pool_size: int = 10

    apply_migrations_on_start: bool = True

    # --- Kafka (unset: the embedded default; the outbox still fills and is readable as a change feed over HTTP)
    kafka_bootstrap_servers: str | None = None
    kafka_client_id: str = "metaledger"
    topic_mcl_versioned: str = "MetadataChangeLog_Versioned_v1"
    topic_mcl_timeseries: str = "MetadataChangeLog_Timeseries_v1"
    topic_platform_event: str = "PlatformEvent_v1"
    topic_mcp: str = "MetadataChangeProposal_v1"
    topic_fmcp: str = "FailedMetadataChangeProposal_v1"
    topic_mce: str = "MetadataChangeEvent_v4"
    topic_fmce: str = "FailedMetadataChangeEvent_v4"
    # Per-aspect events, "Metadata Events (v5)" (app.kafka.per_aspect): opt-in per entity/aspect pair. Routes:
    # [{"entityTypes": [...], "aspects": [...], "auditTopic"?, "changeTopic"?, "failedTopic"?, "sharedTopic"?: bool}],
    # fnmatch patterns; a route's topics default to the templates below ({entity}, {aspect}).
    events_v5_routes: list[dict[str, Any]] = Field(default_factory=list)
    events_v5_audit_topic: str = "MetadataAuditEvent_v5.{entity}.{aspect}"
    events_v5_change_topic: str = "MetadataChangeEvent_v5.{entity}.{aspect}"
    events_v5_failed_topic: str = "FailedMetadataChangeEvent_v5.{entity}.{aspect}"
    events_v5_consumer_enabled: bool = False  # the routed pairs' change topics → the write pipeline
    # The legacy audit event (design doc "MXE"): MetadataAuditEvent_v4 {oldSnapshot, newSnapshot}, off by default
    mae_v4_enabled: bool = False
    topic_mae: str = "MetadataAuditEvent_v4"
    create_topics_on_start: bool = True
    kafka_max_message_bytes: int = 5 * 1024 * 1024
    kafka_compression_type: str = "lz4"
    kafka_topic_partitions: int = 1  # DataHub's default
    kafka_topic_replication_factor: int = 1
    # Values on every topic metaledger writes: "avro" (DataHub's wire: 0x00 + 4-byte schema id + Avro binary) or
    # "json" (the JSON text, as before). Consumers read both whatever this says.
    kafka_value_format: Literal["avro", "json"] = "avro"
    # An external Confluent-compatible schema registry (DataHub's "KAFKA" type): metaledger registers its schemas
    # there and resolves every schema id through it. Unset: metaledger's own registry, served at
    # /schema-registry/api (DataHub's "INTERNAL" type), with DataHub's fixed ids.
    schema_registry_url: str | None = None
    # "user:password" for an external registry that wants HTTP Basic (another metaledger's: its system client id:secret)
    schema_registry_user_info: str | None = None

    # Entity Change Events (tag added, owner removed, ...) computed at write time → PlatformEvent_v1 via the outbox
    platform_events_enabled: bool = True
    # At start-up, create DataHub's server id (urn:li:telemetry:clientId) unless it exists (app.telemetry)
    telemetry_client_id: bool = True

    # --- authentication and authorization (app.auth)
    # Off only for a trusted loopback set-up: every request then acts as urn:li:corpuser:datahub with the admin role.
    auth_enabled: bool = True
    # The HS256 key tokens are signed with. Unset: a random key generated once and kept in Postgres (auth_signing_key),
    # shared by every process of the deployment.
    auth_secret: str | None = None
    # How long a verified token and the policies are trusted before Postgres is asked again: a revocation or a policy
    # change reaches every process within this time.
    auth_cache_seconds: float = 5.0
    auth_token_default_ttl: str = "90d"  # `metaledger token create` without --ttl ("never": no expiry)
    # On the first start (no token issued yet) create an admin token for urn:li:corpuser:datahub and print it once.
    auth_bootstrap_admin_token: bool = True
    # /docs, /redoc and /openapi.json without a token: a browser cannot send a bearer header, and the description of
    # DataHub's public model is no secret. false puts them behind a reader token.
    auth_public_docs: bool = True
    # Schema registry reads without a token, as DataHub leaves /schema-registry/* open (Kafka clients fetch writer
    # schemas by id without credentials); registering a new schema and changing compatibility stay admin-only.
    schema_registry_open_read: bool = True
    # DataHub's system client (`Authorization: Basic <id>:<secret>`): admin, and may act as another actor
    # (X-DataHub-Actor). Unset secret: no system client.
    system_client_id: str = "__datahub_system"
    system_client_secret: str | None = None

    # --- search, lineage graph and timeseries indices (unset: the embedded Postgres backend)
    search_url: str | None = None
    search_flavor: str = "elasticsearch"  # or "opensearch" (maps the client's vendor media type back to JSON)
    search_index_prefix: str = ""
    search_sync_timeout_s: float = 5.0  # X-DataHub-Sync-Index-Update: longer than this answers PENDING
    search_worker_poll_ms: int = 50  # the embedded indexing worker (no Kafka): outbox → indices
    search_worker_batch_size: int = 1000
    # What the index copy of a value may hold (app.search.documents; the stored aspect is never changed): NUL is
    # stripped; each string is cut to `search_max_field_chars` (keyword-typed values to at most 8,191: Lucene's
    # 32,766-byte term limit); the strings of one aspect's contribution, and the text of an entity's Postgres
    # tsvector, to `search_max_document_chars` in all (100,000 keeps the tsvector well under its 1 MB limit).
    search_max_field_chars: int = 32_768
    search_max_document_chars: int = 100_000
    # A change log the backend refuses is recorded in `search_index_failure`, skipped, and retried after
    # min * 2^(attempts-1) seconds, at most max (app.search.failures).
    search_failure_retry_min_s: float = 10.0
    search_failure_retry_max_s: float = 3600.0

    # --- processes (`metaledger serve --workers N`, app.supervisor)
    # Whether this process also runs the background workers (relay, consumers, embedded indexer). `serve --workers N`
    # with N > 1 turns it off in its API processes and runs them in one process of their own.
    background_in_process: bool = True
    # SIGTERM (app.ops.drain): for `shutdown_drain_s` new requests are answered 503 with Retry-After and /ready says
    # not ready (a load balancer takes the process out); then no new connection is taken and the requests in flight
    # get `shutdown_timeout_s` to finish.
    shutdown_drain_s: float = Field(5.0, ge=0)
    shutdown_timeout_s: float = Field(20.0, gt=0)

    # --- the outbox relay (publishes change logs to Kafka; also assigns change-feed offsets in commit order)
    relay_enabled: bool = True  # inside `metaledger serve`; `metaledger relay` runs it standalone
    relay_batch_size: int = 1000
    relay_poll_interval_ms: int = 20
    outbox_retention_hours: float = 24.0  # delivered (or, without Kafka, fed) rows older than this are pruned

    # --- asynchronous ingestion (MetadataChangeProposal_v1 → the write pipeline; failures → FMCP)
    mcp_consumer_enabled: bool = False  # inside `metaledger serve`; `metaledger consume-mcp` runs it standalone
    mcp_consumer_group: str = "generic-mce-consumer-job-client"
    mcp_consumer_batch_size: int = 500
    mce_consumer_enabled: bool = False

    # --- change processors (app.write.processors): each process looks at the stored pipeline at most this often
    change_processor_refresh_s: float = 2.0
    # --- models registered at run time (app.write.runtime_models): each process looks for a new stored set this often
    model_refresh_s: float = 1.0
    after_processor_batch_size: int = 200  # change logs per transaction of the after phase's feed reader
    after_processor_poll_ms: int = 100

    # --- operations: metrics, readiness, backpressure (app.ops)
    http_metrics_enabled: bool = True  # request counts and latency histograms per route (the middleware's part)
    access_log: bool = True  # one INFO line per request on `metaledger.access` (request_id, method, route, status, ms)
    # Write combining (app.write.combiner): HTTP writes waiting at the same moment share a transaction, up to
    # `write_group_transactions` transactions at a time per process and `write_group_max_proposals` proposals each.
    write_combining: bool = True
    write_group_transactions: int = 2
    write_group_max_proposals: int = 1000
    # Writes in flight per process (0: 4 x db_pool_size); a write waits this long for a slot, then answers 429.
    max_in_flight_writes: int = 0
    write_queue_timeout_ms: int = 1000
    # Writes answer 429 while the outbox backlog (change logs not yet published, or without Kafka not yet indexed)
    # is over this many rows; 0: no limit (a broker outage then only delays publishing).
    max_outbox_backlog: int = 0
    backpressure_retry_after_s: int = 1  # Retry-After of the 429s (the least one: app.ops.backpressure)
    # Write admission by cost (app.ops.backpressure): a write costs its proposals plus one per `write_cost_bytes` of
    # its request body; the writes in flight per process may cost `write_budget` in all (0: write_group_transactions
    # x write_group_max_proposals, what the combiner's transactions take at once), and one caller (the token's actor;
    # the client address without auth) may hold at most `write_caller_share` of it and of max_in_flight_writes.
    write_budget: int = 0
    write_caller_share: float = Field(0.5, gt=0, le=1)
    write_cost_bytes: int = Field(65_536, ge=1)
    # While other callers write, one caller's writes may keep its share busy this fraction of the time: a write that
    # took d seconds stays charged to its caller d x (1 / duty - 1) after it ends (app.ops.backpressure). 1: no rest.
    write_caller_duty: float = Field(0.5, gt=0, le=1)
    # An admitted write's transaction finishes or fails within this (its statements run under a `statement_timeout`
    # of what is left); one that does not answers 503 with Retry-After, nothing committed. 0: no deadline.
    write_deadline_ms: int = Field(10_000, ge=0)
    # Read transactions on the search backend's Postgres (searches, facets, scrolls, lineage) run under this
    # `statement_timeout`: a statement past it is cancelled and the request answers 503 with Retry-After. 0: none.
    read_timeout_s: float = Field(10.0, ge=0)
    db_pool_timeout_s: float = 5.0  # longest wait for a pooled connection; then 503 with Retry-After
    ops_sample_interval_s: float = 1.0  # how often the outbox backlog and lags are sampled
    ready_timeout_s: float = 2.0  # each readiness probe (database, broker, external schema registry) at most
    ready_cache_s: float = 5.0  # broker and external registry probes are reused this long

    # --- input limits (hostile input: bounded memory, no 500s; the README's "Hostile input")
    # Items of one batch (v1 proposals, v3 entity batches, Rest.li ingestProposalBatch, batchGet): more answer 413.
    # DataHub's client sends at most 200. A batch's bytes are bounded by max_request_bytes.
    max_batch_items: int = 10_000
    # JSON nesting (a request body, an aspect or system metadata sent as JSON text, a Kafka record): deeper is a 400.
    max_json_depth: int = 100
    # A write's response echoes each written aspect (as DataHub does) unless its value is larger than this: then
    # the aspect comes back without `value`, with a `message` saying so.
    max_echo_value_bytes: int = 1_048_576
    # GraphQL (/api/graphql, app.graphql): a query longer than max_query_chars or of more lexical tokens is refused
    # before parsing; then per operation, fragments expanded: fields nested deeper than max_depth, more aliased
    # fields than max_aliases, more fields than max_fields (its complexity) are GraphQL errors. A search's count
    # is cut to max_count (DataHub's 10,000). An operation costing more than max_cost (app.graphql.limits.query_cost:
    # each field once per result it is resolved for) is refused with a 400 before it runs.
    graphql_max_query_chars: int = 65_536
    graphql_max_tokens: int = 15_000
    graphql_max_depth: int = 20
    graphql_max_aliases: int = 50
    graphql_max_fields: int = 5_000
    graphql_max_count: int = Field(10_000, ge=1, le=10_000)
    graphql_max_cost: int = Field(100_000, ge=1)
    # Origins allowed to call the API from a browser (CORS), e.g. '["https://datahub.example.com"]' or
    # "https://a.example.com,https://b.example.com". Empty: no CORS headers (browsers refuse cross-origin calls).
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, raw: Any) -> Any:
        if isinstance(raw, str):
            text = raw.strip()
            if text.startswith("["):
                return json.loads(text)
            return [origin.strip() for origin in text.split(",") if origin.strip()]
        return raw


@lru_cache
def get_settings() -> Settings:
    return Settings()
