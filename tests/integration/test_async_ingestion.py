"""Asynchronous ingestion against the real broker (Tansu) and the real Postgres: `async=true` → 202 → the MCP topic →
the MCP consumer → the write pipeline; poison records → FailedMetadataChangeProposal_v1; committed offsets.

Each test has its own topics and consumer group. Group joins on Tansu take about half the session timeout, so the
consumers here use 3 s sessions and each test joins as few times as it can.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import httpx
import orjson
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition

from app.errors import ServiceUnavailable
from app.ingest.gateway import IngestGateway
from app.kafka.consumers import McpConsumer
from app.main import create_app
from app.settings import Settings
from tests import helpers
from tests.helpers import (
    ANY_TRACE_ID,
    bearer,
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
    wire_form,
)

A = "urn:li:dataset:(urn:li:dataPlatform:hive,db.async_a,PROD)"
B = "urn:li:dataset:(urn:li:dataPlatform:hive,db.async_b,PROD)"
C = "urn:li:dataset:(urn:li:dataPlatform:hive,db.async_c,PROD)"
D = "urn:li:dataset:(urn:li:dataPlatform:hive,db.async_d,PROD)"
SYSTEM_ACTOR = "urn:li:corpuser:__datahub_system"
# DataHub's wire form (as on the MCP topic): aspect values as JSON strings.
mcp = partial(helpers.mcp, urn=A, encode=True)


# --- fixtures -------------------------------------------------------------------------------------------------------
@pytest.fixture
def topics() -> dict[str, str]:
    return unique_topics("topic_mcp", "topic_fmcp", "topic_mce", "topic_fmce")


@pytest_asyncio.fixture
async def settings_overrides(kafka_broker, topics, monkeypatch) -> dict[str, Any]:
    await create_topics(kafka_broker.bootstrap_servers, *topics.values())
    fast_groups(monkeypatch)
    overrides = kafka_overrides(kafka_broker.bootstrap_servers, topics)
    # The app's own consumer runs only in the test that asks for it.
    return overrides


# --- async=true through the app ------------------------------------------------------------------------------------
async def test_async_writes_are_validated_queued_and_applied_by_the_consumer(
    kafka_broker, topics, database_url, registry, db, monkeypatch
):
    bootstrap = kafka_broker.bootstrap_servers
    await create_topics(bootstrap, *topics.values())
    fast_groups(monkeypatch)
    settings = Settings(
        database_url=database_url,
        apply_migrations_on_start=False,
        mcp_consumer_enabled=True,
        **kafka_overrides(bootstrap, topics),
    )
    app = create_app(settings, registry)

    async with app.router.lifespan_context(app):
        assert app.state.proposal_producer is not None
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://metaledger", headers=await bearer(app)
        ) as client:
            # A bad proposal is refused now, with its index, and nothing is produced.
            bad = await client.post(
                "/openapi/v1/proposals?async=true",
                json=[mcp("status", {"removed": False}), mcp("notAnAspect", {"x": 1}, urn=B)],
            )
            assert bad.status_code == 400, bad.text
            assert [i["index"] for i in bad.json()["issues"]] == [1]
            bad_v3 = await client.post(
                "/openapi/v3/entity/dataset", json=[{"urn": B, "status": {"value": {"removed": "no"}}}]
            )
            assert bad_v3.status_code == 400, bad_v3.text

            # v1: queued, 202, what was queued.
            sm = {"runId": "async-run", "lastObserved": 1700000000000}
            v1 = await client.post(
                "/openapi/v1/proposals?async=true",
                json=[
                    {**mcp("status", {"removed": False}), "systemMetadata": sm},
                    {
                        **mcp("datasetProperties", {"description": "queued", "customProperties": {}}),
                        "headers": {"X-Test": "1"},
                    },
                ],
            )
            assert v1.status_code == 202, v1.text
            assert v1.json() == {
                "results": [
                    {"index": 0, "urn": A, "aspectName": "status", "status": "QUEUED"},
                    {"index": 1, "urn": A, "aspectName": "datasetProperties", "status": "QUEUED"},
                ],
                "changeLogs": 0,
            }

            # v3 batch: async is the default; the entities are echoed, one per URN.
            v3 = await client.post(
                "/openapi/v3/entity/dataset",
                json=[
                    {"urn": B, "status": {"value": {"removed": True}, "systemMetadata": {"runId": "v3-run"}}},
                    {"urn": B, "subTypes": {"value": {"typeNames": ["Table"]}}},
                ],
            )
            assert v3.status_code == 202, v3.text
            traced = {
                "properties": {"telemetryTraceId": ANY_TRACE_ID}
            }  # every write carries its trace (app.ingest.trace)
            assert v3.json() == [
                {
                    "urn": B,
                    "status": {
                        "value": {"removed": True},
                        "systemMetadata": {"runId": "v3-run", **traced},
                        "status": "QUEUED",
                    },
                    "subTypes": {"value": {"typeNames": ["Table"]}, "systemMetadata": traced, "status": "QUEUED"},
                }
            ]

            # v3 single aspect: CREATE by default travels in the MCP; a second CREATE fails later, in FMCP.
            single = await client.post(
                f"/openapi/v3/entity/dataset/{C}/status?async=true", json={"value": {"removed": False}}
            )
            assert single.status_code == 202, single.text
            assert single.json() == {
                "urn": C,
                "status": {"value": {"removed": False}, "systemMetadata": traced, "status": "QUEUED"},
            }

            # On the topic: exactly these MCPs, in order, keyed by URN, in DataHub's form (the bad ones never got there):
            # Avro MetadataChangeProposal framed with DataHub's id 16 (systemMetadata with the Avro record's defaults).
            records = await read_topic(bootstrap, topics["topic_mcp"], expect=5)
            assert [r.key.decode() for r in records] == [A, A, B, B, C]
            assert all(r.value[:5] == b"\x00\x00\x00\x00\x10" for r in records)
            values = [decode_value(r.value) for r in records]
            assert values[0] == {
                "entityType": "dataset",
                "entityUrn": A,
                "changeType": "UPSERT",
                "aspectName": "status",
                "aspect": {"value": '{"removed":false}', "contentType": "application/json"},
                "systemMetadata": {**sm, "lastRunId": "no-run-id-provided", **traced},
            }
            assert (
                values[1]["headers"] == {"X-Test": "1"}
                and values[1]["systemMetadata"]["properties"] == traced["properties"]
            )
            assert orjson.loads(values[1]["aspect"]["value"]) == {"description": "queued", "customProperties": {}}
            assert values[2]["systemMetadata"]["runId"] == "v3-run" and values[3]["aspectName"] == "subTypes"
            assert values[4]["changeType"] == "CREATE" and values[4]["entityUrn"] == C
            assert all(isinstance(v["aspect"]["value"], str) for v in values)

            # The app's consumer applies them; they read back through the API.
            async def applied():
                response = await client.get(f"/openapi/v3/entity/dataset/{C}/status")
                return response.status_code == 200

            await eventually(applied)
            for urn, aspect, value in [
                (A, "status", {"removed": False}),
                (B, "status", {"removed": True}),
                (B, "subTypes", {"typeNames": ["Table"]}),
                (C, "status", {"removed": False}),
            ]:
                response = await client.get(f"/openapi/v3/entity/dataset/{urn}/{aspect}?systemMetadata=true")
                assert response.status_code == 200, (urn, aspect, response.text)
                assert response.json()["value"] == value
            properties = await client.get(f"/openapi/v3/entity/dataset/{A}/datasetProperties")
            assert properties.json()["value"]["description"] == "queued"
            row = await stored(db, A, "status")
            assert row["createdBy"] == SYSTEM_ACTOR  # consumer writes use DataHub's system actor
            # the audit log names the consumer's surface, and no token: the record is what the consumer read
            entries = await db.fetch("SELECT actor, token_id, surface FROM audit_log WHERE urn = $1", A)
            assert entries and {tuple(e) for e in entries} == {(SYSTEM_ACTOR, None, "kafka")}
            assert (
                row["systemMetadata"]["runId"] == "async-run" and row["systemMetadata"]["lastObserved"] == 1700000000000
            )

            again = await client.post(
                f"/openapi/v3/entity/dataset/{C}/status?async=true", json={"value": {"removed": True}}
            )
            assert again.status_code == 202
            (failed,) = await read_topic(bootstrap, topics["topic_fmcp"], expect=1)
            payload, trace = dead_letter(failed)
            assert payload["changeType"] == "CREATE" and payload["entityUrn"] == C and failed.key.decode() == C
            assert trace["status"] == 409 and trace["exceptionClass"] == "app.errors.ExistenceConflict"
            assert (await stored(db, C, "status"))["value"] == {"removed": False}


async def test_async_without_kafka_applies_synchronously(database_url, registry, db):
    app = create_app(Settings(database_url=database_url, apply_migrations_on_start=False), registry)

    async with app.router.lifespan_context(app):
        assert app.state.proposal_producer is None
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://metaledger", headers=await bearer(app)
        ) as client:
            v1 = await client.post("/openapi/v1/proposals?async=true", json=[mcp("status", {"removed": False})])
            assert v1.status_code == 200 and v1.json()["results"][0]["status"] == "CREATED"
            v3 = await client.post(
                "/openapi/v3/entity/dataset", json=[{"urn": B, "status": {"value": {"removed": True}}}]
            )
            assert v3.status_code == 200 and v3.json()[0]["status"]["status"] == "CREATED"
            single = await client.post(
                f"/openapi/v3/entity/dataset/{C}/status?async=true", json={"value": {"removed": False}}
            )
            assert single.status_code == 200
    assert (await stored(db, A, "status"))["createdBy"] == "urn:li:corpuser:datahub"


# --- poison records ------------------------------------------------------------------------------------------------
class FlakyWriter:
    """The app's writer, whose `commit` fails with a 503 (database down) the next `failures` times."""

    def __init__(self, inner) -> None:
        self.inner, self.failures, self.calls = inner, 0, 0
        self.registry, self.settings = inner.registry, inner.settings

    def prepare(self, drafts):
        return self.inner.prepare(drafts)

    async def commit(self, session, proposals, audit, contended=None):
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise ServiceUnavailable("the database is unreachable (injected)")
        return await self.inner.commit(session, proposals, audit, contended)


async def test_poison_records_go_to_fmcp_and_the_consumer_keeps_going(app, kafka_broker, topics, db):
    bootstrap = kafka_broker.bootstrap_servers
    settings = app.state.settings
    writer = FlakyWriter(app.state.write_service)
    not_json = b"\x00{this is not json"  # 0x00: read as an Avro frame, whose schema id no registry knows
    unknown_aspect = mcp("notAnAspect", {"x": 1}, urn=B, systemMetadata={"runId": "poison-run"})
    stale = mcp("status", {"removed": True}, headers={"If-Version-Match": "7"}, systemMetadata={"runId": "poison-run"})
    not_an_mcp = {"hello": "world"}
    schema_bad = mcp("status", {"removed": "yes"}, urn=B)
    await produce(
        bootstrap,
        topics["topic_mcp"],
        [
            (A, mcp("status", {"removed": False})),  # 0 good: status v1
            (None, not_json),  # 1 poison: not JSON
            (A, mcp("datasetProperties", {"description": "once"}, change_type="CREATE")),  # 2 good (a CREATE)
            (B, unknown_aspect),  # 3 poison: unknown aspect
            (A, stale),  # 4 poison: If-Version-Match fails
            (None, not_an_mcp),  # 5 poison: JSON, not an MCP
            (B, mcp("status", {"removed": False}, urn=B)),  # 6 good
            (A, mcp("status", {"removed": True}, headers={"If-Version-Match": "1"})),  # 7 good: v1 → v2, after 4 failed
            (B, schema_bad),  # 8 poison: schema
        ],
    )

    stop = asyncio.Event()
    consumer = McpConsumer(settings, app.state.sessionmaker, IngestGateway(writer))
    task = asyncio.create_task(consumer.run(stop))
    try:
        failed = await read_topic(bootstrap, topics["topic_fmcp"], expect=5, timeout=30)
        assert len(failed) == 5
        letters = [dead_letter(r) for r in failed]
        assert [t["source"]["offset"] for _, t in letters] == [1, 3, 4, 5, 8]
        assert all(t["source"]["topic"] == topics["topic_mcp"] for _, t in letters)

        (p1, t1), (p3, t3), (p4, t4), (p5, t5), (p8, t8) = letters
        assert p1 == not_json.decode("utf-8", errors="backslashreplace") and t1["key"] is None
        assert t1["status"] == 400 and "unknown schema id 2071226473" in t1["message"]
        assert t1["exceptionClass"] == "app.errors.ValidationFailed" and t1["rawRecord"] is True
        assert p3 == wire_form("mcp", unknown_aspect) and t3["key"].decode() == B and t3["status"] == 400
        assert "Unknown aspect notAnAspect for entity dataset" in t3["message"]
        assert t3["body"]["issues"][0]["path"] == "$.aspectName" and "index" not in t3["body"]["issues"][0]
        assert p4 == wire_form("mcp", stale) and t4["key"].decode() == A
        assert t4["status"] == 412 and t4["exceptionClass"] == "app.errors.PreconditionFailed"
        assert t4["body"]["error"] == "Precondition Error" and t4["body"]["issues"][0]["aspect"] == "status"
        assert t4["message"] == "IfVersionMatch: Expected version 7, actual version 1"
        assert p5 == not_an_mcp and t5["status"] == 400 and "unknown proposal field(s) ['hello']" in t5["message"]
        assert p8 == wire_form("mcp", schema_bad) and t8["status"] == 400
        assert t8["body"]["issues"][0]["path"] == "$.aspect.value.removed"
        for _, trace in letters:
            assert set(trace) >= {"message", "exceptionClass", "stackTrace", "cause", "status", "body"}

        # Every good record was applied, in order: #7 saw #0's version although #4 failed between them.
        status_a = await eventually(lambda: stored(db, A, "status"))
        assert status_a["value"] == {"removed": True} and status_a["systemMetadata"]["version"] == "2"
        assert (await stored(db, A, "datasetProperties"))["value"]["description"] == "once"
        assert (await stored(db, B, "status"))["value"] == {"removed": False}
        assert (
            await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'notAnAspect'", B)
            == 0
        )

        # The consumer keeps going; a database outage is retried, never dead-lettered.
        writer.failures = 2
        calls_before = writer.calls
        await produce(bootstrap, topics["topic_mcp"], [(C, mcp("status", {"removed": False}, urn=C))])
        await eventually(lambda: stored(db, C, "status"))
        assert writer.calls - calls_before == 3 and consumer.stats["retries"] == 2
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    assert consumer.stats["dead_letters"] == 5 and consumer.stats["records"] == 10

    # Offsets are committed: the group resumes after the last record.
    check = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=settings.mcp_consumer_group, enable_auto_commit=False
    )
    await check.start()
    try:
        assert await check.committed(TopicPartition(topics["topic_mcp"], 0)) == 10
    finally:
        await check.stop()

    # A restarted consumer neither re-applies (the CREATE would now conflict) nor re-dead-letters anything.
    await produce(bootstrap, topics["topic_mcp"], [(D, mcp("status", {"removed": False}, urn=D))])
    stop = asyncio.Event()
    restarted = McpConsumer(settings, app.state.sessionmaker, IngestGateway(writer))
    task = asyncio.create_task(restarted.run(stop))
    try:
        await eventually(lambda: stored(db, D, "status"))
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    assert restarted.stats["records"] == 1 and restarted.stats["dead_letters"] == 0
    assert len(await read_topic(bootstrap, topics["topic_fmcp"], expect=5)) == 5
    assert (await stored(db, A, "status"))["systemMetadata"]["version"] == "2"


class _Record:
    """A consumed record, as aiokafka gives it (the fields the consumer reads)."""

    def __init__(self, offset: int, value: Any, key: str | None = None) -> None:
        self.topic, self.partition, self.offset, self.timestamp = "mcp", 0, offset, 0
        self.key = key.encode() if key else None
        self.value = value if isinstance(value, bytes) else orjson.dumps(value)


class BuggyWriter(FlakyWriter):
    """Raises an unexpected (non-client) error whenever a batch touches `urn`."""

    def __init__(self, inner, urn: str) -> None:
        super().__init__(inner)
        self.urn = urn

    async def commit(self, session, proposals, audit, contended=None):
        if any(p.urn == self.urn for p in proposals):
            raise RuntimeError("a bug in the write path")
        return await super().commit(session, proposals, audit, contended)


async def test_isolation_when_most_of_a_batch_fails_and_on_unexpected_errors(app, db):
    """Many failures in one batch (beyond the prefix/first-failure rounds: one by one) and an unexpected error: only
    the failing records get an error, in record order everything else is written. No Kafka involved."""
    urns = [f"urn:li:dataset:(urn:li:dataPlatform:hive,db.iso_{i},PROD)" for i in range(30)]
    records = []
    for i, urn in enumerate(urns):
        if i % 3 == 0:  # 10 records fail their precondition (the aspect does not exist yet)
            records.append(
                _Record(i, mcp("status", {"removed": False}, urn=urn, headers={"If-Version-Match": "3"}), urn)
            )
        else:
            records.append(_Record(i, mcp("status", {"removed": False}, urn=urn), urn))
    records.append(_Record(30, mcp("status", {"removed": False}, urn=D), D))  # the buggy one
    writer = BuggyWriter(app.state.write_service, D)
    consumer = McpConsumer(app.state.settings, app.state.sessionmaker, IngestGateway(writer))
    units = await consumer.read(records)
    assert all(u.error is None and len(u.proposals) == 1 for u in units)
    applies = writer.calls
    await consumer.commit(units[:-1])  # 10 failures: 8 first-failure rounds, then one by one
    assert writer.calls - applies > 8
    await consumer.commit(units[-1:])

    failed = [u.offset for u in units if u.error is not None]
    assert failed == [0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30]
    assert all(u.applied for u in units if u.error is None)
    for unit in units[:-1]:
        if unit.error is not None:
            trace = dead_letter_trace(unit)
            assert (
                trace["status"] == 412 and trace["message"] == "IfVersionMatch: Expected version 3, actual version -1"
            )
            assert trace["body"]["issues"] == [{"message": trace["message"], "urn": unit.urn, "aspect": "status"}]
    bug = dead_letter_trace(units[-1])
    assert bug["status"] == 500 and bug["exceptionClass"] == "builtins.RuntimeError" and bug["stackTrace"]
    written = await db.fetch("SELECT urn FROM metadata_aspect_v2 WHERE aspect = 'status' AND version = 0")
    assert sorted(r["urn"] for r in written) == sorted(u for i, u in enumerate(urns) if i % 3)

    # A conflict and a failed precondition in one batch: each gets its own kind of error (409, 412).
    mixed = await consumer.read(
        [
            _Record(40, mcp("status", {"removed": True}, urn=urns[1], change_type="CREATE"), urns[1]),
            _Record(41, mcp("status", {"removed": True}, urn=urns[2], headers={"If-Version-Match": "9"}), urns[2]),
            _Record(42, mcp("subTypes", {"typeNames": ["View"]}, urn=urns[4]), urns[4]),
        ]
    )
    await consumer.commit(mixed)
    assert [dead_letter_trace(u)["status"] if u.error else "applied" for u in mixed] == [409, 412, "applied"]
    assert dead_letter_trace(mixed[0])["exceptionClass"] == "app.errors.ExistenceConflict"


def dead_letter_trace(unit) -> dict[str, Any]:
    from app.kafka.consumers import trace_exception

    return orjson.loads(orjson.dumps(trace_exception(unit.error)))
