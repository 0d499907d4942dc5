"""DataHub's Events API over the change feed (GET /openapi/v1/events/poll), without Kafka: DataHub's shape, offsets
that continue, the long poll, the lookback window, and hostile parameters."""

from __future__ import annotations

import asyncio
import time

import orjson

from app.changelog import feed
from tests.helpers import dataset, eventually, mcp, propose, wait_sequenced

POLL = "/openapi/v1/events/poll"
PE = "PlatformEvent_v1"
MCL = "MetadataChangeLog_Versioned_v1"


async def poll(client, **params) -> dict:
    response = await client.get(POLL, params={k: v for k, v in params.items() if v is not None})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"offsetId", "count", "events"} and body["count"] == len(body["events"])
    assert all(e["contentType"] == "application/json" and isinstance(e["value"], str) for e in body["events"])
    return body


async def drain(client, topic: str, offset: str, want: int, timeout: float = 10.0) -> tuple[list[dict], str]:
    """Every event of `topic` after `offset` until `want` arrived, following offsetId."""
    events: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(events) < want:
        assert time.monotonic() < deadline, f"{len(events)} of {want} events"
        body = await poll(client, topic=topic, offsetId=offset, pollTimeoutSeconds=1)
        events.extend(orjson.loads(e["value"]) for e in body["events"])
        offset = body["offsetId"]
    return events, offset


async def test_without_an_offset_only_new_events_come_and_offsets_continue(client, db):
    urn = dataset("poll_new")
    await propose(client, mcp("globalTags", {"tags": [{"tag": "urn:li:tag:old"}]}, urn=urn))
    await wait_sequenced(db)  # the old tag's event is in the feed, before the poll's start
    start = await poll(client, topic=PE, pollTimeoutSeconds=0)
    assert start["events"] == []  # from now on: the old tag's event is not replayed

    await propose(client, mcp("globalTags", {"tags": [{"tag": "urn:li:tag:old"}, {"tag": "urn:li:tag:new"}]}, urn=urn))
    events, offset = await drain(client, PE, start["offsetId"], 1)
    assert [e["name"] for e in events] == ["entityChangeEvent"]
    # DataHub Actions reads value["payload"] as a GenericPayload whose value is the EntityChangeEvent JSON
    change = orjson.loads(events[0]["payload"]["value"])
    assert (change["category"], change["operation"], change["modifier"], change["entityUrn"]) == (
        "TAG",
        "ADD",
        "urn:li:tag:new",
        urn,
    )
    again = await poll(client, topic=PE, offsetId=offset, pollTimeoutSeconds=0)
    assert again["events"] == [] and again["offsetId"] == offset  # nothing twice


async def test_mcl_topic_and_lookback_window(client, db):
    urn = dataset("poll_lookback")
    await propose(client, mcp("status", {"removed": False}, urn=urn))
    await wait_sequenced(db)
    body = await poll(client, topic=MCL, lookbackWindowDays=1, limit=5000, pollTimeoutSeconds=0)
    mcls = [orjson.loads(e["value"]) for e in body["events"]]
    mine = [m for m in mcls if m["entityUrn"] == urn]
    assert [m["aspectName"] for m in mine] == ["datasetKey", "status"]
    assert orjson.loads(mine[1]["aspect"]["value"]) == {"removed": False}  # the MCL exactly as on Kafka (JSON)


async def test_the_long_poll_returns_when_an_event_arrives(client, db, monkeypatch):
    start = await poll(client, topic=MCL, pollTimeoutSeconds=0)
    urn = dataset("poll_wait")
    reads = 0  # of the feed, by the long poll
    read_page = feed.read_page

    async def counted(*args, **kwargs):
        nonlocal reads
        reads += 1
        return await read_page(*args, **kwargs)

    monkeypatch.setattr(feed, "read_page", counted)
    waiting = asyncio.create_task(poll(client, topic=MCL, offsetId=start["offsetId"], pollTimeoutSeconds=20))
    # the poll found nothing and waits (read the feed twice, empty, still unanswered)
    await eventually(lambda: asyncio.sleep(0, reads >= 2 or waiting.done()), what="the long poll's second read")
    assert not waiting.done(), waiting.result()
    written = time.monotonic()
    await propose(client, mcp("status", {"removed": True}, urn=urn))
    body = await waiting
    after_write = time.monotonic() - written
    assert [(m["entityUrn"], m["aspectName"]) for m in map(orjson.loads, (e["value"] for e in body["events"]))] == [
        (urn, "datasetKey"),
        (urn, "status"),
    ]
    assert after_write < 10, after_write  # answered once the event came, not at its 20 s timeout


async def test_an_idle_poll_waits_its_timeout_and_keeps_the_offset(client, db):
    start = await poll(client, topic=PE, pollTimeoutSeconds=0)
    began = time.monotonic()
    body = await poll(client, topic=PE, offsetId=start["offsetId"], pollTimeoutSeconds=1)
    assert body["events"] == [] and body["offsetId"] == start["offsetId"] and time.monotonic() - began >= 0.9


async def test_bad_parameters_are_400s_naming_them(client):
    cases = {
        "$.topic": {"topic": "MetadataChangeProposal_v1"},
        "$.offsetId": {"topic": PE, "offsetId": "abc"},
        "$.limit": {"topic": PE, "limit": 0},
        "$.pollTimeoutSeconds": {"topic": PE, "pollTimeoutSeconds": -1},
        "$.lookbackWindowDays": {"topic": PE, "lookbackWindowDays": -3},
    }
    for path, params in cases.items():
        response = await client.get(POLL, params=params)
        assert response.status_code == 400, (params, response.text)
        assert [i["path"] for i in response.json()["issues"]] == [path], response.text
    missing = await client.get(POLL)
    assert missing.status_code == 400 and "topic" in missing.text
    huge = await client.get(POLL, params={"topic": PE, "offsetId": "9" * 40})
    assert huge.status_code == 400 and [i["path"] for i in huge.json()["issues"]] == ["$.offsetId"], huge.text
