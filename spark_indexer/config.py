"""The Spark indexer's settings: the service's `METALEDGER_*` settings plus the job's own (`METALEDGER_SPARK_*`).

The database: `METALEDGER_DATABASE_URL`, or, when it is unset, the embedded Postgres `make run` (`metaledger serve`)
runs under `METALEDGER_DATA_DIR` (default `./.metaledger`): `with_database` finds it (on the port it really listens
on) and fails with a clear message when it is not running (the job does not start one of its own).
"""

from __future__ import annotations

from pathlib import Path, PurePath
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_settings import SettingsConfigDict

from app.settings import PROJECT_ROOT, Settings, group

NO_DATABASE_HINT = "start `make run` first or set METALEDGER_DATABASE_URL"


def _storage_uri(value: Any) -> Any:
    """A `Path` (from Python callers) becomes its string; a string is kept as it is (no normalisation: a `Path` would
    turn `s3a://bucket/x` into `s3a:/bucket/x`)."""
    return str(value) if isinstance(value, PurePath) else value


StorageUri = Annotated[str, BeforeValidator(_storage_uri)]


def storage_join(base: str, *parts: str) -> str:
    """`base`/`parts`, for a URI or a path alike."""
    return "/".join([base.rstrip("/"), *parts])


class DatabaseNotFoundError(RuntimeError):
    """No database to read from: METALEDGER_DATABASE_URL is unset and the embedded Postgres is not running."""


class IndexerSettings(Settings):
    model_config = SettingsConfigDict(env_prefix="METALEDGER_", extra="ignore")

    spark_master: str = Field(
        "local[*]",
        json_schema_extra=group("Spark indexer", "spark-indexer.md"),
        description="Spark master of `python -m spark_indexer` when the job builds its own session "
        "(`spark-submit --master` wins)",
    )
    spark_source: str = Field(
        "python",
        description="`python`: metaledger's Kafka source (PySpark's Python Data Source API, no jars needed); "
        '`native`: Spark\'s `format("kafka")` (needs the `spark-sql-kafka` package on the cluster)',
    )
    spark_work_dir: StorageUri = Field(
        (PROJECT_ROOT / ".metaledger" / "spark").as_uri(),
        description="parent of the three locations below. Storage settings are Hadoop filesystem URIs (`file:///`, "
        "`s3a://`, `hdfs://`, `abfss://`; a path without a scheme is on Spark's default filesystem), "
        "handed to Spark exactly as written; on a cluster, storage every node and the next driver reach",
    )
    spark_checkpoint_dir: StorageUri | None = Field(
        None, description="the stream's offsets; unset: `<work dir>/checkpoint`"
    )
    spark_dead_letter_dir: StorageUri | None = Field(
        None, description="dead-lettered records (Parquet, by day); unset: `<work dir>/dead_letter`"
    )
    spark_timeseries_dir: StorageUri | None = Field(
        None, description="the timeseries archive (Parquet, by aspect and day); unset: `<work dir>/timeseries`"
    )
    spark_max_offsets_per_trigger: int = Field(200_000, description="change logs per micro-batch at most")
    spark_trigger_interval_s: float = Field(1.0, description="micro-batch interval")
    spark_index_partitions: int = Field(
        0,
        description="tasks per micro-batch: 0 = one per topic partition (no shuffle; scale with the topics' "
        "partitions), N = shuffled by record key (the URN) into N",
    )
    spark_restore_partitions: int = Field(
        8, description="parallel readers of `metadata_aspect_v2` in `restore-indices` / `reconcile`"
    )
    spark_apply_chunk: int = Field(2000, description="index changes per bulk call from one task")
    spark_schema_registry_url: str | None = Field(
        None,
        description="metaledger's own schema registry (`http://<metaledger>/schema-registry/api`): Avro change logs "
        "framed with an id that is not one of DataHub's are decoded with the writer schema fetched from it "
        "(once per worker); with `SCHEMA_REGISTRY_URL` (an external registry) set, that one answers for "
        "every id instead",
    )
    # The stream's figures per micro-batch: spark_indexer.metrics.
    spark_metrics_file: Path | None = Field(
        None,
        description="the stream's batch figures as a Prometheus textfile (node_exporter's textfile collector), "
        "rewritten per batch (`stream --metrics-file`)",
    )
    spark_pushgateway_url: str | None = Field(
        None, description="push the same figures per batch to this Prometheus Pushgateway"
    )
    spark_metrics_job: str = Field(
        "metaledger_spark_indexer", description="the Pushgateway job name (`instance` = the host name)"
    )

    @property
    def checkpoint_dir(self) -> str:
        return self.spark_checkpoint_dir or storage_join(self.spark_work_dir, "checkpoint")

    @property
    def dead_letter_dir(self) -> str:
        return self.spark_dead_letter_dir or storage_join(self.spark_work_dir, "dead_letter")

    @property
    def timeseries_dir(self) -> str:
        return self.spark_timeseries_dir or storage_join(self.spark_work_dir, "timeseries")


def embedded_database_url(settings: Settings) -> str | None:
    """The URL of the embedded Postgres the service runs under `settings.data_dir` (`<data_dir>/pg`, database
    `metaledger`), or None when it is not running (a server that is not running is not started)."""
    from app.embedded_pg import EmbeddedPostgres

    server = EmbeddedPostgres.from_settings(settings)
    if not server.is_running():
        return None
    return server.start()  # running: reused as is, on the port it listens on (start() does not start a second one)


def with_database(settings: IndexerSettings) -> IndexerSettings:
    """`settings` with `database_url` set: the configured one, else the running embedded Postgres's. Raises
    DatabaseNotFoundError ("start `make run` first or set METALEDGER_DATABASE_URL") when there is none."""
    if settings.database_url:
        return settings
    url = embedded_database_url(settings)
    if url is None:
        raise DatabaseNotFoundError(
            f"METALEDGER_DATABASE_URL is unset and the embedded Postgres under {Path(settings.data_dir) / 'pg'} is not "
            f"running: {NO_DATABASE_HINT}"
        )
    return settings.model_copy(update={"database_url": url})


def database_url_of(settings: Settings) -> str:
    """The database URL of settings that `with_database` gave (DatabaseNotFoundError for others without one)."""
    if not settings.database_url:
        raise DatabaseNotFoundError(f"METALEDGER_DATABASE_URL is unset: {NO_DATABASE_HINT}")
    return settings.database_url
