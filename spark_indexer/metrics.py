"""The streaming job's figures for Prometheus, written after every micro-batch (the job has no HTTP port to scrape):

- a **textfile** (`METALEDGER_SPARK_METRICS_FILE` or `stream --metrics-file PATH`) in the Prometheus text format,
  replaced atomically per batch, for node_exporter's textfile collector (name it `*.prom` in its directory);
- a **Pushgateway** (`METALEDGER_SPARK_PUSHGATEWAY_URL`): the same series pushed per batch under the job
  `METALEDGER_SPARK_METRICS_JOB` (`metaledger_spark_indexer`) and this host as `instance`.

Series (prefix `metaledger_spark_`): the last batch's `batch_id`, `batch_records`, `batch_change_logs_applied`,
`batch_index_changes`, `batch_dead_letters` (records not indexed: undecodable, unknown to the registry or refused by
the search backend's bulk call), `batch_duration_seconds`, `batch_task_seconds`, `lag_records` (records on the topics
not yet indexed; absent while unknown), `last_batch_timestamp_seconds`; and since the job started `batches_total`,
`records_total`, `dead_letters_total`. Reporting never fails a batch: an unwritable file or an unreachable gateway is
logged and the batch goes on.

This module does not import Spark: the reporter is driven by `spark_indexer.stream.BatchSink` with its
`BatchMetrics`.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, push_to_gateway, write_to_textfile

log = logging.getLogger("metaledger.spark_indexer")


class BatchReporter:
    def __init__(
        self,
        *,
        file: str | Path | None = None,
        pushgateway: str | None = None,
        job: str = "metaledger_spark_indexer",
        instance: str | None = None,
    ) -> None:
        self.file = Path(file) if file else None
        self.pushgateway = pushgateway
        self.job = job
        self.instance = instance or socket.gethostname()
        self.registry = registry = CollectorRegistry(auto_describe=True)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"metaledger_spark_{name}", doc, registry=registry)

        self.batch_id = gauge("batch_id", "Id of the last micro-batch")
        self.records = gauge("batch_records", "Records the last micro-batch read")
        self.applied = gauge(
            "batch_change_logs_applied", "Change logs the last micro-batch applied (newest version per aspect)"
        )
        self.changes = gauge(
            "batch_index_changes", "Index changes (documents, edges, points) the last micro-batch wrote"
        )
        self.dead = gauge(
            "batch_dead_letters",
            "Records of the last micro-batch dead-lettered (undecodable, unknown, or refused by the bulk call)",
        )
        self.seconds = gauge("batch_duration_seconds", "Wall time of the last micro-batch")
        self.task_seconds = gauge(
            "batch_task_seconds", "Time the last micro-batch's tasks spent parsing, building and writing (summed)"
        )
        self.lag: Gauge | None = None  # registered once a batch knows it (no Kafka end offsets: never)
        self.finished = gauge("last_batch_timestamp_seconds", "When the last micro-batch finished (Unix time)")
        self.batches_total = Counter(
            "metaledger_spark_batches", "Micro-batches since the job started", registry=registry
        )
        self.records_total = Counter(
            "metaledger_spark_records", "Records read since the job started", registry=registry
        )
        self.dead_total = Counter(
            "metaledger_spark_dead_letters", "Records dead-lettered since the job started", registry=registry
        )

    @classmethod
    def from_settings(cls, settings: Any) -> BatchReporter | None:
        """The reporter the settings ask for; None when neither a file nor a gateway is configured."""
        file = getattr(settings, "spark_metrics_file", None)
        gateway = getattr(settings, "spark_pushgateway_url", None)
        if not file and not gateway:
            return None
        return cls(
            file=file, pushgateway=gateway, job=getattr(settings, "spark_metrics_job", "metaledger_spark_indexer")
        )

    def report(self, metrics: Any) -> None:
        """Record one batch's figures (`spark_indexer.stream.BatchMetrics`) and write/push them."""
        self.batch_id.set(metrics.batch_id)
        self.records.set(metrics.rows)
        self.applied.set(metrics.applied)
        self.changes.set(metrics.changes)
        self.dead.set(metrics.dead_letters)
        self.seconds.set(metrics.seconds)
        self.task_seconds.set(metrics.task_seconds)
        if metrics.lag is not None:
            if self.lag is None:
                self.lag = Gauge(
                    "metaledger_spark_lag_records",
                    "Records on the change-log topics not yet indexed after the last micro-batch",
                    registry=self.registry,
                )
            self.lag.set(metrics.lag)
        self.finished.set(time.time())
        self.batches_total.inc()
        self.records_total.inc(metrics.rows)
        self.dead_total.inc(metrics.dead_letters)
        self.flush()

    def flush(self) -> None:
        if self.file is not None:
            try:
                self.file.parent.mkdir(parents=True, exist_ok=True)
                write_to_textfile(str(self.file), self.registry)
            except OSError as error:
                log.warning(
                    "spark metrics: the textfile cannot be written", extra={"path": str(self.file), "error": str(error)}
                )
        if self.pushgateway:
            try:
                push_to_gateway(
                    self.pushgateway,
                    job=self.job,
                    registry=self.registry,
                    grouping_key={"instance": self.instance},
                    timeout=5,
                )
            except Exception as error:  # noqa: BLE001 - a metrics outage never fails a batch
                log.warning(
                    "spark metrics: the Pushgateway cannot be reached",
                    extra={"url": self.pushgateway, "error": f"{type(error).__name__}: {error}"},
                )
