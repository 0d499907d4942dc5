"""The relay publishing per-aspect events, against the real Postgres and the real (Tansu) broker: a row whose records
cannot be built is kept with its publish error while the service faults (the schema registry down, the database
connection lost) are retried; and a change log of a runtime model set the relay's registry has not taken up yet goes
out with its audit event (the relay takes the stored set up first)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg
import orjson
import pytest

from app.db import create_engine
from app.registry import load_registry
from app.schema_registry import IncompatibleSchema, RegistryUnavailable
from app.schema_registry.internal import InternalRegistry
from app.settings import Settings
from tests.helpers import JSON, dataset, read_topic, run_relay, unique_topics
from tests.integration.test_runtime_models import DATASET, MODEL_SET, MODELS

INSERT_ROW = """
INSERT INTO change_log_outbox (topic, message_key, urn, aspect, version, change_type, payload)
VALUES ($1, $2, $2, $3, $4, 'UPSERT', $5) RETURNING id
"""


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:8]


def v5_settings(tag: str, kafka_broker, aspects: list[str]) -> dict[str, Any]:
    return {
        "kafka_bootstrap_servers": kafka_broker.bootstrap_servers,
        **unique_topics(),
        "events_v5_routes": [{"entityTypes": ["dataset"], "aspects": aspects}],
        "events_v5_audit_topic": f"audit_{tag}.{{entity}}.{{aspect}}",
        "events_v5_change_topic": f"change_{tag}.{{entity}}.{{aspect}}",
        "events_v5_failed_topic": f"failed_{tag}.{{entity}}.{{aspect}}",
    }


async def settled(db: asyncpg.Connection, timeout: float = 30.0) -> dict[int, tuple[bool, str | None]]:
    """Each outbox row's (delivered, publish error) once every row is one or the other."""
    deadline = time.monotonic() + timeout
    while True:
        rows = await db.fetch("SELECT id, delivered_at IS NOT NULL AS delivered, publish_error FROM change_log_outbox")
        if all(row["delivered"] or row["publish_error"] for row in rows):
            return {row["id"]: (row["delivered"], row["publish_error"]) for row in rows}
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.05)


class FlakyRegistry:
    """The schema registry as the relay sees it: unreachable for its first `outage` registrations, and then refusing
    every schema of the `refused` aspect's pair as incompatible; the others registered in the real one."""

    def __init__(self, registry: InternalRegistry, outage: int, refused: str) -> None:
        self.registry = registry
        self.outage = outage
        self.refused = refused
        self.calls = 0

    async def register(self, subject: str, schema: str) -> int:
        self.calls += 1
        if self.calls <= self.outage:
            raise RegistryUnavailable("the schema registry is down (test)")
        if f".{self.refused}-" in subject:
            raise IncompatibleSchema(f"{subject}: a field was removed (test)")
        return await self.registry.register(subject, schema)

    async def schema_by_id(self, schema_id: int) -> str:
        return await self.registry.schema_by_id(schema_id)


async def test_a_row_that_cannot_be_built_keeps_its_error_and_service_faults_are_retried(
    database_url, db, kafka_broker, registry, tag
):
    settings = Settings(database_url=database_url, **v5_settings(tag, kafka_broker, ["status", "globalTags"]))
    topic, urn = settings.topic_mcl_versioned, dataset("faults")

    def mcl(aspect: str, value: Any, **leave_out: bool) -> str:
        log = {
            "entityType": "dataset",
            "entityUrn": urn,
            "changeType": "UPSERT",
            "aspectName": aspect,
            "aspect": {"value": orjson.dumps(value).decode(), "contentType": JSON},
        }
        return orjson.dumps({k: v for k, v in log.items() if not leave_out.get(k)}).decode()

    async def row(aspect: str, version: int, payload: str) -> int:
        return await db.fetchval(INSERT_ROW, topic, urn, aspect, version, payload)

    first = await row("status", 1, mcl("status", {"removed": False}))
    # an MCL may leave its entityUrn out, its audit event may not: a KeyError building it (was retried forever)
    no_urn = await row("status", 2, mcl("status", {"removed": True}, entityUrn=True))
    refused = await row("globalTags", 1, mcl("globalTags", {"tags": []}))  # its pair's schemas are refused
    last = await row("status", 3, mcl("status", {"removed": True}))
    engine = create_engine(database_url, 1)
    flaky = FlakyRegistry(InternalRegistry(engine, settings), outage=3, refused="globalTags")
    _, finish = await run_relay(settings, derived_from=registry, schema_registry=flaky)
    try:
        outcome = await settled(db)
        assert outcome[first] == outcome[last] == (True, None)
        assert not outcome[no_urn][0] and outcome[no_urn][1].startswith("KeyError: the row's derived events")
        assert not outcome[refused][0] and "IncompatibleSchema" in outcome[refused][1]
        assert "dataset.globalTags" in outcome[refused][1]
        assert flaky.calls > flaky.outage  # the registry outage was waited out, not made a row's error

        # the relay's database connections lost: retried, and the next row published
        await db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'metaledger-relay'"
        )
        after = await row("status", 4, mcl("status", {"removed": False}))
        assert (await settled(db))[after] == (True, None)
    finally:
        await finish()
        await engine.dispose()
    audits = await read_topic(kafka_broker.bootstrap_servers, f"audit_{tag}.dataset.status", expect=3)
    assert [r.key.decode() for r in audits] == [urn] * 3  # v1, v3 and v4; not the row kept with its error


@pytest.fixture(scope="module")
def registry():
    """A registry of this module's own: the runtime models change it in place (the session's stays the base)."""
    return load_registry(Settings().registry_path)


@pytest.fixture
def settings_overrides(tag, kafka_broker) -> dict[str, Any]:
    """The app writes (and takes up the model set at once); its relay is off: the test's relay publishes."""
    return {**v5_settings(tag, kafka_broker, ["status", "acmeRating"]), "relay_enabled": False}


async def test_a_change_log_of_a_set_not_taken_up_yet_goes_out_with_its_audit_event(app, client, db, kafka_broker, tag):
    applied = await client.post(MODELS, json=MODEL_SET)
    assert applied.status_code == 200, applied.text
    written = await client.post(f"/openapi/v3/entity/dataset/{DATASET}/acmeRating", json={"value": {"stars": 4}})
    assert written.status_code in (200, 201), written.text

    # a relay whose registry is the base models, and no watcher to take the set up: as the background process in
    # the second after an apply
    relay_registry = load_registry(Settings().registry_path)
    _, finish = await run_relay(app.state.settings, derived_from=relay_registry)
    try:
        outcome = await settled(db)
    finally:
        await finish()
    assert all(delivered for delivered, _ in outcome.values()), outcome
    assert relay_registry.runtime_version == applied.json()["version"]
    audits = await read_topic(kafka_broker.bootstrap_servers, f"audit_{tag}.dataset.acmeRating", expect=1)
    assert len(audits) == 1 and audits[0].key.decode() == DATASET
    assert audits[0].value[0] == 0  # Confluent-framed Avro, under the id the pair's subject was registered with
    subject = await client.get(f"/schema-registry/api/subjects/audit_{tag}.dataset.acmeRating-value/versions/latest")
    assert subject.status_code == 200 and int.from_bytes(audits[0].value[1:5], "big") == subject.json()["id"]
