"""DataHub's Kafka wire against the real broker (Tansu) and the real Postgres: the relay publishes Confluent-framed
Avro by default (read back and decoded here with fastavro and the schema files of the acryl-datahub package, not
through metaledger's codec), `kafka_value_format=json` keeps the JSON text, and the MCP consumer reads Avro and JSON
proposals and dead-letters values that are neither, with the reason, without losing anything or stopping.
"""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import fastavro
import orjson
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition

from app.avro.schemas import package_schema_dir, schema_text
from app.kafka.consumers import McpConsumer
from tests.helpers import (
    ANY_TRACE_ID,
    JSON,
    TopicReader,
    create_topics,
    dataset,
    dead_letter,
    eventually,
    fast_groups,
    kafka_overrides,
    mcp,
    produce,
    propose,
    read_topic,
    stored,
    unique_topics,
    wait_delivered,
)

URN = dataset("wire")
DB_VERSION_HEADER = "X-DataHub-Database-Aspect-Version"


def datahub_schema(record: str) -> Any:
    """The record's schema straight from the acryl-datahub package's .avsc file."""
    return fastavro.parse_schema(json.loads((package_schema_dir() / f"{record}.avsc").read_text()))


def read_framed(raw: bytes, schema: Any) -> tuple[int, dict[str, Any]]:
    """(schema id, datum) of a Confluent-framed Avro value, the way any Confluent consumer reads it."""
    assert raw[0] == 0, raw[:8]
    stream = io.BytesIO(raw[5:])
    datum = fastavro.schemaless_reader(stream, schema)
    assert stream.tell() == len(raw) - 5  # the whole value is the record
    return int.from_bytes(raw[1:5], "big"), datum


async def outbox(db, topic: str) -> list[dict[str, Any]]:
    return [
        dict(r)
        for r in await db.fetch(
            "SELECT topic, message_key, payload FROM change_log_outbox WHERE topic = $1 ORDER BY feed_offset", topic
        )
    ]


# --- the relay ---------------------------------------------------------------------------------------------------


@pytest.fixture
def topics() -> dict[str, str]:
    return unique_topics()


@pytest.fixture
def settings_overrides(request, kafka_broker, topics) -> dict[str, Any]:
    return {"kafka_bootstrap_servers": kafka_broker.bootstrap_servers, **topics, **getattr(request, "param", {})}


async def test_the_relay_publishes_datahubs_avro_by_default(app, client, db, kafka_broker, topics):
    await propose(
        client,
        mcp(
            "status",
            {"removed": False},
            URN,
            systemMetadata={"runId": "run-1", "properties": {"a": "b"}},
            headers={"X-Custom": "a"},
        ),
    )
    await propose(client, mcp("status", {"removed": True}, URN, systemMetadata={"runId": "run-2"}))
    await propose(client, mcp("globalTags", {"tags": [{"tag": "urn:li:tag:pii"}]}, URN))
    await wait_delivered(db)
    mcl_schema, event_schema = datahub_schema("MetadataChangeLog"), datahub_schema("PlatformEvent")

    rows = await outbox(db, topics["topic_mcl_versioned"])
    records = await read_topic(kafka_broker.bootstrap_servers, topics["topic_mcl_versioned"], expect=len(rows))
    assert [r.key.decode() for r in records] == [row["message_key"] for row in rows] == [URN] * 4
    decoded = [read_framed(r.value, mcl_schema) for r in records]
    assert {schema_id for schema_id, _ in decoded} == {18}
    # byte for byte: DataHub's framing of fastavro's encoding of the outbox row (the JSON text metaledger stores)
    for record, row in zip(records, rows, strict=True):
        out = io.BytesIO()
        fastavro.schemaless_writer(out, mcl_schema, to_datum(orjson.loads(row["payload"])))
        assert record.value == b"\x00" + (18).to_bytes(4, "big") + out.getvalue()

    (_, key), (_, create), (_, update), (_, tags) = decoded
    assert key["aspectName"] == "datasetKey" and key["changeType"] == "UPSERT"
    assert create["entityType"] == "dataset" and create["entityUrn"] == URN and create["aspectName"] == "status"
    assert create["aspect"] == {"value": b'{"removed":false}', "contentType": JSON}
    assert create["previousAspectValue"] is None and create["previousSystemMetadata"] is None
    sm = create["systemMetadata"]
    assert (
        sm["runId"] == "run-1"
        and sm["version"] == "1"
        and sm["properties"] == {"a": "b", "telemetryTraceId": ANY_TRACE_ID}
        and sm["lastObserved"] > 0
    )
    assert sm["aspectCreated"]["actor"] == "urn:li:corpuser:datahub"
    assert create["headers"] == {"X-Custom": "a", DB_VERSION_HEADER: "1"}
    assert create["created"]["actor"] == "urn:li:corpuser:datahub" and create["created"]["time"] > 0

    assert update["aspect"]["value"] == b'{"removed":true}'
    assert update["previousAspectValue"] == {"value": b'{"removed":false}', "contentType": JSON}
    assert update["previousSystemMetadata"]["version"] == "1" and update["previousSystemMetadata"]["runId"] == "run-1"
    assert update["systemMetadata"]["version"] == "2" and update["systemMetadata"]["lastRunId"] == "run-1"
    assert update["headers"] == {DB_VERSION_HEADER: "2"} and update["created"]["time"] >= create["created"]["time"]
    assert tags["aspectName"] == "globalTags"

    # the entity change events (created, soft-deleted, tagged) on the platform event topic: DataHub's PlatformEvent, id 4
    events = await read_topic(kafka_broker.bootstrap_servers, topics["topic_platform_event"], expect=3)
    envelopes = []
    for event in events:
        schema_id, envelope = read_framed(event.value, event_schema)
        assert schema_id == 4 and event.key.decode() == f"entityChangeEvent-{URN}"
        assert envelope["name"] == "entityChangeEvent" and envelope["payload"]["contentType"] == JSON
        envelopes.append(envelope)
    eces = [orjson.loads(e["payload"]["value"]) for e in envelopes]
    assert [(e["category"], e["operation"]) for e in eces] == [
        ("LIFECYCLE", "CREATE"),
        ("LIFECYCLE", "SOFT_DELETE"),
        ("TAG", "ADD"),
    ]
    assert eces[2]["modifier"] == "urn:li:tag:pii"
    assert all(e["header"]["timestampMillis"] == ece["auditStamp"]["time"] for e, ece in zip(envelopes, eces))


def to_datum(mcl: dict[str, Any]) -> dict[str, Any]:
    """An MCL's JSON form as fastavro's datum, written out by hand (independent of app.avro): aspect values as bytes."""
    out = dict(mcl)
    for name in ("aspect", "previousAspectValue", "entityKeyAspect"):
        if name in out:
            out[name] = {**out[name], "value": out[name]["value"].encode()}
    return out


@pytest.mark.parametrize("settings_overrides", [{"kafka_value_format": "json"}], indirect=True)
async def test_json_format_keeps_the_json_text(app, client, db, kafka_broker, topics):
    await propose(client, mcp("status", {"removed": False}, URN))
    await wait_delivered(db)
    rows = await outbox(db, topics["topic_mcl_versioned"])
    async with TopicReader(kafka_broker.bootstrap_servers, topics["topic_mcl_versioned"]) as reader:
        records = await reader.read_count(len(rows))
    assert [r["raw"] for r in records] == [row["payload"].encode() for row in rows]
    assert all(r["schema_id"] is None for r in records)


async def test_a_row_that_is_not_a_change_log_stays_in_the_outbox_with_the_reason(
    app, client, db, kafka_broker, topics
):
    topic = topics["topic_mcl_versioned"]
    await db.execute(
        "INSERT INTO change_log_outbox (topic, message_key, urn, aspect, version, change_type, payload) "
        "VALUES ($1, $2, $2, 'status', 1, 'UPSERT', $3)",
        topic,
        URN,
        '{"entityUrn": "x", "changeType": "SIDEWAYS"}',
    )
    await propose(client, mcp("status", {"removed": False}, URN))  # the same URN: not held back by the bad row
    await eventually(
        lambda: db.fetchval(
            "SELECT count(*) FROM change_log_outbox WHERE delivered_at IS NOT NULL AND aspect = 'status'"
        )
    )
    error = await db.fetchval("SELECT publish_error FROM change_log_outbox WHERE payload LIKE '%SIDEWAYS%'")
    assert error.startswith("AvroEncodeError: the row is not a valid mcl_versioned record") and "entityType" in error


# --- the MCP consumer --------------------------------------------------------------------------------------------


@pytest.fixture
def consumer_topics() -> dict[str, str]:
    return unique_topics("topic_mcp", "topic_fmcp", "topic_mce", "topic_fmce")


@pytest_asyncio.fixture
async def consumer_app(kafka_broker, consumer_topics, monkeypatch, database_url, registry):
    from app.main import create_app
    from app.settings import Settings

    await create_topics(kafka_broker.bootstrap_servers, *consumer_topics.values())
    fast_groups(monkeypatch)
    settings = Settings(
        database_url=database_url,
        apply_migrations_on_start=False,
        **kafka_overrides(kafka_broker.bootstrap_servers, consumer_topics),
    )
    application = create_app(settings, registry)
    async with application.router.lifespan_context(application):
        yield application


def avro_mcp(
    value: dict[str, Any], urn: str, aspect: str = "status", schema_id: int = 16, schema: Any = None, **extra: Any
) -> bytes:
    """An MCP as DataHub's `datahub-kafka` sink writes it: fastavro + the package's schema, framed."""
    datum = {
        "entityType": "dataset",
        "entityUrn": urn,
        "changeType": "UPSERT",
        "aspectName": aspect,
        "aspect": {"value": orjson.dumps(value), "contentType": JSON},
        **extra,
    }
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schema or datahub_schema("MetadataChangeProposal"), datum)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


async def test_the_mcp_consumer_reads_avro_and_json_and_dead_letters_what_is_neither(
    consumer_app, kafka_broker, consumer_topics, db
):
    app, bootstrap = consumer_app, kafka_broker.bootstrap_servers
    urns = [dataset(f"consume{i}") for i in range(4)]
    # a variant of the MCP schema (no `headers`) registered in metaledger's registry: an SDK of another version
    variant = json.loads(schema_text("MetadataChangeProposal"))
    variant["fields"] = [f for f in variant["fields"] if f["name"] != "headers"]
    variant_id = await app.state.schema_registry.register(f"{consumer_topics['topic_mcp']}-value", json.dumps(variant))
    assert variant_id >= 1000
    good_avro = avro_mcp(
        {"removed": True},
        urns[0],
        systemMetadata={"runId": "avro-run", "lastObserved": 1, "lastRunId": "x", "properties": {"via": "kafka"}},
    )
    registered = avro_mcp({"typeNames": ["View"]}, urns[2], "subTypes", variant_id, fastavro.parse_schema(variant))
    poison = {
        "truncated frame": b"\x00\x00\x00",
        "wrong magic byte 0x07": b"\x07\x00\x00\x00\x10abc",
        "unknown schema id 4242": b"\x00\x00\x00\x10\x92" + b"\x02",
        "undecodable Avro value for schema id 16": b"\x00\x00\x00\x00\x10\x02\xff\xff\xff\xff",
        "not valid JSON": b"neither json nor avro",
    }
    await produce(
        bootstrap,
        consumer_topics["topic_mcp"],
        [
            (urns[0], good_avro),  # 0 Avro, DataHub's id
            (None, poison["truncated frame"]),  # 1
            (urns[1], mcp("status", {"removed": False}, urns[1])),  # 2 JSON
            (None, poison["wrong magic byte 0x07"]),  # 3
            (None, poison["unknown schema id 4242"]),  # 4
            (urns[2], registered),  # 5 Avro, registered id
            (None, poison["undecodable Avro value for schema id 16"]),  # 6
            (None, poison["not valid JSON"]),  # 7
            (urns[3], avro_mcp({"removed": False}, urns[3])),  # 8 after all of them
        ],
    )
    stop = asyncio.Event()
    consumer = McpConsumer(app.state.settings, app.state.sessionmaker, app.state.gateway, codec=app.state.value_codec)
    task = asyncio.create_task(consumer.run(stop))
    try:
        failed = await read_topic(bootstrap, consumer_topics["topic_fmcp"], expect=len(poison), timeout=30)
        assert len(failed) == len(poison)
        fmcp_schema = fastavro.parse_schema(json.loads(schema_text("FailedMetadataChangeProposal")))
        for record, (reason, raw) in zip(failed, poison.items(), strict=True):
            schema_id, datum = read_framed(record.value, fmcp_schema)  # DataHub's FMCP, id 17
            assert schema_id == 17 and datum["auditHeader"] is None
            placeholder = datum["metadataChangeProposal"]
            assert placeholder["aspect"] == {"value": raw, "contentType": "application/octet-stream"}
            assert placeholder["entityType"] == "unknown" and placeholder["aspectName"] == "unknown"
            (trace,) = orjson.loads(datum["error"])
            assert reason in trace["message"], (reason, trace["message"])
            assert trace["status"] == 400 and trace["rawRecord"] is True
            assert trace["source"]["topic"] == consumer_topics["topic_mcp"]
        payloads = [dead_letter(r) for r in failed]
        assert [t["source"]["offset"] for _, t in payloads] == [1, 3, 4, 6, 7]
        assert payloads[-1][0] == "neither json nor avro"

        row = await eventually(lambda: stored(db, urns[3], "status"))
        assert row["value"] == {"removed": False}
        first = await stored(db, urns[0], "status")
        assert first["value"] == {"removed": True} and first["systemMetadata"]["runId"] == "avro-run"
        assert first["systemMetadata"]["properties"] == {"via": "kafka"}
        assert (await stored(db, urns[1], "status"))["value"] == {"removed": False}
        assert (await stored(db, urns[2], "subTypes"))["value"] == {"typeNames": ["View"]}
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    assert consumer.stats["records"] == 9 and consumer.stats["dead_letters"] == 5 and consumer.stats["applied"] == 4
    check = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=app.state.settings.mcp_consumer_group, enable_auto_commit=False
    )
    await check.start()
    try:
        assert await check.committed(TopicPartition(consumer_topics["topic_mcp"], 0)) == 9
    finally:
        await check.stop()
