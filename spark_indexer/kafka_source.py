"""A Kafka source for Spark Structured Streaming written with PySpark's Python Data Source API.

Spark's own `format("kafka")` needs the spark-sql-kafka jar, which cannot be obtained on every machine; this source
needs nothing but aiokafka and pyarrow on the driver and the executors. `read_stream(spark, settings, topics)` gives
the same columns from either source (`settings.spark_source`: "python" = this one, "native" = Spark's).

Format name `metaledger_kafka` (call `register(spark)` first). Options:

* `bootstrap.servers` (required): Kafka bootstrap servers, "host:port,host:port".
* `topics` (required): comma-separated topic names. A topic that does not exist (yet) has no partitions; once it is
  created its partitions are read from their earliest offset. Partitions are discovered on every micro-batch.
* `startingOffsets`: only `earliest` (the default) is supported.
* `maxOffsetsPerTrigger` (optional): records per micro-batch at most, in total over all partitions (shared in
  proportion to each partition's backlog). Spark passes it back as the read limit of `latestOffset(start, limit)`;
  a `ReadAllAvailable` limit from the engine wins over it, as the API requires.
* `failOnDataLoss` (default `true`): when records a batch should read are gone (retention, a recreated topic), fail
  the query; `false` skips to what is there (like Spark's Kafka source).
* `fetchMaxBytes` / `partitionFetchMaxBytes` / `fetchMaxWaitMs`: tuning of the executors' Fetch requests.

Schema (the subset of Spark's Kafka source columns that the indexer uses, same names and types):
`key binary, value binary, topic string, partition int, offset long, timestamp timestamp, timestampType int`.

Offsets are `{"topic": {"<partition>": next_offset, ...}, ...}` (the checkpoint holds them; `commit` does nothing, no
consumer group is used). Records are read as in `read_uncommitted` (like Spark's default); control batches are
skipped and positions advance by record offsets, so compaction and transaction-marker gaps are not a problem.

Latest offsets come from the high watermark of a Fetch response, not from ListOffsets: the test broker (Tansu)
answers ListOffsets "latest" wrongly after batched produce. Each call fetches at the last known high watermark (or
the current position), with a tiny byte limit and no wait, so it costs at most one record batch per partition.

`Trigger.AvailableNow` is supported (the reader implements `SupportsTriggerAvailableNow`: the high watermarks at
query start are the target; with `maxOffsetsPerTrigger` it still splits into several micro-batches).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

if TYPE_CHECKING:  # pragma: no cover
    from aiokafka.client import AIOKafkaClient
    from aiokafka.cluster import ClusterMetadata
    from pyspark.sql import DataFrame, SparkSession

    from spark_indexer.config import IndexerSettings

log = logging.getLogger("metaledger.spark.kafka_source")

SOURCE_NAME = "metaledger_kafka"
COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
# What Spark expects from `read()` for KAFKA_SCHEMA (pyspark's to_arrow_schema(KAFKA_SCHEMA, timezone="UTC")).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
)

DEFAULT_FETCH_MAX_BYTES = 16 * 1024 * 1024  # one Fetch response of a read task
DEFAULT_PARTITION_FETCH_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_FETCH_MAX_WAIT_MS = 200  # only waited when a read task is ahead of the broker's high watermark
REQUEST_TIMEOUT_MS = 30_000
READ_STALL_TIMEOUT_S = 60.0  # a read task that makes no progress this long fails
READ_UNCOMMITTED = 0
EARLIEST = -2  # ListOffsets timestamp

TopicPartitionKey = tuple[str, int]


# ------------------------------------------------------------------------------------------------------------------
# Options
# ------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceOptions:
    bootstrap_servers: str
    topics: tuple[str, ...]
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    partition_fetch_max_bytes: int = DEFAULT_PARTITION_FETCH_MAX_BYTES
    fetch_max_wait_ms: int = DEFAULT_FETCH_MAX_WAIT_MS

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {str(k).lower(): v for k, v in dict(options).items()}
        bootstrap = (opts.get("bootstrap.servers") or opts.get("kafka.bootstrap.servers") or "").strip()
        if not bootstrap:
            raise ValueError(f"{SOURCE_NAME}: option 'bootstrap.servers' is required")
        topics = tuple(t.strip() for t in (opts.get("topics") or opts.get("subscribe") or "").split(",") if t.strip())
        if not topics:
            raise ValueError(f"{SOURCE_NAME}: option 'topics' (comma-separated topic names) is required")
        starting = (opts.get("startingoffsets") or "earliest").strip().lower()
        if starting != "earliest":
            raise ValueError(f"{SOURCE_NAME}: startingOffsets={starting!r} is not supported (only 'earliest')")
        max_offsets = opts.get("maxoffsetspertrigger")
        max_offsets_int = int(max_offsets) if max_offsets not in (None, "") else None
        if max_offsets_int is not None and max_offsets_int <= 0:
            max_offsets_int = None
        fail = str(opts.get("failondataloss", "true")).strip().lower() not in ("false", "0", "no")
        return cls(
            bootstrap_servers=bootstrap,
            topics=topics,
            max_offsets_per_trigger=max_offsets_int,
            fail_on_data_loss=fail,
            fetch_max_bytes=int(opts.get("fetchmaxbytes") or DEFAULT_FETCH_MAX_BYTES),
            partition_fetch_max_bytes=int(opts.get("partitionfetchmaxbytes") or DEFAULT_PARTITION_FETCH_MAX_BYTES),
            fetch_max_wait_ms=int(opts.get("fetchmaxwaitms") or DEFAULT_FETCH_MAX_WAIT_MS),
        )


# ------------------------------------------------------------------------------------------------------------------
# Kafka protocol helpers (aiokafka's low-level client)
# ------------------------------------------------------------------------------------------------------------------


async def _connect(bootstrap_servers: str) -> AIOKafkaClient:
    from aiokafka.client import AIOKafkaClient

    client = AIOKafkaClient(
        bootstrap_servers=bootstrap_servers, client_id="metaledger-spark-source", request_timeout_ms=REQUEST_TIMEOUT_MS
    )
    try:
        await client.bootstrap()
    except BaseException:
        await client.close()
        raise
    return client


async def _metadata(client: AIOKafkaClient) -> ClusterMetadata:
    """Metadata of all topics: asking for named topics could auto-create them on some brokers."""
    return await client.fetch_all_metadata()


def _topic_partitions(md: ClusterMetadata, topics: tuple[str, ...] | list[str]) -> list[TopicPartitionKey]:
    out = []
    for topic in topics:
        for p in sorted(md.partitions_for_topic(topic) or ()):
            out.append((topic, p))
    return out


def _by_leader(md: ClusterMetadata, tps: list[TopicPartitionKey]) -> dict[int, list[TopicPartitionKey]]:
    from aiokafka.structs import TopicPartition

    grouped: dict[int, list[TopicPartitionKey]] = {}
    for topic, p in tps:
        leader = md.leader_for_partition(TopicPartition(topic, p))
        if leader is None or leader < 0:
            continue  # no leader right now (election): no offsets for it this time
        grouped.setdefault(leader, []).append((topic, p))
    return grouped


def _by_topic(items: list[tuple[str, int, Any]]) -> list[tuple[str, list[tuple[int, Any]]]]:
    grouped: dict[str, list[tuple[int, Any]]] = {}
    for topic, p, value in items:
        grouped.setdefault(topic, []).append((p, value))
    return list(grouped.items())


async def _earliest_offsets(
    client: AIOKafkaClient, md: ClusterMetadata, tps: list[TopicPartitionKey]
) -> dict[TopicPartitionKey, int]:
    """Log-start offsets (ListOffsets "earliest" is right on Tansu; only "latest" is not)."""
    from aiokafka.errors import for_code
    from aiokafka.protocol.offset import OffsetRequest

    out: dict[TopicPartitionKey, int] = {}

    async def one(node: int, node_tps: list[TopicPartitionKey]) -> None:
        request = OffsetRequest(-1, READ_UNCOMMITTED, _by_topic([(t, p, EARLIEST) for t, p in node_tps]))
        response = await client.send(node, request)
        for topic, parts in response.topics:
            for part, error_code, *info in parts:
                if for_code(error_code) is not for_code(0):
                    continue
                offset = info[-1]
                if isinstance(offset, list):  # v0: a list of offsets
                    offset = offset[0] if offset else 0
                out[(topic, part)] = int(offset)

    await asyncio.gather(*(one(node, node_tps) for node, node_tps in _by_leader(md, tps).items()))
    return out


async def _high_watermarks(
    client: AIOKafkaClient, md: ClusterMetadata, positions: dict[TopicPartitionKey, int]
) -> dict[TopicPartitionKey, int]:
    """High watermark of each partition from a Fetch at `positions` (max 1 byte, ~no wait: at most one record batch
    comes back per partition). A position out of range is retried at the log start. Partitions without a leader or
    with another error are left out (the caller keeps their previous offset).

    Tansu answers a Fetch with max_wait_ms=0 with no partitions at all, so the wait is 1 ms (it is waited in full
    when there is no new data); partitions missing from an answer are asked again with a longer wait."""
    from aiokafka.errors import OffsetOutOfRangeError, for_code
    from aiokafka.protocol.fetch import FetchRequest

    out: dict[TopicPartitionKey, int] = {}
    out_of_range: list[TopicPartitionKey] = []
    failed: set[TopicPartitionKey] = set()

    async def one(node: int, node_positions: dict[TopicPartitionKey, int], wait_ms: int) -> None:
        topics: dict[str, list[tuple[int, int, int]]] = {}
        for (t, p), pos in node_positions.items():
            topics.setdefault(t, []).append((p, pos, 1))  # (partition, fetch offset, max bytes)
        response = await client.send(node, FetchRequest(wait_ms, 0, 1, READ_UNCOMMITTED, list(topics.items())))
        for topic, parts in response.topics:
            for part, error_code, highwater, *_ in parts:
                error = for_code(error_code)
                if error is for_code(0) and highwater >= 0:
                    out[(topic, part)] = int(highwater)
                elif error is OffsetOutOfRangeError:
                    out_of_range.append((topic, part))
                else:
                    failed.add((topic, part))

    async def fetch_all(pos: dict[TopicPartitionKey, int]) -> None:
        for wait_ms in (1, 10, 100):
            pos = {tp: off for tp, off in pos.items() if tp not in out and tp not in failed and tp not in out_of_range}
            if not pos:
                return
            grouped = _by_leader(md, list(pos))
            await asyncio.gather(*(one(node, {tp: pos[tp] for tp in tps}, wait_ms) for node, tps in grouped.items()))

    await fetch_all(positions)
    if out_of_range:
        retry = await _earliest_offsets(client, md, out_of_range)
        out_of_range.clear()
        await fetch_all(retry)
    return out


async def _end_offsets(bootstrap_servers: str, topics: list[str] | tuple[str, ...]) -> dict[str, dict[int, int]]:
    client = await _connect(bootstrap_servers)
    try:
        md = await _metadata(client)
        tps = _topic_partitions(md, topics)
        starts = await _earliest_offsets(client, md, tps)
        hws = await _high_watermarks(client, md, {tp: starts.get(tp, 0) for tp in tps})
    finally:
        await client.close()
    result: dict[str, dict[int, int]] = {t: {} for t in topics}
    for (topic, p), hw in hws.items():
        result[topic][p] = hw
    return result


def topic_end_offsets(bootstrap_servers: str, topics: list[str] | tuple[str, ...]) -> dict[str, dict[int, int]]:
    """`{topic: {partition: high_watermark}}` from Fetch responses (not ListOffsets, wrong on Tansu); a topic that
    does not exist maps to `{}`. For lag metrics."""
    return asyncio.run(_end_offsets(bootstrap_servers, list(topics)))


# ------------------------------------------------------------------------------------------------------------------
# Offsets
# ------------------------------------------------------------------------------------------------------------------


def _offsets_to_json(offsets: dict[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, p), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(p)] = int(off)
    return out


def _offsets_from_json(offsets: Mapping[str, Mapping[str, int]] | None) -> dict[TopicPartitionKey, int]:
    return {(topic, int(p)): int(off) for topic, parts in (offsets or {}).items() for p, off in parts.items()}


def _apply_limit(
    start: dict[TopicPartitionKey, int], latest: dict[TopicPartitionKey, int], max_rows: int | None
) -> dict[TopicPartitionKey, int]:
    """End offsets at most `max_rows` records after `start` in total, shared in proportion to each backlog."""
    lags = {tp: latest[tp] - start.get(tp, 0) for tp in latest if latest[tp] > start.get(tp, 0)}
    total = sum(lags.values())
    if max_rows is None or total <= max_rows:
        return dict(latest)
    end = {tp: start.get(tp, latest[tp]) for tp in latest}
    end.update({tp: start.get(tp, 0) for tp in lags})
    shares = {tp: lag * max_rows // total for tp, lag in lags.items()}
    left = max_rows - sum(shares.values())
    for tp in sorted(lags, key=lambda k: (-(lags[k] - shares[k]), k)):  # the rest, one each, biggest backlog first
        if left <= 0:
            break
        if shares[tp] < lags[tp]:
            shares[tp] += 1
            left -= 1
    for tp, share in shares.items():
        end[tp] += share
    return end


# ------------------------------------------------------------------------------------------------------------------
# Reading one offset range (executors)
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class KafkaInputPartition(InputPartition):
    topic: str
    partition: int
    start: int  # first offset to read
    end: int  # offset not to read any more (exclusive)
    from_earliest: bool = False  # a partition new in this batch: out of range at `start` means "from the log start"

    def __init__(self, topic: str, partition: int, start: int, end: int, from_earliest: bool = False) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end, self.from_earliest = (
            topic,
            partition,
            start,
            end,
            from_earliest,
        )


class DataLossError(RuntimeError):
    pass


def _records_to_batch(
    topic: str, partition: int, keys: list, values: list, offsets: list, timestamps: list, timestamp_types: list
) -> pa.RecordBatch:
    n = len(offsets)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, type=pa.binary()),
            pa.array(values, type=pa.binary()),
            pa.array([topic] * n, type=pa.string()),
            pa.array([partition] * n, type=pa.int32()),
            pa.array(offsets, type=pa.int64()),
            pa.array(timestamps, type=pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC")),
            pa.array(timestamp_types, type=pa.int32()),
        ],
        schema=ARROW_SCHEMA,
    )


def read_range(options: SourceOptions, part: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    """Records `part.start` ≤ offset < `part.end` of one partition, one Arrow batch per Fetch response.

    Positions advance by record offsets and by each batch's next offset (control batches, compacted or aborted
    gaps), and reading stops as soon as the position reaches `end`."""
    from aiokafka.errors import (
        NotLeaderForPartitionError,
        OffsetOutOfRangeError,
        UnknownTopicOrPartitionError,
        for_code,
    )
    from aiokafka.protocol.fetch import FetchRequest
    from aiokafka.record.memory_records import MemoryRecords
    from aiokafka.structs import TopicPartition

    topic, partition, end = part.topic, part.partition, part.end
    pos = part.start
    if pos >= end:
        return
    loop = asyncio.new_event_loop()
    client = None
    try:
        client = loop.run_until_complete(_connect(options.bootstrap_servers))
        md = loop.run_until_complete(_metadata(client))
        tp = TopicPartition(topic, partition)
        last_progress = time.monotonic()
        while pos < end:
            leader = md.leader_for_partition(tp)
            if leader is None or leader < 0:
                if time.monotonic() - last_progress > READ_STALL_TIMEOUT_S:
                    raise RuntimeError(f"{topic}-{partition}: no leader for {READ_STALL_TIMEOUT_S:.0f} s")
                time.sleep(0.2)
                md = loop.run_until_complete(_metadata(client))
                continue
            request = FetchRequest(
                options.fetch_max_wait_ms,
                1,
                options.fetch_max_bytes,
                READ_UNCOMMITTED,
                [(topic, [(partition, pos, options.partition_fetch_max_bytes)])],
            )
            response = loop.run_until_complete(client.send(leader, request))
            ((_, parts),) = response.topics
            _part, error_code, highwater, *part_data = parts[0]
            error = for_code(error_code)
            if error is OffsetOutOfRangeError:
                earliest = loop.run_until_complete(_earliest_offsets(client, md, [(topic, partition)]))
                log_start = earliest.get((topic, partition))
                if log_start is None or log_start <= pos:
                    raise DataLossError(
                        f"{topic}-{partition}: offset {pos} is out of range (log start {log_start}, "
                        f"high watermark {highwater}); the batch was planned up to {end}"
                    )
                if not part.from_earliest and options.fail_on_data_loss:
                    raise DataLossError(
                        f"{topic}-{partition}: offsets {pos}..{log_start - 1} are gone (retention?); "
                        "set failOnDataLoss=false to skip them"
                    )
                if not part.from_earliest:
                    log.warning("%s-%d: offsets %d..%d are gone, skipped", topic, partition, pos, log_start - 1)
                pos = log_start
                continue
            if error in (NotLeaderForPartitionError, UnknownTopicOrPartitionError):
                if time.monotonic() - last_progress > READ_STALL_TIMEOUT_S:
                    raise error()
                time.sleep(0.2)
                md = loop.run_until_complete(_metadata(client))
                continue
            if error is not for_code(0):
                raise error()
            records = MemoryRecords(part_data[-1])
            keys: list = []
            values: list = []
            offsets: list = []
            timestamps: list = []
            timestamp_types: list = []
            start_pos = pos
            while pos < end and records.has_next():
                batch = records.next_batch()
                if batch is None:  # a truncated batch at the end of the response
                    break
                if not getattr(batch, "is_control_batch", False):
                    batch_ts_type = getattr(batch, "timestamp_type", None)
                    for record in batch:
                        offset = record.offset
                        if offset < pos:
                            continue  # older records of a compressed legacy message set
                        if offset >= end:
                            pos = end
                            break
                        keys.append(record.key)
                        values.append(record.value)
                        offsets.append(offset)
                        timestamps.append(record.timestamp)
                        timestamp_types.append(
                            batch_ts_type if batch_ts_type is not None else getattr(record, "timestamp_type", 0) or 0
                        )
                        pos = offset + 1
                next_offset = getattr(batch, "next_offset", None)
                if next_offset is not None and next_offset > pos:
                    pos = min(next_offset, end)
            if offsets:
                yield _records_to_batch(topic, partition, keys, values, offsets, timestamps, timestamp_types)
            if pos > start_pos:
                last_progress = time.monotonic()
            else:
                if highwater <= pos and time.monotonic() - last_progress > READ_STALL_TIMEOUT_S:
                    raise DataLossError(
                        f"{topic}-{partition}: the batch was planned up to offset {end} but the "
                        f"high watermark is {highwater} (topic recreated or truncated?)"
                    )
                if records.size_in_bytes() > 0 and not offsets:
                    # a record batch bigger than the byte limit cannot come back whole: take more next time
                    options = _grow(options)
    finally:
        if client is not None:
            loop.run_until_complete(client.close())
        loop.close()


def _grow(options: SourceOptions) -> SourceOptions:
    from dataclasses import replace

    size = max(options.partition_fetch_max_bytes, options.fetch_max_bytes) * 2
    return replace(options, partition_fetch_max_bytes=size, fetch_max_bytes=size)


# ------------------------------------------------------------------------------------------------------------------
# The data source
# ------------------------------------------------------------------------------------------------------------------


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side: offsets and planning (one long-lived Python process per query, which keeps one Kafka client);
    `read` runs on the executors."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: AIOKafkaClient | None = None
        self._known_hw: dict[TopicPartitionKey, int] = {}
        self._target: dict[TopicPartitionKey, int] | None = None  # Trigger.AvailableNow: offsets not to pass

    def __getstate__(self) -> dict[str, Any]:  # the client and loop never leave the driver process
        return {"options": self.options, "_loop": None, "_client": None, "_known_hw": {}, "_target": None}

    # -- Kafka access on the driver ---------------------------------------------------------------------------------

    def _run(self, make_coro):
        """Run `make_coro(client)` on this reader's loop and client, reconnecting once on a connection error."""
        from aiokafka.errors import KafkaConnectionError, KafkaError

        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        for attempt in (1, 2):
            if self._client is None:
                self._client = self._loop.run_until_complete(_connect(self.options.bootstrap_servers))
            try:
                return self._loop.run_until_complete(make_coro(self._client))
            except (TimeoutError, KafkaConnectionError, KafkaError, OSError):
                self._close_client()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _close_client(self) -> None:
        if self._client is not None and self._loop is not None:
            try:
                self._loop.run_until_complete(self._client.close())
            except Exception:  # noqa: BLE001 - closing a broken client
                pass
        self._client = None

    def _current_high_watermarks(self, start: dict[TopicPartitionKey, int]) -> dict[TopicPartitionKey, int]:
        async def go(client: AIOKafkaClient) -> dict[TopicPartitionKey, int]:
            md = await _metadata(client)
            tps = _topic_partitions(md, self.options.topics)
            positions = {tp: max(start.get(tp, 0), self._known_hw.get(tp, 0)) for tp in tps}
            return await _high_watermarks(client, md, positions)

        hws = self._run(go)
        self._known_hw.update(hws)
        return hws

    # -- DataSourceStreamReader -------------------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        async def go(client: AIOKafkaClient) -> dict[TopicPartitionKey, int]:
            md = await _metadata(client)
            tps = _topic_partitions(md, self.options.topics)
            earliest = await _earliest_offsets(client, md, tps)
            return {tp: earliest.get(tp, 0) for tp in tps}

        return _offsets_to_json(self._run(go))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict:
        begin = _offsets_from_json(start)
        hws = self._current_high_watermarks(begin)
        if self._target is not None:
            hws = {tp: min(hw, self._target[tp]) for tp, hw in hws.items() if tp in self._target}
        latest = dict(begin)
        for tp, hw in hws.items():
            if hw < begin.get(tp, 0):
                # fewer records than already read: the topic was recreated or truncated
                msg = (
                    f"{tp[0]}-{tp[1]}: high watermark {hw} is below the checkpointed offset {begin[tp]} "
                    "(topic recreated or truncated?)"
                )
                if self.options.fail_on_data_loss:
                    raise DataLossError(msg + "; set failOnDataLoss=false to continue from the new end")
                log.warning(msg + "; continuing from the new end")
            latest[tp] = hw
        if limit is None:
            limit = self.getDefaultReadLimit()
        max_rows = getattr(limit, "max_rows", None) if isinstance(limit, ReadMaxRows) else None
        return _offsets_to_json(_apply_limit(begin, latest, max_rows))

    def reportLatestOffset(self) -> dict | None:
        return _offsets_to_json(self._known_hw) if self._known_hw else None

    def prepareForTriggerAvailableNow(self) -> None:
        # High watermarks of every partition now (from their log start: no position is known here).
        async def go(client: AIOKafkaClient) -> dict[TopicPartitionKey, int]:
            md = await _metadata(client)
            tps = _topic_partitions(md, self.options.topics)
            earliest = await _earliest_offsets(client, md, tps)
            return await _high_watermarks(
                client, md, {tp: max(earliest.get(tp, 0), self._known_hw.get(tp, 0)) for tp in tps}
            )

        self._target = self._run(go)
        self._known_hw.update(self._target)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, finish = _offsets_from_json(start), _offsets_from_json(end)
        out: list[InputPartition] = []
        for (topic, p), stop in sorted(finish.items()):
            first = begin.get((topic, p))
            if first is None:
                if stop > 0:
                    out.append(KafkaInputPartition(topic, p, 0, stop, from_earliest=True))
            elif stop > first:
                out.append(KafkaInputPartition(topic, p, first, stop))
            elif stop < first:  # recreated/truncated topic, accepted in latestOffset with failOnDataLoss=false
                log.warning("%s-%d: offsets moved back from %d to %d; nothing read", topic, p, first, stop)
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition)
        yield from read_range(self.options, partition)

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark's checkpoint holds the offsets (no consumer group)."""

    def stop(self) -> None:
        self._close_client()
        if self._loop is not None:
            self._loop.close()
            self._loop = None


class KafkaDataSource(DataSource):
    """`spark.readStream.format("metaledger_kafka")`: see the module docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return KAFKA_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(SourceOptions.parse(self.options))


def register(spark: SparkSession) -> None:
    """Register the `metaledger_kafka` format in this session (registering again is harmless)."""
    spark.dataSource.register(KafkaDataSource)


def read_stream(spark: SparkSession, settings: IndexerSettings, topics: list[str]) -> DataFrame:
    """The streaming DataFrame of `topics` (columns `COLUMNS`) from the source `settings.spark_source` names:
    "python" (this module) or "native" (Spark's `format("kafka")`, needs the spark-sql-kafka package)."""
    if not topics:
        raise ValueError("read_stream needs at least one topic")
    source = settings.spark_source.strip().lower()
    max_offsets = settings.spark_max_offsets_per_trigger
    if source == "python":
        register(spark)
        reader = (
            spark.readStream.format(SOURCE_NAME)
            .option("bootstrap.servers", settings.kafka_bootstrap_servers)
            .option("topics", ",".join(topics))
            .option("startingOffsets", "earliest")
            .option("failOnDataLoss", "false")
        )
    elif source == "native":
        reader = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", settings.kafka_bootstrap_servers)
            .option("subscribe", ",".join(topics))
            .option("startingOffsets", "earliest")
            .option("failOnDataLoss", "false")
        )
    else:
        raise ValueError(f"spark_source must be 'python' or 'native', not {settings.spark_source!r}")
    if max_offsets and max_offsets > 0:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
    return reader.load().select(*COLUMNS)
