"""The consumer loop: Kafka clients, batches, partitions and offsets. What a batch's records become is the other
modules' (records: reading; isolation: applying; dead_letters: the failures)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.audit.model import attribute
from app.avro.wire import ValueCodec
from app.ingest.gateway import IngestGateway
from app.kafka.consumers.dead_letters import DeadLetterWriter
from app.kafka.consumers.isolation import IsolatingWriter, is_transient
from app.kafka.consumers.records import MCE, MCP, RecordFormat, Unit, read_batch
from app.kafka.producer import RECORD_OVERHEAD, make_producer
from app.ops.metrics import record_consumer_lag
from app.settings import Settings
from app.workers import pause

log = logging.getLogger("metaledger.kafka.consumers")

BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 30.0

Client = TypeVar("Client", AIOKafkaConsumer, AIOKafkaProducer)


class Consumer:
    """One topic's records (as `format` reads them) → the ingest gateway in batches; failures → dead letters."""

    # Group timings: a join takes about half the session timeout on some brokers; heartbeats keep the membership
    # alive while a batch is being written (aiokafka heartbeats from a background task).
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000

    def __init__(
        self,
        record_format: RecordFormat,
        settings: Settings,
        sessionmaker: async_sessionmaker[AsyncSession],
        gateway: IngestGateway,
        *,
        group_id: str | None = None,
        session_timeout_ms: int | None = None,
        heartbeat_interval_ms: int | None = None,
        codec: ValueCodec | None = None,
    ) -> None:
        self.format, self.settings, self.gateway = record_format, settings, gateway
        # The process's codec (main/background/cli build one); without one, DataHub's fixed ids and no registry.
        self.codec = codec or ValueCodec(settings)
        self.topic = record_format.topic(settings)
        self.topics = [self.topic]  # what the consumer subscribes to (the per-aspect consumer: every routed pair's)
        self.group_id = group_id or record_format.default_group(settings)
        if session_timeout_ms is not None:
            self.session_timeout_ms = session_timeout_ms
        if heartbeat_interval_ms is not None:
            self.heartbeat_interval_ms = heartbeat_interval_ms
        self.writer = IsolatingWriter(sessionmaker, gateway)
        self.dead_letters = DeadLetterWriter(settings, record_format, self.codec)
        self.stats = {"records": 0, "applied": 0, "dead_letters": 0, "batches": 0, "retries": 0}

    # --- a batch's steps (also what the tests drive without Kafka) --------------------------------------------------
    async def read(self, records: list[Any]) -> list[Unit]:
        """The records as units: decoded and prepared, or with their error. ServiceUnavailable when a writer schema
        is needed from a registry that cannot answer."""
        return await read_batch(records, self.format, self.gateway, self.codec)

    async def commit(self, units: list[Unit]) -> None:
        """The units applied in one transaction, the failing ones isolated; transient errors propagate."""
        await self.writer.commit(units)

    # --- the loop --------------------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        attribute(None, "kafka")  # the audit log's surface of what this task writes
        consumer = await self._start(stop, self._make_consumer)
        if consumer is None:
            return
        producer = await self._start(stop, lambda: make_producer(self.settings, f"{self.format.kind}-dead-letters"))
        if producer is None:
            await consumer.stop()
            return
        log.info(
            "consumer started",
            extra={"topic": self.topic, "group": self.group_id, "dead_letters": self.dead_letters.topic},
        )
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
                    record_consumer_lag(consumer, batches)
        finally:
            await consumer.stop()
            await producer.stop()
            log.info("consumer stopped", extra={"topic": self.topic, "group": self.group_id, **self.stats})

    def _make_consumer(self) -> AIOKafkaConsumer:
        fetch_bytes = self.settings.kafka_max_message_bytes + RECORD_OVERHEAD
        return AIOKafkaConsumer(
            *self.topics,
            bootstrap_servers=self.settings.kafka_bootstrap_servers,
            client_id=f"{self.settings.kafka_client_id}-{self.format.kind}-consumer",
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            max_partition_fetch_bytes=max(fetch_bytes, 1024 * 1024),
            fetch_max_bytes=max(fetch_bytes, 50 * 1024 * 1024),
        )

    async def _start(self, stop: asyncio.Event, make: Callable[[], Client]) -> Client | None:
        """Start a Kafka client, retrying with backoff while the broker is unreachable; None if stopped first."""
        backoff = BACKOFF_INITIAL_S
        while not stop.is_set():
            client = make()
            try:
                await client.start()
                return client
            except (KafkaError, OSError) as error:
                await client.stop()
                log.warning(
                    "Kafka unreachable; retrying",
                    extra={"topic": self.topic, "error": repr(error), "retry_in_s": backoff},
                )
                await pause(stop, backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
        return None

    async def _handle_batch(
        self, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, records: list[Any], stop: asyncio.Event
    ) -> None:
        self.stats["batches"] += 1
        self.stats["records"] += len(records)
        paused: set[TopicPartition] = set()
        try:
            # Read; a schema registry that cannot be reached holds the batch, like a database outage.
            wait = _Hold(consumer, stop, paused)
            while True:
                try:
                    units = await self.read(records)
                    break
                except Exception as error:
                    if not is_transient(error):
                        raise
                    self.stats["retries"] += 1
                    log.warning(
                        "schema registry unavailable; batch kept and read again",
                        extra={
                            "topic": self.topic,
                            "records": len(records),
                            "error": repr(error),
                            "retry_in_s": wait.delay,
                        },
                    )
                    if not await wait():
                        return

            # Apply; a database outage holds the batch and retries (records already applied are not re-applied).
            wait = _Hold(consumer, stop, paused)
            while True:
                try:
                    await self.commit([u for u in units if u.error is None and not u.applied and u.proposals])
                    break
                except Exception as error:
                    if not is_transient(error):
                        raise
                    self.stats["retries"] += 1
                    log.warning(
                        "database unavailable; batch kept and retried (nothing dead-lettered, nothing committed)",
                        extra={
                            "topic": self.topic,
                            "records": len(units),
                            "error": repr(error),
                            "retry_in_s": wait.delay,
                        },
                    )
                    if not await wait():
                        return  # stopping: uncommitted, the batch is consumed again after a restart

            # Dead letters, acknowledged, before the offsets move.
            dead = [u for u in units if u.error is not None]
            if dead and not await self.dead_letters.send(producer, dead, _Hold(consumer, stop, paused)):
                return
            self.stats["dead_letters"] += len(dead)
        finally:
            if paused:
                consumer.resume(*[tp for tp in paused if tp in consumer.assignment()])
        self.stats["applied"] += sum(1 for u in units if u.applied)
        await self._commit(consumer, units)

    async def _commit(self, consumer: AIOKafkaConsumer, units: list[Unit]) -> None:
        offsets: dict[TopicPartition, int] = {}
        for unit in units:
            tp = TopicPartition(unit.topic, unit.partition)
            offsets[tp] = max(offsets.get(tp, -1), unit.offset + 1)
        try:
            await consumer.commit(offsets)
        except (CommitFailedError, IllegalStateError, KafkaError) as error:
            # The partitions moved to another member during the batch: it re-reads from the last commit (at least once).
            log.warning(
                "offset commit failed; the batch may be re-applied by the partition's new owner",
                extra={
                    "topic": self.topic,
                    "offsets": {f"{tp.topic}/{tp.partition}": o for tp, o in offsets.items()},
                    "error": repr(error),
                },
            )


class _Hold:
    """A batch waiting for the database or the broker to come back: the first wait pauses the consumer's partitions
    (into `paused`, which the batch resumes), each wait is twice as long as the one before (up to BACKOFF_MAX_S), and
    after each a poll keeps the group membership alive. Calling it waits; False when the consumer is stopping."""

    def __init__(self, consumer: AIOKafkaConsumer, stop: asyncio.Event, paused: set[TopicPartition]) -> None:
        self.consumer, self.stop, self.paused = consumer, stop, paused
        self.delay = BACKOFF_INITIAL_S

    async def __call__(self) -> bool:
        if not self.paused:
            self.paused.update(self.consumer.assignment())
            self.consumer.pause(*self.paused)
        if await pause(self.stop, self.delay):
            return False
        self.delay = min(self.delay * 2, BACKOFF_MAX_S)
        await _keep_polling(self.consumer)
        return True


async def _keep_polling(consumer: AIOKafkaConsumer) -> None:
    """A poll while the partitions are paused (it returns nothing for them), so that the group does not consider
    this member stuck (`max_poll_interval_ms`) during a long outage."""
    try:
        await consumer.getmany(timeout_ms=0)
    except KafkaError as error:
        log.debug("poll while paused failed", extra={"error": repr(error)})


class McpConsumer(Consumer):
    """MetadataChangeProposal_v1 → the ingest gateway in batches; failures → FailedMetadataChangeProposal_v1."""

    def __init__(
        self,
        settings: Settings,
        sessionmaker: async_sessionmaker[AsyncSession],
        gateway: IngestGateway,
        *,
        group_id: str | None = None,
        session_timeout_ms: int | None = None,
        heartbeat_interval_ms: int | None = None,
        codec: ValueCodec | None = None,
    ) -> None:
        super().__init__(
            MCP,
            settings,
            sessionmaker,
            gateway,
            group_id=group_id,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            codec=codec,
        )


class MceConsumer(Consumer):
    """MetadataChangeEvent_v4 → unbundled MCPs → the ingest gateway; failures → FailedMetadataChangeEvent_v4.
    An event is all or nothing: one bad aspect dead-letters the whole event."""

    def __init__(
        self,
        settings: Settings,
        sessionmaker: async_sessionmaker[AsyncSession],
        gateway: IngestGateway,
        *,
        group_id: str | None = None,
        session_timeout_ms: int | None = None,
        heartbeat_interval_ms: int | None = None,
        codec: ValueCodec | None = None,
    ) -> None:
        super().__init__(
            MCE,
            settings,
            sessionmaker,
            gateway,
            group_id=group_id,
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            codec=codec,
        )
