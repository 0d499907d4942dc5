"""The change feed over HTTP (GET /openapi/v1/events/mcl) without Kafka: commit order, pagination, filters, errors."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import orjson
import pytest

from tests.helpers import SequencerPasses, dataset, mcp, propose, wait_sequenced

FEED = "/openapi/v1/events/mcl"


async def read_all(client, after: int = 0, limit: int = 100, **params) -> tuple[list[dict], int]:
    events = []
    while True:
        response = await client.get(FEED, params={"after": after, "limit": limit, **params})
        assert response.status_code == 200, response.text
        page = response.json()
        assert len(page["events"]) <= limit
        if not page["events"]:
            assert page["nextOffset"] == after
            return events, after
        assert page["nextOffset"] == page["events"][-1]["offset"]
        events.extend(page["events"])
        after = page["nextOffset"]


async def wait_for_events(client, count: int, timeout: float = 10.0, **params) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        events, _ = await read_all(client, limit=1000, **params)
        if len(events) >= count:
            return events
        assert time.monotonic() < deadline, f"{len(events)} of {count} events in the feed"
        await asyncio.sleep(0.02)


async def test_feed_pages_through_every_change_in_commit_order(client, db):
    urns = [dataset(f"feed{i}") for i in range(3)]
    for n in range(4):
        await propose(client, *[mcp("status", {"removed": n % 2 == 1}, urn=u) for u in urns])
    stored = await db.fetch(
        "SELECT id, payload FROM change_log_outbox WHERE topic LIKE 'MetadataChangeLog%' ORDER BY id"
    )
    assert len(stored) == 3 + 3 * 4  # the key aspects, then four versions of each status

    everything = await wait_for_events(client, len(stored))
    paged, last = await read_all(client, limit=4)
    assert paged == everything and last == everything[-1]["offset"]
    offsets = [e["offset"] for e in everything]
    assert offsets == sorted(set(offsets))
    # one transaction after another: commit order is write order here
    assert [e["mcl"] for e in everything] == [orjson.loads(r["payload"]) for r in stored]
    # over every topic (platform events too) the offsets are consecutive from 1
    every_topic = await db.fetchval("SELECT count(*) FROM change_log_outbox")
    topics = [
        ("topic", t) for t in ("MetadataChangeLog_Versioned_v1", "MetadataChangeLog_Timeseries_v1", "PlatformEvent_v1")
    ]
    page = (await client.get(FEED, params=[*topics, ("limit", 1000)])).json()
    assert [e["offset"] for e in page["events"]] == list(range(1, every_topic + 1))
    first = everything[0]
    assert set(first) == {"offset", "topic", "key", "urn", "aspect", "version", "changeType", "createdAt", "mcl"}
    assert first["topic"] == "MetadataChangeLog_Versioned_v1" and first["key"] == first["urn"] == urns[0]
    assert first["aspect"] == "datasetKey" and first["version"] == 1 and first["changeType"] == "UPSERT"
    assert abs(first["createdAt"] / 1000 - time.time()) < 60
    for urn in urns:
        versions = [e["version"] for e in everything if e["urn"] == urn and e["aspect"] == "status"]
        assert versions == [1, 2, 3, 4]
        mcl_versions = [
            e["mcl"]["systemMetadata"]["version"] for e in everything if e["urn"] == urn and e["aspect"] == "status"
        ]
        assert mcl_versions == ["1", "2", "3", "4"]

    # continuing from the middle gives the rest; from the end, an empty page that keeps the offset
    rest, _ = await read_all(client, after=everything[5]["offset"], limit=3)
    assert rest == everything[6:]
    response = await client.get(FEED, params={"after": last})
    assert response.json() == {"events": [], "nextOffset": last}
    response = await client.get(FEED, params={"after": last + 100})
    assert response.json() == {"events": [], "nextOffset": last + 100}
    # defaults: after=0, limit=100
    response = await client.get(FEED)
    assert [e["offset"] for e in response.json()["events"]] == [e["offset"] for e in everything]


async def test_feed_never_lets_a_late_commit_slip_behind_a_read_offset(client, db, database_url, monkeypatch):
    """A change log whose transaction is still open holds back every later one: once a reader has seen offset N, no
    change committed later can appear at or below N."""
    await propose(client, mcp("status", {"removed": False}, urn=dataset("early")))
    seen = await wait_for_events(client, 2)
    assert [e["aspect"] for e in seen] == ["datasetKey", "status"]
    slow = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        tx = slow.transaction()
        await tx.start()
        await slow.execute(
            "INSERT INTO change_log_outbox (topic, message_key, urn, aspect, version, change_type, payload) "
            "VALUES ('MetadataChangeLog_Versioned_v1', $1, $1, 'status', 7, 'UPSERT', '{\"slow\": true}')",
            dataset("slow"),
        )
        passes = SequencerPasses(monkeypatch)
        await propose(client, mcp("status", {"removed": True}, urn=dataset("early")))  # commits first
        await passes.wait(3)  # passes of the app's sequencer that saw it committed
        events, _ = await read_all(client)
        assert events == seen  # neither is in the feed while the older transaction is open
        await tx.commit()
    finally:
        await slow.close()
    events = await wait_for_events(client, 4)
    assert [(e["urn"], e["version"]) for e in events[2:]] == [(dataset("slow"), 7), (dataset("early"), 2)]
    assert events[2]["mcl"] == {"slow": True}


async def test_feed_topic_filter(client, app, db):
    await propose(
        client, mcp("datasetProfile", {"timestampMillis": 1_700_000_000_000, "rowCount": 1}, dataset("orders"))
    )
    pe_topic = app.state.settings.topic_platform_event
    await db.execute(
        "INSERT INTO change_log_outbox (topic, message_key, urn, aspect, version, change_type, payload) "
        "VALUES ($1, 'entityChangeEvent-' || $2, $2, 'status', 1, 'UPSERT', '{\"name\": \"entityChangeEvent\"}')",
        pe_topic,
        dataset("pe"),
    )
    total = await db.fetchval("SELECT count(*) FROM change_log_outbox")
    # (the write path may add platform events of its own: count what each filter should see from the table)
    pe_rows = await db.fetchval("SELECT count(*) FROM change_log_outbox WHERE topic = $1", pe_topic)
    await wait_sequenced(db)
    default, _ = await read_all(client)
    assert pe_topic not in {e["topic"] for e in default}  # the MCL topics by default
    assert {e["topic"] for e in default} == {"MetadataChangeLog_Versioned_v1", "MetadataChangeLog_Timeseries_v1"}
    timeseries, _ = await read_all(client, topic="MetadataChangeLog_Timeseries_v1")
    assert [(e["aspect"], e["version"]) for e in timeseries] == [("datasetProfile", 1_700_000_000_000)]
    pe, _ = await read_all(client, topic=pe_topic)
    assert [e["key"] for e in pe if e["urn"] == dataset("pe")] == [f"entityChangeEvent-{dataset('pe')}"]
    assert len(pe) == pe_rows and len(default) == total - pe_rows
    both = (await client.get(FEED, params=[("topic", pe_topic), ("topic", "MetadataChangeLog_Versioned_v1")])).json()
    assert len(both["events"]) == total - len(timeseries)


@pytest.mark.parametrize(
    ("params", "path"),
    [
        ({"limit": 0}, "$.limit"),
        ({"limit": 1001}, "$.limit"),
        ({"limit": -5}, "$.limit"),
        ({"after": -1}, "$.after"),
        ({"topic": "SomethingElse_v1"}, "$.topic"),
        ({"after": "abc"}, "$after"),
        ({"limit": "many"}, "$limit"),
    ],
)
async def test_feed_rejects_bad_parameters(client, params, path):
    response = await client.get(FEED, params=params)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["error"] == "Validation Error" and body["message"]
    assert [issue["path"] for issue in body["issues"]] == [path]


async def test_feed_limit_bounds(client, db):
    await propose(client, *[mcp("status", {"removed": False}, urn=dataset(f"lim{i}")) for i in range(3)])
    await wait_for_events(client, 6)
    assert len((await client.get(FEED, params={"limit": 1})).json()["events"]) == 1
    assert len((await client.get(FEED, params={"limit": 1000})).json()["events"]) == 6


async def test_feed_is_in_the_openapi_spec(client):
    spec = (await client.get("/openapi.json")).json()
    operation = spec["paths"][FEED]["get"]
    assert {p["name"] for p in operation["parameters"]} == {"after", "limit", "topic"}
    assert operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/ChangeFeedPage")
    event = spec["components"]["schemas"]["ChangeFeedEvent"]
    assert set(event["properties"]) == {
        "offset",
        "topic",
        "key",
        "urn",
        "aspect",
        "version",
        "changeType",
        "createdAt",
        "mcl",
    }
