"""The process's Prometheus series (prefix `metaledger_`), served at `/metrics`.

Counters and histograms that the code increments (requests, writes, rejections, retries, auth failures, relay
publishes, consumer lag, indexing) are module-level, created once at import in `REGISTRY`, a registry of metaledger's own (not
prometheus_client's global default), so that any number of apps in one process (the tests) share them without
"Duplicated timeseries". Values that are read from a running app (the DB pool, the outbox backlog, indexing lag,
writes in flight) are not stored here: each app's `Operations` renders them at scrape time from its own objects
(app.ops.Operations), appended to this registry's exposition.

Label values are bounded: routes are templates ("unmatched" when nothing matched), methods a fixed set, entity types
and aspects come from the registry (a write that names neither is rejected before it is counted), validation
reasons and conflict kinds are the short lists below.

Under `metaledger serve --workers N` (PROMETHEUS_MULTIPROC_DIR set before this module is imported) prometheus_client
keeps these values in files shared by every process, and `/metrics` sums them (`exposition`).
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from app.errors import clip  # app.errors imports nothing of metaledger's

if TYPE_CHECKING:
    from app.errors import Issue, MetaledgerError

_write_log = logging.getLogger("metaledger.write")

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

# --- HTTP (app.ops.middleware) ---------------------------------------------------------------------------------------
HTTP_REQUESTS = Counter(
    "metaledger_http_requests",
    "HTTP requests by route template, method and status",
    ["route", "method", "status"],
    registry=REGISTRY,
)
HTTP_DURATION = Histogram(
    "metaledger_http_request_duration_seconds",
    "HTTP request latency (until the response is sent) by route template and method",
    ["route", "method"],
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

# How late the event loop ran a timer (app.ops.Operations' probe): the longest a request waits behind CPU work of
# others in its process (a batch's parsing, decision, encoding). Not per route: every request of the process shares it.
EVENT_LOOP_LAG = Histogram(
    "metaledger_event_loop_lag_seconds",
    "How late this process's event loop ran a timer set every 20 ms",
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)

# --- the write path (app.ingest.gateway, app.write.service) ----------------------------------------------------------
WRITES = Counter(
    "metaledger_writes",
    "Proposals applied in a committed transaction, by entity type, aspect and change type",
    ["entity_type", "aspect", "change_type"],
    registry=REGISTRY,
)
VALIDATION_FAILURES = Counter(
    "metaledger_write_validation_failures",
    "Proposals rejected as invalid, by reason: aspect_value (schema or patch), urn, change_type, aspect_name "
    "(not in the registry), rule (a proposal or pre-commit rule), too_large, other",
    ["reason"],
    registry=REGISTRY,
)
CONFLICTS = Counter(
    "metaledger_write_conflicts",
    "Conditional writes refused: precondition (412, If-Version-Match and friends), existence (409, CREATE/UPDATE)",
    ["kind"],
    registry=REGISTRY,
)
TRANSACTION_RETRIES = Counter(
    "metaledger_write_transaction_retries",
    "Write transactions retried after a lost race, a deadlock or a serialization failure",
    ["reason"],
    registry=REGISTRY,
)
WRITE_REJECTIONS = Counter(
    "metaledger_write_rejections",
    "Writes refused by backpressure (429): in_flight (no write slot within the wait), backlog (outbox backlog over its limit)",
    ["reason"],
    registry=REGISTRY,
)

# --- authentication (incremented by app.auth) ------------------------------------------------------------------------
AUTH_FAILURES = Counter(
    "metaledger_auth_failures",
    "Requests refused by authentication or authorization, by reason",
    ["reason"],
    registry=REGISTRY,
)

# --- change logs and ingestion (app.kafka.relay, app.kafka.consumers.loop) -------------------------------------------
RELAY_PUBLISHED = Counter(
    "metaledger_relay_published",
    "Outbox rows this process's relay published to Kafka and marked delivered",
    registry=REGISTRY,
)
CONSUMER_LAG = Gauge(
    "metaledger_consumer_lag_records",
    "Records on an ingestion topic partition not yet applied by this process's consumer (high watermark - position), "
    "after its last batch",
    ["topic", "partition"],
    registry=REGISTRY,
    multiprocess_mode="mostrecent",
)

# --- change processors (app.write.processors): labels are the pipeline's steps ---------------------------------------
PROCESSOR_CALLS = Counter(
    "metaledger_change_processor_calls",
    "Changes a change processor decided on, by processor, phase and outcome "
    "(accepted, mutated, ignored, rejected, failed)",
    ["processor", "phase", "outcome"],
    registry=REGISTRY,
)
PROCESSOR_SECONDS = Counter(  # with the calls: the mean time per change (a slow one is refused past its budget)
    "metaledger_change_processor_seconds",
    "Time change processors took, by processor and phase",
    ["processor", "phase"],
    registry=REGISTRY,
)

# --- the embedded indexing worker (app.search.worker) ----------------------------------------------------------------
INDEXER_APPLIED = Counter(
    "metaledger_indexer_applied_rows",
    "Change logs the embedded indexing worker applied",
    registry=REGISTRY,
)
INDEXER_FAILED_ROWS = Counter(
    "metaledger_indexer_failures",
    "Change logs the embedded indexer recorded as refused by the search backend (first failures and failed retries)",
    registry=REGISTRY,
)
INDEXER_RETRIED_ROWS = Counter(
    "metaledger_indexer_retried_rows",
    "Refused change logs a retry of the embedded indexer indexed",
    registry=REGISTRY,
)
INDEXER_ERRORS = Counter(
    "metaledger_indexer_errors",
    "Errors of the embedded indexing worker (backend or database unavailable: the batch is retried whole)",
    registry=REGISTRY,
)


def exposition() -> bytes:
    """The module's series: this process's, or with several processes (multiprocess mode) every process's summed."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        shared = CollectorRegistry()
        multiprocess.MultiProcessCollector(shared)
        return generate_latest(shared)
    return generate_latest(REGISTRY)


_ANY_METHOD = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


def method_label(method: str) -> str:
    return method if method in _ANY_METHOD else "other"


# --- the write path's hooks ------------------------------------------------------------------------------------------


class CountedWrite(Protocol):
    """What `count_writes` reads of a proposal (app.write.proposal.Proposal, which stands above app.ops)."""

    @property
    def index(self) -> int: ...
    @property
    def entity_type(self) -> str: ...
    @property
    def aspect_name(self) -> str: ...
    @property
    def change_type(self) -> enum.Enum: ...


def count_writes(proposals: Sequence[CountedWrite], items: Sequence[Any]) -> None:
    """After a commit: one per applied proposal (a proposal dropped by `If-None-Match: *` is not applied). `items`: the
    write's per-proposal results (`index`, `status`)."""
    filtered = {item.index for item in items if item.status.value in ("FILTERED", "IGNORED")} if items else ()
    counts: dict[tuple[str, str, str], int] = {}
    for p in proposals:
        if p.index in filtered:
            continue
        key = (p.entity_type, p.aspect_name, p.change_type.value)
        counts[key] = counts.get(key, 0) + 1
    for key, n in counts.items():
        WRITES.labels(*key).inc(n)


def validation_reason(issue: Issue) -> str:
    """A bounded reason for one invalid proposal, from its first issue's MCP path (before it is relocated into the
    caller's terms): the field at fault, or `rule` for a rule's verdict about the proposal as a whole."""
    path = issue.path
    if path is None:
        return "rule"
    if path.startswith("$.aspect"):
        return "aspect_value" if not path.startswith("$.aspectName") else "aspect_name"
    if path.startswith(("$.entityUrn", "$.entityKeyAspect")):
        return "urn"
    if path.startswith("$.changeType"):
        return "change_type"
    return "other"


def count_rejection(error: MetaledgerError) -> None:
    """A write the pipeline refused (4xx): conflicts by kind, invalid proposals by reason (one per proposal)."""
    status = error.status_code
    if status == 412:
        CONFLICTS.labels("precondition").inc()
    elif status == 409:
        CONFLICTS.labels("existence").inc()
    elif status == 413:
        VALIDATION_FAILURES.labels("too_large").inc()
    elif status == 400:
        first: dict[Any, Issue] = {}
        for issue in error.issues:
            first.setdefault(issue.index, issue)
        if not first:
            VALIDATION_FAILURES.labels("other").inc()
        for issue in first.values():
            VALIDATION_FAILURES.labels(validation_reason(issue)).inc()


def first_write_fields(items: Iterable[Any]) -> dict[str, Any]:
    """urn, aspect and run_id of the first draft or proposal of a write, for its log lines."""
    for item in items:
        sm = getattr(item, "system_metadata", None) or {}
        return {
            "urn": getattr(item, "urn", None),
            "aspect": getattr(item, "aspect_name", None),
            "run_id": sm.get("runId") if isinstance(sm, dict) else None,
        }
    return {}


def write_refused(error: MetaledgerError, items: Sequence[Any]) -> None:
    """A write the pipeline refused: counted (4xx), and logged with the first failing item's urn, aspect and runId
    (INFO for the caller's errors, WARNING for the service's)."""
    count_rejection(error)
    issue = error.issues[0] if error.issues else None
    by_index = {getattr(item, "index", None): item for item in items}
    item = by_index.get(issue.index) if issue is not None else None
    fields = first_write_fields([item] if item is not None else items)
    if issue is not None:
        fields["urn"] = issue.urn or fields.get("urn")
        fields["aspect"] = issue.aspect or fields.get("aspect")
    level = logging.WARNING if error.status_code >= 500 else logging.INFO
    if _write_log.isEnabledFor(level):
        _write_log.log(
            level,
            "write refused",
            extra={
                "status": error.status_code,
                "error": error.error,
                "reason": error.message[:300],
                "items": len(items),
                "issues": len(error.issues),
                # what the client sent, cut: a log line never carries unbounded input
                **{k: clip(v) if isinstance(v, str) else v for k, v in fields.items()},
            },
        )


def record_consumer_lag(consumer: Any, batches: dict[Any, list[Any]]) -> None:
    """After a consumer's batch: per partition it fetched from, the high watermark the fetch reported minus the next
    offset to consume (aiokafka keeps both; no broker call)."""
    for tp, records in batches.items():
        if not records:
            continue
        highwater = consumer.highwater(tp)
        if highwater is not None:
            CONSUMER_LAG.labels(tp.topic, str(tp.partition)).set(max(0, highwater - (records[-1].offset + 1)))
