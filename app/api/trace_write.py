"""Write tracing as DataHub's clients use it (app.ingest.trace keeps the trace id with each write).

* Every HTTP response carries a W3C `traceparent` (`TraceparentMiddleware`): the caller's trace id if it sent one,
  else a new one; the writes of the request keep it in their system metadata (`properties.telemetryTraceId`).
* `POST /openapi/v1/trace/write/{traceId}?onlyIncludeErrors=true&detailed=false&skipCache=false` with
  `{"<urn>": ["<aspectName>", ...]}` → `{"<urn>": {"<aspect>": {"success", "primaryStorage": {"writeStatus",
  "writeMessage"?, "writeExceptions"?}, "searchStorage": {...}}}}` (DataHub's TraceController / TraceServiceImpl).

Where each answer comes from:
* primary storage: the aspect's latest row carries the trace id → ACTIVE_STATE; an older version of it does →
  HISTORIC_STATE. Neither (an asynchronous write): the MCP topic from the trace's time on → PENDING while the MCP
  consumer's group has not committed past the record; the failure topic → ERROR with the consumer's reasons
  (`writeExceptions`, DataHub's TraceException). Found in neither: HISTORIC_STATE when a later write replaced the
  aspect, else UNKNOWN. Kafka is read only for aspects the database does not answer for. Timeseries aspects: NO_OP
  (DataHub's: their points are not traced).
* search storage, for an ACTIVE_STATE write: the index's state (whoever indexes: the embedded worker or the Spark
  job) → ACTIVE_STATE once it holds that version or a newer one, ERROR when it refused it (the failure table's
  reason), NO_OP for an aspect the index does not use, else PENDING. Otherwise DataHub's rules: it follows the
  primary status (PENDING, HISTORIC_STATE, ERROR, UNKNOWN; NO_OP, TRACE_NOT_IMPLEMENTED for timeseries).
`success` is false when either status is ERROR. `skipCache` is accepted and changes nothing: nothing is cached.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any, Literal

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field, RootModel
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.deps import ALLOW_READ, Backend, JsonBody, Registry, Session
from app.api.http import Flag, entity_of_urn, invalid_at
from app.api.search import _indexed_aspects
from app.avro.wire import ValueCodec
from app.db import SessionRepository
from app.errors import ERROR_RESPONSES, Issue, ValidationFailed
from app.ingest.trace import (
    REQUEST_TRACE_ID, TELEMETRY_TRACE_KEY, new_trace_id, trace_id_in, trace_id_of_path, trace_id_of_traceparent,
    trace_time_ms, traceparent,
)
from app.registry import EntityRegistry
from app.search.failures import FailureReader
from app.settings import Settings
from app.write.reader import EntityReader

log = logging.getLogger("metaledger.trace")

router = APIRouter(tags=["trace"], dependencies=[ALLOW_READ])

WriteStatus = Literal["ERROR", "PENDING", "ACTIVE_STATE", "HISTORIC_STATE", "NO_OP", "UNKNOWN", "TRACE_NOT_IMPLEMENTED"]
QUEUE_READ_TIMEOUT_S = 10.0
FETCH_WAIT_MS = 200
UNTIMED_TRACE_LOOKBACK_MS = 86_400_000  # a trace id without a time (an external tracer's): the topics' last day


class TraceparentMiddleware:
    """The request's trace id (`REQUEST_TRACE_ID`) and the `traceparent` of its response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = dict(scope["headers"]).get(b"traceparent")
        trace_id = trace_id_of_traceparent(sent.decode("latin-1") if sent else None) or new_trace_id()
        token = REQUEST_TRACE_ID.set(trace_id)

        async def send_with_traceparent(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["traceparent"] = traceparent(trace_id)
            await send(message)

        try:
            await self.app(scope, receive, send_with_traceparent)
        finally:
            REQUEST_TRACE_ID.reset(token)


# --- the answer's model (DataHub's TraceResponseV1) --------------------------------------------------------------


class TraceException(BaseModel):
    message: str | None = None
    exceptionClass: str | None = None
    stackTrace: list[str] | None = None
    cause: TraceException | None = None


class TraceStorageStatus(BaseModel):
    writeStatus: WriteStatus
    writeMessage: str | None = None
    writeExceptions: list[TraceException] | None = None


class TraceStatus(BaseModel):
    success: bool
    primaryStorage: TraceStorageStatus
    searchStorage: TraceStorageStatus


class TraceRequest(RootModel[dict[str, list[str]]]):
    model_config = ConfigDict(json_schema_extra={
        "description": "The aspects to trace, per URN",
        "examples": [{"urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)": ["status", "datasetProperties"]}],
    })


def _status(write_status: WriteStatus, message: str | None = None, exceptions: list[dict] | None = None) -> dict:
    out: dict[str, Any] = {"writeStatus": write_status}
    if message is not None:
        out["writeMessage"] = message
    if exceptions is not None:
        out["writeExceptions"] = exceptions
    return out


@router.post(
    "/openapi/v1/trace/write/{traceId}",
    response_model=dict[str, dict[str, TraceStatus]],
    response_model_exclude_none=True,
    responses=ERROR_RESPONSES,
    summary="Where the writes of a trace stand: primary storage and the search index (DataHub's write tracing)",
    description="`traceId`: the trace id of a write response's `traceparent` (or the whole header). Per aspect asked: "
    "`success`, `primaryStorage.writeStatus` and `searchStorage.writeStatus` (ERROR, PENDING, ACTIVE_STATE, "
    "HISTORIC_STATE, NO_OP, UNKNOWN, TRACE_NOT_IMPLEMENTED). `onlyIncludeErrors` (default true) answers only the "
    "aspects with an ERROR; `detailed` adds the MCP consumer's reasons of a refused asynchronous write "
    "(`writeExceptions`); `skipCache` changes nothing (nothing is cached).",
)
async def trace_writes(
    request: Request, session: Session, registry: Registry, backend: Backend,
    body: Annotated[TraceRequest, Depends(JsonBody(TraceRequest))],
    traceId: Annotated[str, Path(description="A trace id (32 hex digits) or a whole `traceparent`")],
    onlyIncludeErrors: Annotated[Flag, Query()] = True,
    detailed: Annotated[Flag, Query()] = False,
    skipCache: Annotated[Flag, Query()] = False,
) -> Any:
    trace_id = trace_id_of_path(traceId)
    if trace_id is None:
        raise ValidationFailed(f"{traceId!r} is not a trace id (32 hex digits) nor a traceparent",
                               [Issue("not a trace id", path="$traceId", found=traceId[:80])])
    wanted = _checked(registry, body.root)
    primary: dict[str, dict[str, dict]] = {}
    versions: dict[tuple[str, str], int] = {}
    replaced: set[tuple[str, str]] = set()
    reader = EntityReader(session, registry).repo
    history = TraceHistory(session)
    trace_ms = trace_time_ms(trace_id)

    async def look_up(urn: str, aspects: list[str]) -> list[str]:
        """Settles what the rows tell about `aspects` of `urn` (ACTIVE_STATE, HISTORIC_STATE, or replaced by a later
        write); returns the aspects they tell nothing about."""
        statuses = primary[urn]
        latest = {row.aspect: row for row in await reader.entity_latest(urn, aspects)} if aspects else {}
        for aspect in aspects:
            row = latest.get(aspect)
            if row is not None and trace_id_in(row.system_metadata) == trace_id:
                statuses[aspect] = _status("ACTIVE_STATE")
                versions[urn, aspect] = row.version
            elif row is not None:
                later = trace_time_ms(trace_id_in(row.system_metadata))
                if trace_ms is not None and later is not None and later >= trace_ms:
                    replaced.add((urn, aspect))
        remaining = [a for a in aspects if a not in statuses]
        for aspect in await history.traced(urn, remaining, trace_id):
            statuses[aspect] = _status("HISTORIC_STATE")
        return [a for a in remaining if a not in statuses]

    unresolved: dict[str, list[str]] = {}
    for urn, aspects in wanted.items():
        primary[urn] = {a: _status("NO_OP") for a in aspects if registry.aspect_spec(a).is_timeseries}
        if remaining := await look_up(urn, [a for a in aspects if a not in primary[urn]]):
            unresolved[urn] = remaining
    if unresolved:
        queued = await _queue_statuses(request.app.state.settings, request.app.state.value_codec, unresolved,
                                       trace_id, trace_ms, detailed)
        for urn, aspects in unresolved.items():
            # Neither pending nor failed on the topics: the consumer may have applied the write since the rows were
            # read (a busy consumer does so while the topic is read), so they are asked again before UNKNOWN.
            for aspect in await look_up(urn, [a for a in aspects if (urn, a) not in queued]):
                primary[urn][aspect] = _status("HISTORIC_STATE" if (urn, aspect) in replaced else "UNKNOWN")
            for aspect in aspects:
                if (urn, aspect) in queued:
                    primary[urn][aspect] = queued[urn, aspect]
    out: dict[str, dict[str, Any]] = {}
    for urn, statuses in primary.items():
        search = await _search_statuses(session, registry, backend, urn, statuses, versions)
        answered = {}
        for aspect in wanted[urn]:
            status = {"success": "ERROR" not in (statuses[aspect]["writeStatus"], search[aspect]["writeStatus"]),
                      "primaryStorage": statuses[aspect], "searchStorage": search[aspect]}
            if not onlyIncludeErrors or not status["success"]:
                answered[aspect] = status
        if answered:
            out[urn] = answered
    return out


def _checked(registry: EntityRegistry, body: dict[str, list[str]]) -> dict[str, list[str]]:
    """The URNs and aspect names asked for, each checked against the registry (400 naming the bad one)."""
    wanted: dict[str, list[str]] = {}
    for urn, aspects in body.items():
        entity = entity_of_urn(registry, urn, path=f"$[{urn!r}]")
        for i, aspect in enumerate(aspects):
            with invalid_at(f"$[{urn!r}][{i}]", urn=urn, aspect=aspect):
                registry.aspect(entity, aspect)
        wanted[urn] = list(dict.fromkeys(aspects))
    return wanted


class TraceHistory(SessionRepository):
    async def traced(self, urn: str, aspects: list[str], trace_id: str) -> set[str]:
        """The aspects of `urn` among `aspects` with an older version written by the trace (the history rows of one
        entity's aspects: a range of the primary key)."""
        if not aspects:
            return set()
        conn = await self._conn()
        rows = await conn.fetch(
            """
            SELECT DISTINCT aspect FROM metadata_aspect_v2
            WHERE urn = $1 AND aspect = ANY($2::text[]) AND version > 0
              AND systemmetadata::jsonb -> 'properties' ->> $4 = $3
            """,
            urn, aspects, trace_id, TELEMETRY_TRACE_KEY,
        )
        return {r["aspect"] for r in rows}


async def _search_statuses(session, registry: EntityRegistry, backend, urn: str, primary: dict[str, dict],
                           versions: dict[tuple[str, str], int]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    active = [a for a, s in primary.items() if s["writeStatus"] == "ACTIVE_STATE"]
    indexed = await backend.document_versions(urn) if active else {}
    failing = await FailureReader(session).of_urn(urn) if active else {}
    used = _indexed_aspects(registry, entity_of_urn(registry, urn)) if active else None
    for aspect, status in primary.items():
        write_status = status["writeStatus"]
        if write_status == "ACTIVE_STATE":
            version = versions[urn, aspect]
            in_index, failure = indexed.get(aspect), failing.get(aspect)
            if in_index is not None and int(in_index) >= version:
                out[aspect] = _status("ACTIVE_STATE")
            elif failure is not None and failure["version"] >= version:
                out[aspect] = _status("ERROR", f"the search backend refused version {failure['version']} "
                                               f"({failure['attempts']} attempts; next retry "
                                               f"{failure['next_retry_at'].isoformat()}): {failure['reason']}")
            elif in_index is None and used is not None and aspect not in used:
                out[aspect] = _status("NO_OP")
            else:
                out[aspect] = _status("PENDING", "Pending search index update.")
        elif write_status == "PENDING":
            out[aspect] = _status("PENDING", "Pending primary storage write.")
        elif write_status == "NO_OP":
            out[aspect] = _status("TRACE_NOT_IMPLEMENTED" if registry.aspect_spec(aspect).is_timeseries else "NO_OP")
        elif write_status == "HISTORIC_STATE":
            out[aspect] = _status("HISTORIC_STATE")
        elif write_status == "ERROR":
            out[aspect] = _status("ERROR", "Primary storage write failed.")
        else:
            out[aspect] = _status("UNKNOWN", "Primary storage write indeterminate.")
    return out


# --- asynchronous writes: the MCP topic and its failure topic ------------------------------------------------------


async def _queue_statuses(
    settings: Settings, codec: ValueCodec, wanted: dict[str, list[str]], trace_id: str, trace_ms: int | None,
    detailed: bool,
) -> dict[tuple[str, str], dict]:
    """(urn, aspect) → PENDING (on the MCP topic, not yet consumed) or ERROR (on the failure topic), for the trace's
    records written since its time. Nothing without Kafka (writes are then applied before their answer)."""
    if not settings.kafka_bootstrap_servers:
        return {}
    since_ms = trace_ms if trace_ms is not None else int(time.time() * 1000) - UNTIMED_TRACE_LOOKBACK_MS
    keys = {urn.encode() for urn in wanted}
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap_servers, client_id=f"{settings.kafka_client_id}-trace",
        group_id=None, enable_auto_commit=False, fetch_max_wait_ms=10,
        request_timeout_ms=int(QUEUE_READ_TIMEOUT_S * 1000),
    )
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers,
                                client_id=f"{settings.kafka_client_id}-trace-admin",
                                request_timeout_ms=int(QUEUE_READ_TIMEOUT_S * 1000))
    out: dict[tuple[str, str], dict] = {}
    await admin.start()
    await consumer.start()
    try:
        queued = await _matching(consumer, admin, codec, settings.topic_mcp, since_ms, keys, wanted, trace_id, lambda v: v)
        if queued:
            tps = list({tp for tp, _, _ in queued.values()})
            offsets = await admin.list_consumer_group_offsets(settings.mcp_consumer_group, partitions=tps)
            # the group's committed offsets: the next record it will read
            committed = {tp: meta.offset for tp, meta in offsets.items() if meta is not None and meta.offset >= 0}
            for pair, (tp, offset, _) in queued.items():
                if offset >= committed.get(tp, 0):
                    out[pair] = _status("PENDING", "Consumer has not processed offset.")
        failed = await _matching(consumer, admin, codec, settings.topic_fmcp, since_ms, keys, wanted, trace_id,
                                 lambda v: v.get("metadataChangeProposal"))
        for pair, (_, _, value) in failed.items():
            if pair not in out:
                out[pair] = _status("ERROR", None, _exceptions(value.get("error")) if detailed else None)
    finally:
        await consumer.stop()
        await admin.close()
    return out


async def _matching(consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient, codec: ValueCodec, topic: str, since_ms: int, keys: set[bytes],
                    wanted: dict[str, list[str]], trace_id: str, mcp_of) -> dict[tuple[str, str], tuple]:
    """The topic's records of the trace for the wanted aspects, from `since_ms` until the topic is read to its end
    (past its end offset as it was, and a fetch brought nothing more): (urn, aspect) → (partition, offset, value) of
    the last one."""
    described = await admin.describe_topics([topic])
    tps = [TopicPartition(topic, p["partition"]) for t in described if t.get("error_code") == 0 for p in t["partitions"]]
    if not tps:
        return {}
    consumer.assign(tps)
    starts = await consumer.offsets_for_times({tp: since_ms for tp in tps})
    ends = await consumer.end_offsets(tps)
    todo = []
    for tp in tps:
        if starts.get(tp) is not None:
            consumer.seek(tp, starts[tp].offset)
            todo.append(tp)
    found: dict[tuple[str, str], tuple] = {}
    deadline = time.monotonic() + QUEUE_READ_TIMEOUT_S
    while todo:
        if time.monotonic() > deadline:
            log.warning("trace: topic not read to its end in time", extra={"topic": topic, "trace_id": trace_id})
            break
        batches = await consumer.getmany(*todo, timeout_ms=FETCH_WAIT_MS, max_records=1000)
        if not batches and all([await consumer.position(tp) >= ends[tp] for tp in todo]):
            break
        for tp, records in batches.items():
            for record in records:
                if record.key in keys:
                    _match(codec, record, tp, wanted, trace_id, mcp_of, found)
    return found


def _match(codec: ValueCodec, record, tp: TopicPartition, wanted: dict[str, list[str]], trace_id: str, mcp_of,
           found: dict) -> None:
    try:
        value, _ = codec.decode_known(record.value)
    except Exception:  # noqa: BLE001 - a record of another writer's schema: not one of ours
        return
    mcp = mcp_of(value)
    if not isinstance(mcp, dict):
        return
    system_metadata = mcp.get("systemMetadata")
    if isinstance(system_metadata, str):  # the JSON wire form of a dead letter may keep it as text
        try:
            system_metadata = orjson.loads(system_metadata)
        except orjson.JSONDecodeError:
            return
    urn, aspect = mcp.get("entityUrn"), mcp.get("aspectName")
    if trace_id_in(system_metadata) == trace_id and aspect in wanted.get(urn, ()):
        found[urn, aspect] = (tp, record.offset, value)


def _exceptions(error: Any) -> list[dict]:
    """A dead letter's `error` (a JSON array of TraceException, app.kafka.consumers.dead_letters) as DataHub's
    writeExceptions: message, exceptionClass, stackTrace, cause."""
    try:
        parsed = orjson.loads(error) if isinstance(error, (str, bytes)) else error
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, list):
        return [{"message": str(error) if error else "Unable to extract trace exception"}]

    def one(e: Any) -> dict:
        if not isinstance(e, dict):
            return {"message": str(e)}
        out = {k: e[k] for k in ("message", "exceptionClass", "stackTrace") if e.get(k) is not None}
        if isinstance(e.get("cause"), dict):
            out["cause"] = one(e["cause"])
        return out

    return [one(e) for e in parsed]
