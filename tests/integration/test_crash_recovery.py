"""kill -9 of the service while it ingests: every acknowledged write is in Postgres and has exactly one distinct
change log on the topic after a restart, and its per-aspect audit event (v5, routed for datasetProperties); no change
log or audit event exists for a write that did not commit.

Runs the real service (`uvicorn app.main:app`) as a process against the real test Postgres and broker.
"""

from __future__ import annotations

import asyncio
import io
import time
import uuid

import asyncpg
import fastavro
import httpx
import orjson
from aiokafka import AIOKafkaConsumer

from app.avro.per_aspect import event_schemas
from app.embedded_pg import free_port
from app.registry import load_registry
from app.settings import Settings
from tests.helpers import decode_value
from tests.processes import SYSTEM_AUTH, start_service, wait_healthy

CLIENTS = 6
BATCH = 50
KILLED_AFTER = 1500  # acknowledged writes: five rounds of every client, the kill lands mid-stream all the same


def urn(client: int, i: int) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:hive,crash.c{client}.t{i},PROD)"


async def read_topic(bootstrap: str, topic: str, idle_seconds: float = 3.0, decode=decode_value) -> list[dict]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        group_id=None,
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    await consumer.start()
    messages: list[dict] = []
    try:
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < idle_seconds:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for record in records:
                    messages.append(dict(decode(record.value), _key=record.key.decode()))
                idle_since = time.monotonic()
    finally:
        await consumer.stop()
    return messages


async def test_kill_9_during_ingestion_loses_and_invents_no_change_log(kafka_broker, make_database, migrated_template):
    database_url = make_database(template=migrated_template)
    topic = f"mcl_crash_{uuid.uuid4().hex[:8]}"
    audit_topic = f"audit_crash_{uuid.uuid4().hex[:8]}"
    env = {
        "METALEDGER_DATABASE_URL": database_url,
        "METALEDGER_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers,
        "METALEDGER_TOPIC_MCL_VERSIONED": topic,
        "METALEDGER_TOPIC_PLATFORM_EVENT": f"pe_crash_{uuid.uuid4().hex[:8]}",
        "METALEDGER_RETENTION_MAX_VERSIONS": "100000",
        "METALEDGER_EVENTS_V5_ROUTES": orjson.dumps(
            [{"entityTypes": ["dataset"], "aspects": ["datasetProperties"], "auditTopic": audit_topic}]
        ).decode(),
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
    }
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    service = start_service(env, port)
    acknowledged: dict[tuple[str, int], str] = {}  # (urn, version) -> the value's sequence number
    attempted = 0
    try:
        await wait_healthy(base)
        killed = asyncio.Event()

        async def ingest(client: int) -> None:
            nonlocal attempted
            async with httpx.AsyncClient(timeout=10, headers=SYSTEM_AUTH) as http:
                round_no = 0
                while not killed.is_set():
                    round_no += 1
                    body = [
                        {
                            "entityType": "dataset",
                            "entityUrn": urn(client, i),
                            "aspectName": "datasetProperties",
                            "aspect": {"value": {"customProperties": {"seq": str(round_no)}}},
                        }
                        for i in range(BATCH)
                    ]
                    attempted += BATCH
                    try:
                        response = await http.post(f"{base}/openapi/v1/proposals", json=body)
                    except httpx.TransportError:
                        return  # the service died under us: this batch is unacknowledged
                    assert response.status_code == 200, response.text
                    for result in response.json()["results"]:
                        acknowledged[(result["urn"], int(result["version"]))] = str(round_no)

        writers = [asyncio.create_task(ingest(c)) for c in range(CLIENTS)]
        deadline = time.monotonic() + 120
        while len(acknowledged) < KILLED_AFTER:  # the kill lands mid-stream, once this much is acknowledged
            failed = [w.exception() for w in writers if w.done()]
            assert not failed, f"a writer stopped before the kill: {failed}"
            assert time.monotonic() < deadline, f"{len(acknowledged)} of {KILLED_AFTER} writes acknowledged in 120 s"
            await asyncio.sleep(0.05)
        service.kill()  # SIGKILL, mid-stream
        service.wait(10)
        killed.set()
        await asyncio.gather(*writers)

        service = start_service(env, port)
        await wait_healthy(base)
        conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            deadline = time.monotonic() + 60
            while await conn.fetchval("SELECT count(*) FROM change_log_outbox WHERE delivered_at IS NULL"):
                assert time.monotonic() < deadline, "the relay did not drain the outbox after the restart"
                await asyncio.sleep(0.2)
            stored = {
                (r["urn"], int(orjson.loads(r["systemmetadata"])["version"])): orjson.loads(r["metadata"])[
                    "customProperties"
                ]["seq"]
                for r in await conn.fetch(
                    "SELECT urn, metadata, systemmetadata FROM metadata_aspect_v2 WHERE aspect = 'datasetProperties'"
                )
            }
        finally:
            await conn.close()
    finally:
        service.kill()
        service.wait(10)

    logs = [
        m for m in await read_topic(kafka_broker.bootstrap_servers, topic) if m["aspectName"] == "datasetProperties"
    ]
    on_topic: dict[tuple[str, int], set[str]] = {}
    for mcl in logs:
        assert mcl["_key"] == mcl["entityUrn"]
        key = (mcl["entityUrn"], int(mcl["systemMetadata"]["version"]))
        on_topic.setdefault(key, set()).add(orjson.loads(mcl["aspect"]["value"])["customProperties"]["seq"])

    # every acknowledged write is stored, and has exactly one distinct change log (duplicates carry the same content)
    for key, seq in acknowledged.items():
        assert stored.get(key) == seq, key
        assert on_topic.get(key) == {seq}, key
    # no change log was invented: each one describes a committed version
    for key, seqs in on_topic.items():
        assert key in stored and seqs == {stored[key]}, key
    assert len(acknowledged) >= KILLED_AFTER

    # the per-aspect audit events, published with the change logs: one for each acknowledged write, none invented
    document = event_schemas(
        "dataset", "datasetProperties", load_registry(Settings().registry_path).aspect_spec("datasetProperties").schema
    )["MetadataAuditEvent"]
    parsed = fastavro.parse_schema(document)
    audits = await read_topic(
        kafka_broker.bootstrap_servers,
        audit_topic,
        decode=lambda raw: fastavro.schemaless_reader(io.BytesIO(raw[5:]), parsed),
    )
    audited: dict[str, set[str]] = {}
    for event in audits:
        assert event["_key"] == event["urn"]
        audited.setdefault(event["urn"], set()).add(event["newValue"]["customProperties"]["seq"])
    for (urn_, _), seq in acknowledged.items():
        assert seq in audited.get(urn_, set()), urn_
    committed = {(u, seq) for (u, _), seq in stored.items()}
    assert all((u, seq) in committed for u, seqs in audited.items() for seq in seqs)
