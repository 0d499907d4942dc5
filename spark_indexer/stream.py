"""The streaming job: the change-log topics → search documents, lineage edges and timeseries points, continuously.

Per micro-batch (`BatchSink.__call__`, Spark's `foreachBatch`):
1. index: one task per topic partition with records (the record key is the URN, so one entity's change logs are in
   one partition, in order), or, with `spark_index_partitions` > 0, that many tasks by record key; each task runs `spark_indexer.batch.IndexTask`: parse, newest
   version per (urn, aspect), build changes with `app.search.documents`, bulk apply;
2. dead letters: records that are not change logs the registry knows (or that the backend refuses) are appended
   to a Parquet table (`dead_letter_dir`, by day) with the reason, the record and its topic/partition/offset;
   the registry is the base models plus the runtime model set stored in the database (app.registry.runtime): the
   driver reads the set's version once per batch (`ModelVersionProbe`), after the batch's offsets are fixed, so
   every change log in it was written under that version or an older one; a task whose registry is at another
   version takes the set up first, and one that meets an aspect or entity type its registry does not know checks
   the stored version again before dead-lettering it (a database read with a lag);
3. timeseries analytics: the batch's timeseries change logs are appended to a Parquet dataset partitioned by
   aspect and day (`timeseries_dir`), once per batch (a marker per query and batch id, under `timeseries_dir`,
   makes a replayed batch a no-op); the index tasks decode them anyway and give them back as rows of their result
   (`spark_indexer.batch.Point`), which is kept on the executors until they are written: a batch is read from the
   topics and decoded once;
4. a progress line: rows, change logs applied, changes, dead letters, duration, rate and lag (high watermark
   minus the batch's end offsets); the same figures for Prometheus when a textfile or a Pushgateway is configured
   (spark_indexer.metrics).

Offsets live in the checkpoint directory; a restart (after `kill -9` too) resumes from the last committed batch and
replays at most the batch that was running, which the order-safe apply makes harmless.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_indexer.batch import COUNTS, POINT, RESULT_SCHEMA, index_partition_fn
from spark_indexer.config import DatabaseNotFoundError, IndexerSettings, storage_join, with_database
from spark_indexer.metrics import BatchReporter
from spark_indexer.sink import settings_payload

log = logging.getLogger("metaledger.spark_indexer")

DEAD_LETTER_SCHEMA = (
    "failed_at timestamp, day string, query_id string, batch_id long, topic string, partition int, offset long, "
    "urn string, aspect string, reason string, key binary, value string"
)


@dataclass
class BatchMetrics:
    batch_id: int
    rows: int = 0
    applied: int = 0  # change logs written (after the newest-version-per-aspect filter)
    superseded: int = 0
    changes: int = 0
    dead_letters: int = 0
    timeseries_rows: int = 0
    seconds: float = 0.0
    task_seconds: float = 0.0  # summed over the batch's tasks: parsing, building and writing (the rest is Spark's)
    lag: int | None = None  # records on the topics not yet indexed after this batch (None: unknown)

    def line(self) -> str:
        rate = self.rows / self.seconds if self.seconds > 0 else 0.0
        lag = "?" if self.lag is None else f"{self.lag:,}"
        return (
            f"batch {self.batch_id}: {self.rows:,} records → {self.applied:,} change logs applied "
            f"({self.superseded:,} superseded in-batch), {self.changes:,} index changes, "
            f"{self.timeseries_rows:,} timeseries rows archived, {self.dead_letters:,} dead letters, "
            f"{self.seconds:.2f} s ({self.task_seconds:.2f} s in tasks), {rate:,.0f} records/s, lag {lag}"
        )


@dataclass
class StreamResult:
    batches: list[BatchMetrics] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.batches)

    @property
    def dead_letters(self) -> int:
        return sum(b.dead_letters for b in self.batches)

    def summary(self) -> str:
        seconds = sum(b.seconds for b in self.batches)
        rate = self.rows / seconds if seconds else 0.0
        return (
            f"{len(self.batches)} batches, {self.rows:,} records, {sum(b.changes for b in self.batches):,} index "
            f"changes, {self.dead_letters:,} dead letters, {seconds:.1f} s in batches ({rate:,.0f} records/s)"
        )


class StorageFile:
    """A file at a Hadoop filesystem URI (the job's storage settings), through the driver JVM's Hadoop FileSystem:
    it lives where the Parquet data it marks lives (s3a://, hdfs://, file://), never on the driver's local disk."""

    def __init__(self, spark: SparkSession, uri: str) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None  # a driver's context: its JVM is up
        self.uri = uri
        self.path = jvm.org.apache.hadoop.fs.Path(uri)
        self.fs = self.path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def exists(self) -> bool:
        return bool(self.fs.exists(self.path))

    def touch(self) -> None:
        self.fs.create(self.path, True).close()  # parents are created as needed


class ModelVersionProbe:
    """On the driver: the stored runtime model set's version (app.write.runtime_models.stored_version), read once per
    micro-batch on a connection kept between batches."""

    def __init__(self, database_url: str) -> None:
        from spark_indexer.postgres_source import asyncpg_dsn

        self.dsn = asyncpg_dsn(database_url)
        self.loop = asyncio.new_event_loop()
        self.conn: Any = None

    def version(self) -> int | None:
        """None when the database does not answer: the tasks keep the models they have (and still re-check before
        dead-lettering a record they do not know)."""
        try:
            return self.loop.run_until_complete(self._read())
        except Exception as error:  # noqa: BLE001 - an outage must not stop indexing what the registry knows
            log.warning("runtime model set's version not read", extra={"error": f"{type(error).__name__}: {error}"})
            self.close()
            self.loop = asyncio.new_event_loop()
            return None

    async def _read(self) -> int:
        import asyncpg

        from app.modelset.store import stored_version

        if self.conn is None or self.conn.is_closed():
            self.conn = await asyncpg.connect(
                self.dsn, server_settings={"application_name": "metaledger-spark-indexer"}
            )
        return await stored_version(self.conn)

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.terminate()  # no query in flight: nothing to finish first
        self.loop.close()


class BatchSink:
    """Spark's `foreachBatch` function for the change-log stream."""

    def __init__(self, spark: SparkSession, settings: IndexerSettings, *, echo: bool = True) -> None:
        self.spark = spark
        self.settings = settings
        self.echo = echo
        self.payload = settings_payload(settings)
        self.timeseries_topic = settings.topic_mcl_timeseries
        self.topics = [settings.topic_mcl_versioned, settings.topic_mcl_timeseries]
        self.partitions = settings.spark_index_partitions  # 0: index in the topics' own partitions, no shuffle
        self.result = StreamResult()
        self.positions: dict[tuple[str, int], int] = {}  # next offset to index per topic partition
        self.reporter = BatchReporter.from_settings(settings)  # Prometheus textfile / Pushgateway, when configured
        self.models = ModelVersionProbe(settings.database_url) if settings.database_url else None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        t0 = time.perf_counter()
        metrics = BatchMetrics(batch_id)
        records = batch.select("topic", "partition", "offset", "key", "value")
        if self.partitions > 0:
            records = records.repartition(self.partitions, "key")
        results = records.mapInArrow(
            index_partition_fn(
                self.payload,
                self.timeseries_topic,
                self.settings.spark_apply_chunk,
                self.models.version() if self.models is not None else None,
            ),
            RESULT_SCHEMA,
        ).persist()  # indexed once: the points are written from the tasks' kept results, not by indexing again
        try:
            rows = results.where(F.col("kind") != POINT).collect()
            dead: list[Any] = []
            for row in rows:
                kind = row["kind"]
                if kind == "dead":
                    dead.append(row)
                elif kind == "max_offset":
                    key = (row["topic"], row["partition"])
                    self.positions[key] = max(self.positions.get(key, 0), row["offset"] + 1)
                elif kind in COUNTS:
                    setattr(metrics, kind, getattr(metrics, kind) + row["count"])
                elif kind == "millis":
                    metrics.task_seconds += row["count"] / 1000
            metrics.dead_letters = len(dead)
            if dead:
                self._write_dead_letters(dead, batch_id)
            # the tasks counted the batch's points; the archive says how many it wrote (none for a replayed batch)
            metrics.timeseries_rows = self._archive_timeseries(results, batch_id, metrics.timeseries_rows)
        finally:
            results.unpersist()
        metrics.seconds = time.perf_counter() - t0
        metrics.lag = self._lag()
        self.result.batches.append(metrics)
        log.info(
            metrics.line(),
            extra={
                "batch_id": batch_id,
                "rows": metrics.rows,
                "dead_letters": metrics.dead_letters,
                "lag": metrics.lag,
                "seconds": round(metrics.seconds, 3),
            },
        )
        if self.reporter is not None:
            self.reporter.report(metrics)
        if self.echo:
            print(metrics.line(), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.models is not None:
            self.models.close()

    def _query_id(self) -> str:
        return self.spark.sparkContext.getLocalProperty("sql.streaming.queryId") or "query"

    def _write_dead_letters(self, dead: list[Any], batch_id: int) -> None:
        now = datetime.now(UTC)
        query_id = self._query_id()
        rows = [
            (
                now,
                now.strftime("%Y-%m-%d"),
                query_id,
                batch_id,
                d["topic"],
                d["partition"],
                d["offset"],
                d["urn"],
                d["aspect"],
                d["reason"],
                d["key"],
                (d["value"] or b"").decode("utf-8", "replace"),
            )
            for d in dead
        ]
        for d in dead[:20]:
            log.error(
                "dead letter",
                extra={
                    "urn": d["urn"],
                    "aspect": d["aspect"],
                    "reason": d["reason"],
                    "topic": d["topic"],
                    "partition": d["partition"],
                    "offset": d["offset"],
                },
            )
        frame = self.spark.createDataFrame(rows, DEAD_LETTER_SCHEMA)
        frame.write.mode("append").partitionBy("day").parquet(self.settings.dead_letter_dir)

    def _archive_timeseries(self, results: DataFrame, batch_id: int, points: int) -> int:
        """Append the batch's `points` timeseries rows (the index tasks' `point` rows of `results`) to the Parquet
        dataset, once per query and batch: a replayed batch writes nothing. Returns the rows written."""
        root = self.settings.timeseries_dir
        marker = StorageFile(self.spark, storage_join(root, "_batches", f"{self._query_id()}-{batch_id}"))
        if marker.exists():
            return 0
        if points:
            (
                results.where(F.col("kind") == POINT)
                .select(
                    "urn",
                    "entity_type",
                    "aspect",
                    "timestamp_ms",
                    "event",
                    "run_id",
                    F.col("partition").alias("kafka_partition"),
                    F.col("offset").alias("kafka_offset"),
                )
                .withColumn("day", F.date_format(F.timestamp_millis(F.col("timestamp_ms")), "yyyy-MM-dd"))
                .withColumn("batch_id", F.lit(batch_id).cast("long"))
                .write.mode("append")
                .partitionBy("aspect", "day")
                .parquet(root)
            )
        marker.touch()
        return points

    def _lag(self) -> int | None:
        if not self.settings.kafka_bootstrap_servers:
            return None
        try:
            from spark_indexer.kafka_source import topic_end_offsets

            ends = topic_end_offsets(self.settings.kafka_bootstrap_servers, self.topics)
        except Exception as error:  # noqa: BLE001 - lag is a figure, never a reason to fail a batch
            log.warning("lag unknown", extra={"error": f"{type(error).__name__}: {error}"})
            return None
        lag = 0
        for topic, partitions in ends.items():
            for partition, end in partitions.items():
                position = self.positions.get((topic, int(partition)))
                if position is not None:
                    lag += max(0, end - position)
        return lag


def run_stream(
    spark: SparkSession,
    settings: IndexerSettings,
    *,
    checkpoint: str | None = None,
    once: bool = False,
    echo: bool = True,
) -> StreamResult:
    """Run the streaming job: until stopped, or with `once` until everything on the topics now is indexed."""
    from spark_indexer.kafka_source import read_stream

    if not settings.kafka_bootstrap_servers:
        raise RuntimeError("the streaming job reads the change-log topics: set METALEDGER_KAFKA_BOOTSTRAP_SERVERS")
    if not settings.search_url:  # the embedded Postgres search backend: its tables are in the database
        settings = with_database(settings)
    else:
        try:  # the runtime model set is read from the database
            settings = with_database(settings)
        except DatabaseNotFoundError as error:
            log.warning(f"the stream indexes the base models only (runtime models are not followed): {error}")
    sink = BatchSink(spark, settings, echo=echo)
    source = read_stream(spark, settings, sink.topics)
    writer = (
        source.writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint or settings.checkpoint_dir)
        .queryName("metaledger-indexer")
    )
    writer = (
        writer.trigger(availableNow=True)
        if once
        else writer.trigger(processingTime=f"{settings.spark_trigger_interval_s} seconds")
    )
    query = writer.start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    finally:
        sink.close()
    return sink.result
