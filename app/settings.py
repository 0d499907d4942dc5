"""Service settings, read from the environment with the ``METALEDGER_`` prefix."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic.json_schema import JsonDict
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def group(name: str, docs: str | None = None) -> JsonDict:
    """Marks the first setting of a group on docs/configuration.md (app.settings_docs): the settings declared after it
    belong to the same group up to the next marked one. `docs` is the page of docs/ that explains them."""
    return {"group": name, "docs": docs} if docs else {"group": name}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="METALEDGER_", extra="ignore")

    database_url: str | None = Field(
        None,
        json_schema_extra=group("Database", "getting-started.md#the-embedded-postgres"),
        description="Postgres (`postgresql+asyncpg://user:password@host:5432/db`); unset: the embedded Postgres under "
        "`DATA_DIR`, which `metaledger serve` starts itself",
    )
    data_dir: Path = Field(
        PROJECT_ROOT / ".metaledger", description="where the embedded Postgres keeps its files (`pg/`)"
    )
    embedded_pg_port: int = Field(55433, description="the embedded Postgres's port (on 127.0.0.1)")

    registry_path: Path = Field(
        PROJECT_ROOT / "entity_registry.yml",
        json_schema_extra=group("Registry and writes", "runtime-models.md"),
        description="the entity registry (DataHub's format plus `modelSources`)",
    )
    trim_unknown_fields: bool = Field(
        False, description="drop unknown aspect fields silently (DataHub's behaviour) instead of rejecting them"
    )
    strict_urn_validation: bool = Field(
        True,
        description="reserved characters inside URN parts are errors, not warnings (DataHub's "
        "STRICT_URN_VALIDATION_ENABLED)",
    )
    retention_max_versions: int = Field(
        20, description="history rows kept per aspect (row 0, the latest, is never deleted)"
    )
    retention_overrides: dict[str, int] = Field(
        default_factory=dict,
        description="`RETENTION_MAX_VERSIONS` per `entity/aspect`, `entity/*` or `*/aspect` (JSON), e.g. "
        '`{"dataset/status": 1, "*/datasetProfile": 0}`',
    )
    always_emit_change_log: bool = Field(
        False, description="also log no-op writes (as `RESTATE`; DataHub's ALWAYS_EMIT_CHANGE_LOG)"
    )

    max_request_bytes: int = Field(
        16_000_000,
        json_schema_extra=group("HTTP and input limits", "hostile-input.md"),
        description="larger request bodies answer 413 (checked as the body streams in, chunked ones too)",
    )
    # A request's head: app.http_server.
    max_header_bytes: int = Field(
        65_536,
        ge=1_024,
        description="a request line and headers larger than this answer 431 as they arrive, and the connection is "
        "closed (`metaledger serve`)",
    )
    max_headers: int = Field(100, ge=1, description="more header lines answer 431 (`metaledger serve`)")
    max_aspect_bytes: int = Field(16_000_000, description="larger aspect values (serialized) are rejected")
    transaction_retries: int = Field(
        5,
        json_schema_extra=group("Database"),
        description="retries of a write transaction after a lost race, deadlock or serialization failure",
    )
    db_pool_size: int = Field(
        10, description="database connections per process; a burst may open twice as many, and the pool keeps them"
    )
    apply_migrations_on_start: bool = Field(
        True, description="`serve` applies pending migrations first (`--no-migrate` turns it off)"
    )
    read_database_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        json_schema_extra=group("Read replicas", "replicas.md"),
        description="Postgres streaming replicas (or a managed read endpoint) that serve the reads, comma-separated "
        "`postgresql+asyncpg://` URLs; empty: every read on `DATABASE_URL`. Writes always go to the primary",
    )
    replica_max_lag_s: float = Field(
        5.0, gt=0, description="a replica further behind the primary than this leaves rotation until it catches up"
    )
    read_your_writes_s: float = Field(
        5.0,
        ge=0,
        description="a caller (its token, or its address without one) that wrote within this long reads at least "
        "what it wrote, without sending `X-Metaledger-Written-At` (per process; 0: only the header)",
    )
    read_your_writes_wait_s: float = Field(
        1.0,
        ge=0,
        description="how long a read waits for a replica to replay the position it must see (within the read "
        "budget); then it reads from the primary",
    )

    # --- Kafka (unset: the embedded default; the outbox still fills and is readable as a change feed over HTTP)
    kafka_bootstrap_servers: str | None = Field(
        None,
        json_schema_extra=group("Kafka", "change-logs-and-kafka.md"),
        description="Kafka brokers; unset: no Kafka (the outbox is read as the change feed, the service indexes)",
    )
    kafka_client_id: str = Field("metaledger", description="prefix of the Kafka client ids")
    topic_mcl_versioned: str = Field("MetadataChangeLog_Versioned_v1", description="change logs of versioned aspects")
    topic_mcl_timeseries: str = Field(
        "MetadataChangeLog_Timeseries_v1", description="change logs of timeseries aspects"
    )
    topic_platform_event: str = Field("PlatformEvent_v1", description="Entity Change Events")
    topic_mcp: str = Field("MetadataChangeProposal_v1", description="asynchronous proposals")
    topic_fmcp: str = Field(
        "FailedMetadataChangeProposal_v1", description="asynchronous proposals that failed, with the reason"
    )
    topic_mce: str = Field("MetadataChangeEvent_v4", description="legacy MCEs")
    topic_fmce: str = Field("FailedMetadataChangeEvent_v4", description="legacy MCEs that failed, with the reason")
    # Per-aspect events, "Metadata Events (v5)": app.kafka.per_aspect.
    events_v5_routes: list[dict[str, Any]] = Field(
        default_factory=list,
        json_schema_extra=group(
            "Per-aspect events and MAE v4",
            "change-logs-and-kafka.md#per-aspect-events-metadata-events-v5-and-the-legacy-audit-event-mae-v4",
        ),
        description="per-aspect events, opt-in per entity/aspect pair: a JSON list of routes "
        '`{"entityTypes", "aspects", "auditTopic"?, "changeTopic"?, "failedTopic"?, "sharedTopic"?}` '
        "(fnmatch patterns; the first route that matches a pair wins)",
    )
    events_v5_audit_topic: str = Field(
        "MetadataAuditEvent_v5.{entity}.{aspect}", description="a route's audit topic unless it names its own"
    )
    events_v5_change_topic: str = Field(
        "MetadataChangeEvent_v5.{entity}.{aspect}", description="a route's change topic unless it names its own"
    )
    events_v5_failed_topic: str = Field(
        "FailedMetadataChangeEvent_v5.{entity}.{aspect}", description="a route's failed topic unless it names its own"
    )
    events_v5_consumer_enabled: bool = Field(
        False, description="apply the routed pairs' change topics (through the write pipeline)"
    )
    mae_v4_enabled: bool = Field(
        False, description="publish the legacy `MetadataAuditEvent_v4` next to the change logs"
    )
    topic_mae: str = Field("MetadataAuditEvent_v4", description="the legacy audit event's topic")
    create_topics_on_start: bool = Field(
        True, json_schema_extra=group("Kafka"), description="create missing topics at start-up"
    )
    kafka_max_message_bytes: int = Field(
        5 * 1024 * 1024, description="largest message (topic `max.message.bytes`, producer and consumer limits)"
    )
    kafka_compression_type: str = Field("lz4", description="the relay's producer compression")
    kafka_topic_partitions: int = Field(1, description="partitions of the topics it creates (DataHub's default)")
    kafka_topic_replication_factor: int = Field(1, description="replication factor of the topics it creates")
    kafka_value_format: Literal["avro", "json"] = Field(
        "avro",
        description="what metaledger writes on every topic: `avro` (DataHub's wire: `0x00`, the 4-byte schema id, the "
        "Avro binary) or `json` (the JSON text, metaledger's format before Avro); consumers read both "
        "whatever this says",
    )
    schema_registry_url: str | None = Field(
        None,
        description='an external Confluent-compatible schema registry (DataHub\'s "KAFKA" type): metaledger '
        "registers its schemas there and resolves every schema id through it; unset: metaledger's own, "
        "served at `/schema-registry/api` with DataHub's fixed ids",
    )
    schema_registry_user_info: str | None = Field(
        None,
        description="`user:password` for an external registry that wants HTTP Basic (another metaledger's: "
        "its system client `id:secret`)",
    )

    platform_events_enabled: bool = Field(
        True,
        json_schema_extra=group("Registry and writes"),
        description="compute Entity Change Events (tag added, owner removed, ...) at write time",
    )
    # app.telemetry
    telemetry_client_id: bool = Field(
        True,
        description="at start-up, create DataHub's server id (`urn:li:telemetry:clientId`, aspect "
        "`telemetryClientId`: a random UUID, one per deployment) unless it exists; the `datahub` CLI reads "
        "it when it connects. An ordinary write, with its change log",
    )

    # --- authentication and authorization (app.auth)
    auth_enabled: bool = Field(
        True,
        json_schema_extra=group("Authentication", "authentication.md"),
        description="`false`: no authentication, every request is `urn:li:corpuser:datahub` with the admin role "
        "(trusted loopback only; logged loudly)",
    )
    auth_secret: str | None = Field(
        None,
        description="the HS256 key tokens are signed with; unset: a random key created once and kept in "
        "Postgres (`auth_signing_key`), shared by every process",
    )
    view_authorization: bool = Field(
        False,
        description="DataHub's VIEW_AUTHORIZATION_ENABLED: a caller that is not an admin reads only the entities an "
        "ACTIVE access policy grants it VIEW_ENTITY_PAGE on (entity reads, searches and their counts, lineage, the "
        "change feed, timeline); off, every authenticated caller reads every entity",
    )
    auth_cache_seconds: float = Field(
        5.0,
        description="how long a verified token and the policies are trusted before Postgres is asked again "
        "(how soon a revocation or policy change takes effect everywhere)",
    )
    auth_token_default_ttl: str = Field(
        "90d", description="lifetime of a token created without `--ttl` (`never`: no expiry)"
    )
    auth_bootstrap_admin_token: bool = Field(
        True,
        description="on the first start (no token issued yet), create an admin token for "
        "`urn:li:corpuser:datahub` and print it once",
    )
    auth_public_docs: bool = Field(
        True,
        description="serve `/docs`, `/redoc` and `/openapi.json` without a token (a browser cannot send a "
        "bearer header); `false` puts them behind a reader token",
    )
    schema_registry_open_read: bool = Field(
        True,
        description="schema registry reads without a token (as DataHub leaves `/schema-registry/*` open: Kafka "
        "clients fetch writer schemas by id without credentials); new schemas and compatibility "
        "changes stay admin-only",
    )
    system_client_id: str = Field(
        "__datahub_system",
        description="DataHub's system client (`Authorization: Basic <id>:<secret>`): admin, and may act as another "
        "actor with `X-DataHub-Actor`",
    )
    system_client_secret: str | None = Field(None, description="the system client's secret; unset: no system client")

    # --- search, lineage graph and timeseries indices
    search_url: str | None = Field(
        None,
        json_schema_extra=group("Search", "search.md"),
        description="Elasticsearch/OpenSearch; unset: the indices live in Postgres",
    )
    search_flavor: str = Field(
        "elasticsearch", description="or `opensearch` (maps the client's vendor media type back to plain JSON)"
    )
    search_index_prefix: str = Field("", description="prefix of every index and alias name")
    search_sync_timeout_s: float = Field(
        5.0, description="a sync index update (`X-DataHub-Sync-Index-Update`) longer than this answers `PENDING`"
    )
    search_worker_poll_ms: int = Field(
        50, description="how often the service's indexing worker (no Kafka) polls the outbox"
    )
    search_worker_batch_size: int = Field(1000, description="change logs per indexing batch")
    # What the index copy of a value may hold: app.search.documents.
    search_max_field_chars: int = Field(
        32_768,
        description="the index copy of each string of a search document is cut to this many characters "
        "(keyword-typed values to at most 8,191: Lucene's 32,766-byte term limit); the stored aspect is "
        "untouched",
    )
    search_max_document_chars: int = Field(
        100_000,
        description="the strings one aspect contributes to its entity's search document, in all (higher-boost "
        "fields first); also the text each aspect's Postgres tsvector is built from, and the text of an "
        "entity's aspects, counted in aspect-name order, that its tsvector holds (keeps it under 1 MB)",
    )
    # Refused change logs: app.search.failures.
    search_failure_retry_min_s: float = Field(
        10.0,
        description="a change log the search backend refused is retried after min × 2^(attempts−1) seconds, "
        "at most `SEARCH_FAILURE_RETRY_MAX_S`",
    )
    search_failure_retry_max_s: float = Field(
        3600.0, description="the longest wait before a refused change log is retried"
    )

    # --- processes (`metaledger serve --workers N`, app.supervisor)
    background_in_process: bool = Field(
        True,
        json_schema_extra=group("Processes", "architecture.md#processes"),
        description="run the background workers (relay, consumers, embedded indexer) in this process; `serve "
        "--workers N` (N > 1) sets it to `false` in its API processes and runs them in a process of their "
        "own",
    )
    # SIGTERM: app.ops.drain.
    shutdown_drain_s: float = Field(
        5.0,
        ge=0,
        description="on SIGTERM, how long new requests are answered 503 with `Retry-After` and `/ready` says not "
        "ready before no new connection is taken",
    )
    shutdown_timeout_s: float = Field(
        20.0, gt=0, description="then, how long the requests in flight may take to finish"
    )

    # --- the outbox relay (publishes change logs to Kafka; also assigns change-feed offsets in commit order)
    relay_enabled: bool = Field(
        True,
        json_schema_extra=group("Outbox relay and change feed", "change-logs-and-kafka.md"),
        description="run the outbox relay (and feed sequencer) inside `serve`; `metaledger relay` runs it standalone",
    )
    relay_batch_size: int = Field(1000, description="outbox rows per relay batch")
    relay_poll_interval_ms: int = Field(20, description="how often the relay polls the outbox")
    outbox_retention_hours: float = Field(
        24.0, description="delivered (without Kafka: sequenced) outbox rows older than this are pruned"
    )
    audit_retention_days: float = Field(
        0.0,
        ge=0,
        description="audit log entries older than this are purged, oldest first; the chain keeps the hash of the last "
        "one purged, so its verification still holds (0: kept forever)",
    )

    # --- asynchronous ingestion (MetadataChangeProposal_v1 → the write pipeline; failures → FMCP)
    mcp_consumer_enabled: bool = Field(
        False,
        json_schema_extra=group(
            "Asynchronous ingestion", "datahub-compatibility.md#asynchronous-ingestion-and-legacy-mces"
        ),
        description="run the MCP consumer inside `serve`; `metaledger consume-mcp` runs it standalone",
    )
    mcp_consumer_group: str = Field("generic-mce-consumer-job-client", description="its consumer group (DataHub's)")
    mcp_consumer_batch_size: int = Field(500, description="records per consumer batch (one transaction)")
    mce_consumer_enabled: bool = Field(
        False, description="run the MCE consumer inside `serve`; `metaledger consume-mce` runs it standalone"
    )

    # --- change processors (app.write.processors), models registered at run time (app.modelset)
    change_processor_refresh_s: float = Field(
        2.0,
        json_schema_extra=group("Change processors and runtime models", "runtime-models.md"),
        description="how often each process looks at the stored change-processor pipeline",
    )
    model_refresh_s: float = Field(1.0, description="how often each process looks for a new stored runtime model set")
    after_processor_batch_size: int = Field(
        200, description="change logs per transaction of the change processors' after phase"
    )
    after_processor_poll_ms: int = Field(100, description="the after phase's idle poll of the change feed")

    # --- operations: metrics, readiness, backpressure (app.ops)
    http_metrics_enabled: bool = Field(
        True,
        json_schema_extra=group("Operations", "operations.md"),
        description="per-route request counts and latency histograms",
    )
    access_log: bool = Field(
        True,
        description="one INFO line per request on `metaledger.access` (request id, method, route, status, duration)",
    )
    # Write combining: app.write.combiner.
    write_combining: bool = Field(
        True,
        json_schema_extra=group("Write combining and backpressure", "operations.md#backpressure"),
        description="concurrent HTTP writes of a process share transactions",
    )
    write_group_transactions: int = Field(2, description="write transactions per process at once when combining")
    write_group_max_proposals: int = Field(
        1000,
        description="proposals one combined transaction carries at most (a write of more than 100 has its own "
        "transaction)",
    )
    # Write admission by cost: app.ops.backpressure.
    max_in_flight_writes: int = Field(
        0,
        description="HTTP writes in flight at once per process (applying, or waiting for a shared transaction); "
        "more wait for a slot. 0: 4 × `DB_POOL_SIZE`",
    )
    write_queue_timeout_ms: int = Field(
        1000, description="how long a write waits for a slot before it answers 429 with `Retry-After`"
    )
    max_outbox_backlog: int = Field(
        0,
        description="writes answer 429 while more change logs than this wait to be published (Kafka) or indexed "
        "(embedded). 0: off (a broker outage then only delays publishing)",
    )
    backpressure_retry_after_s: int = Field(
        1,
        description="the least `Retry-After` of those 429s (a caller with writes in flight is told when they will "
        "be done, at most 60 s)",
    )
    write_budget: int = Field(
        0,
        description="the cost of the HTTP writes in flight at once per process: a write costs its proposals plus "
        "one per `WRITE_COST_BYTES` of its body. 0: `WRITE_GROUP_TRANSACTIONS` × "
        "`WRITE_GROUP_MAX_PROPOSALS`",
    )
    write_caller_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="the most of `WRITE_BUDGET` and of `MAX_IN_FLIGHT_WRITES` one caller (token actor; client address "
        "without auth) may hold",
    )
    write_cost_bytes: int = Field(65_536, ge=1, description="request-body bytes that cost as much as one proposal")
    write_caller_duty: float = Field(
        0.5,
        gt=0,
        le=1,
        description="while other callers write, the share of the time one caller's writes may keep its share busy: a "
        "write that took d s stays charged to its caller d × (1/duty − 1) s after it ends (1: off)",
    )
    write_deadline_ms: int = Field(
        10_000,
        ge=0,
        description="an admitted write's transaction runs under a `statement_timeout` of what is left of this; past "
        "it: 503 with `Retry-After`, nothing committed (0: none)",
    )
    idempotency_window_s: float = Field(
        86_400.0,
        gt=0,
        description="how long a write's `Idempotency-Key` and its reply are kept: the same request again with the key "
        "within it is answered with the stored reply and writes nothing",
    )
    read_timeout_s: float = Field(
        10.0,
        ge=0,
        json_schema_extra=group("Operations"),
        description="each request's read budget from its arrival (a caller may shorten it with "
        "`X-Metaledger-Deadline-Ms`): the Postgres search backend's statements (searches, facets, scrolls, lineage) "
        "run under what is left of it; past it a search is a 503 with `Retry-After`, a lineage walk answers the hops "
        "it finished (partial) or a 504 (0: none)",
    )
    db_pool_timeout_s: float = Field(
        5.0, description="longest wait for a pooled database connection; then 503 with `Retry-After` (never a 500)"
    )
    ops_sample_interval_s: float = Field(
        1.0, description="how often the outbox backlog and the relay/indexer lags are sampled"
    )
    ready_timeout_s: float = Field(
        2.0, description="each `/ready` probe (database, broker, external schema registry) at most"
    )
    ready_cache_s: float = Field(5.0, description="the broker and external registry probes are reused this long")

    # --- input limits (hostile input: bounded memory, no 500s; docs/hostile-input.md)
    max_batch_items: int = Field(
        10_000,
        json_schema_extra=group("HTTP and input limits"),
        description="items of one batch (v1 proposals, v3 entity batch, Rest.li `ingestProposalBatch`, `batchGet`), "
        "the write trace's (urn, aspect) pairs, and OpenLineage's datasets and the aspect writes its events "
        "map to; more answer 413 naming the limit. DataHub's client sends at most 200",
    )
    max_json_depth: int = Field(
        100,
        description="nesting of any JSON metaledger parses (a request body, an aspect or system metadata sent as "
        "JSON text, a Kafka record); deeper answers 400 naming where",
    )
    max_echo_value_bytes: int = Field(
        1_048_576,
        description="a v3 write echoes each written aspect (as DataHub) unless its value is larger: then `value` is "
        "left out and `message` says so",
    )
    # --- GraphQL (/api/graphql): the document limits are app.graphql.limits's, the cost app.graphql.limits.query_cost,
    # the answer's bytes app.graphql.limits.AnswerBudget
    graphql_max_query_chars: int = Field(
        65_536,
        json_schema_extra=group("GraphQL limits", "datahub-compatibility.md#graphql-apigraphql"),
        description="a longer GraphQL query is a GraphQL error, before parsing",
    )
    graphql_max_tokens: int = Field(
        15_000, description="lexical tokens of one GraphQL document (graphql-core's `max_tokens`: parsing stops there)"
    )
    graphql_max_depth: int = Field(20, description="field nesting of an operation, fragments expanded")
    graphql_max_aliases: int = Field(
        50, description="aliased fields of an operation as executed (a fragment spread k times counts k times)"
    )
    graphql_max_fields: int = Field(5_000, description="fields of an operation as executed (its complexity)")
    graphql_max_count: int = Field(
        10_000,
        ge=1,
        le=10_000,
        description="a search's `count` is cut to this (DataHub's `searchService.limits.results.max`; at most 10,000)",
    )
    graphql_max_cost: int = Field(
        100_000,
        ge=1,
        description="an operation costing more (each field once per result it is resolved for, with its variables) "
        "is a 400 before it runs",
    )
    graphql_max_response_bytes: int = Field(
        64 * 2**20,
        ge=1_024,
        description="a GraphQL answer that comes to more than this, counting the JSON text of the aspects read for "
        "it and its values (a string by its length) as they come, is refused with a 400 naming this "
        "setting as it grows past it: no further field is resolved, and what a request holds in memory "
        "is bounded whatever its cost",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        json_schema_extra=group("HTTP and input limits"),
        description="origins a browser may call the API from, as a JSON list (`'[\"https://datahub.example.com\"]'`) "
        "or comma-separated; empty: CORS off (no CORS headers: browsers refuse cross-origin calls)",
    )

    @field_validator("cors_origins", "read_database_urls", mode="before")
    @classmethod
    def _comma_separated(cls, raw: Any) -> Any:
        if isinstance(raw, str):
            text = raw.strip()
            if text.startswith("["):
                return json.loads(text)
            return [origin.strip() for origin in text.split(",") if origin.strip()]
        return raw


@lru_cache
def get_settings() -> Settings:
    return Settings()
