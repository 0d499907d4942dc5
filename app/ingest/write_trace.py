"""Where the writes of a trace stand (DataHub's TraceServiceImpl): the service behind `POST
/openapi/v1/trace/write/{traceId}` (app.api.trace_write, which documents the protocol) and the MCP tool `trace_write`
(app.mcp.extras). The trace id each write keeps is app.ingest.trace's.

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
`success` is false when either status is ERROR.

A trace asks about at most MAX_BATCH_ITEMS (urn, aspect) pairs (a trace is of one batch's writes, at most as many):
more is a 413 naming the limit, before anything is looked up. The rows are read TRACE_ROUND_PAIRS pairs a round trip
(the values left out), and the session's connection goes back to the pool after each round, before the topics and
the search index are read: a large trace never holds a connection for long.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from sqlalchemy.ext.asyncio import AsyncSession

from app.auth.model import Principal
from app.auth.reads import unreadable_entities
from app.avro.wire import ValueCodec
from app.db import SessionRepository
from app.errors import Issue, PayloadTooLarge, ValidationFailed
from app.ingest.trace import TELEMETRY_TRACE_KEY, trace_id_in, trace_id_of_path, trace_time_ms
from app.registry import EntityRegistry
from app.registry.errors import RegistryError
from app.search.documents import indexed_aspects
from app.search.model import SearchBackend
from app.settings import Settings
from app.urns import InvalidUrnError, entity_type_of
from app.write.repository import AspectRepository, StoredAspect

log = logging.getLogger("metaledger.trace")

WriteStatus = Literal["ERROR", "PENDING", "ACTIVE_STATE", "HISTORIC_STATE", "NO_OP", "UNKNOWN", "TRACE_NOT_IMPLEMENTED"]
QUEUE_READ_TIMEOUT_S = 10.0
FETCH_WAIT_MS = 200
UNTIMED_TRACE_LOOKBACK_MS = 86_400_000  # a trace id without a time (an external tracer's): the topics' last day
# The (urn, aspect) pairs (the URNs, for the index failures) asked of the database per round: a round's queries take a
# few milliseconds, and the request's connection goes back to the pool after each (a large trace never holds one long)
TRACE_ROUND_PAIRS = 1000


def _status(write_status: WriteStatus, message: str | None = None, exceptions: list[dict] | None = None) -> dict:
    out: dict[str, Any] = {"writeStatus": write_status}
    if message is not None:
        out["writeMessage"] = message
    if exceptions is not None:
        out["writeExceptions"] = exceptions
    return out


async def trace_writes(
    session: AsyncSession,
    registry: EntityRegistry,
    backend: SearchBackend,
    caller: Principal,
    settings: Settings,
    codec: ValueCodec,
    aspects: dict[str, list[str]],
    raw_trace_id: str,
    *,
    only_include_errors: bool = True,
    detailed: bool = False,
    trace_id_path: str = "$traceId",
    aspects_path: str = "$",
) -> dict[str, dict[str, Any]]:
    """urn → aspect → `{success, primaryStorage, searchStorage}` for the aspects asked of the trace
    (`raw_trace_id`: 32 hex digits or a whole traceparent), as `caller` may read them (an entity it may not read is
    UNKNOWN); only those with an ERROR when `only_include_errors`. `detailed` adds the MCP consumer's reasons of a
    refused asynchronous write. The paths name the trace id and the aspects in the caller's request (400s)."""
    trace_id = trace_id_of_path(raw_trace_id)
    if trace_id is None:
        raise ValidationFailed(
            f"{raw_trace_id!r} is not a trace id (32 hex digits) nor a traceparent",
            [Issue("not a trace id", path=trace_id_path, found=raw_trace_id[:80])],
        )
    wanted = checked_aspects(registry, aspects, settings, aspects_path)
    primary: dict[str, dict[str, dict]] = {
        urn: {a: _status("NO_OP") for a in aspects if registry.aspect_spec(a).is_timeseries}
        for urn, aspects in wanted.items()
    }
    for urn in await unreadable_entities(caller, list(wanted), AspectRepository(session)):  # the read rule: absent
        primary[urn] = {a: _status("UNKNOWN") for a in wanted[urn]}
    versions: dict[tuple[str, str], int] = {}
    replaced: set[tuple[str, str]] = set()
    trace_ms = trace_time_ms(trace_id)

    async def look_up(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Settles what the rows tell about `pairs` (ACTIVE_STATE, HISTORIC_STATE, or replaced by a later write), in
        rounds of TRACE_ROUND_PAIRS pairs: two queries each, then the session's connection goes back to the pool.
        Returns the pairs the rows tell nothing about."""
        untold: list[tuple[str, str]] = []
        for start in range(0, len(pairs), TRACE_ROUND_PAIRS):
            chunk = pairs[start : start + TRACE_ROUND_PAIRS]
            rows = TraceRows(session)
            latest = await rows.latest(chunk)
            remaining = []
            for pair in chunk:
                row = latest.get(pair)
                if row is not None and trace_id_in(row.system_metadata) == trace_id:
                    primary[pair[0]][pair[1]] = _status("ACTIVE_STATE")
                    versions[pair] = row.version
                    continue
                if row is not None:
                    later = trace_time_ms(trace_id_in(row.system_metadata))
                    if trace_ms is not None and later is not None and later >= trace_ms:
                        replaced.add(pair)
                remaining.append(pair)
            historic = await rows.traced(remaining, trace_id)
            await session.close()
            for pair in remaining:
                if pair in historic:
                    primary[pair[0]][pair[1]] = _status("HISTORIC_STATE")
                else:
                    untold.append(pair)
        return untold

    unresolved = await look_up([(urn, a) for urn, aspects in wanted.items() for a in aspects if a not in primary[urn]])
    if unresolved and settings.kafka_bootstrap_servers:  # without Kafka every write was applied before its answer
        by_urn: dict[str, list[str]] = {}
        for urn, aspect in unresolved:
            by_urn.setdefault(urn, []).append(aspect)
        queued = await _queue_statuses(settings, codec, by_urn, trace_id, trace_ms, detailed)
        # Neither pending nor failed on the topics: the consumer may have applied the write since the rows were read
        # (a busy consumer does so while the topic is read), so they are asked again before UNKNOWN.
        for urn, aspect in await look_up([p for p in unresolved if p not in queued]):
            primary[urn][aspect] = _status("HISTORIC_STATE" if (urn, aspect) in replaced else "UNKNOWN")
        for pair, status in queued.items():
            primary[pair[0]][pair[1]] = status
    else:
        for urn, aspect in unresolved:
            primary[urn][aspect] = _status("HISTORIC_STATE" if (urn, aspect) in replaced else "UNKNOWN")
    failing = await _index_failures(session, sorted({urn for urn, _ in versions}), TRACE_ROUND_PAIRS)
    out: dict[str, dict[str, Any]] = {}
    for urn, statuses in primary.items():
        search = await _search_statuses(registry, backend, urn, statuses, versions, failing.get(urn, {}))
        answered = {}
        for aspect in wanted[urn]:
            status = {
                "success": "ERROR" not in (statuses[aspect]["writeStatus"], search[aspect]["writeStatus"]),
                "primaryStorage": statuses[aspect],
                "searchStorage": search[aspect],
            }
            if not only_include_errors or not status["success"]:
                answered[aspect] = status
        if answered:
            out[urn] = answered
    return out


def checked_aspects(
    registry: EntityRegistry, body: dict[str, list[str]], settings: Settings, path: str = "$"
) -> dict[str, list[str]]:
    """The URNs and aspect names asked for (at `path` of the request), each checked against the registry (400 naming
    the bad one). First, how many: more (urn, aspect) pairs than MAX_BATCH_ITEMS (a URN asked with none counts as
    one) is a 413 naming the limit, before anything is looked at or looked up (a trace asks about the writes of one
    batch, at most as many)."""
    count = sum(len(aspects) or 1 for aspects in body.values())
    if count > settings.max_batch_items:
        limit = settings.max_batch_items
        raise PayloadTooLarge(
            f"the batch at {path} has {count} aspects to trace; the limit is {limit} (METALEDGER_MAX_BATCH_ITEMS): "
            "send it in smaller batches",
            [Issue("too many aspects to trace", path=path, expected=f"at most {limit} aspects to trace",
                   found=f"{count} aspects to trace")],
        )  # fmt: skip
    wanted: dict[str, list[str]] = {}
    for urn, aspects in body.items():
        with _invalid_at(f"{path}[{urn!r}]", urn, None):
            entity = registry.entity(entity_type_of(urn)).name
        for i, aspect in enumerate(aspects):
            with _invalid_at(f"{path}[{urn!r}][{i}]", urn, aspect):
                registry.aspect(entity, aspect)
        wanted[urn] = list(dict.fromkeys(aspects))
    return wanted


@contextmanager
def _invalid_at(path: str, urn: str, aspect: str | None) -> Iterator[None]:
    """A malformed URN, an unknown entity type or aspect the request names: a 400 naming `path`."""
    try:
        yield
    except (RegistryError, InvalidUrnError) as error:
        raise ValidationFailed(str(error), [Issue(str(error), urn=urn, aspect=aspect, path=path)]) from None


class TraceRows(SessionRepository):
    """The trace API's reads of the primary storage, many (urn, aspect) pairs a round trip: each pair's lookup a range
    of the primary key (a LATERAL lookup per pair, an index lookup whatever the statistics say), without the aspects'
    values (only the system metadata tells the trace)."""

    async def latest(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], StoredAspect]:
        """Row 0 of each pair, without its value."""
        if not pairs:
            return {}
        conn = await self._conn()
        rows = await conn.fetch(
            """
            SELECT k.urn, k.aspect, m.version, m.systemmetadata, m.createdon, m.createdby
            FROM unnest($1::text[], $2::text[]) AS k(urn, aspect)
            CROSS JOIN LATERAL (
                SELECT version, systemmetadata, createdon, createdby FROM metadata_aspect_v2 m
                WHERE m.urn = k.urn AND m.aspect = k.aspect AND m.version = 0 OFFSET 0
            ) m
            """,
            [p[0] for p in pairs],
            [p[1] for p in pairs],
        )
        return {
            (r["urn"], r["aspect"]): StoredAspect(
                r["urn"], r["aspect"], "", r["systemmetadata"], r["createdon"], r["createdby"], row_version=r["version"]
            )
            for r in rows
        }

    async def traced(self, pairs: list[tuple[str, str]], trace_id: str) -> set[tuple[str, str]]:
        """The pairs with an older version written by the trace (each pair's history rows)."""
        if not pairs:
            return set()
        conn = await self._conn()
        rows = await conn.fetch(
            """
            SELECT k.urn, k.aspect FROM unnest($1::text[], $2::text[]) AS k(urn, aspect)
            WHERE EXISTS (
                SELECT 1 FROM metadata_aspect_v2 m
                WHERE m.urn = k.urn AND m.aspect = k.aspect AND m.version > 0
                  AND m.systemmetadata::jsonb -> 'properties' ->> $4 = $3
            )
            """,
            [p[0] for p in pairs],
            [p[1] for p in pairs],
            trace_id,
            TELEMETRY_TRACE_KEY,
        )
        return {(r["urn"], r["aspect"]) for r in rows}

    async def failures(self, urns: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
        """urn -> aspect -> its newest version the search backend refused (app.search.failures): version, reason,
        attempts, next retry."""
        if not urns:
            return {}
        conn = await self._conn()
        rows = await conn.fetch(
            """
            SELECT DISTINCT ON (urn, aspect) urn, aspect, version, reason, attempts, next_retry_at
            FROM search_index_failure WHERE urn = ANY($1::text[])
            ORDER BY urn, aspect, version DESC
            """,
            urns,
        )
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for r in rows:
            out.setdefault(r["urn"], {})[r["aspect"]] = dict(r)
        return out


async def _index_failures(
    session: AsyncSession, urns: list[str], round_pairs: int
) -> dict[str, dict[str, dict[str, Any]]]:
    """The search index's failures of `urns`, in rounds of `round_pairs` URNs, the connection given back after
    each."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for start in range(0, len(urns), round_pairs):
        out.update(await TraceRows(session).failures(urns[start : start + round_pairs]))
        await session.close()
    return out


async def _search_statuses(
    registry: EntityRegistry,
    backend,
    urn: str,
    primary: dict[str, dict],
    versions: dict[tuple[str, str], int],
    failing: dict[str, dict],
) -> dict[str, dict]:
    """The search storage's status of each aspect of `urn` (`failing`: its index failures, read beforehand)."""
    out: dict[str, dict] = {}
    active = [a for a, s in primary.items() if s["writeStatus"] == "ACTIVE_STATE"]
    indexed = await backend.document_versions(urn) if active else {}
    used = indexed_aspects(registry, registry.entity(entity_type_of(urn)).name)[0] if active else None
    for aspect, status in primary.items():
        write_status = status["writeStatus"]
        if write_status == "ACTIVE_STATE":
            version = versions[urn, aspect]
            in_index, failure = indexed.get(aspect), failing.get(aspect)
            if in_index is not None and int(in_index) >= version:
                out[aspect] = _status("ACTIVE_STATE")
            elif failure is not None and failure["version"] >= version:
                out[aspect] = _status(
                    "ERROR",
                    f"the search backend refused version {failure['version']} "
                    f"({failure['attempts']} attempts; next retry "
                    f"{failure['next_retry_at'].isoformat()}): {failure['reason']}",
                )
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
    settings: Settings,
    codec: ValueCodec,
    wanted: dict[str, list[str]],
    trace_id: str,
    trace_ms: int | None,
    detailed: bool,
) -> dict[tuple[str, str], dict]:
    """(urn, aspect) → PENDING (on the MCP topic, not yet consumed) or ERROR (on the failure topic), for the trace's
    records written since its time. Nothing without Kafka (writes are then applied before their answer)."""
    if not settings.kafka_bootstrap_servers:
        return {}
    since_ms = trace_ms if trace_ms is not None else int(time.time() * 1000) - UNTIMED_TRACE_LOOKBACK_MS
    keys = {urn.encode() for urn in wanted}
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        client_id=f"{settings.kafka_client_id}-trace",
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=10,
        request_timeout_ms=int(QUEUE_READ_TIMEOUT_S * 1000),
    )
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        client_id=f"{settings.kafka_client_id}-trace-admin",
        request_timeout_ms=int(QUEUE_READ_TIMEOUT_S * 1000),
    )
    out: dict[tuple[str, str], dict] = {}
    await admin.start()
    await consumer.start()
    try:
        queued = await _matching(
            consumer, admin, codec, settings.topic_mcp, since_ms, keys, wanted, trace_id, lambda v: v
        )
        if queued:
            tps = list({tp for tp, _, _ in queued.values()})
            offsets = await admin.list_consumer_group_offsets(settings.mcp_consumer_group, partitions=tps)
            # the group's committed offsets: the next record it will read
            committed = {tp: meta.offset for tp, meta in offsets.items() if meta is not None and meta.offset >= 0}
            for pair, (tp, offset, _) in queued.items():
                if offset >= committed.get(tp, 0):
                    out[pair] = _status("PENDING", "Consumer has not processed offset.")
        failed = await _matching(
            consumer,
            admin,
            codec,
            settings.topic_fmcp,
            since_ms,
            keys,
            wanted,
            trace_id,
            lambda v: v.get("metadataChangeProposal"),
        )
        for pair, (_, _, value) in failed.items():
            if pair not in out:
                out[pair] = _status("ERROR", None, _exceptions(value.get("error")) if detailed else None)
    finally:
        await consumer.stop()
        await admin.close()
    return out


async def _matching(
    consumer: AIOKafkaConsumer,
    admin: AIOKafkaAdminClient,
    codec: ValueCodec,
    topic: str,
    since_ms: int,
    keys: set[bytes],
    wanted: dict[str, list[str]],
    trace_id: str,
    mcp_of,
) -> dict[tuple[str, str], tuple]:
    """The topic's records of the trace for the wanted aspects, from `since_ms` until the topic is read to its end
    (past its end offset as it was, and a fetch brought nothing more): (urn, aspect) → (partition, offset, value) of
    the last one."""
    described = await admin.describe_topics([topic])
    tps = [
        TopicPartition(topic, p["partition"]) for t in described if t.get("error_code") == 0 for p in t["partitions"]
    ]
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


def _match(
    codec: ValueCodec, record, tp: TopicPartition, wanted: dict[str, list[str]], trace_id: str, mcp_of, found: dict
) -> None:
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
    if not isinstance(urn, str):  # no entity URN (or not a string one): not a write this trace asked about
        return
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
