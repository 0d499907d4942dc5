"""The Spark indexer's settings: the service's `METALEDGER_*` settings plus the job's own (`METALEDGER_SPARK_*`)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import SettingsConfigDict

from app.settings import PROJECT_ROOT, Settings


class IndexerSettings(Settings):
    model_config = SettingsConfigDict(env_prefix="METALEDGER_", extra="ignore")

    # Spark master when the job builds its own session (`spark-submit --master …` wins over it).
    spark_master: str = "local[*]"
    # "python": metaledger's Kafka source (PySpark Python Data Source API, no jars needed);
    # "native": Spark's `format("kafka")` (needs the spark-sql-kafka package on the cluster).
    spark_source: str = "python"
    spark_work_dir: Path = PROJECT_ROOT / ".metaledger" / "spark"
    spark_checkpoint_dir: Path | None = None  # default: <work_dir>/checkpoint
    spark_dead_letter_dir: Path | None = None  # default: <work_dir>/dead_letter (Parquet, by day)
    spark_timeseries_dir: Path | None = None  # default: <work_dir>/timeseries (Parquet, by aspect and day)
    spark_max_offsets_per_trigger: int = 200_000  # MCLs per micro-batch at most
    spark_trigger_interval_s: float = 1.0
    # tasks a micro-batch is indexed in: 0 = one per topic partition (no shuffle; scale with the topics' partitions),
    # N = the batch is shuffled by record key (the URN) into N tasks
    spark_index_partitions: int = 0
    spark_restore_partitions: int = 8  # parallel readers of metadata_aspect_v2 in restore-indices / reconcile
    spark_apply_chunk: int = 2000  # index changes per bulk call from one task

    @property
    def checkpoint_dir(self) -> Path:
        return self.spark_checkpoint_dir or self.spark_work_dir / "checkpoint"

    @property
    def dead_letter_dir(self) -> Path:
        return self.spark_dead_letter_dir or self.spark_work_dir / "dead_letter"

    @property
    def timeseries_dir(self) -> Path:
        return self.spark_timeseries_dir or self.spark_work_dir / "timeseries"
