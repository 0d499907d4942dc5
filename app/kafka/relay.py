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
text). A row that cannot be encoded, like a row Kafka refuses as too large, stays in the outbox with the reason
(`publish_error`) and does not hold back the rows after it.

Delivery guarantee: **at least once, in per-URN commit order**. A crash (or a lost database connection) between the
broker's acknowledgement and the delivered mark publishes those rows again; a failed produce is retried with
backoff, and a row whose earlier rows with the same key failed in that batch is never marked ahead of them.
Consumers deduplicate on (urn, aspect, version) — `systemMetadata.version` for versioned aspects. Writes never wait
for Kafka: they only insert into the outbox.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from typing import Any

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from sqlalchemy.ext.asyncio import AsyncEngine

from app.avro.wire import ValueCodec
from app.changelog import outbox
from app.changelog.sequencer import Sequencer
from app.db import close_quietly, connect_dedicated
from app.kafka.topics import create_missing_topics
from app.kafka.per_aspect import DerivedEvents
from app.kafka.producer import KeyPartitioner
from app.ops.metrics import RELAY_PUBLISHED
from app.settings import Settings
from app.workers import pause

log = logging.getLogger("metaledger.relay")

estimate_size = DefaultRecordBatchBuilder.estimate_size_in_bytes

BALANCE_INTERVAL_S = 1.0  # how often a publisher recounts the relays and takes or gives back lanes
MAX_BACKOFF_S = 5.0  # database reconnects
MAX_KAFKA_BACKOFF_S = 2.0  # producer restarts (a refused connection costs nothing; the outage should end quickly)
PRODUCE_TIMEOUT_MS = 15_000  # a batch not acknowledged within this fails, and is retried later
MAX_KAFKA_BATCH_BYTES = 1024 * 1024
READ_AHEAD_CHUNK = 100  # rows the read-ahead encodes between two turns of the event loop


class OutboxRelay:
    def __init__(self, settings: Settings, engine: AsyncEngine, codec: ValueCodec | None = None,
                 derived: DerivedEvents | None = None) -> None:
        self.settings = settings
        self.engine = engine
        # The process's codec (main/background/cli build one); without one, DataHub's fixed ids and no registry.
        self.codec = codec or ValueCodec(settings)
        # Per-aspect events and MAE v4 (app.kafka.per_aspect): published with the change log they come from
        self.derived = derived if derived is not None and derived.enabled else None
        self._partitioner = KeyPartitioner()  # the producer's, and the batches' (the same placement of a key)
        self._wake = asyncio.Event()  # the sequencer gave offsets: the publisher has work
        self.sequencer = Sequencer(settings, engine, self._wake)
        # figures, for tests, benchmarks and logs
        self.published = 0  # rows this relay produced and marked delivered
        self.lanes: set[int] = set()  # lanes this relay holds now
        self._producer: AIOKafkaProducer | None = None
        self._ahead: asyncio.Task | None = None  # the next batch, read (and encoded) while one is in flight

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

    # --- lifecycle -----------------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Assign change-feed offsets in commit order, publish to Kafka when configured, prune; until `stop`."""
        loops = [asyncio.create_task(self.sequencer.run(stop), name="relay-sequencer")]
        if self.settings.kafka_bootstrap_servers:
            loops.append(asyncio.create_task(self._publisher(stop), name="relay-publisher"))
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

    # --- the publisher -------------------------------------------------------------------------------------------
    async def _publisher(self, stop: asyncio.Event) -> None:
        """Fetch, produce, mark; the delivered mark of one batch (on a second connection) overlaps the fetch and
        produce of the next, and the next batch is read (and encoded) while this one is sent and acknowledged
        (`_read_ahead`: it is only used if this batch went through, and never across a rebalance). A lane is only
        given back, and the read position only reset, once every mark is in."""
        poll = self.settings.relay_poll_interval_ms / 1000
        batch = max(1, self.settings.relay_batch_size)
        db_failures = 0
        kafka_failures = 0
        kafka_retry_at = 0.0
        try:
            while not stop.is_set():
                conn: asyncpg.Connection | None = None
                mark_conn: asyncpg.Connection | None = None
                marking: asyncio.Task | None = None
                try:
                    conn = await connect_dedicated(self.engine, "metaledger-relay")
                    mark_conn = await connect_dedicated(self.engine, "metaledger-relay")
                    await outbox.join_publishers(conn)
                    next_balance = 0.0
                    after = 0  # rows of this relay's lanes up to this offset are produced (marks may be in flight)
                    while not stop.is_set():
                        if time.monotonic() >= next_balance:
                            if marking is not None:
                                await marking
                                marking = None
                            if self._ahead is not None:  # `conn` is needed: let the read-ahead's query finish
                                await asyncio.gather(self._ahead, return_exceptions=True)
                            held = set(self.lanes)
                            await self._balance(conn)
                            if self.lanes != held:
                                self._ahead = None  # read for other lanes
                            if self.lanes - held:
                                after = 0  # a new lane may hold rows below the read position
                            next_balance = time.monotonic() + BALANCE_INTERVAL_S
                        db_failures = 0
                        if not self.lanes:
                            await pause(stop, BALANCE_INTERVAL_S)
                            continue
                        if self._producer is None:
                            wait = kafka_retry_at - time.monotonic()
                            if wait > 0:
                                await pause(stop, min(wait, BALANCE_INTERVAL_S))
                                continue
                            try:
                                await self._start_producer()
                            except Exception as error:  # noqa: BLE001 - Kafka down: retry with backoff
                                kafka_failures += 1
                                kafka_retry_at = time.monotonic() + min(MAX_KAFKA_BACKOFF_S, 0.25 * 2**kafka_failures)
                                if kafka_failures == 1 or kafka_failures % 30 == 0:
                                    log.warning("relay: kafka unavailable; retrying",
                                                extra={"attempts": kafka_failures, "error": f"{type(error).__name__}: {error}"})
                                continue
                        if self._ahead is not None:
                            ahead, self._ahead = self._ahead, None
                            rows, encoded = await ahead
                        else:
                            self._wake.clear()
                            rows = await outbox.pending(conn, sorted(self.lanes), batch, after)
                            encoded = None
                        if not rows:
                            if marking is not None:
                                await marking
                                marking = None
                            try:
                                await asyncio.wait_for(self._wake.wait(), timeout=poll)
                            except TimeoutError:
                                pass
                            continue
                        # The next batch is read (and encoded) while this one is sent and acknowledged.
                        self._ahead = asyncio.create_task(
                            self._read_ahead(conn, sorted(self.lanes), batch, rows[-1].feed_offset))
                        delivered, refused, error = await self._produce(rows, encoded)
                        if error is not None:
                            await self._drop_read_ahead()  # the unpublished rows are read again first
                        if marking is not None:
                            await marking
                        marking = asyncio.create_task(self._mark(mark_conn, delivered, refused))
                        if error is None:
                            kafka_failures = 0
                            after = rows[-1].feed_offset
                        else:
                            await marking
                            marking = None
                            after = 0  # read the unpublished rows again, in order
                            kafka_failures += 1
                            kafka_retry_at = time.monotonic() + min(MAX_KAFKA_BACKOFF_S, 0.25 * 2**kafka_failures)
                            log.warning("relay: produce failed; retrying",
                                        extra={"error": f"{type(error).__name__}: {error}", "unpublished": len(rows) - len(delivered) - len(refused)})
                            await self._stop_producer()
                    if marking is not None:
                        await marking
                        marking = None
                except Exception as error:  # noqa: BLE001 - the relay outlives database restarts
                    db_failures += 1
                    log.warning("relay publisher: database error; retrying", extra={"error": f"{type(error).__name__}: {error}"})
                    await pause(stop, min(MAX_BACKOFF_S, 0.2 * 2**db_failures))
                finally:
                    if marking is not None:  # a mark that does not land means those rows are published again
                        await asyncio.gather(marking, return_exceptions=True)
                    await self._drop_read_ahead()
                    self.lanes = set()
                    for c in (conn, mark_conn):
                        if c is not None:
                            await close_quietly(c)  # closing `conn` releases the lane locks
        finally:
            await self._stop_producer()

    async def _read_ahead(self, conn: asyncpg.Connection, lanes: list[int], limit: int, after: int):
        """The next batch and its encoded values, read while the current batch is sent and acknowledged."""
        self._wake.clear()
        rows = await outbox.pending(conn, lanes, limit, after)
        if not rows or not (self.codec.avro or self.derived):
            return rows, None
        refused: list[tuple[outbox.PendingRow, str]] = []
        values: dict[int, bytes] = {}
        derived: dict[int, list[tuple[str, bytes | None]]] = {}
        for start in range(0, len(rows), READ_AHEAD_CHUNK):  # between chunks, the batch in flight gets its turn
            chunk = rows[start:start + READ_AHEAD_CHUNK]
            values.update(self._encode(chunk, refused))
            derived.update(self._derive(chunk, refused))
            await asyncio.sleep(0)
        return rows, (values, derived, refused)

    async def _drop_read_ahead(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            await asyncio.gather(ahead, return_exceptions=True)  # let its query finish: `conn` is used next

    async def _mark(self, conn: asyncpg.Connection, delivered: list[outbox.PendingRow],
                    refused: list[tuple[outbox.PendingRow, str]]) -> None:
        for row, reason in refused:
            await outbox.mark_failed(conn, row.id, reason)
            log.error("relay: a change log cannot be published (refused by kafka, or not encodable); it stays in the outbox with the error",
                      extra={"outbox_id": row.id, "feed_offset": row.feed_offset, "topic": row.topic, "error": reason})
        if delivered:
            await outbox.mark_delivered(conn, [row.id for row in delivered])
            self.published += len(delivered)
            RELAY_PUBLISHED.inc(len(delivered))

    async def _balance(self, conn: asyncpg.Connection) -> None:
        """Hold a fair share of the lanes: ceil(lanes / live publishers). Extra lanes are given back (between
        batches, so never with rows in flight); missing ones are taken if free."""
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

    async def _produce(self, rows: list[outbox.PendingRow], encoded=None):
        """Produce a batch and await every acknowledgement. Returns (delivered rows, refused rows with the reason,
        the first error or None). A row is delivered only if no earlier row with the same topic and key failed, so
        a retry can never put a key's change logs out of order. `encoded`: the rows' values and encoding refusals
        when read ahead."""
        producer = self._producer
        assert producer is not None
        refused: list[tuple[outbox.PendingRow, str]] = []
        if encoded is None:
            values = self._encode(rows, refused)
            derived = self._derive(rows, refused)
        else:
            values, derived, refused_encoding = encoded
            refused.extend(refused_encoding)
        refused_ids = {row.id for row, _ in refused}
        sent: list[tuple[outbox.PendingRow, asyncio.Future | BaseException]] = []
        # Records go into one batch per topic-partition (aiokafka's batch API: no future and no coroutine per
        # record); a row's records are delivered when every batch holding one of them is acknowledged.
        batches: dict[tuple[str, int], tuple[Any, list[outbox.PendingRow]]] = {}
        partitions: dict[str, list[int]] = {}

        async def submit(tp: tuple[str, int]) -> None:
            builder, in_batch = batches.pop(tp)
            try:
                future: asyncio.Future | BaseException = await producer.send_batch(builder, tp[0], partition=tp[1])
            except Exception as error:  # noqa: BLE001 - e.g. metadata timeout: these rows wait
                future = error
            sent.extend((row, future) for row in in_batch)

        try:
            for row in rows:
                value = values.get(row.id)
                if value is None or row.id in refused_ids:
                    continue  # refused: it cannot be encoded
                key = row.key.encode()
                records = ((row.topic, value), *derived.get(row.id, ()))  # delivered together, or not at all
                too_large = next((size for _, record in records
                                  if (size := estimate_size(key, record, [])) > self.settings.kafka_max_message_bytes), None)
                if too_large is not None:  # can never be produced with these settings (as `send` would refuse it)
                    refused.append((row, f"MessageSizeTooLargeError: a record of the row is {too_large} bytes "
                                         f"serialized, over METALEDGER_KAFKA_MAX_MESSAGE_BYTES"))
                    continue
                for topic, record in records:
                    if topic not in partitions:
                        partitions[topic] = sorted(await producer.partitions_for(topic))
                    tp = (topic, self._partitioner(key, partitions[topic], partitions[topic]))
                    if tp not in batches:
                        batches[tp] = (producer.create_batch(), [])
                    if batches[tp][0].append(timestamp=None, key=key, value=record) is None:  # full: send it
                        await submit(tp)
                        batches[tp] = (producer.create_batch(), [])
                        batches[tp][0].append(timestamp=None, key=key, value=record)  # a first record always fits
                    batches[tp][1].append(row)
        except Exception as error:  # noqa: BLE001 - e.g. no metadata for a topic: nothing of this batch is sent
            for builder, in_batch in batches.values():
                sent.extend((row, error) for row in in_batch)
            batches.clear()
            sent.extend((row, error) for row in rows if row.id not in refused_ids and row.id in values)
        for tp in list(batches):
            await submit(tp)
        futures = list({id(f): f for _, f in sent if isinstance(f, asyncio.Future)}.values())
        if futures:
            try:
                await asyncio.wait_for(asyncio.wait(futures), timeout=PRODUCE_TIMEOUT_MS / 1000 + 5)
            except TimeoutError:
                pass
        order = {row.id: n for n, row in enumerate(rows)}
        sent.sort(key=lambda item: order[item[0].id])  # rows in feed order, whichever batch sent their records
        outcomes: dict[int, list[asyncio.Future | BaseException]] = {}  # a row's change log and derived events
        sent_rows: list[outbox.PendingRow] = []
        for row, outcome in sent:
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
            error = errors[0] if errors else None
            if error is None and (row.topic, row.key) not in failed_keys:
                delivered.append(row)
                continue
            if isinstance(error, MessageSizeTooLargeError):
                broker_too_large.append(row)  # the broker refused the whole record batch this row was in
            failed_keys.add((row.topic, row.key))
            first_error = first_error or error
        if broker_too_large and len(broker_too_large) == len(sent_rows) - len(delivered):
            # Only size refusals: send the rest one by one to find the rows that are too large on their own.
            return await self._produce_one_by_one(rows, values, derived, delivered, refused)
        return delivered, refused, first_error

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
        return values

    def _derive(self, rows: list[outbox.PendingRow],
                refused: list[tuple[outbox.PendingRow, str]]) -> dict[int, list[tuple[str, bytes | None]]]:
        """Each row's derived events (row id → [(topic, value; None: a tombstone)]); a row whose events cannot be
        built is refused with the reason, like a row that cannot be encoded (kept, with its publish error)."""
        if self.derived is None:
            return {}
        derived: dict[int, list[tuple[str, bytes | None]]] = {}
        for row in rows:
            try:
                events = self.derived.for_row(row.topic, row.key, row.aspect, row.payload)
            except ValueError as error:  # AvroEncodeError: a value its generated record cannot carry
                refused.append((row, f"the row's derived events cannot be encoded: {error}"))
                continue
            if events:
                derived[row.id] = events
        return derived

    async def _produce_one_by_one(self, rows, values, derived, delivered, refused):
        done = {row.id for row in delivered} | {row.id for row, _ in refused}
        failed_keys: set[tuple[str, str]] = set()
        first_error = None
        for row in rows:
            if row.id in done:
                continue
            if (row.topic, row.key) in failed_keys:
                continue
            try:
                key = row.key.encode()
                await (await self._producer.send(row.topic, values[row.id], key=key))
                for topic, event in derived.get(row.id, ()):
                    await (await self._producer.send(topic, event, key=key))
                delivered.append(row)
            except MessageSizeTooLargeError as error:
                refused.append((row, f"{type(error).__name__}: {error}"))
            except Exception as error:  # noqa: BLE001
                failed_keys.add((row.topic, row.key))
                first_error = first_error or error
        delivered.sort(key=lambda r: r.feed_offset)
        return delivered, refused, first_error


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
