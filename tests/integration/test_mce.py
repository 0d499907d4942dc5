"""Legacy MetadataChangeEvents against the real Postgres and broker: Rest.li `POST /entities?action=ingest` as the
DataHub Python client sends it, and the `MetadataChangeEvent_v4` topic with failures to `FailedMetadataChangeEvent_v4`."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
import pytest_asyncio

from app.kafka.consumers import MceConsumer
from tests.helpers import (
    ANY_TRACE_ID,
    create_topics,
    dead_letter,
    decode_value,
    eventually,
    fast_groups,
    kafka_overrides,
    produce,
    read_topic,
    stored,
    unique_topics,
)

LEGACY = "urn:li:dataset:(urn:li:dataPlatform:hive,db.legacy,PROD)"
OTHER = "urn:li:dataset:(urn:li:dataPlatform:hive,db.other,PROD)"
SNAPSHOT = "com.linkedin.metadata.snapshot.DatasetSnapshot"
RESTLI_HEADERS = {"X-RestLi-Protocol-Version": "2.0.0", "Content-Type": "application/json"}
CLIENT_SM = {
    "lastObserved": 1795288480532,
    "runId": "no-run-id-provided",
    "lastRunId": "no-run-id-provided",
    "properties": {"clientId": "acryl-datahub", "clientVersion": "1.7.0.17"},
}


def snapshot(urn: str, *aspects: dict[str, Any], snapshot_class: str = SNAPSHOT) -> dict[str, Any]:
    return {snapshot_class: {"urn": urn, "aspects": list(aspects)}}


CAPTURE_ASPECTS = (
    {"com.linkedin.common.Status": {"removed": False}},
    {
        "com.linkedin.dataset.DatasetProperties": {
            "customProperties": {"a": "b"},
            "description": "legacy mce",
            "tags": [],
        }
    },
    {
        "com.linkedin.dataset.UpstreamLineage": {
            "upstreams": [
                {
                    "auditStamp": {"time": 0, "actor": "urn:li:corpuser:unknown"},
                    "dataset": "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)",
                    "type": "TRANSFORMED",
                }
            ]
        }
    },
)


@pytest.fixture
def topics() -> dict[str, str]:
    return unique_topics("topic_mcp", "topic_fmcp", "topic_mce", "topic_fmce")


@pytest_asyncio.fixture
async def settings_overrides(kafka_broker, topics, monkeypatch) -> dict[str, Any]:
    await create_topics(kafka_broker.bootstrap_servers, *topics.values())
    fast_groups(monkeypatch)
    return kafka_overrides(kafka_broker.bootstrap_servers, topics)


async def test_restli_ingest_of_the_client_capture(client, db):
    # The body of capture A_emitter_restli #7 (client-protocol notes §5.3), with the client's headers.
    body = {"entity": {"value": snapshot(LEGACY, *CAPTURE_ASPECTS)}, "systemMetadata": CLIENT_SM}
    response = await client.post("/entities?action=ingest", content=orjson.dumps(body), headers=RESTLI_HEADERS)
    assert response.status_code == 200, response.text
    assert response.json() == {}

    entity = await client.get(f"/openapi/v3/entity/dataset/{LEGACY}")
    assert entity.status_code == 200
    aspects = entity.json()
    assert aspects["status"]["value"] == {"removed": False}
    assert aspects["datasetProperties"]["value"]["description"] == "legacy mce"
    assert aspects["upstreamLineage"]["value"]["upstreams"][0]["type"] == "TRANSFORMED"
    assert "datasetKey" in aspects
    row = await stored(db, LEGACY, "datasetProperties")
    # the client's properties, and the write's trace id (app.ingest.trace)
    assert row["systemMetadata"]["properties"] == {**CLIENT_SM["properties"], "telemetryTraceId": ANY_TRACE_ID}
    assert row["createdBy"] == "urn:li:corpuser:datahub"

    # Re-sending the same event is a no-op; the Avro spelling of the classes is accepted too.
    avro = {
        "entity": {
            "value": snapshot(
                LEGACY,
                {"com.linkedin.pegasus2avro.common.Status": {"removed": True}},
                snapshot_class="com.linkedin.pegasus2avro.metadata.snapshot.DatasetSnapshot",
            )
        }
    }
    assert (await client.post("/entities?action=ingest", json=body)).status_code == 200
    assert (await client.post("/entities?action=ingest", json=avro)).status_code == 200
    assert (await stored(db, LEGACY, "status"))["systemMetadata"]["version"] == "2"
    assert (await stored(db, LEGACY, "datasetProperties"))["systemMetadata"]["version"] == "1"


async def test_restli_ingest_rejects_bad_events_with_paths_and_writes_nothing(client, db):
    base = f'$.entity.value["{SNAPSHOT}"]'
    cases = [
        # unknown aspect class, and an aspect of another entity: every bad aspect is named
        (
            snapshot(
                LEGACY,
                {"com.linkedin.common.Status": {"removed": False}},
                {"com.example.Nope": {}},
                {"com.linkedin.chart.ChartInfo": {"title": "t", "description": "d"}},
            ),
            [f"{base}.aspects[1]", f"{base}.aspects[2]"],
        ),
        # a schema violation inside one aspect: the whole event is refused, the path points into it
        (
            snapshot(
                LEGACY,
                {"com.linkedin.common.Status": {"removed": False}},
                {"com.linkedin.dataset.DatasetProperties": {"description": 5}},
            ),
            [f'{base}.aspects[1]["com.linkedin.dataset.DatasetProperties"].description'],
        ),
        # unknown snapshot class
        (
            snapshot(
                "urn:li:foo:x",
                {"com.linkedin.common.Status": {}},
                snapshot_class="com.linkedin.metadata.snapshot.FooSnapshot",
            ),
            ["$.entity.value"],
        ),
        # snapshot class of another entity than the URN's
        (
            snapshot(
                LEGACY,
                {"com.linkedin.common.Status": {}},
                snapshot_class="com.linkedin.metadata.snapshot.ChartSnapshot",
            ),
            ["$.entity.value"],
        ),
    ]
    for value, paths in cases:
        response = await client.post(
            "/entities?action=ingest", json={"entity": {"value": value}}, headers=RESTLI_HEADERS
        )
        assert response.status_code == 400, response.text
        error = response.json()
        assert error["error"] == "Validation Error"
        assert [i["path"] for i in error["issues"]] == paths, error
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn LIKE 'urn:li:dataset:%'") == 0

    for url, body in [
        ("/entities?action=ingest", {"entity": snapshot(LEGACY, {"com.linkedin.common.Status": {}})}),  # no `value`
        ("/entities?action=ingest", [1]),
        ("/entities?action=bogus", {"urn": LEGACY}),  # an unknown action
        ("/entities", {"entity": {"value": snapshot(LEGACY, {"com.linkedin.common.Status": {}})}}),
    ]:
        response = await client.post(url, json=body)
        assert response.status_code == 400, (url, response.text)
        assert set(response.json()) == {"error", "message", "issues"}


async def test_mce_topic_applies_good_events_and_dead_letters_bad_ones(app, kafka_broker, topics, db):
    bootstrap = kafka_broker.bootstrap_servers
    good = {"proposedSnapshot": snapshot(LEGACY, *CAPTURE_ASPECTS), "systemMetadata": {"runId": "mce-run"}}
    unknown_aspect = {
        "proposedSnapshot": snapshot(
            OTHER, {"com.linkedin.common.Status": {"removed": False}}, {"com.example.Nope": {}}
        ),
        "systemMetadata": {"runId": "bad-run"},
    }
    schema_bad = {"proposedSnapshot": snapshot(OTHER, {"com.linkedin.common.Status": {"removed": "yes"}})}
    avro_good = {
        "proposedSnapshot": {
            "com.linkedin.pegasus2avro.metadata.snapshot.DatasetSnapshot": {
                "urn": OTHER,
                "aspects": [{"com.linkedin.pegasus2avro.common.Status": {"removed": True}}],
            }
        }
    }
    await produce(
        bootstrap,
        topics["topic_mce"],
        [
            (LEGACY, good),  # 0
            (OTHER, unknown_aspect),  # 1 → FMCE: unknown aspect class (the event's good Status is not written either)
            (None, b"not json"),  # 2 → FMCE: not JSON
            (OTHER, schema_bad),  # 3 → FMCE: schema
            (OTHER, avro_good),  # 4
        ],
    )
    stop = asyncio.Event()
    consumer = MceConsumer(
        app.state.settings, app.state.sessionmaker, app.state.gateway, group_id=f"mce-{topics['topic_mce']}"
    )
    task = asyncio.create_task(consumer.run(stop))
    try:
        failed = await read_topic(bootstrap, topics["topic_fmce"], expect=3)
        letters = [dead_letter(r) for r in failed]
        assert [t["source"]["offset"] for _, t in letters] == [1, 2, 3]
        (e1, t1), (e2, t2), (e3, t3) = letters
        base = f'$.proposedSnapshot["{SNAPSHOT}"]'
        assert e1 == unknown_aspect and t1["key"].decode() == OTHER and t1["status"] == 400
        assert t1["body"]["issues"][0]["path"] == f"{base}.aspects[1]" and "com.example.Nope" in t1["message"]
        assert e2 == "not json" and "not valid JSON" in t2["message"] and t2["key"] is None
        assert (
            e3 == schema_bad
            and t3["body"]["issues"][0]["path"] == f'{base}.aspects[0]["com.linkedin.common.Status"].removed'
        )
        for _, trace in letters:
            assert trace["exceptionClass"] == "app.errors.ValidationFailed" and trace["stackTrace"] == []
        for record in failed:  # DataHub's FailedMetadataChangeEvent (Avro, id 21); `source` is in the TraceException
            assert record.value[:5] == b"\x00\x00\x00\x00\x15"
            assert set(decode_value(record.value)) == {"metadataChangeEvent", "error"}

        status = await eventually(lambda: stored(db, OTHER, "status"))
        assert status["value"] == {"removed": True} and status["systemMetadata"]["version"] == "1"
        assert (await stored(db, LEGACY, "upstreamLineage"))["systemMetadata"]["runId"] == "mce-run"
        assert (await stored(db, LEGACY, "datasetProperties"))["createdBy"] == "urn:li:corpuser:__datahub_system"
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    assert consumer.stats == {
        "records": 5,
        "applied": 2,
        "dead_letters": 3,
        "batches": consumer.stats["batches"],
        "retries": 0,
    }
