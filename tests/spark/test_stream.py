"""The streaming job end to end, with the real parts: the service (in-process app, its outbox relay publishing to the
Tansu broker), Spark local[2] reading the topics with metaledger's Kafka source, the OpenSearch-API server, Postgres.

ingest through the API → stream → searchable (documents, lineage, timeseries archive); bad records → dead letter;
`kill -9` of the job mid-stream, restart → nothing lost, nothing regressed, reconcile finds no drift.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaProducer

from spark_indexer.config import IndexerSettings
from tests.helpers import JSON, mcp, propose, unique_topics, wait_delivered
from tests.spark.env import metaledger_env

ROOT = Path(__file__).resolve().parents[2]


def ds(name: str) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:hive,stream.{name},PROD)"


def lineage(*upstream: str) -> dict[str, Any]:
    return {
        "upstreams": [
            {"auditStamp": {"time": 1, "actor": "urn:li:corpuser:etl"}, "dataset": u, "type": "TRANSFORMED"}
            for u in upstream
        ]
    }


@pytest.fixture
def settings_overrides(kafka_broker, search_server, index_prefix):
    yield {
        "kafka_bootstrap_servers": kafka_broker.bootstrap_servers,
        **unique_topics(),
        "search_url": search_server.url,
        "search_flavor": "opensearch",
        "search_index_prefix": index_prefix,
    }
    names = [
        i["index"]
        for i in httpx.get(f"{search_server.url}/_cat/indices?format=json", timeout=30).json()
        if i["index"].startswith(index_prefix)
    ]
    for start in range(0, len(names), 50):
        httpx.delete(f"{search_server.url}/{','.join(names[start : start + 50])}", timeout=30)


@pytest.fixture
def indexer_settings(settings_overrides, database_url, work_dir) -> IndexerSettings:
    return IndexerSettings(
        database_url=database_url, spark_work_dir=work_dir, spark_master="local[2]", **settings_overrides
    )


async def assert_index_current(client, urns: list[str]) -> None:
    """The service's own write trace: every aspect the index uses holds exactly the stored version."""
    for urn in urns:
        response = await client.get(f"/openapi/v1/trace/write/{urn}")
        assert response.status_code == 200, response.text
        for aspect, status in response.json()["aspects"].items():
            search = status["searchStorage"]
            assert search["writeStatus"] in ("ACTIVE_STATE", "NO_OP"), (urn, aspect, status)
            if search["writeStatus"] == "ACTIVE_STATE":
                assert search["version"] == status["primaryStorage"]["version"], (urn, aspect, status)


async def search_urns(client, query: str, count: int = 100) -> list[str]:
    response = await client.get("/openapi/v3/entity/dataset", params={"query": query, "count": count})
    assert response.status_code == 200, response.text
    return [e["urn"] for e in response.json()["entities"]]


async def test_ingest_then_stream_makes_it_searchable_with_lineage_and_timeseries(spark, client, db, indexer_settings):
    from spark_indexer.stream import run_stream

    urns = [ds(f"orders_{i}") for i in range(20)]
    proposals = [
        mcp("datasetProperties", {"name": f"orders_{i}", "description": "daily orders rollup"}, u)
        for i, u in enumerate(urns)
    ]
    proposals += [mcp("upstreamLineage", lineage(urns[i - 1]), urns[i]) for i in range(1, 4)]
    proposals += [mcp("datasetProperties", {"name": "orders_0", "description": "renamed: gold orders"}, urns[0])]
    proposals += [
        mcp("datasetProfile", {"timestampMillis": 1_763_700_000_000 + day * 86_400_000, "rowCount": 100 + day}, urns[0])
        for day in range(3)
    ]
    await propose(client, *proposals, batch_size=500)
    total = await wait_delivered(db)
    mcls = await db.fetchval(
        "SELECT count(*) FROM change_log_outbox WHERE topic = ANY($1::text[])",
        [indexer_settings.topic_mcl_versioned, indexer_settings.topic_mcl_timeseries],
    )
    assert total >= mcls >= len(proposals)

    result = await asyncio.to_thread(run_stream, spark, indexer_settings, once=True, echo=False)
    assert result.rows == mcls and result.dead_letters == 0
    assert result.batches and all(b.lag == 0 for b in result.batches[-1:])

    assert set(await search_urns(client, "orders")) == set(urns)
    assert await search_urns(client, "gold") == [urns[0]]  # the newer version won
    response = await client.get(
        f"/openapi/v3/relationship/dataset/{urns[3]}",
        params={"relationshipType[]": "DownstreamOf", "direction": "OUTGOING"},
    )
    assert response.status_code == 200, response.text
    assert [r["destination"]["urn"] for r in response.json()["results"]] == [urns[2]]
    body = {"urn": urns[0], "entity": "dataset", "aspect": "datasetProfile", "limit": 10}
    points = await client.post(
        "/aspects?action=getTimeseriesAspectValues", json=body, headers={"X-RestLi-Protocol-Version": "2.0.0"}
    )
    assert points.status_code == 200 and len(points.json()["value"]["values"]) == 3

    archive = spark.read.parquet(str(indexer_settings.timeseries_dir))
    rows = archive.where("aspect = 'datasetProfile'").select("urn", "timestamp_ms", "day").collect()
    assert sorted(r["timestamp_ms"] for r in rows) == [1_763_700_000_000 + d * 86_400_000 for d in range(3)]
    assert {str(r["day"]) for r in rows} == {"2025-11-21", "2025-11-22", "2025-11-23"}

    await assert_index_current(client, urns[:4])  # PG and the index agree version for version

    # resumes from the checkpoint: nothing left to do, nothing re-archived
    again = await asyncio.to_thread(run_stream, spark, indexer_settings, once=True, echo=False)
    assert again.rows == 0
    assert spark.read.parquet(str(indexer_settings.timeseries_dir)).where("aspect = 'datasetProfile'").count() == 3


async def test_bad_records_go_to_the_dead_letter_and_the_stream_goes_on(spark, client, db, indexer_settings):
    from spark_indexer.stream import run_stream

    good = ds("good_one")
    await propose(
        client, mcp("datasetProperties", {"name": "good_one", "description": "survives bad neighbours"}, good)
    )
    await wait_delivered(db)
    producer = AIOKafkaProducer(bootstrap_servers=indexer_settings.kafka_bootstrap_servers, acks="all")
    await producer.start()
    try:
        topic = indexer_settings.topic_mcl_versioned
        await producer.send_and_wait(topic, b"{this is not json", key=b"garbage")
        unknown = {
            "entityType": "dataset",
            "entityUrn": ds("warp"),
            "aspectName": "warpDrive",
            "changeType": "UPSERT",
            "aspect": {"value": "{}", "contentType": JSON},
            "systemMetadata": {"version": "1"},
        }
        await producer.send_and_wait(topic, orjson.dumps(unknown), key=ds("warp").encode())
    finally:
        await producer.stop()

    result = await asyncio.to_thread(run_stream, spark, indexer_settings, once=True, echo=False)
    assert result.dead_letters == 2
    assert await search_urns(client, "neighbours") == [good]
    dead = spark.read.parquet(str(indexer_settings.dead_letter_dir)).orderBy("offset").collect()
    assert [d["reason"].split(":")[0] for d in dead] == [
        "unparseable change log",
        "aspect 'warpDrive' is not an aspect of entity 'dataset' in the registry",
    ]
    assert dead[0]["value"] == "{this is not json" and dead[0]["topic"] == indexer_settings.topic_mcl_versioned
    assert dead[1]["urn"] == ds("warp") and dead[1]["aspect"] == "warpDrive" and dead[1]["day"]


def run_job(settings: IndexerSettings, *args: str, log_path: Path) -> subprocess.Popen:
    """`python -m spark_indexer …` in a process of its own, with the settings as METALEDGER_* variables."""
    names = (
        "database_url",
        "kafka_bootstrap_servers",
        "topic_mcl_versioned",
        "topic_mcl_timeseries",
        "search_url",
        "search_flavor",
        "search_index_prefix",
        "spark_work_dir",
        "spark_master",
        "spark_max_offsets_per_trigger",
        "spark_trigger_interval_s",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "spark_indexer", *args],
        cwd=ROOT,
        env={**os.environ, **metaledger_env(settings, *names), "PYTHONUNBUFFERED": "1"},
        stdout=log_path.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


async def test_kill_9_mid_stream_then_restart_loses_nothing_and_regresses_nothing(
    spark, client, db, indexer_settings, tmp_path
):
    from spark_indexer.reconcile import reconcile
    from spark_indexer.stream import run_stream

    # several micro-batches, and versions of one aspect in different ones
    settings = indexer_settings.model_copy(
        update={"spark_max_offsets_per_trigger": 200, "spark_trigger_interval_s": 0.2}
    )
    urns = [ds(f"crash_{i}") for i in range(200)]
    first = [mcp("datasetProperties", {"name": f"crash_{i}", "description": "first"}, u) for i, u in enumerate(urns)]
    first += [mcp("globalTags", {"tags": [{"tag": "urn:li:tag:pii"}]}, u) for u in urns]
    first += [mcp("upstreamLineage", lineage(urns[i - 1]), urns[i]) for i in range(1, 200, 2)]
    await propose(client, *first, batch_size=500)
    await wait_delivered(db)

    log_path = tmp_path / "job.log"
    job = run_job(settings, "stream", log_path=log_path)
    try:
        deadline = time.monotonic() + 120
        while b"batch 1:" not in log_path.read_bytes():
            assert job.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            await asyncio.sleep(0.05)
        # more versions land while the job runs, then the whole job (driver, JVM, Python workers) is killed mid-stream
        await propose(
            client,
            *[mcp("datasetProperties", {"name": f"crash_{i}", "description": "second"}, u) for i, u in enumerate(urns)],
            batch_size=500,
        )
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(10)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    await propose(
        client,
        *[mcp("datasetProperties", {"name": f"crash_{i}", "description": "third"}, u) for i, u in enumerate(urns[:25])],
        batch_size=500,
    )
    await wait_delivered(db)

    # the restart is a new driver (the run's local session) with only the killed job's checkpoint to go on
    restart = await asyncio.to_thread(run_stream, spark, settings, once=True, echo=False)
    assert restart.rows and restart.dead_letters == 0, restart.summary()
    report = await asyncio.to_thread(reconcile, spark, settings)
    assert report.ok and report.pg_rows > 0, report.summary()

    await assert_index_current(client, urns[::10])
    assert sorted(await search_urns(client, "third", 100)) == sorted(urns[:25])
    assert len(await search_urns(client, "second", 200)) == 175
    assert await search_urns(client, "first") == []
