"""The `metaledger_kafka` streaming source (PySpark Python Data Source API) against the real test broker (Tansu)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from spark_indexer.config import IndexerSettings
from spark_indexer.kafka_source import (
    COLUMNS,
    KAFKA_SCHEMA,
    SOURCE_NAME,
    _apply_limit,
    read_stream,
    register,
    topic_end_offsets,
)

Record = tuple[str, int, int, bytes, bytes]  # topic, partition, offset, key, value


def unique(prefix: str = "ks") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int = 3) -> None:
    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            response = await admin.create_topics([NewTopic(name, partitions, 1)])
            assert all(err[1] == 0 for err in response.topic_errors), response.topic_errors
        finally:
            await admin.close()

    asyncio.run(go())


def list_topics(bootstrap: str) -> set[str]:
    async def go() -> set[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return set(await admin.list_topics())
        finally:
            await admin.close()

    return asyncio.run(go())


def produce(bootstrap: str, topic: str, count: int, start: int = 0, size: int = 16) -> list[Record]:
    """`count` keyed records (acks=all, batched); returns where each landed."""

    async def go() -> list[Record]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            linger_ms=5,
            max_batch_size=256 * 1024,
            max_request_size=8 * 1024 * 1024,
        )
        await producer.start()
        try:
            pending = []
            for i in range(start, start + count):
                key = f"key-{i}".encode()
                value = (f"value-{i}-".encode() * (size // 8 + 1))[: max(size, 12)]
                pending.append((key, value, await producer.send(topic, key=key, value=value)))
            out = []
            for key, value, fut in pending:
                meta = await fut
                out.append((topic, meta.partition, meta.offset, key, value))
            return out
        finally:
            await producer.stop()

    return asyncio.run(go())


class Collector:
    """A foreachBatch sink that keeps every row and the size of every micro-batch (runs in the driver process)."""

    def __init__(self) -> None:
        self.rows: list = []
        self.batches: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        rows = df.collect()
        with self.lock:
            self.rows.extend(rows)
            self.batches.append((batch_id, len(rows)))

    def records(self) -> list[Record]:
        return [(r.topic, r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in self.rows]


def stream(spark, bootstrap: str, topics: list[str], **options: str):
    register(spark)
    reader = (
        spark.readStream.format(SOURCE_NAME).option("bootstrap.servers", bootstrap).option("topics", ",".join(topics))
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_available_now(df, checkpoint: Path, timeout: float = 120) -> Collector:
    collector = Collector()
    query = (
        df.writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(timeout), "the availableNow query did not finish"
    finally:
        query.stop()
    if query.exception() is not None:
        raise AssertionError(f"query failed: {query.exception()}")
    return collector


def assert_exactly(received: list[Record], expected: list[Record]) -> None:
    assert len(received) == len(set(received)), "duplicate records"
    assert sorted(received) == sorted(expected)


# ----------------------------------------------------------------------------------------------------------------


def test_apply_limit_shares_the_limit_by_backlog() -> None:
    start = {("a", 0): 0, ("a", 1): 10}
    latest = {("a", 0): 100, ("a", 1): 20, ("b", 0): 30}  # ("b", 0) is new: starts at 0
    assert _apply_limit(start, latest, None) == latest
    assert _apply_limit(start, latest, 1000) == latest
    end = _apply_limit(start, latest, 14)
    assert sum(end[tp] - start.get(tp, 0) for tp in end) == 14
    assert end[("a", 0)] == 10 and end[("a", 1)] == 11 and end[("b", 0)] == 3
    end = _apply_limit(start, latest, 1)
    assert sum(end[tp] - start.get(tp, 0) for tp in end) == 1  # always progress
    assert _apply_limit({("a", 0): 5}, {("a", 0): 5}, 10) == {("a", 0): 5}


def test_topic_end_offsets_are_fetch_high_watermarks(kafka_broker) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic, missing = unique(), unique("missing")
    create_topic(bootstrap, topic, 3)
    produced = produce(bootstrap, topic, 500)
    per_partition = {p: 0 for p in range(3)}
    for _, p, offset, _, _ in produced:
        per_partition[p] = max(per_partition[p], offset + 1)
    assert topic_end_offsets(bootstrap, [topic, missing]) == {topic: per_partition, missing: {}}
    assert missing not in list_topics(bootstrap)  # asking did not auto-create it


def test_every_record_exactly_once_with_its_coordinates(spark, kafka_broker, tmp_path: Path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique()
    create_topic(bootstrap, topic, 3)
    produced = produce(bootstrap, topic, 600)
    assert len({p for _, p, _, _, _ in produced}) == 3  # the keys spread over the partitions

    df = stream(spark, bootstrap, [topic])
    assert [(f.name, f.dataType) for f in df.schema.fields] == [(f.name, f.dataType) for f in KAFKA_SCHEMA.fields]
    collector = run_available_now(df, tmp_path / "checkpoint")
    assert_exactly(collector.records(), produced)
    now = time.time()
    assert all(r.timestampType == 0 and abs(r.timestamp.timestamp() - now) < 300 for r in collector.rows)


def test_second_run_reads_only_new_records(spark, kafka_broker, tmp_path: Path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique()
    create_topic(bootstrap, topic, 2)
    first = produce(bootstrap, topic, 150)
    checkpoint = tmp_path / "checkpoint"
    assert_exactly(run_available_now(stream(spark, bootstrap, [topic]), checkpoint).records(), first)

    second = produce(bootstrap, topic, 70, start=150)
    assert_exactly(run_available_now(stream(spark, bootstrap, [topic]), checkpoint).records(), second)
    # nothing new: a third run reads nothing
    assert run_available_now(stream(spark, bootstrap, [topic]), checkpoint).records() == []


def test_max_offsets_per_trigger_splits_into_micro_batches(spark, kafka_broker, tmp_path: Path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique()
    create_topic(bootstrap, topic, 3)
    produced = produce(bootstrap, topic, 200)
    collector = run_available_now(stream(spark, bootstrap, [topic], maxOffsetsPerTrigger="60"), tmp_path / "checkpoint")
    sizes = [n for _, n in collector.batches if n]
    assert len(sizes) == 4 and max(sizes) == 60 and sum(sizes) == 200, collector.batches
    assert_exactly(collector.records(), produced)


def test_missing_and_empty_topics_then_a_topic_created_later(spark, kafka_broker, tmp_path: Path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    empty, later = unique("empty"), unique("later")
    create_topic(bootstrap, empty, 2)
    collector = Collector()
    query = (
        stream(spark, bootstrap, [empty, later])
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        # a few more triggers over the empty and the missing topic: they come on the query's 200 ms clock (the
        # processing-time trigger), so their passing is the time itself; none may fail, read, or create the topic
        time.sleep(0.5)
        assert query.exception() is None and query.isActive
        assert collector.records() == []
        assert later not in list_topics(bootstrap)  # polling for it did not create it

        create_topic(bootstrap, later, 2)
        produced = produce(bootstrap, later, 80) + produce(bootstrap, empty, 20)
        deadline = time.monotonic() + 30
        while len(collector.records()) < len(produced) and time.monotonic() < deadline:
            query.processAllAvailable()
            time.sleep(0.2)
        assert_exactly(collector.records(), produced)
    finally:
        query.stop()
    assert query.exception() is None


def test_read_stream_gives_the_same_columns_for_both_sources(spark, kafka_broker, tmp_path: Path) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    topic = unique()
    create_topic(bootstrap, topic, 2)
    produced = produce(bootstrap, topic, 90)
    settings = IndexerSettings(
        kafka_bootstrap_servers=bootstrap, spark_source="python", spark_max_offsets_per_trigger=50
    )
    df = read_stream(spark, settings, [topic])
    assert df.columns == COLUMNS and df.isStreaming
    collector = run_available_now(df, tmp_path / "checkpoint")
    assert [n for _, n in collector.batches if n] == [50, 40]
    assert_exactly(collector.records(), produced)

    # Spark's own Kafka source: the jar is not on this machine, so the format is unknown (the branch is taken).
    native = settings.model_copy(update={"spark_source": "native"})
    with pytest.raises(Exception, match="(?i)kafka"):
        read_stream(spark, native, [topic])
    with pytest.raises(ValueError):
        read_stream(spark, settings.model_copy(update={"spark_source": "other"}), [topic])


def test_options_are_checked(spark) -> None:
    from spark_indexer.kafka_source import SourceOptions

    with pytest.raises(ValueError, match="bootstrap.servers"):
        SourceOptions.parse({"topics": "a"})
    with pytest.raises(ValueError, match="topics"):
        SourceOptions.parse({"bootstrap.servers": "x:1", "topics": " , "})
    with pytest.raises(ValueError, match="startingOffsets"):
        SourceOptions.parse({"bootstrap.servers": "x:1", "topics": "a", "startingOffsets": "latest"})
    parsed = SourceOptions.parse(
        {"bootstrap.servers": "x:1", "topics": "a, b", "maxOffsetsPerTrigger": "7", "failOnDataLoss": "false"}
    )
    assert parsed.topics == ("a", "b") and parsed.max_offsets_per_trigger == 7 and not parsed.fail_on_data_loss


def test_reader_offsets_limits_and_available_now_target(kafka_broker) -> None:
    """The stream reader on its own (as Spark's driver-side runner calls it): offsets, read limits, the
    Trigger.AvailableNow target, planning and reading exact ranges."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from spark_indexer.kafka_source import KafkaInputPartition, KafkaStreamReader, SourceOptions

    bootstrap = kafka_broker.bootstrap_servers
    topic, missing = unique(), unique("missing")
    create_topic(bootstrap, topic, 2)
    produced = produce(bootstrap, topic, 100)
    ends = topic_end_offsets(bootstrap, [topic])[topic]
    reader = KafkaStreamReader(
        SourceOptions.parse(
            {"bootstrap.servers": bootstrap, "topics": f"{topic},{missing}", "maxOffsetsPerTrigger": "30"}
        )
    )
    try:
        start = reader.initialOffset()
        assert start == {topic: {"0": 0, "1": 0}}
        assert reader.getDefaultReadLimit() == ReadMaxRows(30)
        limited = reader.latestOffset(start, ReadMaxRows(30))
        assert sum(limited[topic].values()) == 30
        everything = reader.latestOffset(start, ReadAllAvailable())
        assert everything == {topic: {str(p): n for p, n in ends.items()}}
        assert reader.reportLatestOffset() == everything

        reader.prepareForTriggerAvailableNow()
        produce(bootstrap, topic, 50, start=100)  # after the target: not read by this availableNow run
        assert reader.latestOffset(everything, ReadAllAvailable()) == everything
        assert reader.partitions(everything, everything) == []

        parts = reader.partitions(start, limited) + reader.partitions(limited, everything)
        assert all(isinstance(p, KafkaInputPartition) for p in parts)
        rows = [row for part in parts for batch in reader.read(part) for row in batch.to_pylist()]
        received = [(r["topic"], r["partition"], r["offset"], r["key"], r["value"]) for r in rows]
        assert_exactly(received, produced)
    finally:
        reader.stop()
    # a fresh reader (no target) sees the later records
    fresh = KafkaStreamReader(SourceOptions.parse({"bootstrap.servers": bootstrap, "topics": topic}))
    try:
        assert sum(fresh.latestOffset(everything, fresh.getDefaultReadLimit())[topic].values()) == 150
    finally:
        fresh.stop()
