"""A rollback's changes reach Kafka as any write's do: its change logs on the MCL topic, in order after the run's, under
the rollback's run id, and their entity change events on the platform event topic (app.runs, through the relay)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.helpers import TopicReader, unique_topics, wait_delivered
from tests.integration.test_runs import A, B, runs, seed_and_two_runs


@pytest.fixture
def topics() -> dict[str, str]:
    return unique_topics()


@pytest.fixture
def settings_overrides(kafka_broker, topics) -> dict[str, Any]:
    return {"kafka_bootstrap_servers": kafka_broker.bootstrap_servers, **topics}


async def test_a_rollbacks_change_logs_and_events_are_published(client, db, kafka_broker, topics):
    await seed_and_two_runs(client)
    await runs(client, "rollback", runId="r1", dryRun=False, safe=True)
    published = await wait_delivered(db)

    async with TopicReader(
        kafka_broker.bootstrap_servers, topics["topic_mcl_versioned"], topics["topic_platform_event"]
    ) as reader:
        records = await reader.read_count(published)
        await reader.settle()
    mcls = [r["value"] for r in records if r["topic"] == topics["topic_mcl_versioned"]]
    rollback = [m for m in mcls if m["systemMetadata"]["runId"] == "__rollback:r1"]
    assert sorted((m["entityUrn"], m["aspectName"], m["changeType"]) for m in rollback) == [
        (B, "datasetProperties", "DELETE"),
        (B, "status", "UPSERT"),
        (A, "datasetProperties", "UPSERT"),
    ]
    assert mcls[-len(rollback) :] == rollback  # after everything the runs wrote
    assert {m["previousSystemMetadata"]["runId"] for m in rollback} == {"r1"}  # each replaced r1's write
    events = [
        orjson.loads(r["value"]["payload"]["value"]) for r in records if r["topic"] == topics["topic_platform_event"]
    ]
    # B soft-removed and its description gone, A's description back: the last three events, the rollback's
    assert sorted((e["entityUrn"], e["category"], e["operation"]) for e in events[-3:]) == [
        (B, "DOCUMENTATION", "REMOVE"),
        (B, "LIFECYCLE", "SOFT_DELETE"),
        (A, "DOCUMENTATION", "MODIFY"),
    ]
