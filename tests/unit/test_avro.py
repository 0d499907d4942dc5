"""DataHub's Kafka wire (app.avro): Confluent framing, the record schemas, JSON form ↔ Avro, the codec.

The JSON forms are built by the write path's own functions (build_change_log, platform_event, proposal_to_mcp), and
every encoding is checked byte for byte against fastavro writing `to_avro(...)` with the parsed DataHub schema.
"""

from __future__ import annotations

import io
from typing import Any

import fastavro
import orjson
import pytest

from app.avro import records, schemas
from app.avro.records import AvroEncodeError, from_avro, to_avro
from app.avro.wire import ValueCodec, WireFormatError, frame, topic_roles, unframe
from app.changelog.entity_change_events import platform_event
from app.ingest.mcp import proposal_to_mcp
from app.settings import Settings
from app.write.mcl import build_change_log
from app.write.proposal import AuditStamp, ChangeType, Draft, Proposal

URN = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"
ACTOR = "urn:li:corpuser:datahub"


# --- the JSON forms, as the write path builds them -------------------------------------------------------------------


def proposal(aspect: str, value: Any, change_type: ChangeType = ChangeType.UPSERT, **kw: Any) -> Proposal:
    return Proposal(0, "dataset", URN, aspect, change_type, value, **kw)


def system_metadata(version: int, run_id: str = "run-1", **extra: Any) -> dict[str, Any]:
    return {
        "runId": run_id,
        "lastObserved": 1_763_700_000_000 + version,
        "lastRunId": "run-0",
        "version": str(version),
        "aspectCreated": {"time": 1_763_700_000_000, "actor": ACTOR},
        **extra,
    }


def mcl_create() -> dict[str, Any]:
    key = {"platform": "urn:li:dataPlatform:hive", "name": "db.orders", "origin": "PROD"}
    p = proposal("datasetKey", key, entity_key_aspect=key, headers={"X-Custom": "a"})
    return orjson.loads(
        build_change_log(
            p,
            change_type=ChangeType.UPSERT,
            aspect_name="datasetKey",
            aspect_json=orjson.dumps(key).decode(),
            system_metadata=system_metadata(1, properties={"clientId": "acryl", "ünï": "cödé"}, pipelineName="p1"),
            previous_json=None,
            previous_system_metadata=None,
            created=AuditStamp(1_763_700_000_001, ACTOR),
        )
    )


def mcl_update() -> dict[str, Any]:
    p = proposal("datasetProperties", {"description": "v2"}, headers={"X-Other": "b"})
    sm = system_metadata(2, aspectModified={"time": 1_763_700_000_002, "actor": "urn:li:corpuser:jdoe"})
    return orjson.loads(
        build_change_log(
            p,
            change_type=ChangeType.UPSERT,
            aspect_name="datasetProperties",
            aspect_json='{"description":"v2"}',
            system_metadata=sm,
            previous_json='{"description":"v1 ✓"}',
            previous_system_metadata=system_metadata(1),
            created=AuditStamp(1_763_700_000_002, "urn:li:corpuser:jdoe"),
        )
    )


def mcl_delete() -> dict[str, Any]:
    p = proposal("status", None, ChangeType.DELETE)
    return orjson.loads(
        build_change_log(
            p,
            change_type=ChangeType.DELETE,
            aspect_name="status",
            aspect_json=None,
            system_metadata=system_metadata(3),
            previous_json='{"removed":true}',
            previous_system_metadata=system_metadata(2),
            created=AuditStamp(1_763_700_000_003, ACTOR),
        )
    )


def a_platform_event() -> dict[str, Any]:
    ece = {
        "entityType": "dataset",
        "entityUrn": URN,
        "category": "TAG",
        "operation": "ADD",
        "modifier": "urn:li:tag:pii",
        "parameters": {"tagUrn": "urn:li:tag:pii", "context": "{}"},
        "auditStamp": {"time": 1_763_700_000_004, "actor": ACTOR},
        "version": 0,
    }
    return platform_event(ece)


def an_mcp(change_type: ChangeType = ChangeType.UPSERT) -> dict[str, Any]:
    draft = Draft(
        0,
        "dataset",
        "globalTags",
        change_type.value,
        URN,
        value={"tags": [{"tag": "urn:li:tag:pii"}]},
        system_metadata={"runId": "ingest-1", "lastObserved": 1_763_700_000_000, "properties": {"k": "v"}},
        headers={"If-Version-Match": "3"},
    )
    return proposal_to_mcp(draft, proposal("globalTags", draft.value, change_type))


def with_defaults(sm: dict[str, Any]) -> dict[str, Any]:
    """A systemMetadata as it reads back from Avro: the record's non-null defaults filled in."""
    return {"lastObserved": 0, "runId": "no-run-id-provided", "lastRunId": "no-run-id-provided", **sm}


CASES = [
    ("MetadataChangeLog", mcl_create),
    ("MetadataChangeLog", mcl_update),
    ("MetadataChangeLog", mcl_delete),
    ("PlatformEvent", a_platform_event),
    ("MetadataChangeProposal", an_mcp),
    ("MetadataChangeProposal", lambda: an_mcp(ChangeType.PATCH)),
]


def fastavro_bytes(record: str, obj: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, schemas.parsed(record), to_avro(record, obj))
    return out.getvalue()


def fastavro_read(record: str, payload: bytes) -> dict[str, Any]:
    stream = io.BytesIO(payload)
    datum = fastavro.schemaless_reader(stream, schemas.parsed(record), None, return_named_type=True)
    assert stream.tell() == len(payload)
    return datum


# --- framing ----------------------------------------------------------------------------------------------------------


def test_frame_and_unframe():
    assert frame(18, b"avro") == b"\x00\x00\x00\x00\x12avro"
    assert unframe(b"\x00\x00\x00\x00\x12avro") == (18, b"avro")
    assert unframe(frame(0, b"")) == (0, b"")
    assert unframe(frame(2**32 - 1, b"x")) == (2**32 - 1, b"x")
    assert unframe(frame(1001, b"\x00\x01")) == (1001, b"\x00\x01")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "empty value"),
        (b"\x00", "truncated frame: 1 bytes"),
        (b"\x00\x00\x00\x12", "truncated frame: 4 bytes"),
        (b"\x01\x00\x00\x00\x12avro", "wrong magic byte 0x01"),
        (b"{}", "wrong magic byte 0x7b"),
    ],
)
def test_unframe_says_what_is_wrong(raw, reason):
    with pytest.raises(WireFormatError, match=reason):
        unframe(raw)


@pytest.mark.parametrize("schema_id", [-1, 2**32])
def test_frame_refuses_ids_that_do_not_fit(schema_id):
    with pytest.raises(ValueError, match="does not fit"):
        frame(schema_id, b"")


# --- schemas ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("record", schemas.RECORD_NAMES)
def test_every_schema_is_self_contained_avro(record):
    text = schemas.schema_text(record)
    document = orjson.loads(text)
    assert document["name"] == record and document["namespace"] == "com.linkedin.pegasus2avro.mxe"
    fastavro.parse_schema(document)  # valid on its own: every named type defined before it is used
    assert schemas.schema_text(record) is text  # one text per process


def test_the_schemas_written_from_datahubs_pdl():
    fmcp = schemas.schema("FailedMetadataChangeProposal")
    assert [f["name"] for f in fmcp["fields"]] == ["auditHeader", "metadataChangeProposal", "error"]
    assert fmcp["fields"][0]["default"] is None and fmcp["fields"][0]["type"][1]["name"] == "KafkaAuditHeader"
    mcp = fmcp["fields"][1]["type"]
    assert mcp["name"] == "MetadataChangeProposal" and mcp == {
        **schemas.schema("MetadataChangeProposal"),
        "fields": mcp["fields"],
    }
    assert [f["name"] for f in mcp["fields"]] == [f["name"] for f in schemas.schema("MetadataChangeProposal")["fields"]]
    assert mcp["fields"][0]["type"] == ["null", "com.linkedin.events.KafkaAuditHeader"]  # defined once, above
    fmce = schemas.schema("FailedMetadataChangeEvent")
    assert [f["name"] for f in fmce["fields"]] == ["auditHeader", "metadataChangeEvent", "error"]
    mae = schemas.schema("MetadataAuditEvent")
    assert [f["name"] for f in mae["fields"]] == ["auditHeader", "oldSnapshot", "newSnapshot"]
    snapshots = [m["name"] if isinstance(m, dict) else m.rpartition(".")[2] for m in mae["fields"][1]["type"][1:]]
    assert snapshots[0] == "ChartSnapshot" and "DatasetSnapshot" in snapshots and len(snapshots) == 21


def test_datahubs_schema_ids():
    assert schemas.CURRENT_SCHEMA_ID == {
        "mcp": 16,
        "fmcp": 17,
        "mcl_versioned": 18,
        "mcl_timeseries": 19,
        "platform_event": 4,
        "mce": 20,
        "fmce": 21,
        "mae": 22,
    }
    for role, schema_id in schemas.CURRENT_SCHEMA_ID.items():
        assert schemas.DATAHUB_SCHEMA_IDS[schema_id] == schemas.ROLE_RECORD[role]
    assert {schemas.DATAHUB_SCHEMA_IDS[i] for i in (0, 9, 16)} == {"MetadataChangeProposal"}
    assert {schemas.DATAHUB_SCHEMA_IDS[i] for i in (2, 11, 18, 3, 12, 19)} == {"MetadataChangeLog"}
    assert sorted(schemas.DATAHUB_SCHEMA_IDS) == [i for i in range(23) if i != 8]  # 8: DataHubUpgradeHistoryEvent


# --- JSON form ↔ Avro ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("record", "build"), CASES)
def test_the_fast_encoder_is_byte_for_byte_fastavro_and_reads_back(record, build):
    obj = build()
    encoded = records.encoder(record)(obj)
    assert encoded == fastavro_bytes(record, obj)
    back = from_avro(record, fastavro_read(record, encoded))
    expected = dict(obj)
    for name in ("systemMetadata", "previousSystemMetadata"):
        if name in expected:
            expected[name] = with_defaults(expected[name])
    assert back == expected
    assert records.codecs(record).read(encoded) == expected


def test_mcl_fields_on_the_avro_side():
    obj = mcl_update()
    datum = fastavro_read("MetadataChangeLog", records.encoder("MetadataChangeLog")(obj))
    assert datum["aspect"] == (
        "com.linkedin.pegasus2avro.mxe.GenericAspect",
        {"value": b'{"description":"v2"}', "contentType": "application/json"},
    )
    assert datum["previousAspectValue"][1]["value"] == '{"description":"v1 ✓"}'.encode()
    assert datum["changeType"] == "UPSERT" and datum["auditHeader"] is None and datum["entityKeyAspect"] is None
    sm = datum["systemMetadata"][1]
    assert sm["version"] == "2" and sm["runId"] == "run-1" and sm["lastObserved"] == 1_763_700_000_002
    assert sm["aspectModified"][1] == {
        "time": 1_763_700_000_002,
        "actor": "urn:li:corpuser:jdoe",
        "impersonator": None,
        "message": None,
    }
    assert datum["previousSystemMetadata"][1]["version"] == "1"
    assert datum["created"][1]["time"] == 1_763_700_000_002
    assert datum["headers"] == {"X-Other": "b", "X-DataHub-Database-Aspect-Version": "2"}


def test_platform_event_payload_is_bytes():
    datum = fastavro_read("PlatformEvent", records.encoder("PlatformEvent")(a_platform_event()))
    assert datum["name"] == "entityChangeEvent" and datum["header"] == {"timestampMillis": 1_763_700_000_004}
    assert orjson.loads(datum["payload"]["value"])["modifier"] == "urn:li:tag:pii"


def test_json_form_details():
    # fields the schema lacks are dropped; an aspect value given as an object is serialized; tuples are accepted
    obj = {**an_mcp(), "notAField": 1, "systemMetadata": {"runId": "r", "noSuchField": True}}
    obj["aspect"] = {"value": {"removed": False}, "contentType": "application/json"}
    back = records.codecs("MetadataChangeProposal").read(records.encoder("MetadataChangeProposal")(obj))
    assert "notAField" not in back and back["systemMetadata"] == with_defaults({"runId": "r"})
    assert back["aspect"]["value"] == '{"removed":false}'
    assert records.encoder("MetadataChangeProposal")(obj) == fastavro_bytes("MetadataChangeProposal", obj)


def test_mce_unions_in_pegasus_and_avro_spelling():
    pegasus = {
        "proposedSnapshot": {
            "com.linkedin.metadata.snapshot.DatasetSnapshot": {
                "urn": URN,
                "aspects": [
                    {"com.linkedin.common.Status": {"removed": True}},
                    {"com.linkedin.common.GlobalTags": {"tags": [{"tag": "urn:li:tag:pii"}]}},
                ],
            }
        },
        "systemMetadata": {"runId": "mce"},
    }
    encoded = records.encoder("MetadataChangeEvent")(pegasus)
    assert encoded == fastavro_bytes("MetadataChangeEvent", pegasus)
    back = records.codecs("MetadataChangeEvent").read(encoded)
    snapshot = back["proposedSnapshot"]["com.linkedin.pegasus2avro.metadata.snapshot.DatasetSnapshot"]
    assert snapshot["urn"] == URN
    assert snapshot["aspects"][0] == {"com.linkedin.pegasus2avro.common.Status": {"removed": True}}
    assert snapshot["aspects"][1] == {
        "com.linkedin.pegasus2avro.common.GlobalTags": {"tags": [{"tag": "urn:li:tag:pii"}]}
    }
    assert records.encoder("MetadataChangeEvent")(back) == encoded  # Avro spelling encodes the same


@pytest.mark.parametrize(
    ("record", "obj", "path", "reason"),
    [
        ("MetadataChangeLog", {"entityUrn": URN, "changeType": "UPSERT"}, "entityType", "required field missing"),
        (
            "MetadataChangeLog",
            {"entityType": "dataset", "changeType": "FLIP"},
            "changeType",
            "'FLIP' is not one of UPSERT",
        ),
        (
            "MetadataChangeLog",
            {"entityType": "dataset", "changeType": "UPSERT", "systemMetadata": {"properties": {"k": 1}}},
            "systemMetadata.properties.k",
            "expected a string, found an integer",
        ),
        (
            "MetadataChangeLog",
            {"entityType": "dataset", "changeType": "UPSERT", "systemMetadata": {"lastObserved": "x"}},
            "systemMetadata.lastObserved",
            "expected long, found a string",
        ),
        ("PlatformEvent", {"header": {"timestampMillis": 1}, "name": "x"}, "payload", "required field missing"),
    ],
)
def test_a_value_that_does_not_fit_says_where(record, obj, path, reason):
    with pytest.raises(AvroEncodeError, match=reason) as error:
        records.encoder(record)(obj)
    assert error.value.path == path
    with pytest.raises((ValueError, TypeError)):
        fastavro_bytes(record, obj)  # the reference path refuses it too


# --- the codec ---------------------------------------------------------------------------------------------------------


def test_codec_encodes_each_role_with_its_datahub_id():
    codec = ValueCodec(Settings())
    text = orjson.dumps(mcl_update()).decode()
    expected = frame(18, fastavro_bytes("MetadataChangeLog", orjson.loads(text)))
    assert codec.encode("mcl_versioned", text) == expected == codec.encode("mcl_versioned", text.encode())
    assert codec.encode("mcl_timeseries", text)[:5] == frame(19, b"")
    assert codec.encode("platform_event", a_platform_event())[:5] == frame(4, b"")
    assert codec.encode("mcp", an_mcp())[:5] == frame(16, b"")
    assert codec.role_of(Settings().topic_platform_event) == "platform_event" and codec.role_of("other") is None
    json_codec = ValueCodec(Settings(kafka_value_format="json"))
    assert json_codec.encode("mcl_versioned", text) == text.encode()
    assert json_codec.encode("mcp", an_mcp()) == orjson.dumps(an_mcp())


def test_topic_roles_follow_the_settings():
    roles = topic_roles(Settings(topic_mcl_versioned="v", topic_mcl_timeseries="t", topic_mcp="m"))
    assert roles["v"] == "mcl_versioned" and roles["t"] == "mcl_timeseries" and roles["m"] == "mcp"


async def test_codec_decodes_avro_and_json():
    codec = ValueCodec(Settings())
    obj = mcl_delete()
    assert await codec.decode(orjson.dumps(obj)) == (obj, None)
    value, schema_id = await codec.decode(codec.encode("mcl_versioned", obj))
    assert schema_id == 18 and value["previousAspectValue"] == obj["previousAspectValue"] and "aspect" not in value
    for old_id in (2, 11, 3, 12, 19):  # DataHub's older ids read with the current schema
        assert (await codec.decode(frame(old_id, records.encoder("MetadataChangeLog")(obj))))[0] == value


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "empty value"),
        (b"\x00\x00\x00", "truncated frame: 3 bytes"),
        (b"\x05\x00\x00\x00\x12abc", "wrong magic byte 0x05"),
        (b"not json", "not valid JSON"),
        (b"[1, 2]", "a JSON list, not an object"),
        (frame(999, b"\x02"), "unknown schema id 999: not one of DataHub's ids and no schema registry"),
        (
            frame(18, b"\xff\xff\xff"),
            "undecodable Avro value for schema id 18 \\(com.linkedin.pegasus2avro.mxe.MetadataChangeLog\\)",
        ),
        (frame(4, b"\x02\x00\x00\x00\x00\x00"), "undecodable Avro value for schema id 4"),
    ],
)
async def test_codec_says_why_a_value_is_neither(raw, reason):
    with pytest.raises(WireFormatError, match=reason):
        await ValueCodec(Settings()).decode(raw)


async def test_trailing_bytes_are_not_a_record():
    codec = ValueCodec(Settings())
    raw = codec.encode("platform_event", a_platform_event()) + b"\x00"
    with pytest.raises(WireFormatError, match="1 bytes left over"):
        await codec.decode(raw)


class FakeRegistry:
    def __init__(self, schemas_by_id: dict[int, str]) -> None:
        self.schemas, self.calls = schemas_by_id, 0

    async def schema_by_id(self, schema_id: int) -> str:
        self.calls += 1
        try:
            return self.schemas[schema_id]
        except KeyError:
            raise LookupError(f"schema {schema_id} not found") from None


async def test_writer_schemas_from_the_registry_are_fetched_once():
    # an older MCP writer schema (no `headers`), registered by another SDK version under a new id
    older = orjson.loads(schemas.schema_text("MetadataChangeProposal"))
    older["fields"] = [f for f in older["fields"] if f["name"] != "headers"]
    registry = FakeRegistry({1000: orjson.dumps(older).decode()})
    codec = ValueCodec(Settings(), registry)
    mcp = {k: v for k, v in an_mcp().items() if k != "headers"}
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(older), to_avro("MetadataChangeProposal", mcp))
    raw = frame(1000, out.getvalue())
    for _ in range(50):
        value, schema_id = await codec.decode(raw)
    assert schema_id == 1000 and value["aspect"] == mcp["aspect"] and "headers" not in value
    assert registry.calls == 1 and codec.registry_fetches == 1  # cached: no call per message
    await codec.decode(codec.encode("mcp", an_mcp()))  # DataHub's own id: no registry call
    assert registry.calls == 1
    with pytest.raises(WireFormatError, match="unknown schema id 1001: the schema registry does not know it"):
        await codec.decode(frame(1001, b"\x00"))
    with pytest.raises(WireFormatError, match="unknown schema id 1001"):
        await codec.decode(frame(1001, b"\x00"))
    assert registry.calls == 2  # an unknown id is remembered for a while, not asked for every record


async def test_an_external_registry_answers_for_every_id():
    text = schemas.schema_text("MetadataChangeLog")
    registry = FakeRegistry({18: text, 7: text})

    async def register(subject: str, schema: str) -> int:
        return {"MetadataChangeLog_Versioned_v1-value": 7}.get(subject, 500)

    registry.register = register  # type: ignore[attr-defined]
    codec = ValueCodec(Settings(schema_registry_url="http://registry:8081"), registry)
    with pytest.raises(RuntimeError, match="not registered"):
        codec.encode("mcl_versioned", mcl_create())
    await codec.start()
    raw = codec.encode("mcl_versioned", mcl_create())
    assert unframe(raw)[0] == 7  # the registry's id, not DataHub's
    assert (await codec.decode(raw))[1] == 7 and registry.calls == 1
    await codec.decode(frame(18, unframe(raw)[1]))  # id 18 is the registry's too: asked, not assumed DataHub's
    assert registry.calls == 2


def test_decode_sync_fetches_with_a_blocking_lookup():
    calls = []

    def fetch(schema_id: int) -> str:
        calls.append(schema_id)
        if schema_id != 1000:
            raise LookupError("no")
        return schemas.schema_text("PlatformEvent")

    codec = ValueCodec(Settings(), fetch_schema=fetch)
    raw = frame(1000, records.encoder("PlatformEvent")(a_platform_event()))
    assert codec.decode_sync(raw)[0]["name"] == "entityChangeEvent"
    assert codec.decode_sync(raw)[1] == 1000 and calls == [1000]
    with pytest.raises(WireFormatError, match="unknown schema id 1002"):
        codec.decode_sync(frame(1002, b""))


async def test_an_unreachable_registry_is_not_the_values_fault():
    from app.avro.wire import SchemaFetchFailed

    class Down:
        calls = 0

        async def schema_by_id(self, schema_id: int) -> str:
            self.calls += 1
            raise ConnectionRefusedError("connection refused")

    registry = Down()
    codec = ValueCodec(Settings(), registry)
    for _ in range(2):  # not remembered as unknown: asked again (the consumer holds the batch and retries)
        with pytest.raises(SchemaFetchFailed, match="could not be asked for schema id 1000"):
            await codec.decode(frame(1000, b""))
    assert registry.calls == 2
    assert (await codec.decode(codec.encode("mcp", an_mcp())))[1] == 16  # DataHub's ids never need it
