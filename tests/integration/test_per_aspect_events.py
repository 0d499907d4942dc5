"""Per-aspect events ("Metadata Events (v5)") and MAE v4 against the real broker (Tansu) and the real Postgres: the
relay publishes the routed pairs' audit events (old and new values, a tombstone for a delete, nothing for the other
pairs, per-URN order) and MAE v4 next to the change logs; the per-aspect change topics are applied through the write
pipeline and their failures go to the pair's failed topic. Values are read back with fastavro and the schema the
registry serves for their id, not through metaledger's codec."""

from __future__ import annotations

import asyncio
import io
import uuid
from typing import Any

import fastavro
import httpx
import orjson
import pytest

from app.avro import per_aspect, schemas
from app.avro.wire import frame
from app.kafka.per_aspect import EventRoutingError, resolve_routes
from app.settings import Settings
from tests.helpers import (
    create_topics,
    dataset,
    eventually,
    fast_groups,
    mcp,
    produce,
    propose,
    read_topic,
    stored,
    unique_topics,
    wait_delivered,
)

URN = dataset("v5_a")
OTHER = dataset("v5_b")


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def topics(tag) -> dict[str, Any]:
    return {
        **unique_topics(),
        "events_v5_audit_topic": f"audit_{tag}.{{entity}}.{{aspect}}",
        "events_v5_change_topic": f"change_{tag}.{{entity}}.{{aspect}}",
        "events_v5_failed_topic": f"failed_{tag}.{{entity}}.{{aspect}}",
        "topic_mae": f"mae_{tag}",
    }


@pytest.fixture
def settings_overrides(kafka_broker, topics, monkeypatch) -> dict[str, Any]:
    fast_groups(monkeypatch)
    return {
        "kafka_bootstrap_servers": kafka_broker.bootstrap_servers,
        **topics,
        "events_v5_routes": [{"entityTypes": ["dataset"], "aspects": ["globalTags", "status"]}],
        "mae_v4_enabled": True,
        "events_v5_consumer_enabled": True,
        "mcp_consumer_group": f"group-{topics['topic_mcp']}",
    }


async def served_schema(client: httpx.AsyncClient, schema_id: int) -> Any:
    response = await client.get(f"/schema-registry/api/schemas/ids/{schema_id}")
    assert response.status_code == 200, response.text
    return fastavro.parse_schema(orjson.loads(response.json()["schema"]))


async def read_framed(client: httpx.AsyncClient, raw: bytes) -> tuple[int, dict[str, Any]]:
    assert raw[0] == 0
    schema_id = int.from_bytes(raw[1:5], "big")
    return schema_id, fastavro.schemaless_reader(io.BytesIO(raw[5:]), await served_schema(client, schema_id))


def tags(*names: str) -> dict[str, Any]:
    return {"tags": [{"tag": f"urn:li:tag:{n}"} for n in names]}


async def test_audit_events_and_mae_v4_are_published_with_the_change_logs(
    app, client, anonymous, db, kafka_broker, topics, tag
):
    bootstrap = kafka_broker.bootstrap_servers
    await propose(client, mcp("globalTags", tags("a"), URN))  # create
    await propose(client, mcp("datasetProperties", {"description": "x"}, URN))  # not routed
    await propose(client, mcp("globalTags", tags("a", "b"), URN))  # update
    await propose(client, mcp("globalTags", tags("a", "b"), URN))  # no-op: no change log, no event
    await propose(client, mcp("status", {"removed": False}, OTHER))  # another routed pair
    await propose(client, mcp("globalTags", None, URN, change_type="DELETE"))  # delete
    await wait_delivered(db)

    audit = await read_topic(bootstrap, f"audit_{tag}.dataset.globalTags", expect=3)
    assert [r.key.decode() for r in audit] == [URN] * 3
    (id1, created), (id2, updated) = [await read_framed(client, r.value) for r in audit[:2]]
    assert id1 == id2 and id1 >= 1000  # the generated schema, registered under the topic's subject
    assert created["urn"] == URN and created["oldValue"] is None
    assert [t["tag"] for t in created["newValue"]["tags"]] == ["urn:li:tag:a"]
    assert [t["tag"] for t in updated["oldValue"]["tags"]] == ["urn:li:tag:a"]
    assert [t["tag"] for t in updated["newValue"]["tags"]] == ["urn:li:tag:a", "urn:li:tag:b"]
    assert audit[2].value is None  # the delete: a tombstone
    subject = await client.get(f"/schema-registry/api/subjects/audit_{tag}.dataset.globalTags-value/versions/latest")
    assert subject.json()["id"] == id1
    served = orjson.loads(subject.json()["schema"])
    assert schemas.record_name_of(served) == "com.linkedin.mxe.dataset.globalTags.MetadataAuditEvent"

    status = await read_topic(bootstrap, f"audit_{tag}.dataset.status", expect=1)
    assert [r.key.decode() for r in status] == [OTHER]
    assert (await read_framed(client, status[0].value))[1]["newValue"]["removed"] is False
    # an unrouted pair has no topic at all (nothing was created for it, nothing published)
    assert await read_topic(bootstrap, f"audit_{tag}.dataset.datasetProperties", expect=0, timeout=1, settle=0.2) == []

    # MAE v4: DataHub's MetadataAuditEvent (id 22), snapshots with the one aspect the change touched
    mae = await read_topic(bootstrap, topics["topic_mae"], expect=7)
    mae_schema = await served_schema(client, 22)
    assert {r.value[1:5] for r in mae} == {(22).to_bytes(4, "big")}
    events = [fastavro.schemaless_reader(io.BytesIO(r.value[5:]), mae_schema, return_record_name=True) for r in mae]

    def aspects(snapshot: Any) -> list[tuple[str, Any]]:
        if snapshot is None:
            return []
        name, body = snapshot
        assert name == "com.linkedin.pegasus2avro.metadata.snapshot.DatasetSnapshot"
        return body["aspects"]

    touched = [
        e
        for e in events
        if any(name.endswith(".GlobalTags") for name, _ in aspects(e["newSnapshot"]) + aspects(e["oldSnapshot"]))
    ]
    first, second, deleted = touched
    assert first["oldSnapshot"] is None and first["newSnapshot"][1]["urn"] == URN
    assert [[t["tag"] for t in value["tags"]] for _, value in aspects(first["newSnapshot"])] == [["urn:li:tag:a"]]
    assert [[t["tag"] for t in value["tags"]] for _, value in aspects(second["oldSnapshot"])] == [["urn:li:tag:a"]]
    assert [len(value["tags"]) for _, value in aspects(second["newSnapshot"])] == [2]
    assert aspects(deleted["newSnapshot"]) == [] and [len(v["tags"]) for _, v in aspects(deleted["oldSnapshot"])] == [2]
    # every change log of a dataset aspect its snapshot carries: the key, tags x3, properties, status of OTHER
    assert len(events) == 7

    assert (await anonymous.get("/openapi/v1/events/v5")).status_code == 401  # READ, as every read
    listed = (await client.get("/openapi/v1/events/v5?schemas=true")).json()
    pairs = {(p["entityType"], p["aspectName"]): p for p in listed["pairs"]}
    assert set(pairs) == {("dataset", "globalTags"), ("dataset", "status")}
    assert pairs["dataset", "globalTags"]["topics"]["MetadataAuditEvent"] == f"audit_{tag}.dataset.globalTags"
    assert pairs["dataset", "globalTags"]["schemas"]["MetadataAuditEvent"]["name"] == "MetadataAuditEvent"


async def test_per_aspect_change_events_are_applied_and_failures_go_to_the_pairs_failed_topic(
    app, client, db, kafka_broker, tag, topics
):
    bootstrap = kafka_broker.bootstrap_servers
    change_topic = f"change_{tag}.dataset.globalTags"
    await create_topics(bootstrap, change_topic, f"failed_{tag}.dataset.globalTags")
    document = per_aspect.event_schemas("dataset", "globalTags", app.state.registry.aspect_spec("globalTags").schema)
    # a producer registers the exported schema under its topic's subject (as Confluent's AvroSerializer does)
    schema_id = await app.state.schema_registry.register(
        f"{change_topic}-value", orjson.dumps(document["MetadataChangeEvent"]).decode()
    )
    parsed = fastavro.parse_schema(document["MetadataChangeEvent"])

    def event(urn: str, value: Any) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, {"urn": urn, "proposedValue": value})
        return frame(schema_id, out.getvalue())

    bad = "urn:li:chart:(looker,not_a_dataset)"
    await produce(
        bootstrap,
        change_topic,
        [
            (URN, event(URN, tags("in"))),  # UPSERT
            (OTHER, event(OTHER, tags("x"))),
            (OTHER, event(OTHER, None)),  # no proposedValue: DELETE of the aspect
            (bad, event(bad, tags("y"))),  # not a dataset: refused
        ],
    )

    async def applied() -> bool:
        row = await stored(db, URN, "globalTags")
        return row is not None

    assert await eventually(applied, timeout=30)
    assert (await stored(db, URN, "globalTags"))["value"]["tags"] == [{"tag": "urn:li:tag:in"}]
    (failed,) = await read_topic(bootstrap, f"failed_{tag}.dataset.globalTags", expect=1, timeout=30)
    assert failed.key.decode() == bad
    _, letter = await read_framed(client, failed.value)
    assert letter["metadataChangeEvent"]["urn"] == bad
    (trace,) = orjson.loads(letter["error"])
    assert trace["status"] == 400 and "dataset" in trace["message"]

    async def deleted() -> bool:
        return (
            await db.fetchval(
                "SELECT count(*) FROM change_log_outbox WHERE urn = $1 AND aspect = 'globalTags' "
                "AND change_type = 'DELETE' AND topic = $2",
                OTHER,
                topics["topic_mcl_versioned"],
            )
            == 1
        )

    assert await eventually(deleted, timeout=30)
    assert await stored(db, OTHER, "globalTags") is None


def test_routes_are_checked_at_start_up(registry):
    def routes(*entries: dict, **settings: Any):
        return resolve_routes(Settings(events_v5_routes=list(entries), **settings), registry)

    assert list(routes({"entityTypes": ["dataset"], "aspects": ["globalTags"]})) == [("dataset", "globalTags")]
    assert len(routes({"entityTypes": ["data*"], "aspects": ["globalTags"]})) > 1  # patterns
    with pytest.raises(EventRoutingError, match="matches no entity/aspect pair"):
        routes({"entityTypes": ["nothing"]})
    with pytest.raises(EventRoutingError, match="not a legal Kafka topic name"):
        routes({"entityTypes": ["dataset"], "aspects": ["status"], "auditTopic": "no spaces allowed"})
    with pytest.raises(EventRoutingError, match="several schemas on one topic"):
        routes({"entityTypes": ["dataset", "chart"], "aspects": ["status"], "auditTopic": "shared"})
    assert (
        len(
            routes(
                {
                    "entityTypes": ["dataset", "chart"],
                    "aspects": ["status"],
                    "auditTopic": "shared",
                    "changeTopic": "c.{entity}",
                    "failedTopic": "f.{entity}",
                    "sharedTopic": True,
                }
            )
        )
        == 2
    )
    with pytest.raises(EventRoutingError, match="unknown key"):
        routes({"entityTypes": ["dataset"], "aspects": ["status"], "topic": "x"})
    assert schemas.schema(schemas.MAE)["name"] == "MetadataAuditEvent"


async def test_a_bad_route_stops_the_service_from_starting(database_url, registry):
    from app.main import create_app

    with pytest.raises(EventRoutingError):
        create_app(Settings(database_url=database_url, events_v5_routes=[{"aspects": ["noSuchAspect"]}]), registry)
    await asyncio.sleep(0)
