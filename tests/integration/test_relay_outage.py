"""The broker stopped for 30 s during ingestion: writes keep succeeding, the change feed keeps growing, and every
change log committed during and after the outage arrives once the broker is back.

Tansu keeps its data in memory only: restarted on the same port it comes back empty, without topics (the relay
recreates them) and without the messages delivered before the stop. So the assertion is about what the relay owes
after the stop: every change acknowledged from the moment of the stop on is on the topic, in per-URN order, and
nothing on the topic is a change that was not committed. (This test is the suite's one slow test.)
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import orjson
import pytest

from tests.helpers import TopicReader, dataset, eventually, mcp, propose, unique_topics, wait_delivered

OUTAGE_SECONDS = 30


@pytest.fixture
def settings_overrides(kafka_broker):
    return {
        "kafka_bootstrap_servers": kafka_broker.bootstrap_servers,
        "retention_max_versions": 1000,
        **unique_topics(),
    }


async def test_broker_outage_of_30s_loses_no_change_log(app, client, db, kafka_broker):
    settings = app.state.settings
    topic = settings.topic_mcl_versioned
    urns = [dataset(f"outage{i}") for i in range(4)]
    acknowledged: list[tuple[str, int, float]] = []  # (urn, version, when acknowledged)
    writing = True

    async def ingest() -> None:
        n = 0
        while writing:
            n += 1
            result = await propose(client, *[mcp("datasetProperties", {"description": f"n{n}"}, urn=u) for u in urns])
            now = time.monotonic()
            acknowledged.extend((r["urn"], int(r["version"]), now) for r in result["results"])  # propose asserts 200
            await asyncio.sleep(0.1)  # the ingestion's pace (about ten batches a second), not a wait for anything

    writer = asyncio.create_task(ingest())
    try:

        async def published() -> bool:
            return await db.fetchval(
                "SELECT count(*) FROM change_log_outbox WHERE aspect = 'datasetProperties' AND delivered_at IS NOT NULL"
            ) >= 2 * len(urns)

        await eventually(published, what="the relay publishing the first writes' change logs")
        await wait_delivered(db)  # (writes continue; this only shows the relay is publishing before the outage)
        kafka_broker.stop()
        stopped_at = time.monotonic()
        feed_before = await db.fetchval("SELECT last_offset FROM change_log_feed_state")
        await asyncio.sleep(OUTAGE_SECONDS)  # the outage itself: its length is what the test is about
        # the outage did not stop writes (every propose above asserted 200) nor the change feed
        during = [a for a in acknowledged if a[2] > stopped_at]
        assert len(during) >= OUTAGE_SECONDS * 4 * len(urns) // 2, len(during)
        assert await db.fetchval("SELECT last_offset FROM change_log_feed_state") >= feed_before + len(during)
        assert await db.fetchval("SELECT count(*) FROM change_log_outbox WHERE delivered_at IS NULL") >= len(during)
        kafka_broker.start()  # same port, empty: no topics, no messages
        restarted_at = time.monotonic()
        await eventually(
            lambda: asyncio.sleep(0, sum(at > restarted_at for _, _, at in acknowledged) >= 3 * len(urns)),
            what="three batches written after the broker came back",
        )
    finally:
        writing = False
        await writer
    await wait_delivered(db, timeout=60)

    owed = {(urn, version) for urn, version, at in acknowledged if at > stopped_at}
    committed = {
        (r["urn"], r["version"])
        for r in await db.fetch("SELECT urn, version FROM change_log_outbox WHERE aspect = 'datasetProperties'")
    }
    async with TopicReader(kafka_broker.bootstrap_servers, topic) as reader:
        records = await reader.read_until(
            lambda rs: owed <= {(r["key"], int(r["value"]["systemMetadata"]["version"])) for r in rs}, timeout=30
        )
        records = await reader.settle(0.5)
    on_topic = [(r["key"], r["value"]["aspectName"], int(r["value"]["systemMetadata"]["version"])) for r in records]
    props = [(urn, version) for urn, aspect, version in on_topic if aspect == "datasetProperties"]
    assert owed <= set(props)  # nothing committed during or after the outage is lost
    assert set(props) <= committed  # nothing invented
    versions: dict[str, list[int]] = defaultdict(list)
    for urn, version in props:
        versions[urn].append(version)
    for urn, seen in versions.items():
        # per-URN order as a consumer that deduplicates on (urn, aspect, version) sees it (at least once: a batch
        # acknowledged but not yet marked delivered would be published again)
        first_seen = list(dict.fromkeys(seen))
        assert first_seen == list(range(first_seen[0], first_seen[0] + len(first_seen))), (urn, seen)
    for record in records:
        assert record["key"] == record["value"]["entityUrn"]
        assert orjson.loads(record["value"]["aspect"]["value"])
