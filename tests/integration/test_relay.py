"""The outbox relay against the real Postgres and the real (Tansu) broker: every MCL field on the wire, per-URN order
under concurrent writers, two relays at once, topics and their configs, refused rows, pruning, sequencing.

Each test gets its own topic names (Tansu keeps every message of the run in memory; unique names keep tests apart).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict
from typing import Any

import asyncpg
import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError

from app.embedded_pg import free_port
from app.kafka.relay import OutboxRelay
from app.kafka.topics import create_missing_topics, ensure_topics
from app.settings import Settings
from tests.helpers import (
    JSON,
    SequencerPasses,
    TopicReader,
    dataset,
    mcp,
    propose,
    published_value,
    run_relay,
    unique_topics,
    wait_delivered,
)

DATASET = dataset("orders")
DB_VERSION_HEADER = "X-DataHub-Database-Aspect-Version"


# --- helpers ---------------------------------------------------------------------------------------------------


async def outbox_rows(db: asyncpg.Connection, topic: str | None = None) -> list[dict[str, Any]]:
    query = (
        "SELECT id, feed_offset, topic, message_key, urn, aspect, version, change_type, payload FROM change_log_outbox"
    )
    args = []
    if topic is not None:
        query += " WHERE topic = $1"
        args.append(topic)
    return [dict(r) for r in await db.fetch(query + " ORDER BY feed_offset NULLS LAST, id", *args)]


# --- fixtures ---------------------------------------------------------------------------------------------------


@pytest.fixture
def topics() -> dict[str, str]:
    return unique_topics()


@pytest.fixture
def settings_overrides(request, kafka_broker, topics) -> dict[str, Any]:
    """The app with Kafka (the session's broker) and this test's own topics; parametrize to add settings."""
    return {"kafka_bootstrap_servers": kafka_broker.bootstrap_servers, **topics, **getattr(request, "param", {})}


@pytest.fixture
async def reader(kafka_broker, app, topics):
    settings = app.state.settings
    async with TopicReader(
        kafka_broker.bootstrap_servers, settings.topic_mcl_versioned, settings.topic_mcl_timeseries
    ) as r:
        yield r


def mcls(records, aspect: str | None = None, urn: str | None = None) -> list[dict[str, Any]]:
    return [
        r
        for r in records
        if (aspect is None or r["value"]["aspectName"] == aspect) and (urn is None or r["value"]["entityUrn"] == urn)
    ]


# --- the wire ---------------------------------------------------------------------------------------------------


async def test_topics_are_created_with_their_configs_idempotently(kafka_broker, topics):
    settings = Settings(
        kafka_bootstrap_servers=kafka_broker.bootstrap_servers, kafka_max_message_bytes=3_000_000, **topics
    )
    assert sorted(await create_missing_topics(settings)) == sorted(topics.values())
    assert await create_missing_topics(settings) == []  # idempotent
    await ensure_topics(settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    await admin.start()
    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics.values()])
        configs = {
            resource[3]: {entry[0]: entry[1] for entry in resource[4]}
            for response in responses
            for resource in response.resources
        }
        described = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(list(topics.values()))}
    finally:
        await admin.close()
    assert configs[topics["topic_mcl_versioned"]]["retention.ms"] == "604800000"
    assert configs[topics["topic_mcl_timeseries"]]["retention.ms"] == "7776000000"
    for name in topics.values():
        assert configs[name]["max.message.bytes"] == "3000000", name
        assert described[name] == 1, name


async def test_ensure_topics_tolerates_an_unreachable_broker():
    """Kafka unreachable at start-up is logged, not raised: the service starts, the relay creates topics later."""
    bootstrap = f"127.0.0.1:{free_port()}"
    settings = Settings(kafka_bootstrap_servers=bootstrap)
    with pytest.raises(KafkaConnectionError):  # what ensure_topics is given to tolerate
        await create_missing_topics(settings)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("metaledger.kafka.topics")
    logger.addHandler(handler)
    try:
        assert await ensure_topics(settings) is None
    finally:
        logger.removeHandler(handler)
    [warning] = records
    assert warning.levelno == logging.WARNING and "kafka unreachable" in warning.getMessage()
    assert warning.bootstrap_servers == bootstrap and warning.error.startswith("KafkaConnectionError")


async def test_every_mcl_field_on_the_wire_for_create_update_delete(app, client, db, reader, topics):
    created = await propose(
        client, mcp("status", {"removed": False}, DATASET, systemMetadata={"runId": "run-1"}, headers={"X-Custom": "a"})
    )
    assert created["results"][0]["status"] == "CREATED"
    await propose(client, mcp("status", {"removed": True}, DATASET, systemMetadata={"runId": "run-2"}))
    await propose(client, mcp("status", {"removed": True}, DATASET))  # a no-op: no change log
    await propose(client, mcp("status", None, DATASET, change_type="DELETE"))
    await propose(client, mcp("subTypes", {"typeNames": ["Marker"]}, DATASET))  # arrives after everything above

    records = await reader.read_until(lambda rs: any(r["value"]["aspectName"] == "subTypes" for r in rs))
    records = await reader.settle(0.3)
    assert {r["topic"] for r in records} == {topics["topic_mcl_versioned"]}
    assert all(r["key"] == DATASET for r in records)
    # the wire carries exactly the committed outbox rows (Avro-encoded at publish time), byte for byte, in order
    stored = await outbox_rows(db, topics["topic_mcl_versioned"])
    assert [r["raw"] for r in records] == [
        published_value(app.state.settings, row["topic"], row["payload"]) for row in stored
    ]
    assert {r["schema_id"] for r in records} == {18}  # DataHub's MetadataChangeLog id on the versioned topic
    assert [r["value"] for r in records] == [orjson.loads(row["payload"]) for row in stored]
    assert [(r["value"]["aspectName"], r["value"]["changeType"]) for r in records] == [
        ("datasetKey", "UPSERT"),
        ("status", "UPSERT"),
        ("status", "UPSERT"),
        ("status", "DELETE"),
        ("subTypes", "UPSERT"),
    ]
    key, create, update, delete, _ = (r["value"] for r in records)

    assert key["entityType"] == "dataset" and key["entityUrn"] == DATASET and key["aspectName"] == "datasetKey"
    assert orjson.loads(key["aspect"]["value"]) == {
        "platform": "urn:li:dataPlatform:hive",
        "name": "relay.orders",
        "origin": "PROD",
    }
    assert key["systemMetadata"]["version"] == "1"

    assert create["entityType"] == "dataset" and create["entityUrn"] == DATASET
    assert create["aspect"] == {"value": '{"removed":false}', "contentType": JSON}
    assert create["systemMetadata"]["version"] == "1" and create["systemMetadata"]["runId"] == "run-1"
    assert "previousAspectValue" not in create and "previousSystemMetadata" not in create
    assert create["created"]["actor"] == "urn:li:corpuser:datahub" and create["created"]["time"] > 0
    assert create["headers"] == {"X-Custom": "a", DB_VERSION_HEADER: "1"}

    assert update["changeType"] == "UPSERT"
    assert orjson.loads(update["aspect"]["value"]) == {"removed": True} and update["aspect"]["contentType"] == JSON
    assert update["previousAspectValue"] == {"value": '{"removed":false}', "contentType": JSON}
    assert update["previousSystemMetadata"]["version"] == "1" and update["previousSystemMetadata"]["runId"] == "run-1"
    assert update["systemMetadata"]["version"] == "2" and update["systemMetadata"]["runId"] == "run-2"
    assert update["systemMetadata"]["lastRunId"] == "run-1"
    assert update["headers"] == {DB_VERSION_HEADER: "2"}
    assert update["created"]["time"] >= create["created"]["time"]

    assert delete["changeType"] == "DELETE" and "aspect" not in delete
    assert orjson.loads(delete["previousAspectValue"]["value"]) == {"removed": True}
    assert delete["previousSystemMetadata"]["version"] == "2"
    assert delete["entityUrn"] == DATASET and delete["aspectName"] == "status" and "created" in delete


@pytest.mark.parametrize("settings_overrides", [{"always_emit_change_log": True}], indirect=True)
async def test_no_op_is_a_restate_when_always_emit_change_log(client, reader, topics):
    await propose(client, mcp("status", {"removed": False}, DATASET, systemMetadata={"runId": "a"}))
    result = await propose(client, mcp("status", {"removed": False}, DATASET, systemMetadata={"runId": "b"}))
    assert result["results"][0]["status"] == "UNCHANGED"
    records = await reader.read_until(lambda rs: len(mcls(rs, "status")) >= 2)
    first, restate = (r["value"] for r in mcls(records, "status"))
    assert restate["changeType"] == "RESTATE"
    assert restate["aspect"] == first["aspect"]
    assert restate["systemMetadata"]["version"] == "1" and restate["systemMetadata"]["runId"] == "b"
    assert restate["previousAspectValue"] == first["aspect"]
    assert restate["previousSystemMetadata"]["runId"] == "a"
    assert all(r["key"] == DATASET and r["topic"] == topics["topic_mcl_versioned"] for r in records)


async def test_timeseries_mcl_goes_to_the_timeseries_topic(app, client, db, reader, topics):
    profile = {"timestampMillis": 1_700_000_000_000, "rowCount": 42}
    assert (await propose(client, mcp("datasetProfile", profile, DATASET)))["results"][0]["status"] == "APPENDED"
    # both topics' records: the reader may fetch the timeseries topic's before the versioned one's
    records = await reader.read_until(lambda rs: mcls(rs, "datasetProfile") and mcls(rs, "datasetKey"))
    [record] = mcls(records, "datasetProfile")
    assert record["topic"] == topics["topic_mcl_timeseries"] and record["key"] == DATASET
    mcl = record["value"]
    assert mcl["entityType"] == "dataset" and mcl["entityUrn"] == DATASET and mcl["changeType"] == "UPSERT"
    value = orjson.loads(mcl["aspect"]["value"])
    assert value == {**profile, "partitionSpec": {"partition": "FULL_TABLE_SNAPSHOT", "type": "FULL_TABLE"}}
    assert mcl["aspect"]["contentType"] == JSON
    assert "previousAspectValue" not in mcl and mcl["created"]["actor"] == "urn:li:corpuser:datahub"
    assert mcl["systemMetadata"]["runId"] == "no-run-id-provided"
    # the entity's key aspect went to the versioned topic
    assert [r["value"]["aspectName"] for r in records if r["topic"] == topics["topic_mcl_versioned"]] == ["datasetKey"]
    [row] = await outbox_rows(db, topics["topic_mcl_timeseries"])
    assert published_value(app.state.settings, row["topic"], row["payload"]) == record["raw"]
    assert record["schema_id"] == 19 and row["version"] == 1_700_000_000_000  # DataHub's timeseries MCL id


# --- order ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings_overrides", [{"retention_max_versions": 1000}], indirect=True)
async def test_per_urn_order_under_concurrent_writers(client, db, reader, topics):
    urns = [dataset(f"hot{i}") for i in range(3)]
    for urn in urns:  # create the entities first: later writes contend on row locks, not on first inserts
        await propose(client, mcp("status", {"removed": False}, urn=urn))
    rng = random.Random(7)

    async def writer(w: int) -> None:
        for n in range(25):
            urn = rng.choice(urns)
            body = [mcp("datasetProperties", {"description": f"w{w} n{n}"}, urn=urn)]
            if n % 3 == 0:
                body.append(mcp("status", {"removed": n % 2 == 0}, urn=urn))
            await propose(client, *body)

    await asyncio.gather(*(writer(w) for w in range(8)))
    total = await wait_delivered(db)
    stored = await outbox_rows(db, topics["topic_mcl_versioned"])
    records = await reader.read_count(len(stored))
    assert len(records) == len(stored) <= total

    def check_order(pairs, where: str) -> None:
        versions: dict[tuple[str, str], list[int]] = defaultdict(list)
        for urn, aspect, version in pairs:
            versions[(urn, aspect)].append(version)
        for key, seen in versions.items():
            assert seen == list(range(1, len(seen) + 1)), f"{where}: {key} versions {seen}"
        return versions

    on_topic = check_order(
        [(r["key"], r["value"]["aspectName"], int(r["value"]["systemMetadata"]["version"])) for r in records], "topic"
    )
    assert sum(len(v) for k, v in on_topic.items() if k[1] == "datasetProperties") == 8 * 25
    in_feed = check_order([(r["urn"], r["aspect"], r["version"]) for r in stored], "feed")
    assert in_feed == on_topic
    # feed offsets are consecutive from 1
    offsets = [r["feed_offset"] for r in await outbox_rows(db)]
    assert offsets == list(range(1, len(offsets) + 1))


# --- several relays ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("settings_overrides", [{"relay_enabled": False, "relay_batch_size": 50}], indirect=True)
async def test_two_relays_share_the_lanes_and_publish_each_row_once(app, client, db, kafka_broker, topics):
    settings = app.state.settings
    relays = [OutboxRelay(settings, app.state.engine), OutboxRelay(settings, app.state.engine)]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(relay.run(stop)) for relay in relays]
    try:
        deadline = time.monotonic() + 30  # a condition, with a deadline a loaded CI machine meets
        while sorted(len(r.lanes) for r in relays) != [8, 8]:
            assert time.monotonic() < deadline, [sorted(r.lanes) for r in relays]
            await asyncio.sleep(0.05)
        assert not relays[0].lanes & relays[1].lanes

        async def writer(w: int) -> None:
            for n in range(10):
                await propose(
                    client,
                    *[
                        mcp("datasetProperties", {"description": f"round {n}"}, urn=dataset(f"shared{w}_{i}"))
                        for i in range(5)
                    ],
                )

        await asyncio.gather(*(writer(w) for w in range(6)))
        total = await wait_delivered(db)
    finally:
        stop.set()
        await asyncio.gather(*tasks)

    stored = await outbox_rows(db)
    assert len(stored) == total
    all_topics = sorted({row["topic"] for row in stored})
    async with TopicReader(kafka_broker.bootstrap_servers, *all_topics) as r:
        records = await r.read_count(total)
        records = await r.settle(0.5)
    # each row once: the multiset of (topic, key, value) on the wire is exactly the outbox's
    assert sorted((m["topic"], m["key"], m["raw"]) for m in records) == sorted(
        (row["topic"], row["message_key"], published_value(settings, row["topic"], row["payload"])) for row in stored
    )
    assert all(relay.published > 0 for relay in relays), [relay.published for relay in relays]
    assert sum(relay.published for relay in relays) == total
    assert sum(relay.sequenced for relay in relays) == total


# --- refused rows, no Kafka, pruning (relays on their own, without the app) ------------------------------------


INSERT_ROW = """
INSERT INTO change_log_outbox (topic, message_key, urn, aspect, version, change_type, payload)
VALUES ($1, $2, $2, 'status', $3, 'UPSERT', $4)
"""


async def test_a_row_kafka_refuses_is_kept_with_its_error_and_does_not_block_its_urn(
    database_url, db, kafka_broker, topics
):
    settings = Settings(
        database_url=database_url,
        kafka_bootstrap_servers=kafka_broker.bootstrap_servers,
        kafka_max_message_bytes=2000,
        **topics,
    )
    topic, urn = topics["topic_mcl_versioned"], dataset("big")
    for version, size in ((1, 10), (2, 5000), (3, 10)):
        mcl = {
            "entityType": "dataset",
            "entityUrn": urn,
            "changeType": "UPSERT",
            "aspectName": "status",
            "aspect": {"value": orjson.dumps({"v": version, "pad": "x" * size}).decode(), "contentType": JSON},
        }
        await db.execute(INSERT_ROW, topic, urn, version, orjson.dumps(mcl).decode())
    relay, finish = await run_relay(settings, database_url)
    try:
        async with TopicReader(kafka_broker.bootstrap_servers, topic) as r:
            records = await r.read_count(2)
            records = await r.settle(0.3)
    finally:
        await finish()
    assert [orjson.loads(m["value"]["aspect"]["value"])["v"] for m in records] == [1, 3]
    rows = await db.fetch(
        "SELECT version, delivered_at IS NOT NULL AS delivered, publish_error FROM change_log_outbox ORDER BY id"
    )
    assert [(r["version"], r["delivered"]) for r in rows] == [(1, True), (2, False), (3, True)]
    assert "MessageSizeTooLarge" in rows[1]["publish_error"]
    assert relay.published == 2


async def test_without_kafka_the_relay_sequences_and_prunes_the_feed_window(database_url, db):
    settings = Settings(database_url=database_url, outbox_retention_hours=1 / 3600)  # a 1 s window
    for version in (1, 2, 3):
        await db.execute(INSERT_ROW, "t", dataset("window"), version, "{}")
    relay, finish = await run_relay(settings, database_url)
    try:
        deadline = time.monotonic() + 10
        while await db.fetchval("SELECT count(*) FROM change_log_outbox"):
            assert time.monotonic() < deadline, "rows older than the window were not pruned"
            await asyncio.sleep(0.1)
        assert relay.sequenced == 3 and relay.pruned == 3
        # offsets are never reused after pruning: they continue from the last one given
        await db.execute(INSERT_ROW, "t", dataset("window"), 4, "{}")
        while (offset := await db.fetchval("SELECT feed_offset FROM change_log_outbox WHERE version = 4")) is None:
            assert time.monotonic() < deadline, "row 4 was not sequenced after the pruning"
            await asyncio.sleep(0.02)
        assert offset == 4
    finally:
        await finish()


async def test_with_kafka_unreachable_rows_are_sequenced_but_never_pruned_undelivered(database_url, db, topics):
    settings = Settings(
        database_url=database_url,
        kafka_bootstrap_servers=f"127.0.0.1:{free_port()}",
        outbox_retention_hours=0.1 / 3600,
        **topics,
    )
    for version in (1, 2):
        await db.execute(INSERT_ROW, topics["topic_mcl_versioned"], dataset("stuck"), version, "{}")
    relay, finish = await run_relay(settings, database_url)
    try:
        deadline = time.monotonic() + 10
        while relay.prune_passes < 1:  # a pruning pass after the rows left the 0.1 s window
            assert time.monotonic() < deadline, "no pruning pass within 10 s"
            await asyncio.sleep(0.05)
        rows = await db.fetch("SELECT feed_offset, delivered_at FROM change_log_outbox ORDER BY id")
        assert [(r["feed_offset"], r["delivered_at"]) for r in rows] == [(1, None), (2, None)]
        assert relay.published == 0 and relay.pruned == 0 and len(relay.lanes) == 16
    finally:
        await finish()


async def test_sequencer_waits_for_open_transactions_and_keeps_per_urn_commit_order(database_url, db, monkeypatch):
    """A row written by a transaction still open blocks the offsets of every later row (it could commit first);
    ids allocated out of commit order across URNs are sequenced only once nothing older is still running."""
    settings = Settings(database_url=database_url, relay_poll_interval_ms=10)
    dsn = database_url.replace("postgresql+asyncpg://", "postgresql://")
    slow = await asyncpg.connect(dsn)
    passes = SequencerPasses(monkeypatch)
    relay, finish = await run_relay(settings, database_url)
    try:
        tx = slow.transaction()
        await tx.start()
        await slow.execute(INSERT_ROW, "t", dataset("slow"), 1, "{}")  # id 1, open
        await db.execute(INSERT_ROW, "t", dataset("fast"), 1, "{}")  # id 2, committed
        await passes.wait(3)  # passes that saw the committed row
        assert await db.fetch("SELECT feed_offset FROM change_log_outbox WHERE feed_offset IS NOT NULL") == []
        assert relay.sequenced == 0
        await tx.commit()
        deadline = time.monotonic() + 5
        while await db.fetchval("SELECT count(*) FROM change_log_outbox WHERE feed_offset IS NULL"):
            assert time.monotonic() < deadline, "the rows were not sequenced within 5 s of the commit"
            await asyncio.sleep(0.02)
        rows = await db.fetch("SELECT urn, feed_offset FROM change_log_outbox ORDER BY feed_offset")
        assert [(r["urn"], r["feed_offset"]) for r in rows] == [(dataset("slow"), 1), (dataset("fast"), 2)]
    finally:
        await finish()
        await slow.close()
