"""restore-indices against the real Postgres and the osmem OpenSearch-API server, with the shared local[2] session.

The shared data set (the `ingested` fixture, one per test process): ~60 entities (50 datasets with six aspects each,
some updated twice, corpusers, tags) ingested through the HTTP API with sync indexing into a reference prefix (the
live index). Restores go into other prefixes (a prefix nobody wrote to is exactly "the indices were deleted") and are compared with the reference.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import asyncpg
import httpx
import orjson
import pytest

from spark_indexer.restore import restore_indices
from tests.spark.dataset import N_DATASETS, drop_prefix, ds, dump, indexer_settings, indices_with, tag, user

ENTITY_ALIASES = ("datasetindex_v2", "corpuserindex_v2", "tagindex_v2")
GRAPH_ALIASES = ("graph_service_v1", "graph_service_v1_sets")


# --- index helpers (sync: the restore functions run their own event loops) ----------------------------------------


def alias_targets(url: str, prefix: str) -> dict[str, list[str]]:
    response = httpx.get(f"{url}/_alias", timeout=30)
    response.raise_for_status()
    out: dict[str, list[str]] = {}
    for index, body in response.json().items():
        for alias in body.get("aliases") or {}:
            if alias.startswith(prefix):
                out.setdefault(alias, []).append(index)
    return out


def assert_same_indices(url: str, reference: str, restored: str) -> None:
    for alias in ENTITY_ALIASES + GRAPH_ALIASES:
        expected, actual = dump(url, reference + alias), dump(url, restored + alias)
        assert expected, f"reference {alias} is empty"
        assert actual.keys() == expected.keys(), f"{alias}: ids differ: {sorted(actual.keys() ^ expected.keys())[:5]}"
        for doc_id, source in expected.items():
            assert actual[doc_id] == source, f"{alias}/{doc_id} differs"


@pytest.fixture(scope="module")
def restored(spark, ingested) -> SimpleNamespace:
    """A second index set, restored from Postgres into a prefix nobody wrote to (= the indices were deleted)."""
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    ingested.prefixes.append(prefix)
    result = restore_indices(spark, indexer_settings(ingested, prefix), progress=False)
    return SimpleNamespace(prefix=prefix, result=result)


# --- tests --------------------------------------------------------------------------------------------------------


def test_restore_into_deleted_indices_equals_the_live_index(ingested, restored):
    result = restored.result
    assert result.mode == "rebuild" and result.backend == "opensearch"
    assert result.rows_total == result.rows_read == ingested.rows
    assert result.rows_failed == 0 and result.rows_indexed > 0
    assert result.entities == N_DATASETS + 5 + 3
    assert result.aspects_per_s > 0
    assert "aspects/s" in result.summary()
    assert_same_indices(ingested.search_url, ingested.reference, restored.prefix)
    targets = alias_targets(ingested.search_url, restored.prefix)
    dataset_alias = restored.prefix + "datasetindex_v2"
    assert len(targets[dataset_alias]) == 1 and "_r" in targets[dataset_alias][0].removeprefix(dataset_alias)

    async def edges() -> tuple[Any, Any]:
        from app.search.elastic import ElasticBackend
        from spark_indexer.sink import registry_for

        settings = indexer_settings(ingested, restored.prefix)
        backend = ElasticBackend(settings, registry_for(settings))
        try:
            out = await backend.relationships(ds(5), direction="OUTGOING")
            into = await backend.relationships(user(0), direction="INCOMING", types=["OwnedBy"])
            return out, into
        finally:
            await backend.close()

    (outgoing, _), (_, owned_count) = asyncio.run(edges())
    assert {(e.relationship, e.destination) for e in outgoing} >= {
        ("DownstreamOf", ds(4)),
        ("OwnedBy", user(0)),
        ("TaggedWith", tag(2)),
    }
    assert owned_count == N_DATASETS // 5


def test_restore_with_fewer_readers_than_cores_shuffles_and_gives_the_same_indices(spark, ingested, restored):
    """One reader on local[2]: the rows are repartitioned by urn and sorted by Spark (the path for clusters with more
    cores than `spark_restore_partitions`); the indices equal those of the ordered, shuffle-free path."""
    assert spark.sparkContext.defaultParallelism > 1
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    ingested.prefixes.append(prefix)
    result = restore_indices(spark, indexer_settings(ingested, prefix, spark_restore_partitions=1), progress=False)
    assert result.rows_read == ingested.rows and result.rows_failed == 0
    assert_same_indices(ingested.search_url, restored.prefix, prefix)


def test_ordered_bucket_query_sorts_in_byte_order():
    from spark_indexer.postgres_source import RowFilter, latest_query

    sql, params = latest_query(RowFilter(), 4, ordered=True)
    assert sql.endswith(' ORDER BY urn COLLATE "C", aspect COLLATE "C"') and params[-2:] == [4, 0]
    assert "ORDER BY" not in latest_query(RowFilter(), 4)[0]


def test_clean_rebuild_swaps_aliases_and_search_keeps_serving(spark, ingested, restored):
    url, prefix = ingested.search_url, restored.prefix
    before = alias_targets(url, prefix)
    expected = len(dump(url, ingested.reference + "datasetindex_v2"))
    counts: list[int] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            response = httpx.post(
                f"{url}/{prefix}datasetindex_v2/_count", json={"query": {"match_all": {}}}, timeout=30
            )
            counts.append(response.json()["count"] if response.status_code == 200 else -response.status_code)
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        result = restore_indices(spark, indexer_settings(ingested, prefix), clean=True, progress=False)
    finally:
        done.set()
        poller.join()
    assert result.mode == "rebuild" and result.rows_read == ingested.rows
    assert len(counts) > 5 and set(counts) == {expected}, counts  # never empty, never an error during the rebuild
    after = alias_targets(url, prefix)
    assert after.keys() == before.keys()
    for alias, old in before.items():
        assert after[alias] != old and after[alias] == [result.swapped[alias]]
    remaining = indices_with(url, prefix)
    assert not set(remaining) & {i for old in before.values() for i in old}, "old indices deleted"
    assert set(result.deleted_indices) == {i for old in before.values() for i in old}
    assert_same_indices(url, ingested.reference, prefix)


def test_filtered_restore_touches_only_matching_documents(spark, ingested, restored):
    url, prefix = ingested.search_url, restored.prefix
    before = alias_targets(url, prefix)
    for alias, doc in (("datasetindex_v2", ds(1)), ("datasetindex_v2", ds(2)), ("corpuserindex_v2", user(1))):
        httpx.delete(
            f"{url}/{prefix}{alias}/_doc/{_quote(doc)}", params={"refresh": "true"}, timeout=30
        ).raise_for_status()
    result = restore_indices(spark, indexer_settings(ingested, prefix), urn_like="%,db1.%", progress=False)
    assert result.mode == "in-place" and not result.swapped
    assert result.entities == N_DATASETS // 5 and result.rows_read == result.rows_total
    datasets = dump(url, prefix + "datasetindex_v2")
    assert ds(1) in datasets and ds(2) not in datasets
    assert user(1) not in dump(url, prefix + "corpuserindex_v2")

    result = restore_indices(spark, indexer_settings(ingested, prefix), entities=["corpuser"], progress=False)
    assert result.mode == "in-place" and result.entities == 5
    assert user(1) in dump(url, prefix + "corpuserindex_v2")
    assert ds(2) not in dump(url, prefix + "datasetindex_v2")

    result = restore_indices(
        spark,
        indexer_settings(ingested, prefix),
        entities=["dataset"],
        aspects=["datasetProperties", "datasetKey", "status"],
        urn_like="%table02%",
        progress=False,
    )
    assert result.entities == 1 and result.rows_read == 3
    partial = dump(url, prefix + "datasetindex_v2")[ds(2)]
    assert set(partial["aspectVersions"]) == {"datasetProperties", "datasetKey", "status"}
    restore_indices(
        spark,
        indexer_settings(ingested, prefix),
        urn_like="%table02%",
        since=datetime(2000, 1, 1, tzinfo=UTC),
        progress=False,
    )
    assert alias_targets(url, prefix) == before, "in place: no alias moved"
    assert_same_indices(url, ingested.reference, prefix)


def test_clean_rebuild_of_one_entity_type_keeps_the_other_edges(spark, ingested, restored, registry):
    url, prefix = ingested.search_url, restored.prefix
    before = alias_targets(url, prefix)
    result = restore_indices(
        spark, indexer_settings(ingested, prefix), clean=True, entities=["corpuser"], progress=False
    )
    assert result.mode == "rebuild" and result.entities == 5
    after = alias_targets(url, prefix)
    assert after[prefix + "datasetindex_v2"] == before[prefix + "datasetindex_v2"]
    for alias in ("corpuserindex_v2",) + GRAPH_ALIASES:
        assert after[prefix + alias] != before[prefix + alias]
    assert_same_indices(url, ingested.reference, prefix)

    # the copied edge sets keep their versions: a newer ownership still replaces the edges (no stale projection)
    async def update() -> list[str]:
        from app.search.documents import changes_from_mcl
        from app.search.elastic import ElasticBackend

        backend = ElasticBackend(indexer_settings(ingested, prefix), registry)
        try:
            value = {
                "owners": [{"owner": user(4), "type": "DATAOWNER"}],
                "lastModified": {"time": 1, "actor": "urn:li:corpuser:admin"},
            }
            mcl = {
                "entityType": "dataset",
                "entityUrn": ds(20),
                "aspectName": "ownership",
                "changeType": "UPSERT",
                "aspect": {"value": orjson.dumps(value).decode()},
                "systemMetadata": {"version": "7"},
            }
            await backend.apply(changes_from_mcl(mcl, registry))
            edges, _ = await backend.relationships(ds(20), direction="OUTGOING", types=["OwnedBy"])
            return [e.destination for e in edges]
        finally:
            await backend.close()

    assert asyncio.run(update()) == [user(4)]
    restore_indices(spark, indexer_settings(ingested, prefix), progress=False)  # back to the reference
    assert_same_indices(url, ingested.reference, prefix)


def test_clean_refuses_row_level_filters(spark, ingested, restored):
    with pytest.raises(ValueError, match="--entity only"):
        restore_indices(spark, indexer_settings(ingested, restored.prefix), clean=True, urn_like="%x%", progress=False)


def test_progress_line_on_stderr(capsys):
    from spark_indexer.restore import Progress

    meter = Progress("restore-indices", 1000, interval=0.0)
    meter.update(250, force=True)
    line = capsys.readouterr().err
    assert "250/1,000 rows (25.0%)" in line and "rows/s" in line and "ETA" in line


def _quote(urn: str) -> str:
    from urllib.parse import quote

    return quote(urn, safe="")


# --- throughput -------------------------------------------------------------------------------------------------

BENCH_ROWS = int(os.environ.get("METALEDGER_RESTORE_BENCH_ROWS", "2000"))  # set 20000+ to measure


def bench_rows(n_entities: int) -> list[tuple[Any, ...]]:
    rows = []
    now = datetime.now(UTC).replace(tzinfo=None) - timedelta(days=1)  # older than the run: no catch-up
    for i in range(n_entities):
        urn = f"urn:li:dataset:(urn:li:dataPlatform:kafka,bench.topic{i:06d},PROD)"
        sm = orjson.dumps({"version": "1", "runId": "bench", "lastObserved": 1}).decode()
        aspects = {
            "datasetKey": {"platform": "urn:li:dataPlatform:kafka", "name": f"bench.topic{i:06d}", "origin": "PROD"},
            "datasetProperties": {
                "name": f"topic{i:06d}",
                "description": f"benchmark topic {i} " * 4,
                "customProperties": {"team": f"team{i % 17}", "tier": str(i % 3)},
            },
            "ownership": {
                "owners": [{"owner": f"urn:li:corpuser:u{i % 100}", "type": "DATAOWNER"}],
                "lastModified": {"time": 1, "actor": "urn:li:corpuser:admin"},
            },
            "globalTags": {"tags": [{"tag": f"urn:li:tag:t{i % 10}"}]},
            "status": {"removed": False},
        }
        for aspect, value in aspects.items():
            rows.append((urn, aspect, 0, orjson.dumps(value).decode(), sm, now, "urn:li:corpuser:bench", None))
    return rows


def test_restore_throughput(spark, make_database, migrated_template, search_server, capsys):
    database_url = make_database(template=migrated_template)
    rows = bench_rows(max(1, BENCH_ROWS // 5))

    async def load() -> None:
        conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await conn.copy_records_to_table(
                "metadata_aspect_v2",
                records=rows,
                columns=[
                    "urn",
                    "aspect",
                    "version",
                    "metadata",
                    "systemmetadata",
                    "createdon",
                    "createdby",
                    "createdfor",
                ],
            )
            await conn.execute("ANALYZE metadata_aspect_v2")
        finally:
            await conn.close()

    asyncio.run(load())
    prefix = f"t{uuid.uuid4().hex[:8]}_"
    data = SimpleNamespace(database_url=database_url, search_url=search_server.url)
    try:
        result = restore_indices(spark, indexer_settings(data, prefix, spark_apply_chunk=2000), progress=True)
        assert result.rows_read == len(rows) and result.rows_failed == 0
        count = httpx.get(f"{search_server.url}/{prefix}datasetindex_v2/_count", timeout=30).json()["count"]
        assert count == len(rows) // 5
        with capsys.disabled():
            print(f"\n[restore throughput] {result.summary()}")
    finally:
        drop_prefix(search_server.url, prefix)
