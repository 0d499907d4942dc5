"""The outbox relay: change-feed offsets in commit order, publication to Kafka, pruning.

Every committed aspect change wrote its change log into `change_log_outbox` in its own transaction. A relay runs
two loops, each on its own Postgres connection (so a Kafka outage never stalls the change feed):

* **sequencer** (always, also without Kafka; app.changelog.sequencer): gives consecutive `feed_offset`s to committed
  rows in commit order and prunes the outbox.
* **publisher** (when `kafka_bootstrap_servers` is set): holds a fair share of the 16 lanes (lane = hash of the URN)
  with session-level advisory locks, reads the lanes' sequenced, undelivered rows in feed order, produces them with
  `acks=all` (key = message key, value = the row's MCL / PlatformEvent encoded by the process's `ValueCodec`:
  Confluent-framed Avro with the topic's schema id by default, the row's JSON text with
  `kafka_value_format=json`; topic = the row's topic), awaits every acknowledgement and marks the rows delivered.
  All rows of one URN are in one lane, published by one relay at a time, in order.

The outbox stores JSON whatever the format: encoding happens here, at publish time (the topic gives the record: the
MCL topics MetadataChangeLog, the platform event topic PlatformEvent; a topic metaledger does not know gets the JSON
text). A row that cannot be encoded or published for a reason of its own (not a valid record, derived events
that cannot be built, a per-aspect pair whose schemas the registry refused, a record Kafka refuses as too large)
stays in the outbox with the reason (`publish_error`, logged as an error) and does not hold back the rows after it.
Database, broker and registry faults are not the row's: the batch is retried with backoff. Anything else that stops
the loop is logged with its traceback as an unexpected error, and retried.

Before a batch is encoded, a versioned change log of an entity/aspect pair the registry does not have (written
under a runtime model set this process has not taken up yet: the set was stored before the row) makes the relay take
the stored set up (`ModelFollower.refresh_for`) and register its per-aspect pairs first, so that no change log of a
runtime aspect goes out without the events derived from it.

Every record carries its row's feed offset and lane in two headers (`FEED_OFFSET_HEADER`, `LANE_HEADER`).

Delivery guarantee: **exactly once per topic-partition under database and relay restarts, in per-URN commit
order**. A relay that stops between the broker's acknowledgement and the delivered mark (a lost database connection,
a crash) leaves rows that are on the broker but not marked. Whoever takes their lane next (this relay once the
database is back, or another one) reads back the tail of each partition before it first publishes a row there
(`PartitionTails`) and does not produce again a record whose feed offset it finds. The tail is read once per
partition when lanes are taken, not per batch. **At least once** where the relay cannot see what the broker did: a
produce that timed out but landed is sent again, and so is a record older than the tail read (a clock skewed by
more than `TAIL_CLOCK_SKEW_MS`). A failed produce is retried with backoff, and a row whose earlier rows with the same
key failed in that batch is never marked ahead of them. Consumers that must not see a duplicate deduplicate on
(urn, aspect, version) — `systemMetadata.version` for versioned aspects. Writes never wait for Kafka: they only
insert into the outbox.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.avro.wire import ValueCodec
from app.changelog import outbox
from app.changelog.sequencer import Sequencer
from app.db import close_quietly, connect_dedicated
from app.kafka.per_aspect import DerivedEvents
from app.kafka.producer import RECORD_OVERHEAD, KeyPartitioner
from app.kafka.topics import create_missing_topics
from app.ops.metrics import RELAY_PUBLISHED
from app.registry.runtime import ModelFollower
from app.settings import Settings
from app.workers import pause

log = logging.getLogger("metaledger.relay")

estimate_size = DefaultRecordBatchBuilder.estimate_size_in_bytes

BALANCE_INTERVAL_S = 1.0  # how often a publisher recounts the relays and takes or gives back lanes
PRODUCE_TIMEOUT_MS = 15_000  # a batch not acknowledged within this fails, and is retried later
MAX_KAFKA_BATCH_BYTES = 1024 * 1024
READ_AHEAD_CHUNK = 100  # rows the read-ahead encodes between two turns of the event loop
# Faults of what the relay talks to (the database, the broker, the schema registry: RegistryUnavailable is a
# ConnectionError), retried with backoff; never a row's publish error.
TRANSIENT = (asyncpg.PostgresError, asyncpg.InterfaceError, SQLAlchemyError, KafkaError, OSError)

# The headers every published record carries: its outbox row's feed offset and lane (decimal ASCII).
FEED_OFFSET_HEADER = "metaledger-feed-offset"
LANE_HEADER = "metaledger-lane"
LANE_HEADERS = tuple((LANE_HEADER, b"%d" % lane) for lane in range(outbox.LANES))
# Reading a partition's tail back stops, for a lane, at a record older than the lane's first unmarked row was
# written, less this much (the relay's and the database's clocks may differ), or at a record of the lane that is
# marked delivered.
TAIL_CLOCK_SKEW_MS = 1_000
TAIL_CHUNK = 500  # records read back first; each step further back reads twice as many
TAIL_READ_TIMEOUT_S = PRODUCE_TIMEOUT_MS / 1000  # a tail not read within this fails the batch, like a produce

# A batch's values as read ahead: row id → value, row id → derived events [(topic, value; None: a tombstone)], and
# the rows refused with the reason.
Encoded = tuple[dict[int, bytes], dict[int, list[tuple[str, bytes | None]]], list[tuple[outbox.PendingRow, str]]]
# A produced batch: the rows delivered, the rows refused with the reason, the first error (None: no row failed).
Produced = tuple[list[outbox.PendingRow], list[tuple[outbox.PendingRow, str]], BaseException | None]
# A batch as sent, in the order sent: each row with the future of a record batch holding one of its records (its
# change log and derived events may be in several), or the error that kept one from being sent.
Sent = list[tuple[outbox.PendingRow, asyncio.Future | BaseException]]


@dataclass(slots=True)
class Backoff:
    """Capped exponential backoff, without jitter: after the n-th failure in a row the next attempt waits
    min(cap, base * 2**n) seconds; a success starts the count again."""

    base: float
    cap: float
    failures: int = 0

    def failed(self) -> float:
        """Count a failure; the wait before the next attempt."""
        self.failures += 1
        # past the cap the exponent changes nothing, and 2**n of a long outage would overflow a float
        return min(self.cap, self.base * 2.0 ** min(self.failures, 64))

    def succeeded(self) -> None:
        self.failures = 0


class OutboxRelay:
    """The sequencer (always) and, when `kafka_bootstrap_servers` is set, the publisher, each on its own
    connections; the sequencer wakes the publisher when it gave offsets."""

    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        codec: ValueCodec | None = None,
        derived: DerivedEvents | None = None,
        models: ModelFollower | None = None,
    ) -> None:
        """`models`: the process's watcher of the registry `derived` uses (`metaledger relay`, the background
        process), which the publisher asks to take a model set up at once (a relay without one publishes with the
        registry as it is)."""
        self.settings = settings
        self._wake = asyncio.Event()  # the sequencer gave offsets: the publisher has work
        self.sequencer = Sequencer(settings, engine, self._wake)
        self.publisher = Publisher(
            settings,
            engine,
            # The process's codec (main/background/cli build one); without one, DataHub's fixed ids and no registry.
            codec or ValueCodec(settings),
            # Per-aspect events and MAE v4 (app.kafka.per_aspect): published with the change log they come from
            derived if derived is not None and derived.enabled else None,
            self._wake,
            models,
        )

    # figures, for tests, benchmarks and logs
    @property
    def sequenced(self) -> int:
        """Rows given a feed offset by this relay's sequencer."""
        return self.sequencer.sequenced

    @property
    def pruned(self) -> int:
        return self.sequencer.pruned

    @property
    def prune_passes(self) -> int:
        return self.sequencer.prune_passes

    @property
    def published(self) -> int:
        """Rows this relay produced and marked delivered."""
        return self.publisher.published

    @property
    def lanes(self) -> set[int]:
        """The lanes this relay holds now."""
        return self.publisher.lanes

    async def run(self, stop: asyncio.Event) -> None:
        """Assign change-feed offsets in commit order, publish to Kafka when configured, prune; until `stop`."""
        loops = [asyncio.create_task(self.sequencer.run(stop), name="relay-sequencer")]
        if self.settings.kafka_bootstrap_servers:
            loops.append(asyncio.create_task(self.publisher.run(stop), name="relay-publisher"))
        waker = asyncio.create_task(self._wake_on(stop))
        try:
            await asyncio.gather(*loops)
        finally:
            for task in (*loops, waker):
                task.cancel()
            await asyncio.gather(*loops, waker, return_exceptions=True)

    async def _wake_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._wake.set()


class Publisher:
    """Holds a fair share of the lanes and publishes their sequenced rows in feed order, a batch at a time:
    rebalance (when due), take the next batch, produce it, settle it (mark what was delivered).

    The delivered mark of one batch (on a second connection) overlaps the fetch and produce of the next, and the
    next batch is read (and encoded) while this one is sent and acknowledged (`_read_ahead`: it is only used if this
    batch went through, and never across a rebalance). A lane is only given back, and the read position only reset,
    once every mark is in. A lane taken may hold rows its last publisher produced but did not mark: they are looked
    up on the broker (`_resume`, `PartitionTails`) before they are produced."""

    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        codec: ValueCodec,
        derived: DerivedEvents | None,
        wake: asyncio.Event,
        models: ModelFollower | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.codec = codec
        self.derived = derived
        # the stored runtime model set, taken up when a batch holds a pair the registry does not have yet
        self._models = models if derived is not None else None
        self._wake = wake
        self._poll_s = settings.relay_poll_interval_ms / 1000
        self._batch_size = max(1, settings.relay_batch_size)
        self._partitioner = KeyPartitioner()  # the producer's, and the batches' (the same placement of a key)
        self._database = Backoff(base=0.2, cap=5.0)  # reconnects
        # producer restarts: a refused connection costs nothing, and the outage should end quickly
        self._kafka = Backoff(base=0.25, cap=2.0)
        self._kafka_retry_at = 0.0  # no producer is started before this (time.monotonic)
        self._producer: AIOKafkaProducer | None = None
        self.published = 0  # rows produced and marked delivered
        self.found_published = 0  # rows of lanes just taken that were on the broker already: not produced again
        self.lanes: set[int] = set()  # lanes held now (by advisory locks on `_conn`)
        # Each database session's (`_session`):
        self._conn: asyncpg.Connection | None = None  # lane locks, reads
        self._mark_conn: asyncpg.Connection | None = None  # delivered marks
        self._marking: asyncio.Task | None = None  # the marks of the last batch, in flight
        self._ahead: asyncio.Task | None = None  # the next batch, read (and encoded) while one is in flight
        self._after = 0  # rows of the held lanes up to this offset are produced (marks may be in flight)
        # Lanes taken with unmarked rows, that may be on the broker already (`_resume`): their first unmarked row,
        # the last feed offset given when they were taken (no row after it can be on the broker), and the feed
        # offsets of theirs found on each partition read back so far.
        self._resuming: dict[int, outbox.LaneFront] = {}
        self._resume_until = 0
        self._on_broker: dict[tuple[str, int], set[int]] = {}
        self._next_balance = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        """Publish until `stop`; database and broker outages are retried with backoff."""
        try:
            while not stop.is_set():
                try:
                    await self._session(stop)
                except TRANSIENT as error:  # the relay outlives database, broker and registry outages
                    log.warning(
                        "relay publisher: database, broker or registry error; retrying",
                        extra={"error": f"{type(error).__name__}: {error}"},
                    )
                    await pause(stop, self._database.failed())
                except Exception as error:  # noqa: BLE001 - not a row's (those are its publish error): a fault here
                    log.exception(
                        "relay publisher: unexpected error; retrying",
                        extra={"error": f"{type(error).__name__}: {error}"},
                    )
                    await pause(stop, self._database.failed())
        finally:
            await self._stop_producer()

    async def _session(self, stop: asyncio.Event) -> None:
        """Publish on one pair of connections until `stop` or a database error. Whatever ends it, the marks in
        flight land (or fail: those rows are published again) before the connections close, and closing `_conn`
        gives the lanes back."""
        try:
            self._conn = await connect_dedicated(self.engine, "metaledger-relay")
            self._mark_conn = await connect_dedicated(self.engine, "metaledger-relay")
            await outbox.join_publishers(self._conn)
            self._after, self._next_balance = 0, 0.0
            while not stop.is_set():
                if time.monotonic() >= self._next_balance:
                    await self._rebalance()
                self._database.succeeded()
                if not self.lanes:
                    await pause(stop, BALANCE_INTERVAL_S)
                    continue
                if not await self._producer_ready(stop):
                    continue
                if self.derived is not None:
                    await self.derived.start()  # a runtime model set's new pairs (app.kafka.per_aspect)
                rows, encoded = await self._next_batch()
                if not rows:
                    await self._settle_marks()
                    try:
                        await asyncio.wait_for(self._wake.wait(), timeout=self._poll_s)
                    except TimeoutError:
                        pass
                    continue
                if encoded is None:
                    await self._take_up_models(rows)
                # The next batch is read (and encoded) while this one is sent and acknowledged.
                self._ahead = asyncio.create_task(
                    self._read_ahead(self._conn, sorted(self.lanes), rows[-1].feed_offset)
                )
                await self._settle(rows, *await self._produce(rows, encoded))
            await self._settle_marks()
        finally:
            if self._marking is not None:
                await asyncio.gather(self._marking, return_exceptions=True)
                self._marking = None
            await self._drop_read_ahead()
            self.lanes = set()
            self._resuming, self._on_broker = {}, {}
            conns, self._conn, self._mark_conn = (self._conn, self._mark_conn), None, None
            for conn in conns:
                if conn is not None:
                    await close_quietly(conn)

    async def _rebalance(self) -> None:
        """Take or give back lanes with every mark in and no read in flight (`_conn` is needed)."""
        await self._settle_marks()
        if self._ahead is not None:
            await asyncio.gather(self._ahead, return_exceptions=True)
        held = set(self.lanes)
        await self._balance()
        if self.lanes != held:
            self._ahead = None  # read for other lanes
        if self.lanes - held:
            self._after = 0  # a new lane may hold rows below the read position
            await self._resume(self.lanes - held)
        self._next_balance = time.monotonic() + BALANCE_INTERVAL_S

    async def _resume(self, taken: set[int]) -> None:
        """Lanes just taken may hold rows their last publisher produced but could not mark (it crashed, or lost the
        database): their partitions' tails are read again before the first row goes there (`_produce`)."""
        lanes = (self._resuming.keys() & self.lanes) | taken
        self._resuming, self._resume_until = await outbox.lane_fronts(self._conn, sorted(lanes))
        self._on_broker = {}  # read back again, for every lane now resuming

    async def _balance(self) -> None:
        """Hold a fair share of the lanes: ceil(lanes / live publishers). Extra lanes are given back (between
        batches, so never with rows in flight); missing ones are taken if free."""
        conn = self._conn
        members = max(1, await outbox.count_publishers(conn))
        target = math.ceil(outbox.LANES / members)
        if len(self.lanes) > target:
            for lane in sorted(self.lanes, reverse=True)[: len(self.lanes) - target]:
                await outbox.unlock_lane(conn, lane)
                self.lanes.discard(lane)
        elif len(self.lanes) < target:
            start = random.randrange(outbox.LANES)
            for i in range(outbox.LANES):
                lane = (start + i) % outbox.LANES
                if lane not in self.lanes and await outbox.try_lock_lane(conn, lane):
                    self.lanes.add(lane)
                    if len(self.lanes) >= target:
                        break

    async def _producer_ready(self, stop: asyncio.Event) -> bool:
        """Whether a producer is up: one is started when the Kafka backoff allows. A wait is cut at
        BALANCE_INTERVAL_S, so that the lanes stay balanced meanwhile."""
        if self._producer is not None:
            return True
        wait = self._kafka_retry_at - time.monotonic()
        if wait > 0:
            await pause(stop, min(wait, BALANCE_INTERVAL_S))
            return False
        try:
            await self._start_producer()
        except Exception as error:  # noqa: BLE001 - Kafka down: retry with backoff
            self._kafka_retry_at = time.monotonic() + self._kafka.failed()
            attempts = self._kafka.failures
            if attempts == 1 or attempts % 30 == 0:
                log.warning(
                    "relay: kafka unavailable; retrying",
                    extra={"attempts": attempts, "error": f"{type(error).__name__}: {error}"},
                )
            return False
        return True

    async def _next_batch(self) -> tuple[list[outbox.PendingRow], Encoded | None]:
        """The held lanes' rows after the read position (a batch at most), with their encoded values when they were
        read ahead (None: encoded when produced)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            return await ahead
        self._wake.clear()
        return await outbox.pending(self._conn, sorted(self.lanes), self._batch_size, self._after), None

    async def _settle(
        self,
        rows: list[outbox.PendingRow],
        delivered: list[outbox.PendingRow],
        refused: list[tuple[outbox.PendingRow, str]],
        error: BaseException | None,
    ) -> None:
        """Mark the delivered and refused rows of a produced batch (in flight while the next batch goes out). After
        a failed produce, the read position goes back to the first unpublished row and the producer is stopped,
        to be restarted when the Kafka backoff allows."""
        if error is not None:
            await self._drop_read_ahead()  # the unpublished rows are read again first
        await self._settle_marks()
        self._marking = asyncio.create_task(self._mark(self._mark_conn, delivered, refused))
        if error is None:
            self._kafka.succeeded()
            self._after = rows[-1].feed_offset
            if self._resuming and self._after >= self._resume_until:
                self._resuming, self._on_broker = {}, {}  # every row that may have been on the broker is settled
            return
        await self._settle_marks()
        self._after = 0  # read the unpublished rows again, in order
        self._kafka_retry_at = time.monotonic() + self._kafka.failed()
        log.warning(
            "relay: produce failed; retrying",
            extra={
                "error": f"{type(error).__name__}: {error}",
                "unpublished": len(rows) - len(delivered) - len(refused),
            },
        )
        await self._stop_producer()

    async def _settle_marks(self) -> None:
        """Wait for the marks in flight (a failed mark raises here: a database error)."""
        if self._marking is not None:
            await self._marking
            self._marking = None

    async def _read_ahead(
        self, conn: asyncpg.Connection, lanes: list[int], after: int
    ) -> tuple[list[outbox.PendingRow], Encoded | None]:
        """The next batch and its encoded values, read while the current batch is sent and acknowledged."""
        self._wake.clear()
        rows = await outbox.pending(conn, lanes, self._batch_size, after)
        if not rows or not (self.codec.avro or self.derived):
            return rows, None
        await self._take_up_models(rows)
        refused: list[tuple[outbox.PendingRow, str]] = []
        values: dict[int, bytes] = {}
        derived: dict[int, list[tuple[str, bytes | None]]] = {}
        for start in range(0, len(rows), READ_AHEAD_CHUNK):  # between chunks, the batch in flight gets its turn
            chunk = rows[start : start + READ_AHEAD_CHUNK]
            encoded = self._encode(chunk, refused)
            values.update(encoded)
            derived.update(self._derive([row for row in chunk if row.id in encoded], refused))
            await asyncio.sleep(0)
        return rows, (values, derived, refused)

    async def _take_up_models(self, rows: list[outbox.PendingRow]) -> None:
        """Before `rows` are encoded: the stored runtime model set when one of them is of a pair the registry does
        not have, and the per-aspect pairs of the registry registered."""
        derived, models = self.derived, self._models
        if derived is None or models is None:
            return
        # only versioned change logs have derived events
        await models.refresh_for((row.key, row.aspect) for row in rows if row.topic == derived.versioned_topic)
        await derived.start()

    async def _drop_read_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            await asyncio.gather(ahead, return_exceptions=True)  # let its query finish: `_conn` is used next

    async def _mark(
        self, conn: asyncpg.Connection, delivered: list[outbox.PendingRow], refused: list[tuple[outbox.PendingRow, str]]
    ) -> None:
        for row, reason in refused:
            await outbox.mark_failed(conn, row.id, reason)
            log.error(
                "relay: a change log cannot be published (refused by kafka, or not encodable); it stays in the outbox with the error",
                extra={"outbox_id": row.id, "feed_offset": row.feed_offset, "topic": row.topic, "error": reason},
            )
        if delivered:
            await outbox.mark_delivered(conn, [row.id for row in delivered])
            self.published += len(delivered)
            RELAY_PUBLISHED.inc(len(delivered))

    async def _start_producer(self) -> None:
        settings = self.settings
        if settings.create_topics_on_start:
            # again: a broker may have come back without them
            await create_missing_topics(settings, self.derived.topics() if self.derived is not None else ())
        await self.codec.start()  # an external registry: the schemas registered (retried like the broker)
        if self.derived is not None:
            await self.derived.start()  # the per-aspect event schemas registered
        producer = AIOKafkaProducer(
            bootstrap_servers=settings.kafka_bootstrap_servers,
            client_id=f"{settings.kafka_client_id}-relay",
            acks="all",
            enable_idempotence=False,  # aiokafka's idempotent producer fails against Tansu (InitProducerId)
            max_request_size=settings.kafka_max_message_bytes,
            max_batch_size=min(MAX_KAFKA_BATCH_BYTES, settings.kafka_max_message_bytes),
            compression_type=settings.kafka_compression_type or None,
            linger_ms=0,
            request_timeout_ms=PRODUCE_TIMEOUT_MS,
            partitioner=self._partitioner,
            retry_backoff_ms=200,
        )
        try:
            await producer.start()
        except BaseException:
            await _stop_quietly(producer)
            raise
        self._producer = producer

    async def _stop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await _stop_quietly(producer)

    async def _produce(self, rows: list[outbox.PendingRow], encoded: Encoded | None = None) -> Produced:
        """Produce a batch and await every acknowledgement. Returns (delivered rows, refused rows with the reason,
        the first error or None). A row is delivered only if no earlier row with the same topic and key failed, so
        a retry can never put a key's change logs out of order. A record found on its partition when its lane was
        taken (`_resume`) is not produced again; a row whose records are all there is delivered as it is.
        `encoded`: the rows' values and encoding refusals when read ahead.

        Three steps: send the records (`_send_in_batches`), await the broker's acknowledgements (`_await_acks`),
        tell from them which rows were delivered (`_outcome`). `_settle` then marks the rows."""
        producer = self._producer
        assert producer is not None
        refused: list[tuple[outbox.PendingRow, str]] = []
        if encoded is None:
            values = self._encode(rows, refused)
            derived = self._derive([row for row in rows if row.id in values], refused)
        else:
            values, derived, refused_encoding = encoded
            refused.extend(refused_encoding)
        on_broker = asyncio.get_running_loop().create_future()  # the outcome of a row found on the broker
        on_broker.set_result(None)
        sent = await self._send_in_batches(producer, rows, values, derived, refused, on_broker)
        await self._await_acks(sent)
        delivered, first_error, only_too_large = self._outcome(rows, sent, on_broker)
        if only_too_large:
            # Only size refusals: send the rest one by one to find the rows that are too large on their own.
            return await self._produce_one_by_one(rows, values, derived, delivered, refused)
        return delivered, refused, first_error

    async def _send_in_batches(
        self,
        producer: AIOKafkaProducer,
        rows: list[outbox.PendingRow],
        values: dict[int, bytes],
        derived: dict[int, list[tuple[str, bytes | None]]],
        refused: list[tuple[outbox.PendingRow, str]],
        on_broker: asyncio.Future,
    ) -> Sent:
        """Send the records of the rows not refused, in feed order, and return the rows with their record batches'
        futures, not waiting for the broker: every batch is awaited at once after (`_await_acks`). Records go into
        one batch per topic-partition (aiokafka's batch API: no future and no coroutine per record), each sent when
        full and the rest at the end. A row with a record too large for the settings is added to `refused`; a row
        whose records are all on the broker already (`_resume`) is given `on_broker`. A fault here (e.g. no metadata
        for a topic) is the error of every row not refused before: none of them is delivered, so the batch goes out
        again in order."""
        refused_ids = {row.id for row, _ in refused}
        sent: Sent = []
        batches: dict[tuple[str, int], tuple[Any, list[outbox.PendingRow]]] = {}  # (builder, its rows) being filled
        partitions: dict[str, list[int]] = {}
        resuming, resume_until = self._resuming, self._resume_until
        tails = PartitionTails(self.settings)  # connects only to read a partition back (`_found_on_broker`)
        try:
            for row in rows:
                value = values.get(row.id)
                if value is None or row.id in refused_ids:
                    continue  # refused: it cannot be encoded
                key = row.key.encode()
                headers = [(FEED_OFFSET_HEADER, b"%d" % row.feed_offset), LANE_HEADERS[row.lane]]
                records = ((row.topic, value), *derived.get(row.id, ()))  # delivered together, or not at all
                too_large = self._too_large(key, records, headers)
                if too_large is not None:  # can never be produced with these settings (as `send` would refuse it)
                    refused.append(
                        (
                            row,
                            f"MessageSizeTooLargeError: a record of the row is {too_large} bytes "
                            f"serialized, over METALEDGER_KAFKA_MAX_MESSAGE_BYTES",
                        )
                    )
                    continue
                resumed = row.lane in resuming and row.feed_offset <= resume_until
                produced = 0
                for topic, record in records:
                    if topic not in partitions:
                        partitions[topic] = sorted(await producer.partitions_for(topic))
                    tp = (topic, self._partitioner(key, partitions[topic], partitions[topic]))
                    if resumed and row.feed_offset in await self._found_on_broker(tails, tp, resuming):
                        continue
                    produced += 1
                    if tp not in batches:
                        batches[tp] = (producer.create_batch(), [])
                    builder, in_batch = batches[tp]
                    if builder.append(timestamp=None, key=key, value=record, headers=headers) is None:  # full: send it
                        await self._submit(producer, tp, batches.pop(tp), sent)
                        builder, in_batch = producer.create_batch(), []
                        batches[tp] = (builder, in_batch)
                        builder.append(timestamp=None, key=key, value=record, headers=headers)  # a first record fits
                    in_batch.append(row)
                if not produced:
                    sent.append((row, on_broker))
        except Exception as error:  # noqa: BLE001 - e.g. no metadata for a topic: nothing of this batch is sent
            for _builder, in_batch in batches.values():
                sent.extend((row, error) for row in in_batch)
            batches.clear()
            sent.extend((row, error) for row in rows if row.id not in refused_ids and row.id in values)
        finally:
            await tails.close()
        for tp in list(batches):
            await self._submit(producer, tp, batches.pop(tp), sent)
        return sent

    def _too_large(
        self, key: bytes, records: tuple[tuple[str, bytes | None], ...], headers: list[tuple[str, bytes]]
    ) -> int | None:
        """The serialized size of the first of a row's records over `kafka_max_message_bytes` (None: they all fit).
        Such a row can never be produced with these settings: it is refused up front with its own error, rather
        than sent for the broker to refuse with the whole record batch it is in."""
        limit = self.settings.kafka_max_message_bytes
        return next((size for _, record in records if (size := estimate_size(key, record, headers)) > limit), None)

    async def _found_on_broker(
        self, tails: PartitionTails, tp: tuple[str, int], resuming: dict[int, outbox.LaneFront]
    ) -> set[int]:
        """The feed offsets of the resuming lanes' rows that are on a partition already. The tail is read back the
        first time a row of theirs goes there, and kept in `_on_broker` until every row that may be on the broker
        is settled: once per partition when lanes are taken, not per batch."""
        if tp not in self._on_broker:
            self._on_broker[tp] = await tails.feed_offsets(tp, resuming)
        return self._on_broker[tp]

    @staticmethod
    async def _submit(
        producer: AIOKafkaProducer, tp: tuple[str, int], batch: tuple[Any, list[outbox.PendingRow]], sent: Sent
    ) -> None:
        """Send one topic-partition's record batch and add its rows to `sent` with its future. A batch that cannot
        be sent (e.g. a metadata timeout) gives its rows the error instead: they wait, while the other batches
        still go out and are acknowledged."""
        builder, in_batch = batch
        try:
            future: asyncio.Future | BaseException = await producer.send_batch(builder, tp[0], partition=tp[1])
        except Exception as error:  # noqa: BLE001 - e.g. metadata timeout: these rows wait
            future = error
        sent.extend((row, future) for row in in_batch)

    @staticmethod
    async def _await_acks(sent: Sent) -> None:
        """Wait for the acknowledgement of every record batch sent (once, whatever number of rows it holds), but no
        longer than a little past the producer's request timeout: a batch still unanswered then is its rows' error
        (`_future_error`), so a broker that never answers fails the batch, to be retried, instead of stalling
        the lanes."""
        futures = list({id(f): f for _, f in sent if isinstance(f, asyncio.Future)}.values())
        if futures:
            try:
                await asyncio.wait_for(asyncio.wait(futures), timeout=PRODUCE_TIMEOUT_MS / 1000 + 5)
            except TimeoutError:
                pass

    def _outcome(
        self, rows: list[outbox.PendingRow], sent: Sent, on_broker: asyncio.Future
    ) -> tuple[list[outbox.PendingRow], BaseException | None, bool]:
        """The acknowledged batch told row by row, in feed order: (the rows delivered, the first error, whether
        every failure was the broker refusing a record batch as too large). A row is delivered when every record
        of it was acknowledged (or was on the broker already: counted in `found_published`) and no earlier row of
        its topic and key failed, so a key's change logs are never marked out of order. A size refusal is the
        whole record batch's, not necessarily its rows' own: the caller sends such rows again one by one."""
        order = {row.id: n for n, row in enumerate(rows)}
        outcomes: dict[int, list[asyncio.Future | BaseException]] = {}  # a row's change log and derived events
        sent_rows: list[outbox.PendingRow] = []
        # rows in feed order, whichever batch sent their records
        for row, outcome in sorted(sent, key=lambda item: order[item[0].id]):
            if row.id not in outcomes:
                sent_rows.append(row)
                outcomes[row.id] = []
            outcomes[row.id].append(outcome)
        delivered: list[outbox.PendingRow] = []
        failed_keys: set[tuple[str, str]] = set()
        first_error: BaseException | None = None
        broker_too_large: list[outbox.PendingRow] = []
        for row in sent_rows:
            errors = [e for o in outcomes[row.id] if (e := o if isinstance(o, BaseException) else _future_error(o))]
            row_error = errors[0] if errors else None
            if row_error is None and (row.topic, row.key) not in failed_keys:
                delivered.append(row)
                if outcomes[row.id] == [on_broker]:
                    self.found_published += 1
                continue
            if isinstance(row_error, MessageSizeTooLargeError):
                broker_too_large.append(row)  # the broker refused the whole record batch this row was in
            failed_keys.add((row.topic, row.key))
            first_error = first_error or row_error
        only_too_large = bool(broker_too_large) and len(broker_too_large) == len(sent_rows) - len(delivered)
        return delivered, first_error, only_too_large

    def _encode(self, rows: list[outbox.PendingRow], refused: list[tuple[outbox.PendingRow, str]]) -> dict[int, bytes]:
        """Each row's value as published (row id → bytes); a row that does not fit its topic's record is refused
        with the reason."""
        codec = self.codec
        if not codec.avro:
            return {row.id: row.payload for row in rows}
        values: dict[int, bytes] = {}
        role_of, encode = codec.role_of, codec.encode
        for row in rows:
            role = role_of(row.topic)
            if role is None:
                values[row.id] = row.payload  # not one of metaledger's topics: the JSON text as stored
                continue
            try:
                values[row.id] = encode(role, row.payload)
            except ValueError as error:  # AvroEncodeError, or text that is not JSON
                refused.append((row, f"AvroEncodeError: the row is not a valid {role} record for Avro: {error}"))
            except Exception as error:  # noqa: BLE001 - encoding is the row's alone: whatever fails is its error
                refused.append((row, f"{type(error).__name__}: the row cannot be encoded as a {role} record: {error}"))
        return values

    def _derive(
        self, rows: list[outbox.PendingRow], refused: list[tuple[outbox.PendingRow, str]]
    ) -> dict[int, list[tuple[str, bytes | None]]]:
        """Each row's derived events (row id → [(topic, value; None: a tombstone)]); a row whose events cannot be
        built is refused with the reason, like a row that cannot be encoded (kept, with its publish error)."""
        if self.derived is None:
            return {}
        derived: dict[int, list[tuple[str, bytes | None]]] = {}
        for row in rows:
            try:
                events = self.derived.for_row(row.topic, row.key, row.aspect, row.payload)
            except Exception as error:  # noqa: BLE001 - built from the row alone (AvroEncodeError, PairRefused, ...)
                refused.append((row, f"{type(error).__name__}: the row's derived events cannot be built: {error}"))
                continue
            if events:
                derived[row.id] = events
        return derived

    async def _produce_one_by_one(
        self,
        rows: list[outbox.PendingRow],
        values: dict[int, bytes],
        derived: dict[int, list[tuple[str, bytes | None]]],
        delivered: list[outbox.PendingRow],
        refused: list[tuple[outbox.PendingRow, str]],
    ) -> Produced:
        producer = self._producer
        assert producer is not None  # called by `_produce`, with the producer it produced with
        done = {row.id for row in delivered} | {row.id for row, _ in refused}
        failed_keys: set[tuple[str, str]] = set()
        first_error: BaseException | None = None
        for row in rows:
            if row.id in done:
                continue
            if (row.topic, row.key) in failed_keys:
                continue
            try:
                key = row.key.encode()
                headers = [(FEED_OFFSET_HEADER, b"%d" % row.feed_offset), LANE_HEADERS[row.lane]]
                await (await producer.send(row.topic, values[row.id], key=key, headers=headers))
                for topic, event in derived.get(row.id, ()):
                    await (await producer.send(topic, event, key=key, headers=headers))
                delivered.append(row)
            except MessageSizeTooLargeError as error:
                refused.append((row, f"{type(error).__name__}: {error}"))
            except Exception as error:  # noqa: BLE001
                failed_keys.add((row.topic, row.key))
                first_error = first_error or error
        delivered.sort(key=lambda r: r.feed_offset)
        return delivered, refused, first_error


class PartitionTails:
    """Reads back the tail of a partition for the feed offsets of the given lanes' rows that are on it already.

    Going back from the end a chunk at a time, a lane is done at one of its records below its first unmarked row
    (the lane's records on a partition are in feed order, one publisher at a time), or at a record older than that
    row (less `TAIL_CLOCK_SKEW_MS`): its publisher produced nothing of it before it was written."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None

    async def feed_offsets(self, tp: tuple[str, int], fronts: dict[int, outbox.LaneFront]) -> set[int]:
        consumer = await self._started()
        partition = TopicPartition(*tp)
        consumer.assign([partition])
        start = (await consumer.beginning_offsets([partition]))[partition]
        end = await self._high_watermark(consumer, partition)
        since = {lane: int(front.created_at.timestamp() * 1000) - TAIL_CLOCK_SKEW_MS for lane, front in fronts.items()}
        open_lanes = {lane: front.feed_offset for lane, front in fronts.items()}
        found: set[int] = set()
        size = TAIL_CHUNK
        while open_lanes and end > start:
            position = max(start, end - size)
            consumer.seek(partition, position)
            done: set[int] = set()
            oldest = None
            deadline = time.monotonic() + TAIL_READ_TIMEOUT_S
            while await consumer.position(partition) < end:
                if time.monotonic() > deadline:
                    raise KafkaTimeoutError(f"the tail of {tp[0]}-{tp[1]} could not be read back")
                for record in (await consumer.getmany(partition, timeout_ms=100)).get(partition, ()):
                    if record.offset >= end:
                        break
                    if oldest is None or record.timestamp < oldest:
                        oldest = record.timestamp
                    lane = offset = None
                    for name, value in record.headers:
                        if name == FEED_OFFSET_HEADER:
                            offset = int(value)
                        elif name == LANE_HEADER:
                            lane = int(value)
                    if lane is None or offset is None:
                        continue
                    first = open_lanes.get(lane)
                    if first is None:
                        continue
                    if offset >= first:
                        found.add(offset)
                    else:
                        done.add(lane)
            done.update(lane for lane in open_lanes if oldest is not None and oldest < since[lane])
            for lane in done:
                open_lanes.pop(lane, None)
            end, size = position, size * 2
        return found

    async def _high_watermark(self, consumer: AIOKafkaConsumer, partition: TopicPartition) -> int:
        """The partition's end from a Fetch answer: ListOffsets "latest" can be short of it (on Tansu, after batched
        produce), and a Fetch from there (or, out of range, from the start) answers with the right one."""
        consumer.seek(partition, (await consumer.end_offsets([partition]))[partition])
        deadline = time.monotonic() + TAIL_READ_TIMEOUT_S
        while (end := consumer.highwater(partition)) is None:
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"no high watermark for {partition.topic}-{partition.partition}")
            await consumer.getmany(partition, timeout_ms=20)
        return end

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            settings = self.settings
            consumer = AIOKafkaConsumer(
                bootstrap_servers=settings.kafka_bootstrap_servers,
                client_id=f"{settings.kafka_client_id}-relay-tail",
                group_id=None,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                fetch_max_wait_ms=10,
                max_partition_fetch_bytes=max(1024 * 1024, settings.kafka_max_message_bytes + RECORD_OVERHEAD),
                request_timeout_ms=PRODUCE_TIMEOUT_MS,
            )
            try:
                await consumer.start()
            except BaseException:
                await consumer.stop()
                raise
            self._consumer = consumer
        return self._consumer

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()


def _future_error(future: asyncio.Future) -> BaseException | None:
    if not future.done():
        return TimeoutError("no acknowledgement from kafka")
    if future.cancelled():
        return asyncio.CancelledError()
    return future.exception()


async def _stop_quietly(producer: AIOKafkaProducer) -> None:
    try:
        await asyncio.wait_for(producer.stop(), timeout=5)
    except Exception as error:  # noqa: BLE001 - stopping a producer whose broker is gone
        log.debug("relay: producer stop failed", extra={"error": f"{type(error).__name__}: {error}"})
