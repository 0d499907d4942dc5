"""Dead letters in DataHub's Avro FailedMetadataChangeProposal / FailedMetadataChangeEvent (the default) and in JSON:
the record as received when the Avro record can carry it, a placeholder with the record's bytes when it cannot, the
size limit, the reason and the record's coordinates in `error`."""

from __future__ import annotations

import base64

import orjson

from app.avro.wire import ValueCodec, unframe
from app.errors import Issue, ValidationFailed
from app.kafka.consumers import MCE, MCP, DeadLetterWriter, Unit
from app.settings import Settings

URN = "urn:li:dataset:(urn:li:dataPlatform:hive,db.dead,PROD)"


def unit(payload, raw: bytes, urn: str | None = None, aspect: str | None = None) -> Unit:
    u = Unit("MetadataChangeProposal_v1", 2, 41, 1_700_000_000_000, b"key", payload, raw=raw, urn=urn, aspect=aspect)
    u.error = ValidationFailed("the aspect is invalid", [Issue("the aspect is invalid", path="$.aspect.value")])
    return u


def written(settings: Settings, record_format, u: Unit) -> tuple[bytes | None, dict, dict]:
    codec = ValueCodec(settings)
    key, value = DeadLetterWriter(settings, record_format, codec).record(u)
    schema_id, _ = unframe(value)
    assert schema_id == (17 if record_format is MCP else 21)
    letter, _ = codec.decode_known(value)
    (trace,) = orjson.loads(letter["error"])
    return key, letter, trace


def test_an_mcp_is_carried_as_an_mcp_with_its_coordinates_in_the_error():
    mcp = {
        "entityType": "dataset",
        "entityUrn": URN,
        "changeType": "UPSERT",
        "aspectName": "status",
        "aspect": {"value": '{"removed":"no"}', "contentType": "application/json"},
        "headers": {"h": "1"},
    }
    key, letter, trace = written(Settings(), MCP, unit(mcp, orjson.dumps(mcp), URN, "status"))
    assert key == URN.encode()
    assert letter["metadataChangeProposal"] == mcp and set(letter) == {"metadataChangeProposal", "error"}
    assert trace["message"] == "the aspect is invalid" and trace["status"] == 400
    assert trace["exceptionClass"] == "app.errors.ValidationFailed" and "rawRecord" not in trace
    assert trace["source"] == {
        "topic": "MetadataChangeProposal_v1",
        "partition": 2,
        "offset": 41,
        "timestamp": 1_700_000_000_000,
    }


def test_a_record_that_is_not_an_mcp_travels_raw_in_a_placeholder():
    raw = b"\x00\x00\x00\x10\x92\xde\xad"
    key, letter, trace = written(Settings(), MCP, unit(raw.decode("utf-8", "backslashreplace"), raw))
    assert key == b"key"  # no URN could be read: the record's own key
    placeholder = letter["metadataChangeProposal"]
    assert placeholder == {
        "entityType": "unknown",
        "changeType": "UPSERT",
        "aspectName": "unknown",
        "aspect": {"value": raw.decode("utf-8", "backslashreplace"), "contentType": "application/octet-stream"},
    }
    assert trace["rawRecord"] is True and "payloadTruncated" not in trace
    # what could be read is kept: a JSON object that is not an MCP
    not_mcp = {"entityUrn": URN, "changeType": "DELETE", "oops": True}
    _, letter, _ = written(Settings(), MCP, unit(not_mcp, orjson.dumps(not_mcp), URN, "status"))
    assert letter["metadataChangeProposal"]["entityUrn"] == URN
    assert (
        letter["metadataChangeProposal"]["changeType"] == "DELETE"
        and letter["metadataChangeProposal"]["aspectName"] == "status"
    )
    assert orjson.loads(letter["metadataChangeProposal"]["aspect"]["value"]) == not_mcp


def test_a_dead_letter_too_large_for_the_topic_keeps_the_head_of_the_record():
    settings = Settings(kafka_max_message_bytes=4000)
    mcp = {
        "entityType": "dataset",
        "entityUrn": URN,
        "changeType": "UPSERT",
        "aspectName": "status",
        "aspect": {"value": orjson.dumps({"pad": "x" * 10_000}).decode(), "contentType": "application/json"},
    }
    raw = orjson.dumps(mcp)
    codec = ValueCodec(settings)
    _, value = DeadLetterWriter(settings, MCP, codec).record(unit(mcp, raw, URN, "status"))
    assert len(value) <= 4000
    letter, _ = codec.decode_known(value)
    (trace,) = orjson.loads(letter["error"])
    assert trace["payloadTruncated"] is True and trace["rawRecord"] is True
    assert letter["metadataChangeProposal"]["aspect"]["value"] == raw[:2000].decode()
    assert letter["metadataChangeProposal"]["entityUrn"] == URN


def test_an_mce_that_cannot_be_written_as_one_keeps_its_bytes_in_system_metadata():
    raw = b"\xff\xfe not utf-8"
    u = unit(raw.decode("utf-8", "backslashreplace"), raw, URN)
    u.topic = "MetadataChangeEvent_v4"
    _, letter, trace = written(Settings(), MCE, u)
    event = letter["metadataChangeEvent"]
    assert event["proposedSnapshot"] == {
        "com.linkedin.pegasus2avro.metadata.snapshot.DatasetSnapshot": {"urn": URN, "aspects": []}
    }
    properties = event["systemMetadata"]["properties"]
    assert properties["metaledger.rawRecordEncoding"] == "base64"
    assert base64.b64decode(properties["metaledger.rawRecord"]) == raw
    assert trace["rawRecord"] is True and trace["source"]["topic"] == "MetadataChangeEvent_v4"


def test_json_format_keeps_todays_dead_letter():
    settings = Settings(kafka_value_format="json")
    u = unit("not json", b"not json")
    key, value = DeadLetterWriter(settings, MCP, ValueCodec(settings)).record(u)
    letter = orjson.loads(value)
    assert set(letter) == {"metadataChangeProposal", "error", "source"}
    assert letter["metadataChangeProposal"] == "not json" and letter["source"]["offset"] == 41
    (trace,) = orjson.loads(letter["error"])
    assert trace["message"] == "the aspect is invalid" and "source" not in trace
