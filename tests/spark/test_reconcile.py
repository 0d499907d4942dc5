"""reconcile against the real Postgres and the osmem OpenSearch-API server (and the embedded Postgres backend): a
consistent index has no drift; each kind of corruption is reported, and `repair=True` fixes it (re-check ok).

`python -m spark_indexer` as an operator runs it: settings from METALEDGER_* variables, exit status 0 only when the job
succeeded (restore-indices) or no drift remains (reconcile). It reuses the run's SparkSession (the command reuses an
active session, as under spark-submit) and the shared data set."""

from __future__ import annotations

import asyncio
import json
import uuid
from urllib.parse import quote

import asyncpg
import httpx
import pytest
from click.testing import CliRunner

from spark_indexer.cli import main
from spark_indexer.reconcile import reconcile
from spark_indexer.restore import restore_indices
from tests.spark.dataset import ds, dump, indexer_settings
from tests.spark.env import metaledger_env

ORPHAN = "urn:li:dataset:(urn:li:dataPlatform:hive,db9.ghost,PROD)"


def _doc_url(url: str, index: str, doc_id: str) -> str:
    return f"{url}/{index}/_doc/{quote(doc_id, safe='')}"


@pytest.fixture(scope="module")
def own_index(spark, ingested):
    """An index set of this module's own (restored from Postgres), free to corrupt."""
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    ingested.prefixes.append(prefix)
    restore_indices(spark, indexer_settings(ingested, prefix), progress=False)
    return prefix


def test_the_live_index_has_no_drift(spark, ingested):
    report = reconcile(spark, indexer_settings(ingested, ingested.reference))
    assert report.ok, report.summary()
    assert report.pg_rows > 0 and report.index_entries >= report.pg_rows
    assert report.counts == {"missing": 0, "stale": 0, "orphan": 0, "ahead": 0}
    assert "OK: no drift" in report.summary()


def test_each_kind_of_drift_is_reported_and_repaired(spark, ingested, own_index):
    url, prefix = ingested.search_url, own_index
    index = prefix + "datasetindex_v2"
    # missing: a whole document gone
    httpx.delete(_doc_url(url, index, ds(3)), params={"refresh": "true"}, timeout=30).raise_for_status()
    # stale: one aspect's version regressed (datasetProperties of ds(4) is at version 2)
    docs = dump(url, index)
    stale = docs[ds(4)]
    assert stale["aspectVersions"]["datasetProperties"] == 2
    stale["aspectVersions"]["datasetProperties"] = 1
    # ahead: an aspect indexed at a version Postgres never had
    ahead = docs[ds(6)]
    ahead["aspectVersions"]["globalTags"] = 99
    # orphan: a document for an entity Postgres does not have
    orphan = dict(docs[ds(7)], urn=ORPHAN)
    for doc_id, body in ((ds(4), stale), (ds(6), ahead), (ORPHAN, orphan)):
        httpx.put(_doc_url(url, index, doc_id), params={"refresh": "true"}, json=body, timeout=30).raise_for_status()

    report = reconcile(spark, indexer_settings(ingested, prefix), entities=["dataset"])
    assert not report.ok
    kinds = {(d.kind, d.target, d.urn, d.aspect) for d in report.examples}
    assert ("stale", "document", ds(4), "datasetProperties") in kinds
    assert ("ahead", "document", ds(6), "globalTags") in kinds
    assert report.counts["missing"] == 7  # ds(3): key, properties, schema, ownership, tags, lineage, status
    assert report.counts["stale"] == 1 and report.counts["ahead"] == 1
    assert report.counts["orphan"] == 7  # every aspect of the ghost document
    assert any(d.urn == ORPHAN and d.kind == "orphan" for d in report.examples)
    assert "DRIFT" in report.summary()

    repaired = reconcile(spark, indexer_settings(ingested, prefix), entities=["dataset"], repair=True)
    assert repaired.found == report.counts
    assert repaired.repaired and repaired.repair_changes > 0
    # "ahead" cannot be lowered through apply (versions are monotonic): reported, left for a clean rebuild
    assert repaired.counts == {"missing": 0, "stale": 0, "orphan": 0, "ahead": 1}, repaired.summary()
    assert not repaired.ok and [(d.kind, d.urn) for d in repaired.remaining] == [("ahead", ds(6))]
    after = dump(url, index)
    assert after.get(ORPHAN, {}).get("entityRemoved") is True  # a tombstone: hidden from reads, not an orphan
    reference = dump(url, ingested.reference + "datasetindex_v2")
    for urn in (ds(3), ds(4)):
        assert after[urn] == reference[urn]

    restore_indices(spark, indexer_settings(ingested, prefix), clean=True, entities=["dataset"], progress=False)
    final = reconcile(spark, indexer_settings(ingested, prefix))
    assert final.ok, final.summary()
    assert dump(url, index)[ds(6)] == reference[ds(6)]


def test_edge_set_drift_is_reported_and_repaired(spark, ingested, own_index):
    url, prefix = ingested.search_url, own_index
    sets = dump(url, prefix + "graph_service_v1_sets")
    marker_id, marker = next((i, m) for i, m in sets.items() if m["source"] == ds(8) and m["aspect"] == "ownership")
    httpx.delete(
        _doc_url(url, prefix + "graph_service_v1_sets", marker_id), params={"refresh": "true"}, timeout=30
    ).raise_for_status()
    report = reconcile(spark, indexer_settings(ingested, prefix), entities=["dataset"])
    assert report.counts["missing"] == 1 and [(d.kind, d.target, d.urn) for d in report.examples] == [
        ("missing", "edges", ds(8))
    ]
    repaired = reconcile(spark, indexer_settings(ingested, prefix), entities=["dataset"], repair=True)
    assert repaired.ok, repaired.summary()
    assert dump(url, prefix + "graph_service_v1_sets")[marker_id] == marker


def test_restore_and_reconcile_on_the_embedded_postgres_backend(spark, ingested):
    settings = indexer_settings(ingested, None)  # no search_url: the Postgres backend on the same database
    dsn = ingested.database_url.replace("postgresql+asyncpg://", "postgresql://")

    async def query(sql: str, *args):
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    # the app indexed into OpenSearch: the embedded tables hold only what the clean restore puts there
    result = restore_indices(spark, settings, clean=True, progress=False)
    assert result.backend == "postgres" and result.mode == "in-place" and result.rows_failed == 0
    assert set(result.cleared) == {"search_document", "search_aspect_fields", "search_edge", "search_edge_version"}
    versions = {
        r["urn"]: json.loads(r["aspect_versions"])
        for r in asyncio.run(query("SELECT urn, aspect_versions::text FROM search_document"))
    }
    reference = dump(ingested.search_url, ingested.reference + "datasetindex_v2")
    assert {u: versions[u] for u in reference} == {u: d["aspectVersions"] for u, d in reference.items()}
    edges = asyncio.run(query("SELECT count(*) AS n FROM search_edge"))[0]["n"]
    assert edges == len(dump(ingested.search_url, ingested.reference + "graph_service_v1"))

    assert reconcile(spark, settings).ok
    asyncio.run(query("DELETE FROM search_aspect_fields WHERE urn = $1 AND aspect = 'ownership'", ds(10)))
    asyncio.run(
        query("UPDATE search_aspect_fields SET version = 0 WHERE urn = $1 AND aspect = 'datasetProperties'", ds(11))
    )
    asyncio.run(
        query(
            "INSERT INTO search_aspect_fields (urn, aspect, entity_type, version) VALUES ($1, 'status', 'dataset', 1)",
            ORPHAN,
        )
    )
    report = reconcile(spark, settings, entities=["dataset"])
    assert (report.counts["missing"], report.counts["stale"], report.counts["orphan"]) == (1, 1, 1), report.summary()
    repaired = reconcile(spark, settings, entities=["dataset"], repair=True)
    assert repaired.ok, repaired.summary()
    # the orphan became a tombstone: version markers only (deleted), no live aspect
    assert {
        r["deleted"] for r in asyncio.run(query("SELECT deleted FROM search_aspect_fields WHERE urn = $1", ORPHAN))
    } == {True}


def test_restore_then_reconcile_exit_status_follows_drift(spark, ingested):
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    ingested.prefixes.append(prefix)
    env = metaledger_env(
        indexer_settings(ingested, prefix),
        "database_url",
        "search_url",
        "search_flavor",
        "search_index_prefix",
        "spark_restore_partitions",
        "spark_apply_chunk",
    )
    runner = CliRunner()

    restored = runner.invoke(main, ["restore-indices", "--clean"], env=env)
    assert restored.exit_code == 0, restored.output
    assert "restore-indices" in restored.output

    clean = runner.invoke(main, ["reconcile"], env=env)
    assert clean.exit_code == 0, clean.output

    index = f"{prefix}datasetindex_v2"
    httpx.delete(_doc_url(ingested.search_url, index, ds(2)), params={"refresh": "true"}, timeout=30).raise_for_status()
    drift = runner.invoke(main, ["reconcile"], env=env)
    assert drift.exit_code == 1 and "missing" in drift.output, drift.output

    # --repair re-checks after repairing: its exit status is the re-check's
    repaired = runner.invoke(main, ["reconcile", "--repair"], env=env)
    assert repaired.exit_code == 0 and "left after re-check: missing 0" in repaired.output, repaired.output
