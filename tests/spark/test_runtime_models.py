"""The Spark indexer follows the runtime model set (issue 28) as the service's processes do: a stream that is running
when an admin applies a set indexes the new aspect's change logs, no process restarted; a change log of an aspect no
set defines is still dead-lettered; a task whose registry is behind the stored set re-checks it before dead-lettering
a record it does not know."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaProducer

from app.registry import load_registry
from app.settings import Settings
from spark_indexer.config import IndexerSettings
from tests.helpers import JSON, mcp, propose, unique_topics

DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,runtime.rated,PROD)"
RATING = {
    "type": "record",
    "name": "Rating",
    "namespace": "com.acme",
    "Aspect": {"name": "acmeRating"},
    "fields": [
        {"name": "stars", "type": "int"},
        {
            "name": "review",
            "type": ["null", "string"],
            "default": None,
            "Searchable": {"fieldType": "TEXT", "fieldName": "acmeReview"},
        },
    ],
}
MODEL_SET = {"aspects": [{"schema": RATING}], "entities": [{"name": "dataset", "aspects": ["acmeRating"]}]}
NOT_IN_ANY_SET = "warpDrive"


@pytest.fixture(scope="module")
def registry():
    """The app's registry, of this module only: the model set changes it in place (the session's stays the base)."""
    return load_registry(Settings().registry_path)


@pytest.fixture
def settings_overrides(kafka_broker, search_server, index_prefix):
    return {
        "kafka_bootstrap_servers": kafka_broker.bootstrap_servers,
        **unique_topics(),
        "search_url": search_server.url,
        "search_flavor": "opensearch",
        "search_index_prefix": index_prefix,
    }


@pytest.fixture
def indexer_settings(settings_overrides, database_url, work_dir, search_server, index_prefix):
    yield IndexerSettings(
        database_url=database_url,
        spark_work_dir=work_dir,
        spark_master="local[2]",
        spark_trigger_interval_s=0.2,
        **settings_overrides,
    )
    names = [
        i["index"]
        for i in httpx.get(f"{search_server.url}/_cat/indices?format=json", timeout=30).json()
        if i["index"].startswith(index_prefix)
    ]
    if names:
        httpx.delete(f"{search_server.url}/{','.join(names)}", timeout=30)


def change_log(aspect: str, value: dict[str, Any], version: int) -> bytes:
    return orjson.dumps(
        {
            "entityType": "dataset",
            "entityUrn": DATASET,
            "aspectName": aspect,
            "changeType": "UPSERT",
            "aspect": {"value": orjson.dumps(value).decode(), "contentType": JSON},
            "systemMetadata": {"version": str(version)},
        }
    )


def indexed_urns(settings: IndexerSettings, field: str, text: str) -> list[str]:
    """The dataset index's documents whose `field` matches `text`, read from the search server itself."""
    response = httpx.post(
        f"{settings.search_url}/{settings.search_index_prefix}datasetindex_v2/_search",
        json={"query": {"match": {field: text}}},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return [hit["_source"]["urn"] for hit in response.json()["hits"]["hits"]]


def dead_letters(spark, settings: IndexerSettings) -> list[Any]:
    if not (Path(settings.dead_letter_dir.removeprefix("file://")) / "_SUCCESS").exists():
        return []
    return spark.read.parquet(settings.dead_letter_dir).orderBy("offset").collect()


async def until(condition: Callable[[], Any], stream: asyncio.Future, what: str, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert not stream.done(), f"the stream ended while waiting for {what}: {stream.result()}"
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.2)
    return found


async def test_a_running_stream_indexes_an_aspect_applied_while_it_runs(spark, client, indexer_settings):
    from spark_indexer.stream import run_stream

    settings = indexer_settings
    stream = asyncio.ensure_future(asyncio.to_thread(run_stream, spark, settings))
    try:
        # the stream's workers are up, on the base models, before the set is applied
        await propose(client, mcp("datasetProperties", {"name": "rated", "description": "kumquat"}, DATASET))
        await until(lambda: indexed_urns(settings, "description", "kumquat"), stream, "the base aspect indexed")

        applied = await client.post("/openapi/v1/models", json=MODEL_SET)
        assert applied.status_code == 200, applied.text
        written = await client.post(
            f"/openapi/v3/entity/dataset/{DATASET}/acmeRating", json={"value": {"stars": 5, "review": "zanzibar"}}
        )
        assert written.status_code in (200, 201), written.text
        producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(
                settings.topic_mcl_versioned, change_log(NOT_IN_ANY_SET, {}, 1), key=DATASET.encode()
            )
        finally:
            await producer.stop()

        # indexed, or (the stream not following the set) dead-lettered
        await until(
            lambda: (
                indexed_urns(settings, "acmeReview", "zanzibar")
                or [d for d in dead_letters(spark, settings) if d["aspect"] == "acmeRating"]
            ),
            stream,
            "the runtime aspect's change log taken",
        )
        dead = await until(lambda: dead_letters(spark, settings), stream, "the dead letter")
    finally:
        for query in spark.streams.active:
            if query.name == "metaledger-indexer":
                query.stop()
        result = await stream
    assert [(d["aspect"], d["reason"]) for d in dead] == [
        (NOT_IN_ANY_SET, f"aspect '{NOT_IN_ANY_SET}' is not an aspect of entity 'dataset' in the registry")
    ]
    assert result.dead_letters == 1
    assert indexed_urns(settings, "acmeReview", "zanzibar") == [DATASET]
    found = await client.get("/openapi/v3/entity/dataset", params={"query": "zanzibar"})
    assert [e["urn"] for e in found.json()["entities"]] == [DATASET]


async def test_a_task_behind_the_stored_set_rechecks_it_before_dead_lettering(client, indexer_settings):
    """A task's registry older than the change logs it meets (the driver's reading lagged, or did not answer):
    an unknown aspect makes it read the stored set again, so only what no set defines is dead-lettered."""
    from spark_indexer.batch import IndexTask, Record
    from spark_indexer.sink import WorkerRuntime

    applied = await client.post("/openapi/v1/models", json=MODEL_SET)
    assert applied.status_code == 200, applied.text
    topic = indexer_settings.topic_mcl_versioned
    records = [
        Record(topic, 0, 0, DATASET.encode(), change_log("acmeRating", {"stars": 3, "review": "quokka"}, 1)),
        Record(topic, 0, 1, DATASET.encode(), change_log(NOT_IN_ANY_SET, {}, 1)),
    ]

    def index(recheck: bool) -> Any:
        runtime = WorkerRuntime(indexer_settings)  # this process's registry: the base models until it follows
        task = IndexTask(runtime, 100, recheck=runtime.recheck_models if recheck else None)
        try:
            return task.run(records, indexer_settings.topic_mcl_timeseries), runtime.registry.runtime_version
        finally:
            runtime.reset_backend()

    behind, version = await asyncio.to_thread(index, False)
    assert version == 0 and [d.aspect for d in behind.dead] == ["acmeRating", NOT_IN_ANY_SET]
    rechecked, version = await asyncio.to_thread(index, True)
    assert version == 1 and rechecked.applied == 1
    assert [(d.aspect, d.reason) for d in rechecked.dead] == [
        (NOT_IN_ANY_SET, f"aspect '{NOT_IN_ANY_SET}' is not an aspect of entity 'dataset' in the registry")
    ]
    assert indexed_urns(indexer_settings, "acmeReview", "quokka") == [DATASET]
