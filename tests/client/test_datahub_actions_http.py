"""A real DataHub Actions pipeline with its HTTP event source (`datahub-cloud`: DataHub's Events API,
`GET /openapi/v1/events/poll`) against a metaledger WITHOUT Kafka, as the embedded default runs: the change feed
serves the events, and the source keeps its offset in a `platformResourceInfo` aspect written back to metaledger.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import orjson
import pytest

from tests.client.helpers import ECE, MCL, mcp, of, propose, warm_up

pytestmark = pytest.mark.client


def test_actions_http_event_source_over_the_change_feed(actions_pipeline, metaledger):
    tag = uuid.uuid4().hex[:8]
    urn = f"urn:li:dataset:(urn:li:dataPlatform:hive,actions_http.orders_{tag},PROD)"
    name = f"metaledger-http-{tag}"
    source = {"type": "datahub-cloud", "config": {"topics": ["PlatformEvent_v1", "MetadataChangeLog_Versioned_v1"]}}
    pipeline = actions_pipeline(name, source, datahub={"server": metaledger.url, "token": metaledger.token})

    warm_up(pipeline, metaledger, tag)  # the source starts at the end of the feed

    propose(metaledger, mcp(urn, "globalTags", {"tags": [{"tag": "urn:li:tag:gold"}]}))
    propose(metaledger, mcp(urn, "datasetProperties", {"description": "over http"}))

    # the source polls two topics in turn: wait for what is asserted from each, not for a count on one
    def complete(events):
        tags = {(e["category"], e["operation"], e.get("modifier")) for e in of(events, urn, ECE)}
        return ("TAG", "ADD", "urn:li:tag:gold") in tags and len(of(events, urn, MCL)) >= 3

    pipeline.wait_for(complete, timeout=60, what="the MCLs and the tag event")
    events = pipeline.events()
    mcls = of(events, urn, MCL)
    assert [m["aspect"] for m in mcls] == ["datasetKey", "globalTags", "datasetProperties"]
    assert mcls[2]["value"]["value"]["description"] == "over http" and mcls[2]["systemMetadata"]["version"] == "1"
    tags = [(e["category"], e["operation"], e.get("modifier")) for e in of(events, urn, ECE)]
    assert ("TAG", "ADD", "urn:li:tag:gold") in tags, tags
    assert "Traceback" not in pipeline.log_tail(400), pipeline.log_tail()

    # On stop the source stores its offset in metaledger: a platformResourceInfo aspect keyed by the consumer id.
    pipeline.stop()
    stored = asyncio.run(_consumer_states(metaledger.database_url))
    assert any(state["primaryKey"].startswith(f"urn:li:dataHubAction:{name}") for state in stored), stored


async def _consumer_states(database_url: str) -> list[dict]:
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        rows = await conn.fetch(
            "SELECT metadata FROM metadata_aspect_v2 WHERE aspect = 'platformResourceInfo' AND version = 0"
        )
    finally:
        await conn.close()
    return [orjson.loads(r["metadata"]) for r in rows]
