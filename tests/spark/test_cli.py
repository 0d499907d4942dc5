"""`python -m spark_indexer` as an operator runs it: settings from METALEDGER_* variables, exit status 0 only when
the job succeeded (restore-indices) or no drift remains (reconcile). Uses the run's SparkSession (the command reuses
an active session, as under spark-submit)."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import httpx
from click.testing import CliRunner

from spark_indexer.cli import main
from tests.spark.env import metaledger_env
from tests.spark.dataset import ds, indexer_settings


def test_restore_then_reconcile_exit_status_follows_drift(spark, ingested):
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    ingested.prefixes.append(prefix)
    env = metaledger_env(indexer_settings(ingested, prefix), "database_url", "search_url", "search_flavor",
                         "search_index_prefix", "spark_restore_partitions", "spark_apply_chunk")
    runner = CliRunner()

    restored = runner.invoke(main, ["restore-indices", "--clean"], env=env)
    assert restored.exit_code == 0, restored.output
    assert "restore-indices" in restored.output

    clean = runner.invoke(main, ["reconcile"], env=env)
    assert clean.exit_code == 0, clean.output

    index = f"{prefix}datasetindex_v2"
    httpx.delete(f"{ingested.search_url}/{index}/_doc/{quote(ds(2), safe='')}", params={"refresh": "true"},
                 timeout=30).raise_for_status()
    drift = runner.invoke(main, ["reconcile"], env=env)
    assert drift.exit_code == 1 and "missing" in drift.output, drift.output

    # --repair re-checks after repairing: its exit status is the re-check's
    repaired = runner.invoke(main, ["reconcile", "--repair"], env=env)
    assert repaired.exit_code == 0 and "left after re-check: missing 0" in repaired.output, repaired.output
