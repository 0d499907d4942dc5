"""DataHub's Kafka wire with DataHub's own Kafka clients (confluent-kafka, in `.venv-client`) against a metaledger
process on the test broker, its schema registry at `<url>/schema-registry/api/`:

* `datahub ingest` with the `datahub-kafka` sink (Avro MCPs; a legacy MCE, which the 1.7 sink unpacks into MCPs) and
  `DatahubKafkaEmitter.emit(mce)` (a legacy MCE on the MCE topic) → the MCP / MCE consumers → readable over HTTP.
* A poison Avro record (DataHub's MCP id, a body that is not an MCP) and a record whose schema id no registry knows
  → FailedMetadataChangeProposal records with their reasons, read with the registry's FMCP schema; the consumer goes
  on (the good records after them are applied).
* confluent-kafka's `AvroDeserializer` + `MetadataChangeLogClass.from_obj(value, True)` read every MCL field the JSON
  relay tests check (aspect, previous value, system metadata, previous system metadata, created, headers), and the
  bytes on the topic are fastavro's encoding of the committed outbox rows.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from urllib.parse import quote

import asyncpg
import httpx
import pytest
import yaml

from app.avro.wire import ValueCodec
from app.settings import Settings
from tests.client.helpers import mcp, propose
from tests.helpers import ANY_TRACE_ID

pytestmark = pytest.mark.client

DB_VERSION_HEADER = "X-DataHub-Database-Aspect-Version"

# Python run in the client venv: `read_topic` reads a topic from offset 0 (assigned, no group join) and decodes each
# value with confluent-kafka's AvroDeserializer, writer schema fetched by id from metaledger's registry.
READ_TOPIC = """
import json, time
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext

registry = SchemaRegistryClient({"url": REGISTRY})
deserialize = AvroDeserializer(registry)

def read_topic(topic, keys, expect, timeout=60, settle=1.0):
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "metaledger-test-reader",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out, deadline, quiet_since = [], time.monotonic() + timeout, None
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                if len(out) >= expect:
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > settle:
                        break
                continue
            if message.error():
                raise RuntimeError(str(message.error()))
            key = message.key().decode() if message.key() is not None else None
            if key not in keys:
                continue
            quiet_since = None
            raw = message.value()
            value = deserialize(raw, SerializationContext(topic, MessageField.VALUE))
            out.append({"key": key, "offset": message.offset(), "magic": raw[0],
                        "schemaId": int.from_bytes(raw[1:5], "big"), "value": value, "raw": raw.hex()})
    finally:
        consumer.close()
    return out

def text(value):
    return value.decode() if isinstance(value, bytes) else value
"""


def entity(server, entity_type: str, urn: str) -> dict:
    with server.http() as http:
        response = http.get(
            f"/openapi/v3/entity/{entity_type}/{quote(urn, safe='')}", params={"systemMetadata": "true"}
        )
        return response.json() if response.status_code == 200 else {}


def wait_entity(server, entity_type: str, urn: str, check, timeout: float = 90) -> dict:
    """The entity once `check(entity)` holds (the consumers apply asynchronously; their first group join is slow)."""
    deadline = time.monotonic() + timeout
    while True:
        found = entity(server, entity_type, urn)
        if check(found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{urn}: not as expected after {timeout}s: {json.dumps(found)[:2000]}\n"
                f"--- metaledger log ---\n{server.log_tail()}"
            )
        time.sleep(0.3)


def outbox_payloads(server, urn: str) -> list[tuple[str, str]]:
    """(topic setting, JSON payload) of the URN's MCL outbox rows, in feed order."""
    settings_of = {name: setting for setting, name in server.topics.items()}

    async def fetch():
        conn = await asyncpg.connect(server.database_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return await conn.fetch(
                "SELECT topic, payload FROM change_log_outbox WHERE urn = $1 AND topic = ANY($2)"
                " ORDER BY feed_offset NULLS LAST, id",
                urn,
                [server.topic("topic_mcl_versioned"), server.topic("topic_mcl_timeseries")],
            )
        finally:
            await conn.close()

    return [(settings_of[row["topic"]], row["payload"]) for row in asyncio.run(fetch())]


def tagged(name: str) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:hive,kafka.{name}_{uuid.uuid4().hex[:8]},PROD)"


def client_globals(server) -> dict[str, object]:
    return {"BOOTSTRAP": server.bootstrap, "REGISTRY": server.registry_url, "TOPICS": server.topics}


def test_registry_is_served_where_datahub_clients_look(kafka_metaledger):
    """The URL the tests give the clients answers like GMS's registry (the DataHub ids the clients will ask for)."""
    with httpx.Client(timeout=10) as http:
        root = http.get(kafka_metaledger.registry_url)
        assert root.status_code == 200 and root.json() == {}, root.text  # Confluent's root answer
        for schema_id, name in [
            (16, "MetadataChangeProposal"),
            (17, "FailedMetadataChangeProposal"),
            (18, "MetadataChangeLog"),
            (4, "PlatformEvent"),
        ]:
            response = http.get(f"{kafka_metaledger.registry_url}schemas/ids/{schema_id}")
            assert response.status_code == 200, response.text
            assert json.loads(response.json()["schema"])["name"] == name


def test_datahub_ingest_with_the_datahub_kafka_sink(kafka_datahub, kafka_metaledger, tmp_path):
    orders, legacy, props_only = tagged("orders"), tagged("legacy_in_file"), tagged("props")
    metadata = tmp_path / "metadata.json"
    kafka_datahub.script(
        """
        from datahub.emitter.mcp import MetadataChangeProposalWrapper
        from datahub.ingestion.sink.file import write_metadata_file
        from datahub.metadata.schema_classes import (
            DatasetPropertiesClass, DatasetSnapshotClass, GlobalTagsClass, MetadataChangeEventClass, OwnerClass,
            OwnershipClass, OwnershipTypeClass, StatusClass, TagAssociationClass, UpstreamClass,
            UpstreamLineageClass, DatasetLineageTypeClass)

        write_metadata_file(PATH, [
            MetadataChangeProposalWrapper(entityUrn=ORDERS, aspect=DatasetPropertiesClass(
                description="orders via Kafka \\u00e9\\u2713", customProperties={"k": "v"})),
            MetadataChangeProposalWrapper(entityUrn=ORDERS, aspect=GlobalTagsClass(
                tags=[TagAssociationClass("urn:li:tag:gold")])),
            MetadataChangeProposalWrapper(entityUrn=ORDERS, aspect=OwnershipClass(
                owners=[OwnerClass(owner="urn:li:corpuser:jdoe", type=OwnershipTypeClass.DATAOWNER)])),
            MetadataChangeProposalWrapper(entityUrn=PROPS, aspect=StatusClass(removed=False)),
            MetadataChangeEventClass(proposedSnapshot=DatasetSnapshotClass(urn=LEGACY, aspects=[
                StatusClass(removed=False), DatasetPropertiesClass(description="legacy mce in a file"),
                UpstreamLineageClass(upstreams=[UpstreamClass(dataset=ORDERS, type=DatasetLineageTypeClass.TRANSFORMED)])])),
        ])
        """,
        PATH=str(metadata),
        ORDERS=orders,
        LEGACY=legacy,
        PROPS=props_only,
    )
    recipe = {
        "source": {"type": "file", "config": {"path": str(metadata)}},
        "sink": {
            "type": "datahub-kafka",
            "config": {
                "connection": {
                    "bootstrap": kafka_metaledger.bootstrap,
                    "schema_registry_url": kafka_metaledger.registry_url,
                },
                "topic_routes": {
                    "MetadataChangeProposal": kafka_metaledger.topic("topic_mcp"),
                    "MetadataChangeEvent": kafka_metaledger.topic("topic_mce"),
                },
            },
        },
    }
    (tmp_path / "recipe.yml").write_text(yaml.safe_dump(recipe))
    started = time.monotonic()
    result = kafka_datahub.cli("ingest", "-c", str(tmp_path / "recipe.yml"))
    ingest_s = time.monotonic() - started
    assert "Pipeline finished successfully" in result.stdout + result.stderr, result.stdout[-3000:]
    # the sink's AvroSerializer registered its MCP schema under the topic's subject (TopicNameStrategy)
    with httpx.Client(timeout=10) as http:
        subject = f"{kafka_metaledger.topic('topic_mcp')}-value"
        latest = http.get(f"{kafka_metaledger.registry_url}subjects/{subject}/versions/latest")
        assert latest.status_code == 200, latest.text
        assert json.loads(latest.json()["schema"])["name"] == "MetadataChangeProposal"

    got = wait_entity(
        kafka_metaledger, "dataset", orders, lambda e: {"datasetProperties", "globalTags", "ownership"} <= set(e)
    )
    landed_s = time.monotonic() - started
    assert got["datasetProperties"]["value"]["description"] == "orders via Kafka é✓"
    assert got["datasetProperties"]["value"]["customProperties"] == {"k": "v"}
    # the pipeline's run id and observation time travel in the Avro MCP's systemMetadata
    system = got["datasetProperties"]["systemMetadata"]
    assert system["runId"].startswith("file-") and system["lastObserved"] > 0, system
    assert [t["tag"] for t in got["globalTags"]["value"]["tags"]] == ["urn:li:tag:gold"]
    assert got["ownership"]["value"]["owners"][0]["owner"] == "urn:li:corpuser:jdoe"
    assert wait_entity(kafka_metaledger, "dataset", props_only, lambda e: "status" in e)["status"]["value"] == {
        "removed": False
    }
    got = wait_entity(
        kafka_metaledger, "dataset", legacy, lambda e: {"datasetProperties", "upstreamLineage", "status"} <= set(e)
    )
    assert got["datasetProperties"]["value"]["description"] == "legacy mce in a file"
    assert got["upstreamLineage"]["value"]["upstreams"][0]["dataset"] == orders
    print(f"\ndatahub ingest (datahub-kafka sink) {ingest_s:.1f}s; all applied after {landed_s:.1f}s")


def test_legacy_mce_on_the_mce_topic(kafka_datahub, kafka_metaledger):
    """`DatahubKafkaEmitter.emit(mce)`: an Avro MetadataChangeEvent (the SDK's MCE schema, registered by the
    serializer) on the MCE topic → the MCE consumer."""
    legacy = tagged("legacy_mce")
    kafka_datahub.script(
        """
        from datahub.emitter.kafka_emitter import DatahubKafkaEmitter, KafkaEmitterConfig
        from datahub.metadata.schema_classes import (DatasetPropertiesClass, DatasetSnapshotClass,
            MetadataChangeEventClass, StatusClass, OwnershipClass, OwnerClass, OwnershipTypeClass)

        emitter = DatahubKafkaEmitter(KafkaEmitterConfig.model_validate({
            "connection": {"bootstrap": BOOTSTRAP, "schema_registry_url": REGISTRY},
            "topic_routes": {"MetadataChangeEvent": TOPICS["topic_mce"], "MetadataChangeProposal": TOPICS["topic_mcp"]},
        }))
        failures = []
        emitter.emit(MetadataChangeEventClass(proposedSnapshot=DatasetSnapshotClass(urn=URN, aspects=[
            StatusClass(removed=False), DatasetPropertiesClass(description="legacy mce on kafka"),
            OwnershipClass(owners=[OwnerClass(owner="urn:li:corpuser:jdoe", type=OwnershipTypeClass.DATAOWNER)])])),
            callback=lambda err, msg: err and failures.append(str(err)))
        emitter.flush()
        assert not failures, failures
        """,
        URN=legacy,
        **client_globals(kafka_metaledger),
    )
    got = wait_entity(
        kafka_metaledger, "dataset", legacy, lambda e: {"datasetProperties", "status", "ownership"} <= set(e)
    )
    assert got["datasetProperties"]["value"]["description"] == "legacy mce on kafka"
    assert got["ownership"]["value"]["owners"][0]["owner"] == "urn:li:corpuser:jdoe"


def test_poison_and_unknown_schema_id_go_to_fmcp_and_the_consumer_goes_on(kafka_datahub, kafka_metaledger):
    tag = uuid.uuid4().hex[:8]
    poison_key, unknown_key, truncated_key = f"poison-{tag}", f"unknown-id-{tag}", f"truncated-{tag}"
    good_avro, good_json = tagged("after_poison_avro"), tagged("after_poison_json")
    out = kafka_datahub.script(
        READ_TOPIC
        + """
from confluent_kafka import Producer
from datahub.emitter.kafka_emitter import DatahubKafkaEmitter, KafkaEmitterConfig
from datahub.emitter.mcp import MetadataChangeProposalWrapper
from datahub.metadata.schema_classes import DatasetPropertiesClass

producer = Producer({"bootstrap.servers": BOOTSTRAP})
mcp_topic = TOPICS["topic_mcp"]
# DataHub's MCP schema id (16), a body that is not an MCP: union branch 63 of `auditHeader` does not exist
producer.produce(mcp_topic, key=POISON, value=b"\\x00" + (16).to_bytes(4, "big") + b"\\x7egarbage")
# a schema id no registry knows
producer.produce(mcp_topic, key=UNKNOWN, value=b"\\x00" + (7_654_321).to_bytes(4, "big") + b"\\x00\\x02x")
# Confluent framing cut short (magic byte and two bytes of the id)
producer.produce(mcp_topic, key=TRUNCATED, value=b"\\x00\\x00\\x00")
assert producer.flush(30) == 0
emitter = DatahubKafkaEmitter(KafkaEmitterConfig.model_validate({
    "connection": {"bootstrap": BOOTSTRAP, "schema_registry_url": REGISTRY},
    "topic_routes": {"MetadataChangeProposal": mcp_topic}}))
emitter.emit(MetadataChangeProposalWrapper(entityUrn=GOOD_AVRO, aspect=DatasetPropertiesClass(description="after poison")))
emitter.flush()
# a JSON MCP (today's format) is still read
producer.produce(mcp_topic, key=GOOD_JSON, value=json.dumps({"entityType": "dataset", "entityUrn": GOOD_JSON,
    "changeType": "UPSERT", "aspectName": "datasetProperties",
    "aspect": {"value": json.dumps({"description": "json after poison"}), "contentType": "application/json"}}).encode())
assert producer.flush(30) == 0

records = read_topic(TOPICS["topic_fmcp"], {POISON, UNKNOWN, TRUNCATED}, expect=3, timeout=90)
print(json.dumps(records, default=text))
""",
        POISON=poison_key,
        UNKNOWN=unknown_key,
        TRUNCATED=truncated_key,
        GOOD_AVRO=good_avro,
        GOOD_JSON=good_json,
        **client_globals(kafka_metaledger),
    )
    got = wait_entity(kafka_metaledger, "dataset", good_avro, lambda e: "datasetProperties" in e)
    assert got["datasetProperties"]["value"]["description"] == "after poison"
    got = wait_entity(kafka_metaledger, "dataset", good_json, lambda e: "datasetProperties" in e)
    assert got["datasetProperties"]["value"]["description"] == "json after poison"

    records = {r["key"]: r for r in json.loads(out.stdout.strip().splitlines()[-1])}
    assert set(records) == {poison_key, unknown_key, truncated_key}, f"{records}\n{kafka_metaledger.log_tail()}"
    for record in records.values():
        assert record["magic"] == 0 and record["schemaId"] == 17  # DataHub's FailedMetadataChangeProposal id
        assert set(record["value"]) >= {"metadataChangeProposal", "error"}
    reasons = {key: json.loads(record["value"]["error"])[0]["message"] for key, record in records.items()}
    print("\n" + "\n".join(f"{key}: {reason}" for key, reason in reasons.items()))
    assert "schema id 16" in reasons[poison_key] and "MetadataChangeProposal" in reasons[poison_key]
    assert "unknown schema id 7654321" in reasons[unknown_key]
    assert "truncated frame" in reasons[truncated_key]
    # the record itself travels in the FMCP (a placeholder MCP carrying its bytes)
    poison = records[poison_key]["value"]["metadataChangeProposal"]
    assert poison["aspect"]["contentType"] == "application/octet-stream"
    assert poison["aspect"]["value"] == "\x00\x00\x00\x00\x10\x7egarbage"


def test_avro_deserializer_and_datahub_classes_read_every_mcl_field(kafka_datahub, kafka_metaledger):
    """What the JSON relay test checks on the wire, read the way DataHub's Python consumers read it."""
    urn = tagged("mcl_fields")
    created = propose(
        kafka_metaledger,
        mcp(urn, "status", {"removed": False}, systemMetadata={"runId": "run-1"}, headers={"X-Custom": "a"}),
    )
    assert created["results"][0]["status"] == "CREATED"
    propose(
        kafka_metaledger,
        mcp(urn, "status", {"removed": True}, systemMetadata={"runId": "run-2", "properties": {"p": "q"}}),
    )
    propose(kafka_metaledger, mcp(urn, "status", {"removed": True}))  # a no-op: no change log
    propose(kafka_metaledger, mcp(urn, "status", None, change_type="DELETE"))
    propose(kafka_metaledger, mcp(urn, "datasetProfile", {"timestampMillis": 1_700_000_000_000, "rowCount": 42}))
    propose(kafka_metaledger, mcp(urn, "subTypes", {"typeNames": ["Marker"]}))  # arrives after everything above

    out = kafka_datahub.script(
        READ_TOPIC
        + """
from datahub.metadata.schema_classes import MetadataChangeLogClass

def aspect(generic):
    return None if generic is None else {"value": json.loads(text(generic.value)), "contentType": generic.contentType}

def fields(record):
    mcl = MetadataChangeLogClass.from_obj(record["value"], True)
    return {
        "key": record["key"], "magic": record["magic"], "schemaId": record["schemaId"],
        "entityType": mcl.entityType, "entityUrn": mcl.entityUrn, "changeType": mcl.changeType,
        "aspectName": mcl.aspectName, "aspect": aspect(mcl.aspect), "previousAspectValue": aspect(mcl.previousAspectValue),
        "systemMetadata": mcl.systemMetadata.to_obj() if mcl.systemMetadata else None,
        "previousSystemMetadata": mcl.previousSystemMetadata.to_obj() if mcl.previousSystemMetadata else None,
        "created": mcl.created.to_obj() if mcl.created else None,
        "headers": mcl.headers, "entityKeyAspect": mcl.entityKeyAspect, "raw": record["raw"],
    }

versioned = read_topic(TOPICS["topic_mcl_versioned"], {URN}, expect=5)
timeseries = read_topic(TOPICS["topic_mcl_timeseries"], {URN}, expect=1)
print(json.dumps({"versioned": [fields(r) for r in versioned], "timeseries": [fields(r) for r in timeseries]}, default=text))
""",
        URN=urn,
        **client_globals(kafka_metaledger),
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    versioned, timeseries = result["versioned"], result["timeseries"]
    assert [(m["aspectName"], m["changeType"]) for m in versioned] == [
        ("datasetKey", "UPSERT"),
        ("status", "UPSERT"),
        ("status", "UPSERT"),
        ("status", "DELETE"),
        ("subTypes", "UPSERT"),
    ]
    assert all(m["magic"] == 0 and m["schemaId"] == 18 and m["key"] == urn for m in versioned)
    key, create, update, delete, _ = versioned
    name = urn.split(",")[1]
    assert key["entityType"] == "dataset" and key["aspect"]["value"] == {
        "platform": "urn:li:dataPlatform:hive",
        "name": name,
        "origin": "PROD",
    }
    assert key["systemMetadata"]["version"] == "1"

    assert create["entityUrn"] == urn and create["aspect"] == {
        "value": {"removed": False},
        "contentType": "application/json",
    }
    assert create["systemMetadata"]["version"] == "1" and create["systemMetadata"]["runId"] == "run-1"
    assert create["previousAspectValue"] is None and create["previousSystemMetadata"] is None
    assert create["created"]["actor"] == "urn:li:corpuser:datahub" and create["created"]["time"] > 0
    assert create["headers"] == {"X-Custom": "a", DB_VERSION_HEADER: "1"}

    assert update["aspect"]["value"] == {"removed": True}
    assert update["previousAspectValue"] == {"value": {"removed": False}, "contentType": "application/json"}
    assert update["previousSystemMetadata"]["version"] == "1" and update["previousSystemMetadata"]["runId"] == "run-1"
    assert update["systemMetadata"]["version"] == "2" and update["systemMetadata"]["runId"] == "run-2"
    assert update["systemMetadata"]["lastRunId"] == "run-1" and update["systemMetadata"]["properties"] == {
        "p": "q",
        "telemetryTraceId": ANY_TRACE_ID,
    }
    assert update["systemMetadata"]["lastObserved"] > 0
    assert update["headers"] == {DB_VERSION_HEADER: "2"}
    assert update["created"]["time"] >= create["created"]["time"]

    assert delete["aspect"] is None and delete["previousAspectValue"]["value"] == {"removed": True}
    assert delete["previousSystemMetadata"]["version"] == "2" and delete["created"] is not None

    # byte for byte: what is on the topic is fastavro's encoding of the committed outbox row (its JSON form)
    rows = outbox_payloads(kafka_metaledger, urn)
    codec = ValueCodec(Settings(kafka_value_format="avro"))
    assert [m["raw"] for m in versioned] == [
        codec.encode("mcl_versioned", p).hex() for t, p in rows if t == "topic_mcl_versioned"
    ]
    assert [m["raw"] for m in timeseries] == [
        codec.encode("mcl_timeseries", p).hex() for t, p in rows if t == "topic_mcl_timeseries"
    ]

    [profile] = timeseries
    assert profile["schemaId"] == 19 and profile["aspectName"] == "datasetProfile" and profile["changeType"] == "UPSERT"
    assert profile["aspect"]["value"] == {
        "timestampMillis": 1_700_000_000_000,
        "rowCount": 42,
        "partitionSpec": {"partition": "FULL_TABLE_SNAPSHOT", "type": "FULL_TABLE"},
    }
    assert profile["previousAspectValue"] is None and profile["systemMetadata"]["runId"] == "no-run-id-provided"
