"""Issue 28's proof on real processes: `metaledger serve --workers 2` on the Kafka-protocol broker (Avro values, the
registry metaledger serves). An admin applies a new aspect of `dataset` and a new entity type through the API; within
5 s every API worker accepts writes of both and serves their v3 routes and OpenAPI document, and the background process
publishes their change logs, and the new dataset pair's per-aspect audit event of each (also of those written before
it took the set up), as Avro under registered schemas that confluent-kafka's AvroDeserializer reads. An incompatible change is refused naming the field and the rule. No process
is restarted. One service start for all of it."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import httpx
import orjson
from aiokafka.admin import AIOKafkaAdminClient
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

from app.embedded_pg import free_port
from tests.client.conftest import kafka_service_env
from tests.helpers import read_topic, unique_topics
from tests.integration.test_runtime_models import DATASET, MODEL_SET, MODELS, RATING, with_rating
from tests.processes import SYSTEM_AUTH, start_service, stop_process, wait_healthy

TAKE_UP_S = 5.0  # the issue's bound: every worker accepts the new models within it
SERVICE_START_S = 60.0  # the background process may start well after the API workers on a busy machine
ROUND = 12  # requests per round, each on a connection of its own: both workers answer some (2^-11 that one does not)


async def fresh(base: str, method: str, path: str, **kwargs) -> httpx.Response:
    """One request on a new connection: the two API processes share the port, the kernel picks one per connection."""
    async with httpx.AsyncClient(base_url=base, headers=SYSTEM_AUTH, timeout=30) as http:
        return await http.request(method, path, **kwargs)


async def every_worker(requests: list) -> float:
    """Seconds until a whole round of `requests` (each sent ROUND / len(requests) times on fresh connections) all
    succeeded; fails past TAKE_UP_S."""
    started = time.monotonic()
    while True:
        answers = await asyncio.gather(*(request() for request in requests for _ in range(ROUND // len(requests))))
        if all(a.status_code in (200, 201) for a in answers):
            return time.monotonic() - started
        assert time.monotonic() - started < TAKE_UP_S, [
            (a.status_code, a.text[:200]) for a in answers if a.status_code >= 300
        ]
        await asyncio.sleep(0.1)


async def delivered(database_url: str) -> list:
    """The outbox rows once every one is published (none kept with a publish error)."""
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        deadline = time.monotonic() + SERVICE_START_S
        while True:
            rows = await conn.fetch("SELECT id, topic, urn, aspect, delivered_at, publish_error FROM change_log_outbox")
            assert not any(row["publish_error"] for row in rows), rows
            if all(row["delivered_at"] for row in rows):
                return rows
            assert time.monotonic() < deadline, rows
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


async def created(bootstrap: str, topic: str) -> None:
    """Wait until the service created `topic`. Listing the topics creates none, where a reader's request for a missing
    topic would have the broker create it with its own defaults (Tansu: 4 partitions, where the service creates 1):
    the relay would then spread the records over partitions that `read_topic` does not read."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        deadline = time.monotonic() + SERVICE_START_S
        while topic not in await admin.list_topics():
            assert time.monotonic() < deadline, f"{topic} was not created"
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def test_serve_two_workers_take_up_runtime_models(make_database, migrated_template, kafka_broker, tmp_path):
    database_url = make_database(template=migrated_template)
    topics = unique_topics()
    tag = uuid.uuid4().hex[:8]
    audit_topic = f"mae5_{tag}.{{entity}}.{{aspect}}"
    env = kafka_service_env(database_url, kafka_broker.bootstrap_servers, topics)
    env.update(
        {
            "METALEDGER_MODEL_REFRESH_S": "0.5",
            # dataset's existing status pair at start; the runtime aspect's pair joins when the set is taken up
            "METALEDGER_EVENTS_V5_ROUTES": orjson.dumps(
                [{"entityTypes": ["dataset"], "aspects": ["status", "acmeRating"], "auditTopic": audit_topic}]
            ).decode(),
            "METALEDGER_EVENTS_V5_CHANGE_TOPIC": f"mce5_{tag}.{{entity}}.{{aspect}}",
            "METALEDGER_EVENTS_V5_FAILED_TOPIC": f"fmce5_{tag}.{{entity}}.{{aspect}}",
        }
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "metaledger.log"
    supervisor = start_service(env, port, workers=2, log=log)
    try:
        await wait_healthy(base, 90, supervisor)
        bootstrap, mcl_topic = kafka_broker.bootstrap_servers, topics["topic_mcl_versioned"]
        await created(bootstrap, mcl_topic)  # by the background process at its start: the whole service runs
        applied = await fresh(base, "POST", MODELS, json=MODEL_SET)
        assert applied.status_code == 200, applied.text

        widget = f"urn:li:acmeWidget:w{tag}"
        taken_up = await every_worker(
            [
                lambda: fresh(
                    base,
                    "POST",
                    f"/openapi/v3/entity/dataset/{DATASET}/acmeRating",
                    params={"createIfNotExists": "false"},
                    json={"value": {"stars": 4}},
                ),
                lambda: fresh(
                    base,
                    "POST",
                    "/openapi/v3/entity/acmeWidget",
                    params={"async": "false"},
                    json=[{"urn": widget, "acmeRating": {"value": {"stars": 5}}}],
                ),
                lambda: fresh(base, "GET", f"/openapi/v3/entity/acmeWidget/{widget}"),
            ]
        )
        assert taken_up < TAKE_UP_S
        for _ in range(4):  # the OpenAPI document of each worker
            document = (await fresh(base, "GET", "/openapi.json")).json()
            assert "/openapi/v3/entity/acmeWidget/{urn}" in document["paths"]
            assert any(
                "acmeRating" in name.lower() or "AcmeRating" in name for name in document["components"]["schemas"]
            )

        # The background process publishes every change log as Avro under registered schemas, and with each one of
        # the new dataset pair its per-aspect audit event: also those written before it took the set up (its relay
        # takes the stored set up when a change log is of a pair its registry does not have).
        pair_topic = audit_topic.format(entity="dataset", aspect="acmeRating")
        rows = await delivered(database_url)
        registry = SchemaRegistryClient({"url": f"{base}/schema-registry/api/"})
        deserialize = AvroDeserializer(registry)
        records = await read_topic(bootstrap, mcl_topic, expect=sum(row["topic"] == mcl_topic for row in rows))
        logs = [deserialize(r.value, SerializationContext(mcl_topic, MessageField.VALUE)) for r in records]
        rated = [log for log in logs if log["aspectName"] == "acmeRating"]
        assert {(log["entityUrn"], log["entityType"]) for log in rated} == {
            (DATASET, "dataset"),
            (widget, "acmeWidget"),
        }
        assert orjson.loads(next(log for log in rated if log["entityType"] == "acmeWidget")["aspect"]["value"]) == {
            "stars": 5
        }
        dataset_rated = [log for log in rated if log["entityType"] == "dataset"]

        def audit_events(records) -> list[tuple[str, dict]]:
            events = [deserialize(r.value, SerializationContext(pair_topic, MessageField.VALUE)) for r in records]
            return [(event["urn"], event["newValue"]) for event in events]

        await created(bootstrap, pair_topic)
        audits = await read_topic(bootstrap, pair_topic, expect=len(dataset_rated))
        assert audit_events(audits) == [(DATASET, {"stars": 4, "note": None})] * len(dataset_rated)

        written = await fresh(
            base,
            "POST",
            f"/openapi/v3/entity/dataset/{DATASET}/acmeRating",
            params={"createIfNotExists": "false"},
            json={"value": {"stars": 2}},
        )
        assert written.status_code == 200, written.text
        audits = await read_topic(bootstrap, pair_topic, expect=len(dataset_rated) + 1)
        assert audit_events(audits)[-1] == (DATASET, {"stars": 2, "note": None})
        subject = registry.get_latest_version(f"{pair_topic}-value")
        assert (
            orjson.loads(subject.schema.schema_str)["name"] == "com.linkedin.mxe.dataset.acmeRating.MetadataAuditEvent"
        )

        refused = await fresh(
            base, "POST", MODELS, json=with_rating(fields=[{"name": "stars", "type": "string"}, RATING["fields"][1]])
        )
        assert refused.status_code == 400, refused.text
        issue = refused.json()["issues"][0]
        assert issue["message"].startswith("TypeChanged") and issue["path"] == "$.fields.stars.type"
        assert supervisor.poll() is None
    except BaseException:
        print(
            "\n".join(line for line in log.read_text(errors="replace").splitlines() if '"level":"INFO"' not in line)[
                -8000:
            ]
        )
        raise
    finally:
        stop_process(supervisor)
