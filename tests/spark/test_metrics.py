"""The streaming job's Prometheus figures (spark_indexer.metrics): the reporter alone, no Spark session."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from app.embedded_pg import free_port
from spark_indexer.cli import main
from spark_indexer.config import IndexerSettings
from spark_indexer.metrics import BatchReporter
from spark_indexer.stream import BatchMetrics


def parse(text: str) -> dict[str, float]:
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("metaledger_spark_")
    }


def test_a_textfile_per_batch(tmp_path: Path):
    path = tmp_path / "textfile" / "metaledger_spark.prom"
    reporter = BatchReporter.from_settings(IndexerSettings(spark_metrics_file=path))
    assert reporter is not None
    reporter.report(
        BatchMetrics(7, rows=1200, applied=1100, changes=2500, dead_letters=3, seconds=1.5, task_seconds=0.9)
    )
    first = parse(path.read_text())
    assert first["metaledger_spark_batch_id"] == 7
    assert first["metaledger_spark_batch_records"] == 1200
    assert first["metaledger_spark_batch_change_logs_applied"] == 1100
    assert first["metaledger_spark_batch_index_changes"] == 2500
    assert first["metaledger_spark_batch_dead_letters"] == 3
    assert first["metaledger_spark_batch_duration_seconds"] == 1.5
    assert first["metaledger_spark_last_batch_timestamp_seconds"] > 1.7e9
    assert "metaledger_spark_lag_records" not in first  # unknown so far: absent, not 0
    reporter.report(BatchMetrics(8, rows=300, dead_letters=1, seconds=0.5, lag=42))
    second = parse(path.read_text())
    assert second["metaledger_spark_batch_id"] == 8 and second["metaledger_spark_batch_records"] == 300
    assert second["metaledger_spark_lag_records"] == 42
    assert second["metaledger_spark_batches_total"] == 2
    assert second["metaledger_spark_records_total"] == 1500
    assert second["metaledger_spark_dead_letters_total"] == 4


def test_pushed_to_a_pushgateway_and_an_outage_never_fails_a_batch():
    received: list[tuple[str, str, bytes]] = []

    class Gateway(BaseHTTPRequestHandler):
        def do_PUT(self):  # noqa: N802 - http.server's naming
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.command, self.path, body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        reporter = BatchReporter.from_settings(IndexerSettings(spark_pushgateway_url=url))
        reporter.instance = "worker-1"
        reporter.report(BatchMetrics(3, rows=10, applied=10, changes=12, seconds=0.2, lag=0))
    finally:
        server.shutdown()
        server.server_close()
    assert len(received) == 1
    method, path, body = received[0]
    assert method == "PUT" and path == "/metrics/job/metaledger_spark_indexer/instance/worker-1"
    figures = parse(body.decode())
    assert figures["metaledger_spark_batch_records"] == 10 and figures["metaledger_spark_lag_records"] == 0
    # nothing listens there any more: logged, not raised
    dead = BatchReporter(pushgateway=f"http://127.0.0.1:{free_port()}")
    dead.report(BatchMetrics(4, rows=1))


def test_no_reporter_unless_configured_and_the_cli_option():
    assert BatchReporter.from_settings(IndexerSettings()) is None
    help_text = CliRunner().invoke(main, ["stream", "--help"]).output
    assert "--metrics-file" in help_text
