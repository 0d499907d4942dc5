"""Asynchronous ingestion consumers: proposals (MCP) and legacy events (MCE) from Kafka → the write pipeline.

One loop, for both:

1. `getmany` up to `mcp_consumer_batch_size` records (consumer group, earliest offsets, manual commits);
2. each record is parsed and prepared on its own (`WriteService.prepare`: registry, schema, URN, proposal rules);
   a record that is not JSON, not an MCP/MCE, or invalid becomes a dead letter;
3. the good records are applied in ONE transaction, with DataHub's system actor. If that fails with a client error
   (a precondition, an existence conflict, a patch that does not apply, a too-large aspect...), the first failing
   record is dead-lettered, the records before it are committed together and the rest is tried again (after a few
   rounds, one by one): only the failing records are dead-lettered, everything else commits, in record order;
4. dead letters are produced to the failure topic (`FailedMetadataChangeProposal_v1` / `FailedMetadataChangeEvent_v4`),
   keyed by URN, and logged with urn, aspect and run id; then the offsets are committed.

A database outage (503, connection errors) is never dead-lettered: the batch is retried with backoff (partitions
paused, the group membership kept alive) and nothing is committed until it went through. Delivery is at least
once: a crash between the write and the offset commit re-applies the batch (UPSERTs are then no-ops).

Dead-letter records (JSON):

    {"metadataChangeProposal": <the MCP as received: an object, or the raw text when it was not JSON>,
     "error": "<JSON array of TraceException: [{message, exceptionClass, stackTrace, cause, status, body}]>",
     "source": {"topic", "partition", "offset", "timestamp"}}

`body` is metaledger's error body (`{"error", "message", "issues": [...]}`), `status` its HTTP status. MCE dead
letters carry `metadataChangeEvent` instead of `metadataChangeProposal`.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from dataclasses import dataclass, field
from typing import Any, ClassVar

import asyncpg
import orjson
import sqlalchemy.exc
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.errors import Issue, MetaledgerError, ServiceUnavailable, ValidationFailed
from app.kafka.proposals import RECORD_OVERHEAD, make_producer
from app.proposals.mce import relocate_issues, unbundle_mce
from app.proposals.schemas import parse_proposals
from app.settings import Settings
from app.write.proposal import DEFAULT_RUN_ID, SYSTEM_ACTOR, AuditStamp, Proposal
from app.write.service import Draft, WriteService
from app.workers import pause

log = logging.getLogger("metaledger.kafka.consumers")

# Errors after which a batch is retried (never dead-lettered): the database is down, restarting or overloaded.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    ServiceUnavailable,
    OSError,  # includes ConnectionRefusedError and TimeoutError
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # shutdown, cannot connect now, statement cancelled
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.TimeoutError,  # pool exhausted
)

# After this many "commit the prefix, drop the first failure, retry the rest" rounds in one batch, the rest of the
# batch is applied one record at a time (bounds the work when most of a batch fails).
MAX_ISOLATION_ROUNDS = 8
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0


def is_transient(error: BaseException) -> bool:
    if isinstance(error, TRANSIENT_ERRORS):
        return True
    return isinstance(error, sqlalchemy.exc.DBAPIError) and bool(error.connection_invalidated)


def _class_name(error: BaseException) -> str:
    cls = type(error)
    return f"{cls.__module__}.{cls.__qualname__}"


def trace_exception(error: BaseException, depth: int = 0) -> dict[str, Any]:
    """DataHub's TraceException `{message, exceptionClass, stackTrace, cause}`, plus metaledger's status and error
    body. Client errors carry no stack trace (they are not bugs); unexpected ones do."""
    if isinstance(error, MetaledgerError):
        return {
            "message": error.message,
            "exceptionClass": _class_name(error),
            "stackTrace": [],
            "cause": None,
            "status": error.status_code,
            "body": error.to_json(),
        }
    cause = error.__cause__ or error.__context__
    return {
        "message": str(error) or type(error).__name__,
        "exceptionClass": _class_name(error),
        "stackTrace": [line.rstrip("\n") for line in traceback.format_tb(error.__traceback__)][-20:],
        "cause": trace_exception(cause, depth + 1) if cause is not None and depth < 3 else None,
        "status": 500,
        "body": {"error": "Internal Server Error", "message": str(error) or type(error).__name__, "issues": []},
    }


def _only_issues_of(error: MetaledgerError, indices: set[int]) -> MetaledgerError:
    """The part of a batch error that concerns some items, as an error of the same kind about them alone."""
    return type(error)(error.message, [i for i in error.issues if i.index in indices])


def for_record(error: MetaledgerError) -> MetaledgerError:
    """An error as a record's: no request indices, `$` is the record (not `$[0]`)."""
    issues = [
        Issue(i.message, None, i.urn, i.aspect, i.path.replace("$[0]", "$", 1) if i.path else i.path, i.expected, i.found)
        for i in error.issues
    ]
    if not issues:
        return type(error)(error.message, issues)
    # The issues are the record's: say them, not a batch summary ("1 of 1 proposals are invalid").
    said = dict.fromkeys(i.message + (f" (at {i.path})" if i.path and i.path != "$" else "") for i in issues)
    message = "; ".join(said)
    return type(error)(message if len(message) <= 2000 else message[:1997] + "...", issues)


@dataclass(slots=True, eq=False)
class Unit:
    """One record of a batch and what became of it."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    payload: Any  # the record as received: parsed JSON, or the raw text when it was not JSON
    proposals: list[Proposal] = field(default_factory=list)
    error: BaseException | None = None
    applied: bool = False
    urn: str | None = None
    aspect: str | None = None
    run_id: str | None = None
    event: Any = None  # MCE: the unbundled event (for error paths)


class McpConsumer:
    """MetadataChangeProposal_v1 → the write pipeline in batches; failures → FailedMetadataChangeProposal_v1."""

    kind: ClassVar[str] = "proposal"
    payload_field: ClassVar[str] = "metadataChangeProposal"
    # Group timings: a join takes about half the session timeout on some brokers; heartbeats keep the membership
    # alive while a batch is being written (aiokafka heartbeats from a background task).
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000

    def __init__(
        self,
        settings: Settings,
        sessionmaker: async_sessionmaker[AsyncSession],
        writer: WriteService,
        *,
        group_id: str | None = None,
        session_timeout_ms: int | None = None,
        heartbeat_interval_ms: int | None = None,
    ) -> None:
        self.settings, self.sessionmaker, self.writer = settings, sessionmaker, writer
        self.group_id = group_id or self.default_group()
        if session_timeout_ms is not None:
            self.session_timeout_ms = session_timeout_ms
        if heartbeat_interval_ms is not None:
            self.heartbeat_interval_ms = heartbeat_interval_ms
        self.stats = {"records": 0, "applied": 0, "dead_letters": 0, "batches": 0, "retries": 0}

    # --- what differs between MCP and MCE -----------------------------------------------------------------------
    @property
    def topic(self) -> str:
        return self.settings.topic_mcp

    @property
    def dead_letter_topic(self) -> str:
        return self.settings.topic_fmcp

    def default_group(self) -> str:
        return self.settings.mcp_consumer_group

    def _drafts(self, unit: Unit, first_index: int) -> list[Draft]:
        """The record's drafts (indices from `first_index`); raises MetaledgerError when it is not an MCP."""
        mcp = unit.payload
        if isinstance(mcp, dict):
            unit.urn = mcp.get("entityUrn") if isinstance(mcp.get("entityUrn"), str) else None
            unit.aspect = mcp.get("aspectName") if isinstance(mcp.get("aspectName"), str) else None
            sm = mcp.get("systemMetadata")
            unit.run_id = sm.get("runId") if isinstance(sm, dict) else None
        drafts = parse_proposals([mcp])
        for draft in drafts:
            draft.index = first_index
        return drafts

    def _prepare(self, unit: Unit, drafts: list[Draft]) -> list[Proposal]:
        return self.writer.prepare(drafts)

    # --- the loop ------------------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        consumer = await self._start(stop, self._make_consumer)
        if consumer is None:
            return
        producer = await self._start(stop, lambda: make_producer(self.settings, f"{self.kind}-dead-letters"))
        if producer is None:
            await consumer.stop()
            return
        log.info("consumer started", extra={"topic": self.topic, "group": self.group_id, "dead_letters": self.dead_letter_topic})
        try:
            while not stop.is_set():
                try:
                    batches = await consumer.getmany(timeout_ms=500, max_records=self.settings.mcp_consumer_batch_size)
                except KafkaError as error:
                    log.warning("fetch failed; retrying", extra={"topic": self.topic, "error": repr(error)})
                    await pause(stop, 1.0)
                    continue
                records = [record for tp_records in batches.values() for record in tp_records]
                if records:
                    await self._handle_batch(consumer, producer, records, stop)
        finally:
            await consumer.stop()
            await producer.stop()
            log.info("consumer stopped", extra={"topic": self.topic, "group": self.group_id, **self.stats})

    def _make_consumer(self) -> AIOKafkaConsumer:
        fetch_bytes = self.settings.kafka_max_message_bytes + RECORD_OVERHEAD
        return AIOKafkaConsumer(
            self.topic,
            bootstrap_servers=self.settings.kafka_bootstrap_servers,
            client_id=f"{self.settings.kafka_client_id}-{self.kind}-consumer",
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            max_partition_fetch_bytes=max(fetch_bytes, 1024 * 1024),
            fetch_max_bytes=max(fetch_bytes, 50 * 1024 * 1024),
        )

    async def _start(self, stop: asyncio.Event, make):
        """Start a Kafka client, retrying with backoff while the broker is unreachable; None if stopped first."""
        backoff = BACKOFF_INITIAL_S
        while not stop.is_set():
            client = make()
            try:
                await client.start()
                return client
            except (KafkaError, OSError) as error:
                await client.stop()
                log.warning("Kafka unreachable; retrying", extra={"topic": self.topic, "error": repr(error), "retry_in_s": backoff})
                await pause(stop, backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
        return None

    async def _handle_batch(
        self, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, records: list[Any], stop: asyncio.Event
    ) -> None:
        self.stats["batches"] += 1
        self.stats["records"] += len(records)
        units = self._prepare_units(records)

        # Apply; a database outage pauses the partitions and retries (records already applied are not re-applied).
        backoff = BACKOFF_INITIAL_S
        paused: set[TopicPartition] = set()
        try:
            while True:
                try:
                    await self._apply_units([u for u in units if u.error is None and not u.applied and u.proposals])
                    break
                except Exception as error:
                    if not is_transient(error):
                        raise
                    self.stats["retries"] += 1
                    log.warning(
                        "database unavailable; batch kept and retried (nothing dead-lettered, nothing committed)",
                        extra={"topic": self.topic, "records": len(units), "error": repr(error), "retry_in_s": backoff},
                    )
                    if not paused:
                        paused = set(consumer.assignment())
                        consumer.pause(*paused)
                    if await pause(stop, backoff):
                        return  # stopping: uncommitted, the batch is consumed again after a restart
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                    await _keep_polling(consumer)

            # Dead letters, acknowledged, before the offsets move.
            dead = [u for u in units if u.error is not None]
            if dead and not await self._dead_letter(producer, dead, stop, consumer, paused):
                return
        finally:
            if paused:
                consumer.resume(*[tp for tp in paused if tp in consumer.assignment()])
        self.stats["applied"] += sum(1 for u in units if u.applied)

        offsets: dict[TopicPartition, int] = {}
        for unit in units:
            tp = TopicPartition(unit.topic, unit.partition)
            offsets[tp] = max(offsets.get(tp, -1), unit.offset + 1)
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError, KafkaError) as error:
            # The partitions moved to another member during the batch: it re-reads from the last commit (at least once).
            log.warning("offset commit failed; the batch may be re-applied by the partition's new owner",
                        extra={"topic": self.topic, "offsets": {f"{tp.topic}/{tp.partition}": o for tp, o in offsets.items()},
                               "error": repr(error)})

    def _prepare_units(self, records: list[Any]) -> list[Unit]:
        units: list[Unit] = []
        next_index = 0
        for record in records:
            unit = Unit(record.topic, record.partition, record.offset, record.timestamp, record.key, None)
            units.append(unit)
            raw = record.value
            try:
                if raw is None:
                    raise ValidationFailed("the record has no value", [Issue("empty record", path="$")])
                try:
                    unit.payload = orjson.loads(raw)
                except orjson.JSONDecodeError as error:
                    unit.payload = raw.decode("utf-8", errors="backslashreplace")
                    message = f"the record is not valid JSON: {error}"
                    raise ValidationFailed(message, [Issue(message, path="$")]) from None
                drafts = self._drafts(unit, next_index)
                next_index += len(drafts)
                unit.proposals = self._prepare(unit, drafts)
                if unit.proposals:
                    first = unit.proposals[0]
                    unit.urn, unit.aspect, unit.run_id = first.urn, unit.aspect or first.aspect_name, first.run_id
            except MetaledgerError as error:
                unit.error = for_record(error)
            except Exception as error:  # a bug: still never dropped silently
                log.exception("unexpected error preparing a record", extra={"topic": unit.topic, "offset": unit.offset})
                unit.error = error
        return units

    async def _apply(self, proposals: list[Proposal]) -> None:
        async with self.sessionmaker() as session:
            await self.writer.apply(session, proposals, AuditStamp.now(SYSTEM_ACTOR))

    async def _apply_units(self, units: list[Unit]) -> None:
        """Apply the units' proposals in one transaction; on a client error isolate the failing units (in record
        order) so that only they get an error and everything else commits. Transient errors propagate."""
        remaining = units
        rounds = 0
        while remaining:
            try:
                await self._apply([p for u in remaining for p in u.proposals])
                for unit in remaining:
                    unit.applied = True
                return
            except MetaledgerError as error:
                if is_transient(error):
                    raise
                batch_error: Exception = error
                owner = {p.index: u for u in remaining for p in u.proposals}
                failing_indices = sorted(i.index for i in error.issues if i.index in owner)
            except Exception as error:
                if is_transient(error):
                    raise
                batch_error, failing_indices = error, []
            if len(remaining) == 1:
                self._fail(remaining[0], batch_error)
                return
            rounds += 1
            if not failing_indices or rounds > MAX_ISOLATION_ROUNDS:
                for unit in remaining:
                    await self._apply_units([unit])
                return
            # The first failure is genuine (everything before it applied cleanly in the same transaction); what
            # follows it may have been judged against a state without it, so it is tried again.
            culprit = owner[failing_indices[0]]
            position = remaining.index(culprit)
            if position:
                await self._apply_units(remaining[:position])
            if len({id(owner[i]) for i in failing_indices}) > 1:
                # A batch error has one class for all its issues (e.g. 412 when a precondition and a conflict
                # failed together): the culprit alone gives its own, exact error.
                await self._apply_units([culprit])
            else:
                self._fail(culprit, batch_error)
            remaining = remaining[position + 1:]

    def _fail(self, unit: Unit, error: Exception) -> None:
        if not isinstance(error, MetaledgerError):
            log.error("unexpected error applying a record", exc_info=error,
                      extra={"topic": unit.topic, "offset": unit.offset, "urn": unit.urn, "aspect": unit.aspect})
        if isinstance(error, MetaledgerError):
            mine = {p.index for p in unit.proposals}
            if any(i.index in mine for i in error.issues):
                error = self._relocate(unit, _only_issues_of(error, mine))
            error = for_record(error)
        unit.error = error

    def _relocate(self, unit: Unit, error: MetaledgerError) -> MetaledgerError:
        return error

    async def _dead_letter(
        self, producer: AIOKafkaProducer, dead: list[Unit], stop: asyncio.Event,
        consumer: AIOKafkaConsumer, paused: set[TopicPartition],
    ) -> bool:
        """Produce the dead letters and wait for their acknowledgement, retrying while the broker is away.
        False if stopped before they were all acknowledged (then nothing is committed)."""
        records = []
        limit = self.settings.kafka_max_message_bytes
        for unit in dead:
            assert unit.error is not None
            value = {
                self.payload_field: unit.payload,
                "error": orjson.dumps([trace_exception(unit.error)]).decode(),
                "source": {"topic": unit.topic, "partition": unit.partition, "offset": unit.offset, "timestamp": unit.timestamp},
            }
            encoded = orjson.dumps(value)
            if len(encoded) > limit:
                # Too large for the failure topic (the record itself was at the limit): keep its head; `source`
                # locates the original on the input topic.
                head = orjson.dumps(unit.payload).decode(errors="replace")[: min(limit // 2, 1024 * 1024)]
                value[self.payload_field] = head
                value["payloadTruncated"] = True
                encoded = orjson.dumps(value)
            key = unit.urn.encode() if unit.urn else unit.key
            records.append((key, encoded, unit))
        pending = list(records)
        backoff = BACKOFF_INITIAL_S
        while pending:
            try:
                futures = [await producer.send(self.dead_letter_topic, value, key=key) for key, value, _ in pending]
                outcomes = await asyncio.gather(*futures, return_exceptions=True)
                failed = [(record, outcome) for record, outcome in zip(pending, outcomes) if isinstance(outcome, BaseException)]
                for _, outcome in failed:
                    if not isinstance(outcome, KafkaError):
                        raise outcome
                pending = [record for record, _ in failed]
                if failed:
                    raise failed[0][1]
            except KafkaError as error:
                log.warning("dead letters not acknowledged; retrying",
                            extra={"topic": self.dead_letter_topic, "pending": len(pending), "error": repr(error)})
                if not paused:
                    paused.update(consumer.assignment())
                    consumer.pause(*paused)
                if await pause(stop, backoff):
                    return False
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                await _keep_polling(consumer)
        for _, _, unit in records:
            self.stats["dead_letters"] += 1
            assert unit.error is not None
            log.warning(
                f"{self.kind} dead-lettered",
                extra={
                    "urn": unit.urn, "aspect": unit.aspect, "run_id": unit.run_id or DEFAULT_RUN_ID,
                    "topic": unit.topic, "partition": unit.partition, "offset": unit.offset,
                    "dead_letter_topic": self.dead_letter_topic,
                    "error_class": _class_name(unit.error),
                    "reason": unit.error.message if isinstance(unit.error, MetaledgerError) else str(unit.error),
                },
            )
        return True


async def _keep_polling(consumer: AIOKafkaConsumer) -> None:
    """A poll while the partitions are paused (it returns nothing for them), so that the group does not consider
    this member stuck (`max_poll_interval_ms`) during a long outage."""
    try:
        await consumer.getmany(timeout_ms=0)
    except KafkaError as error:
        log.debug("poll while paused failed", extra={"error": repr(error)})


class MceConsumer(McpConsumer):
    """MetadataChangeEvent_v4 → unbundled MCPs → the write pipeline; failures → FailedMetadataChangeEvent_v4.
    An event is all or nothing: one bad aspect dead-letters the whole event."""

    kind: ClassVar[str] = "event"
    payload_field: ClassVar[str] = "metadataChangeEvent"

    @property
    def topic(self) -> str:
        return self.settings.topic_mce

    @property
    def dead_letter_topic(self) -> str:
        return self.settings.topic_fmce

    def default_group(self) -> str:
        # DataHub's MetadataChangeEventsProcessor group.
        return "mce-consumer-job-client"

    def _drafts(self, unit: Unit, first_index: int) -> list[Draft]:
        mce = unit.payload
        if isinstance(mce, dict):
            sm = mce.get("systemMetadata")
            unit.run_id = sm.get("runId") if isinstance(sm, dict) else None
            snapshot = mce.get("proposedSnapshot")
            if isinstance(snapshot, dict) and len(snapshot) == 1:
                inner = next(iter(snapshot.values()))
                if isinstance(inner, dict) and isinstance(inner.get("urn"), str):
                    unit.urn = inner["urn"]
        event = unbundle_mce(mce, self.writer.registry, first_index=first_index)
        unit.aspect = ",".join(d.aspect_name for d in event.drafts)
        unit.event = event
        return event.drafts

    def _prepare(self, unit: Unit, drafts: list[Draft]) -> list[Proposal]:
        try:
            return self.writer.prepare(drafts)
        except ValidationFailed as error:
            raise self._relocate(unit, error) from None

    def _relocate(self, unit: Unit, error: MetaledgerError) -> MetaledgerError:
        """Paths inside the event (`$.proposedSnapshot[...].aspects[i][...]`) rather than inside an MCP."""
        return relocate_issues(error, unit.event) if unit.event is not None else error
