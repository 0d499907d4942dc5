"""The schema registry metaledger serves at /schema-registry/api (Confluent's REST API, as GMS serves it):

- every endpoint against the app (ASGI), with DataHub's fixed ids and subjects, registrations (content-addressed,
  ids from 1000, versions per subject), compatibility (409 with the reason), hostile input (Confluent's 4xx bodies);
- Confluent's own `SchemaRegistryClient`, `AvroSerializer` and `AvroDeserializer` (confluent-kafka) against a real
  metaledger process, and ids that survive a restart of that process;
- metaledger's `ConfluentRegistryClient` (the external-registry client) against metaledger's own routes.
"""

from __future__ import annotations

import io
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import fastavro
import httpx
import orjson
import pytest

from app.avro.schemas import package_schema_dir, schema_text
from app.embedded_pg import free_port
from app.schema_registry import (
    IncompatibleSchema,
    InvalidSchema,
    RegistryUnavailable,
    SchemaRegistryClient,
    UnknownSchema,
    make_registry_client,
)
from app.schema_registry.confluent import ConfluentRegistryClient
from app.schema_registry.internal import InternalRegistry
from app.schema_registry.normal_form import normalize
from app.settings import Settings
from tests.processes import SYSTEM_CLIENT_ID, SYSTEM_CLIENT_SECRET, start_service, stop_process, wait_healthy_sync

API = "/schema-registry/api"
SR_JSON = "application/vnd.schemaregistry.v1+json"
MCP_SUBJECT = "MetadataChangeProposal_v1-value"
DATAHUB_SUBJECTS = {
    MCP_SUBJECT: ("MetadataChangeProposal", [0, 9, 16]),
    "FailedMetadataChangeProposal_v1-value": ("FailedMetadataChangeProposal", [1, 10, 17]),
    "MetadataChangeLog_Versioned_v1-value": ("MetadataChangeLog", [2, 11, 18]),
    "MetadataChangeLog_Timeseries_v1-value": ("MetadataChangeLog", [3, 12, 19]),
    "PlatformEvent_v1-value": ("PlatformEvent", [4]),
    "MetadataChangeEvent_v4-value": ("MetadataChangeEvent", [5, 13, 20]),
    "FailedMetadataChangeEvent_v4-value": ("FailedMetadataChangeEvent", [6, 14, 21]),
    "MetadataAuditEvent_v4-value": ("MetadataAuditEvent", [7, 15, 22]),
}


def record(
    name: str = "Order", namespace: str = "com.example", fields: list[dict[str, Any]] | None = None, **extra: Any
) -> dict:
    fields = fields if fields is not None else [{"name": "id", "type": "string"}, {"name": "amount", "type": "int"}]
    return {"type": "record", "name": name, "namespace": namespace, "fields": fields, **extra}


def text(schema: Any, **dumps: Any) -> str:
    return orjson.dumps(schema, **dumps).decode()


def subject() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}-value"


async def register(client, subject_name: str, schema: Any, expect: int = 200) -> dict:
    body = {"schema": schema if isinstance(schema, str) else text(schema)}
    response = await client.post(f"{API}/subjects/{subject_name}/versions", json=body)
    assert response.status_code == expect, response.text
    return response.json()


def confluent_error(response: httpx.Response, status: int, code: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error_code"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return body["message"]


# --- DataHub's schemas, ids and subjects ---------------------------------------------------------------------------


async def test_root_types_mode_and_config(client):
    for path in (API, f"{API}/"):
        response = await client.get(path)
        assert response.status_code == 200 and response.json() == {}
        assert response.headers["content-type"] == SR_JSON
    assert (await client.get(f"{API}/schemas/types")).json() == ["AVRO"]
    assert (await client.get(f"{API}/mode")).json() == {"mode": "READWRITE"}
    assert (await client.get(f"{API}/config")).json() == {"compatibilityLevel": "BACKWARD"}
    assert (await client.get(f"{API}/config/{MCP_SUBJECT}")).json() == {"compatibilityLevel": "BACKWARD"}
    # a client that asks for plain JSON gets it
    response = await client.get(f"{API}/schemas/types", headers={"Accept": "application/json"})
    assert response.headers["content-type"] == "application/json"


async def test_datahub_subjects_versions_and_fixed_ids(client):
    subjects = (await client.get(f"{API}/subjects")).json()
    assert set(DATAHUB_SUBJECTS) <= set(subjects)
    for name, (record_name, ids) in DATAHUB_SUBJECTS.items():
        assert (await client.get(f"{API}/subjects/{name}/versions")).json() == list(range(1, len(ids) + 1))
        latest = (await client.get(f"{API}/subjects/{name}/versions/latest")).json()
        assert latest == {"subject": name, "version": len(ids), "id": ids[-1], "schema": schema_text(record_name)}
        assert "schemaType" not in latest  # AVRO is left out, as Confluent does
        first = (await client.get(f"{API}/subjects/{name}/versions/1")).json()
        assert (first["version"], first["id"]) == (1, ids[0])
        for schema_id in ids:
            response = await client.get(f"{API}/schemas/ids/{schema_id}", params={"subject": name})
            assert response.status_code == 200, response.text
            assert response.json() == {"schema": schema_text(record_name)}
    assert (await client.get(f"{API}/schemas/ids/22/subjects")).json() == ["MetadataAuditEvent_v4-value"]
    assert (await client.get(f"{API}/schemas/ids/16/versions")).json() == [{"subject": MCP_SUBJECT, "version": 3}]
    assert (await client.get(f"{API}/schemas/ids/19/subjects")).json() == ["MetadataChangeLog_Timeseries_v1-value"]
    raw = await client.get(f"{API}/schemas/ids/4/schema")
    assert orjson.loads(raw.content) == orjson.loads(schema_text("PlatformEvent"))
    raw = await client.get(f"{API}/subjects/{MCP_SUBJECT}/versions/latest/schema")
    assert orjson.loads(raw.content)["name"] == "MetadataChangeProposal"
    # the served text is a schema fastavro reads
    fastavro.parse_schema(orjson.loads((await client.get(f"{API}/schemas/ids/20")).json()["schema"]))


@pytest.mark.parametrize("settings_overrides", [{"topic_mcp": "my_mcp_topic", "topic_platform_event": "my_events"}])
async def test_subjects_follow_the_configured_topics(client, settings_overrides):
    subjects = (await client.get(f"{API}/subjects")).json()
    assert "my_mcp_topic-value" in subjects and "my_events-value" in subjects and MCP_SUBJECT not in subjects
    latest = (await client.get(f"{API}/subjects/my_mcp_topic-value/versions/latest")).json()
    assert latest["id"] == 16


async def test_registering_datahubs_own_schema_gives_datahubs_id(client):
    mcp = schema_text("MetadataChangeProposal")
    assert (await register(client, MCP_SUBJECT, mcp)) == {"id": 16}
    # the same schema laid out differently is the same schema
    assert (await register(client, MCP_SUBJECT, text(orjson.loads(mcp), option=orjson.OPT_INDENT_2))) == {"id": 16}
    # DataHub's schema under another subject keeps DataHub's id
    other = subject()
    assert (await register(client, other, mcp)) == {"id": 16}
    assert (await client.get(f"{API}/subjects/{other}/versions/1")).json()["id"] == 16
    assert (await client.get(f"{API}/subjects/{MCP_SUBJECT}/versions")).json() == [1, 2, 3]
    lookup = await client.post(f"{API}/subjects/{MCP_SUBJECT}", json={"schema": mcp})
    assert lookup.status_code == 200 and lookup.json()["id"] == 16 and lookup.json()["version"] == 3


async def test_the_sdks_avsc_files_register_as_datahubs_ids(client):
    """What the datahub-kafka sink's AvroSerializer posts: the .avsc text shipped in acryl-datahub, as is."""
    folder = package_schema_dir()
    for subject_name, record_name, expected in [
        (MCP_SUBJECT, "MetadataChangeProposal", 16),
        ("MetadataChangeLog_Versioned_v1-value", "MetadataChangeLog", 18),
        ("MetadataChangeLog_Timeseries_v1-value", "MetadataChangeLog", 19),
        ("PlatformEvent_v1-value", "PlatformEvent", 4),
        ("MetadataChangeEvent_v4-value", "MetadataChangeEvent", 20),
    ]:
        avsc = (folder / f"{record_name}.avsc").read_text()
        assert (await register(client, subject_name, avsc)) == {"id": expected}


def test_every_schema_acryl_datahub_ships_is_accepted_with_a_layout_independent_fingerprint():
    for path in sorted(package_schema_dir().glob("*.avsc")):
        raw = path.read_text()
        normal = normalize(raw)
        assert normalize(normal.text).text == normal.text, path.name
        reordered = orjson.dumps(orjson.loads(raw), option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2).decode()
        assert normalize(reordered).fingerprint == normal.fingerprint, path.name


async def test_a_compatible_datahub_schema_variant_is_stored_as_a_new_version(client):
    """Another SDK version's MCP schema (here: one more optional field) gets an id of its own, as version 4."""
    variant = orjson.loads(schema_text("MetadataChangeProposal"))
    variant["fields"].append({"name": "newField", "type": ["null", "string"], "default": None})
    schema_id = (await register(client, MCP_SUBJECT, variant))["id"]
    assert schema_id >= 1000
    assert (await client.get(f"{API}/subjects/{MCP_SUBJECT}/versions")).json() == [1, 2, 3, 4]
    latest = (await client.get(f"{API}/subjects/{MCP_SUBJECT}/versions/latest")).json()
    assert (latest["version"], latest["id"]) == (4, schema_id)
    assert (await client.get(f"{API}/schemas/ids/{schema_id}")).json()["schema"] == latest["schema"]
    # DataHub's id is unchanged
    assert (await client.get(f"{API}/schemas/ids/16")).json()["schema"] == schema_text("MetadataChangeProposal")


# --- registrations ------------------------------------------------------------------------------------------------


async def test_register_is_content_addressed_with_ids_from_1000(client, db):
    name = subject()
    first = (await register(client, name, record()))["id"]
    assert first >= 1000
    assert (await register(client, name, record()))["id"] == first
    # key order, layout and namespace spelling do not make another schema
    reordered = {"fields": record()["fields"], "name": "com.example.Order", "type": "record"}
    assert (await register(client, name, text(reordered, option=orjson.OPT_INDENT_2)))["id"] == first
    assert (await client.get(f"{API}/subjects/{name}/versions")).json() == [1]
    # the same schema under another subject: the same id, that subject's version 1
    elsewhere = subject()
    assert (await register(client, elsewhere, record()))["id"] == first
    assert sorted(
        (await client.get(f"{API}/schemas/ids/{first}/versions")).json(), key=lambda v: v["subject"]
    ) == sorted([{"subject": name, "version": 1}, {"subject": elsewhere, "version": 1}], key=lambda v: v["subject"])
    assert sorted((await client.get(f"{API}/schemas/ids/{first}/subjects")).json()) == sorted([name, elsewhere])
    assert set((await client.get(f"{API}/subjects")).json()) >= {name, elsewhere}
    # stored once, in normal form
    assert await db.fetchval("SELECT count(*) FROM schema_registry_schema WHERE id = $1", first) == 1
    served = (await client.get(f"{API}/schemas/ids/{first}")).json()["schema"]
    assert orjson.loads(served) == {
        "type": "record",
        "name": "com.example.Order",
        "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "int"}],
    }

    # a compatible change: a new version and a new id
    evolved = record(fields=[*record()["fields"], {"name": "note", "type": ["null", "string"], "default": None}])
    second = (await register(client, name, evolved))["id"]
    assert second > first
    assert (await client.get(f"{API}/subjects/{name}/versions")).json() == [1, 2]
    version = (await client.get(f"{API}/subjects/{name}/versions/2")).json()
    assert (version["subject"], version["version"], version["id"]) == (name, 2, second)
    assert (await client.get(f"{API}/subjects/{name}/versions/latest")).json()["id"] == second
    # registering version 1's schema again answers its id, no new version
    assert (await register(client, name, record()))["id"] == first
    assert (await client.get(f"{API}/subjects/{name}/versions")).json() == [1, 2]

    # lookup
    found = await client.post(f"{API}/subjects/{name}", json={"schema": text(record())})
    assert found.status_code == 200
    assert found.json() == {"subject": name, "version": 1, "id": first, "schema": served}
    missing = await client.post(f"{API}/subjects/{name}", json={"schema": text(record(name="Other"))})
    confluent_error(missing, 404, 40403)
    confluent_error(await client.post(f"{API}/subjects/{subject()}", json={"schema": text(record())}), 404, 40401)


async def test_concurrent_registrations_agree(client):
    """Many clients registering at once: one id per schema, one version per schema in a subject."""
    import asyncio

    name = subject()
    others = [subject() for _ in range(4)]
    schema = record(name=f"Concurrent{uuid.uuid4().hex[:6]}")
    answers = await asyncio.gather(
        *(register(client, name, schema) for _ in range(8)), *(register(client, other, schema) for other in others)
    )
    assert len({answer["id"] for answer in answers}) == 1
    assert (await client.get(f"{API}/subjects/{name}/versions")).json() == [1]
    # distinct compatible schemas at once get consecutive versions
    variants = [
        record(name=schema["name"], fields=[*schema["fields"], {"name": f"f{i}", "type": "int", "default": i}])
        for i in range(5)
    ]
    ids = await asyncio.gather(*(register(client, name, variant) for variant in variants))
    assert len({answer["id"] for answer in ids}) == 5
    assert (await client.get(f"{API}/subjects/{name}/versions")).json() == [1, 2, 3, 4, 5, 6]


INCOMPATIBLE = {
    "added field without default": (
        record(),
        record(fields=[*record()["fields"], {"name": "currency", "type": "string"}]),
        "'currency'",
    ),
    "renamed field without alias": (
        record(),
        record(fields=[{"name": "id", "type": "string"}, {"name": "total", "type": "int"}]),
        "'total'",
    ),
    "type change that is not a promotion": (
        record(),
        record(fields=[{"name": "id", "type": "int"}, {"name": "amount", "type": "int"}]),
        "from string to int",
    ),
    "narrowing long to int": (
        record(fields=[{"name": "n", "type": "long"}]),
        record(fields=[{"name": "n", "type": "int"}]),
        "from long to int",
    ),
    "enum symbol removed": (
        record(fields=[{"name": "s", "type": {"type": "enum", "name": "State", "symbols": ["A", "B", "C"]}}]),
        record(fields=[{"name": "s", "type": {"type": "enum", "name": "State", "symbols": ["A", "B"]}}]),
        "['C']",
    ),
    "union member removed": (
        record(fields=[{"name": "v", "type": ["null", "string", "int"], "default": None}]),
        record(fields=[{"name": "v", "type": ["null", "string"], "default": None}]),
        "int",
    ),
    "record renamed": (record(), record(name="Purchase"), "Purchase"),
    "fixed resized": (
        record(fields=[{"name": "h", "type": {"type": "fixed", "name": "Hash", "size": 16}}]),
        record(fields=[{"name": "h", "type": {"type": "fixed", "name": "Hash", "size": 32}}]),
        "16 to 32",
    ),
}


@pytest.mark.parametrize("case", list(INCOMPATIBLE))
async def test_incompatible_registration_is_409_with_the_reason(client, case):
    old, new, reason = INCOMPATIBLE[case]
    name = subject()
    await register(client, name, old)
    response = await client.post(f"{API}/subjects/{name}/versions", json={"schema": text(new)})
    message = confluent_error(response, 409, 409)
    assert name in message and "BACKWARD" in message and reason in message, message
    assert (await client.get(f"{API}/subjects/{name}/versions")).json() == [1]
    check = await client.post(f"{API}/compatibility/subjects/{name}/versions/latest", json={"schema": text(new)})
    assert check.json()["is_compatible"] is False and check.json()["messages"]


COMPATIBLE = {
    "added field with default": record(fields=[*record()["fields"], {"name": "c", "type": "string", "default": "EUR"}]),
    "removed field": record(fields=[{"name": "id", "type": "string"}]),
    "renamed field with alias": record(
        fields=[{"name": "id", "type": "string"}, {"name": "total", "type": "int", "aliases": ["amount"]}]
    ),
    "int promoted to long": record(fields=[{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}]),
    "string read as bytes": record(fields=[{"name": "id", "type": "bytes"}, {"name": "amount", "type": "double"}]),
    "widened to a union": record(
        fields=[{"name": "id", "type": ["string", "null"]}, {"name": "amount", "type": "int"}]
    ),
    "record renamed with alias": record(name="Purchase", aliases=["com.example.Order"]),
}


@pytest.mark.parametrize("case", list(COMPATIBLE))
async def test_backward_compatible_changes_are_accepted(client, case):
    name = subject()
    first = (await register(client, name, record()))["id"]
    check = await client.post(f"{API}/compatibility/subjects/{name}/versions", json={"schema": text(COMPATIBLE[case])})
    assert check.json() == {"is_compatible": True, "messages": []}
    assert (await register(client, name, COMPATIBLE[case]))["id"] > first


async def test_enum_with_default_and_recursive_records(client):
    """An enum that drops a symbol is BACKWARD compatible only with a default (old data's dropped symbol reads as
    it); a recursive record registers and evolves (a widened field, a field added with a default)."""
    name = subject()
    enum = {"type": "enum", "name": "State", "symbols": ["A", "B", "C"]}
    first = await register(client, name, record(fields=[{"name": "s", "type": enum}]))
    without_default = {"type": "enum", "name": "State", "symbols": ["A", "B"]}
    message = confluent_error(
        await client.post(
            f"{API}/subjects/{name}/versions",
            json={"schema": text(record(fields=[{"name": "s", "type": without_default}]))},
        ),
        409,
        409,
    )
    assert "at /s: the enum com.example.State lost the symbols ['C'] and has no default" in message, message
    reduced = {"type": "enum", "name": "State", "symbols": ["A", "B"], "default": "A"}
    check = await client.post(
        f"{API}/compatibility/subjects/{name}/versions/latest",
        json={"schema": text(record(fields=[{"name": "s", "type": reduced}]))},
    )
    assert check.json() == {"is_compatible": True, "messages": []}
    second = await register(client, name, record(fields=[{"name": "s", "type": reduced}]))
    assert second["id"] > first["id"]
    assert (await client.get(f"{API}/subjects/{name}/versions")).json() == [1, 2]
    latest = (await client.get(f"{API}/subjects/{name}/versions/latest")).json()
    assert (latest["version"], latest["id"]) == (2, second["id"])
    assert latest["schema"] == normalize(text(record(fields=[{"name": "s", "type": reduced}]))).text

    linked = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "value", "type": "int"}, {"name": "next", "type": ["null", "Node"], "default": None}],
    }
    other = subject()
    node = await register(client, other, linked)
    evolved = {
        "type": "record",
        "name": "Node",
        "fields": [
            {"name": "value", "type": "long"},
            {"name": "next", "type": ["null", "Node"], "default": None},
            {"name": "label", "type": "string", "default": ""},
        ],
    }
    node2 = await register(client, other, evolved)
    assert (await client.get(f"{API}/subjects/{other}/versions")).json() == [1, 2]
    assert (await client.get(f"{API}/schemas/ids/{node['id']}")).json()["schema"] == normalize(text(linked)).text
    assert (await client.get(f"{API}/schemas/ids/{node2['id']}")).json()["schema"] == normalize(text(evolved)).text
    # and checked like any record: a field changed incompatibly is refused
    broken = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "value", "type": "string"}, {"name": "next", "type": ["null", "Node"], "default": None}],
    }
    message = confluent_error(
        await client.post(f"{API}/subjects/{other}/versions", json={"schema": text(broken)}), 409, 409
    )
    assert "at /value: the type changed from long to string" in message, message


async def test_compatibility_levels_per_subject_and_global(client):
    name = subject()
    await register(client, name, record())
    breaking = record(fields=[{"name": "other", "type": "string"}])
    await register(client, name, breaking, expect=409)
    response = await client.put(f"{API}/config/{name}", json={"compatibility": "NONE"})
    assert response.status_code == 200 and response.json() == {"compatibility": "NONE"}
    assert (await client.get(f"{API}/config/{name}")).json() == {"compatibilityLevel": "NONE"}
    assert (await client.get(f"{API}/config")).json() == {"compatibilityLevel": "BACKWARD"}
    await register(client, name, breaking)

    # FORWARD: the old schema must read the new one's data (a removed field needs a default in the old schema)
    forward = subject()
    await client.put(f"{API}/config/{forward}", json={"compatibility": "forward"})
    await register(client, forward, record())
    message = confluent_error(
        await client.post(
            f"{API}/subjects/{forward}/versions",
            json={"schema": text(record(fields=[{"name": "id", "type": "string"}]))},
        ),
        409,
        409,
    )
    assert "'amount'" in message and "FORWARD" in message
    # FULL_TRANSITIVE checks every earlier version
    full = subject()
    await client.put(f"{API}/config/{full}", json={"compatibility": "FULL_TRANSITIVE"})
    await register(client, full, record(fields=[{"name": "a", "type": "int", "default": 0}]))
    await register(
        client,
        full,
        record(fields=[{"name": "a", "type": "int", "default": 0}, {"name": "b", "type": "int", "default": 0}]),
    )
    # deleting the subject's level falls back to the global one
    deleted = await client.delete(f"{API}/config/{name}")
    assert deleted.json() == {"compatibilityLevel": "NONE"}
    assert (await client.get(f"{API}/config/{name}")).json() == {"compatibilityLevel": "BACKWARD"}
    # the global level
    assert (await client.put(f"{API}/config", json={"compatibility": "FULL"})).json() == {"compatibility": "FULL"}
    assert (await client.get(f"{API}/config")).json() == {"compatibilityLevel": "FULL"}
    assert (await client.get(f"{API}/config/{subject()}")).json() == {"compatibilityLevel": "FULL"}
    # invalid levels
    confluent_error(await client.put(f"{API}/config", json={"compatibility": "SOMETIMES"}), 422, 42203)
    confluent_error(await client.put(f"{API}/config/{name}", json={"compatibility": 7}), 422, 42203)
    confluent_error(await client.put(f"{API}/config/{name}", json={"level": "NONE"}), 422, 422)


# --- hostile input ----------------------------------------------------------------------------------------------


INVALID_SCHEMAS = {
    "not JSON": "{not json",
    "unknown type": text(record(fields=[{"name": "a", "type": "Missing"}])),
    "duplicate field": text(record(fields=[{"name": "a", "type": "int"}, {"name": "a", "type": "int"}])),
    "default of the wrong type": text(record(fields=[{"name": "a", "type": "int", "default": "x"}])),
    "union default not matching the first branch": text(
        record(fields=[{"name": "a", "type": ["null", "int"], "default": 3}])
    ),
    "invalid name": text(record(name="1Order")),
    "invalid field name": text(record(fields=[{"name": "a-b", "type": "int"}])),
    "record without fields": text({"type": "record", "name": "R"}),
    "enum with duplicate symbols": text({"type": "enum", "name": "E", "symbols": ["A", "A"]}),
    "enum default not a symbol": text({"type": "enum", "name": "E", "symbols": ["A"], "default": "B"}),
    "fixed without size": text({"type": "fixed", "name": "F"}),
    "array without items": text({"type": "array"}),
    "nested union": text(["null", ["int", "string"]]),
    "duplicate union branch": text(["int", "int"]),
    "empty union": "[]",
    "a number": "5",
    "an object without type": "{}",
    "a type defined twice": text(
        record(
            fields=[
                {"name": "a", "type": {"type": "fixed", "name": "F", "size": 1}},
                {"name": "b", "type": {"type": "fixed", "name": "F", "size": 2}},
            ]
        )
    ),
    "deeply nested": "[" * 5000 + "]" * 5000,
    "types nested 65 levels": '{"type":"array","items":' * 65 + '"int"' + "}" * 65,
    "deeply nested arrays": '{"type":"array","items":' * 3000 + '"int"' + "}" * 3000,
}


@pytest.mark.parametrize("case", list(INVALID_SCHEMAS))
async def test_invalid_avro_is_422_42201(client, case):
    response = await client.post(f"{API}/subjects/{subject()}/versions", json={"schema": INVALID_SCHEMAS[case]})
    message = confluent_error(response, 422, 42201)
    assert len(message) < 2000


async def test_hostile_requests_get_confluent_4xx_bodies(client):
    name = subject()
    post = f"{API}/subjects/{name}/versions"
    confluent_error(await client.post(post, content=b"{bad json", headers={"Content-Type": SR_JSON}), 400, 400)
    confluent_error(await client.post(post, content=b"", headers={"Content-Type": SR_JSON}), 400, 400)
    confluent_error(await client.post(post, json=["schema"]), 422, 422)
    confluent_error(await client.post(post, json={}), 422, 42201)
    confluent_error(await client.post(post, json={"schema": {"type": "string"}}), 422, 42201)
    confluent_error(await client.post(post, json={"schema": 5}), 422, 42201)
    confluent_error(await client.post(post, json={"schema": '"string"', "schemaType": "PROTOBUF"}), 422, 42201)
    confluent_error(
        await client.post(
            post, json={"schema": '"string"', "references": [{"name": "x", "subject": "y", "version": 1}]}
        ),
        422,
        42201,
    )
    too_large = '"' + "x" * (1024 * 1024 + 10) + '"'
    confluent_error(await client.post(post, json={"schema": too_large}), 422, 42201)
    confluent_error(
        await client.post(post, content=b" " * (3 * 1024 * 1024), headers={"Content-Type": SR_JSON}), 413, 413
    )
    # nothing of the above was registered
    confluent_error(await client.get(f"{API}/subjects/{name}/versions"), 404, 40401)
    # a subject name that is too long
    confluent_error(await client.post(f"{API}/subjects/{'s' * 600}/versions", json={"schema": '"string"'}), 422, 42208)

    # unknown subjects, versions and ids
    confluent_error(await client.get(f"{API}/subjects/{name}/versions/latest"), 404, 40401)
    confluent_error(await client.get(f"{API}/subjects/{MCP_SUBJECT}/versions/99"), 404, 40402)
    for bad in ("abc", "0", "-2", "1.5", "99999999999", "١"):
        confluent_error(await client.get(f"{API}/subjects/{MCP_SUBJECT}/versions/{bad}"), 422, 42202)
    assert (await client.get(f"{API}/subjects/{MCP_SUBJECT}/versions/-1")).json()["id"] == 16
    for bad in ("999", "999999", "abc", "-1", "99999999999999999999"):
        confluent_error(await client.get(f"{API}/schemas/ids/{bad}"), 404, 40403)
        confluent_error(await client.get(f"{API}/schemas/ids/{bad}/versions"), 404, 40403)
    # unknown endpoints and methods
    confluent_error(await client.get(f"{API}/nothing/here"), 404, 404)
    confluent_error(await client.delete(f"{API}/subjects/{MCP_SUBJECT}"), 404, 404)


# --- the registry objects --------------------------------------------------------------------------------------------


async def test_internal_registry_satisfies_the_client_protocol(app):
    registry = app.state.schema_registry
    assert isinstance(registry, InternalRegistry) and isinstance(registry, SchemaRegistryClient)
    assert await registry.schema_by_id(18) == schema_text("MetadataChangeLog")
    name = subject()
    schema_id = await registry.register(name, text(record()))
    assert schema_id >= 1000 and await registry.register(name, text(record())) == schema_id
    assert orjson.loads(await registry.schema_by_id(schema_id))["name"] == "com.example.Order"
    with pytest.raises(UnknownSchema) as unknown:
        await registry.schema_by_id(123456)
    assert isinstance(unknown.value, LookupError)
    with pytest.raises(InvalidSchema):
        await registry.register(name, "{")
    with pytest.raises(IncompatibleSchema):
        await registry.register(name, text(record(fields=[{"name": "x", "type": "int"}])))


@pytest.mark.parametrize("settings_overrides", [{"schema_registry_url": "http://127.0.0.1:9/registry"}])
async def test_with_an_external_registry_the_routes_point_to_it(app, client, settings_overrides):
    assert isinstance(app.state.schema_registry, ConfluentRegistryClient)
    message = confluent_error(await client.get(f"{API}/schemas/ids/16"), 404, 40401)
    assert "http://127.0.0.1:9/registry" in message
    confluent_error(await client.get(f"{API}/"), 404, 40401)


class CountingTransport(httpx.AsyncBaseTransport):
    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.requests: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        return await self.inner.handle_async_request(request)


async def test_confluent_registry_client_against_metaledgers_routes(app):
    transport = CountingTransport(httpx.ASGITransport(app=app))
    # As the system client, which may register (reads would need no credentials).
    app.state.auth.settings.system_client_secret = "registry-test-secret"
    registry = ConfluentRegistryClient(
        f"http://metaledger{API}/", transport=transport, user_info="__datahub_system:registry-test-secret"
    )
    try:
        assert await registry.schema_by_id(16) == schema_text("MetadataChangeProposal")
        assert await registry.schema_by_id(16) == schema_text("MetadataChangeProposal")
        assert transport.requests == [f"GET {API}/schemas/ids/16"]  # cached by id
        name = subject()
        schema_id = await registry.register(name, text(record()))
        assert schema_id >= 1000
        assert await registry.register(name, text(record())) == schema_id
        assert orjson.loads(await registry.schema_by_id(schema_id))["name"] in ("Order", "com.example.Order")
        assert len(transport.requests) == 2
        with pytest.raises(IncompatibleSchema) as incompatible:
            await registry.register(name, text(record(fields=[{"name": "x", "type": "int"}])))
        assert "'x'" in str(incompatible.value)
        with pytest.raises(InvalidSchema):
            await registry.register(name, "{")
        with pytest.raises(UnknownSchema):
            await registry.schema_by_id(424242)
    finally:
        await registry.aclose()
    unreachable = ConfluentRegistryClient(f"http://127.0.0.1:{free_port()}/")
    try:
        with pytest.raises(RegistryUnavailable):
            await unreachable.schema_by_id(16)
    finally:
        await unreachable.aclose()


async def test_make_registry_client_chooses_by_setting(database_url):
    from app.db import create_engine

    engine = create_engine(database_url)
    try:
        internal = make_registry_client(Settings(database_url=database_url), engine)
        assert isinstance(internal, InternalRegistry)
        external = make_registry_client(
            Settings(database_url=database_url, schema_registry_url="http://sr:8081"), engine
        )
        assert isinstance(external, ConfluentRegistryClient) and external.url == "http://sr:8081"
        await external.aclose()
    finally:
        await engine.dispose()


# --- confluent-kafka's client against a metaledger process -------------------------------------------------------


class Process:
    def __init__(self, database_url: str) -> None:
        self.env = {
            "METALEDGER_DATABASE_URL": database_url,
            "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
            "METALEDGER_KAFKA_BOOTSTRAP_SERVERS": "",
        }
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = None

    def start(self) -> None:
        self.process = start_service(self.env, self.port)
        wait_healthy_sync(self.url, process=self.process)

    def stop(self) -> None:
        stop_process(self.process)

    def registry(self):
        from confluent_kafka.schema_registry import SchemaRegistryClient as ConfluentClient

        # As the system client (admin): these tests register new schemas.
        return ConfluentClient(
            {"url": f"{self.url}{API}/", "basic.auth.user.info": f"{SYSTEM_CLIENT_ID}:{SYSTEM_CLIENT_SECRET}"}
        )


@pytest.fixture(scope="module")
def metaledger_process(make_database, migrated_template) -> Iterator[Process]:
    process = Process(make_database(template=migrated_template))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_confluent_schema_registry_client(metaledger_process):
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    sr = metaledger_process.registry()
    mcp = sr.get_schema(16, subject_name=MCP_SUBJECT)
    assert mcp.schema_type == "AVRO" and mcp.schema_str == schema_text("MetadataChangeProposal")
    assert sr.get_schema_types() == ["AVRO"]
    assert set(DATAHUB_SUBJECTS) <= set(sr.get_subjects())
    assert sr.get_versions(MCP_SUBJECT) == [1, 2, 3]
    latest = sr.get_latest_version(MCP_SUBJECT)
    assert (latest.schema_id, latest.version, latest.subject) == (16, 3, MCP_SUBJECT)
    assert sr.get_version(MCP_SUBJECT, 1).schema_id == 0
    assert sr.get_compatibility() == "BACKWARD"
    assert sr.get_compatibility(MCP_SUBJECT) == "BACKWARD"
    # (a fresh client: this one cached version 1's schema, the same text, under id 0)
    assert (
        metaledger_process.registry().register_schema(
            MCP_SUBJECT, Schema(schema_text("MetadataChangeProposal"), "AVRO")
        )
        == 16
    )

    name = subject()
    schema = Schema(text(record()), "AVRO")
    schema_id = sr.register_schema(name, schema)
    assert schema_id >= 1000
    assert metaledger_process.registry().register_schema(name, schema) == schema_id  # a fresh client: no cache
    found = metaledger_process.registry().lookup_schema(name, schema)
    assert (found.schema_id, found.version, found.subject) == (schema_id, 1, name)
    assert [(v.subject, v.version) for v in sr.get_schema_versions(schema_id)] == [(name, 1)]
    assert sr.test_compatibility(name, Schema(text(record(fields=[{"name": "x", "type": "int"}])), "AVRO")) is False

    with pytest.raises(SchemaRegistryError) as incompatible:
        sr.register_schema(
            name, Schema(text(record(fields=[*record()["fields"], {"name": "currency", "type": "string"}])), "AVRO")
        )
    assert (incompatible.value.http_status_code, incompatible.value.error_code) == (409, 409)
    assert "'currency'" in incompatible.value.error_message
    with pytest.raises(SchemaRegistryError) as invalid:
        sr.register_schema(
            subject(), Schema('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "nope"}]}', "AVRO")
        )
    assert (invalid.value.http_status_code, invalid.value.error_code) == (422, 42201)
    with pytest.raises(SchemaRegistryError) as unknown:
        sr.get_schema(777)
    assert (unknown.value.http_status_code, unknown.value.error_code) == (404, 40403)
    with pytest.raises(SchemaRegistryError) as no_subject:
        sr.get_latest_version(subject())
    assert (no_subject.value.http_status_code, no_subject.value.error_code) == (404, 40401)
    with pytest.raises(SchemaRegistryError) as no_lookup:
        sr.lookup_schema(name, Schema(text(record(name="Other")), "AVRO"))
    assert no_lookup.value.error_code == 40403

    sr.set_compatibility(name, "NONE")
    assert sr.get_compatibility(name) == "NONE"


def frame(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + payload


def test_confluent_avro_serializer_and_deserializer(metaledger_process):
    """A producer auto-registers its schema (AvroSerializer) and a consumer reads by id (AvroDeserializer); a DataHub
    MCP written with id 16 decodes with the schema metaledger serves for 16."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = f"orders_{uuid.uuid4().hex[:8]}"
    context = SerializationContext(topic, MessageField.VALUE)
    serializer = AvroSerializer(metaledger_process.registry(), text(record()))
    value = serializer({"id": "o-1", "amount": 42}, context)
    assert value[0] == 0 and struct.unpack(">I", value[1:5])[0] >= 1000
    deserializer = AvroDeserializer(metaledger_process.registry())
    assert deserializer(value, context) == {"id": "o-1", "amount": 42}

    mcp = {
        "auditHeader": None,
        "entityType": "dataset",
        "entityUrn": "urn:li:dataset:(urn:li:dataPlatform:hive,t,PROD)",
        "entityKeyAspect": None,
        "changeType": "UPSERT",
        "aspectName": "status",
        "aspect": {"value": b'{"removed": false}', "contentType": "application/json"},
        "systemMetadata": None,
        "headers": None,
    }
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(orjson.loads(schema_text("MetadataChangeProposal"))), mcp)
    decoded = deserializer(
        frame(16, buffer.getvalue()), SerializationContext("MetadataChangeProposal_v1", MessageField.VALUE)
    )
    assert decoded["entityUrn"] == mcp["entityUrn"] and decoded["aspect"]["value"] == b'{"removed": false}'


def test_ids_are_stable_across_a_restart(metaledger_process):
    """The module's process restarted (left running for the other tests): a process of its own cost a start more."""
    from confluent_kafka.schema_registry import Schema

    process = metaledger_process
    first_subject, second_subject = subject(), subject()
    first = process.registry().register_schema(first_subject, Schema(text(record()), "AVRO"))
    served = process.registry().get_schema(first).schema_str
    process.stop()
    process.start()
    sr = process.registry()
    assert sr.get_schema(first).schema_str == served
    assert sr.get_schema(16).schema_str == schema_text("MetadataChangeProposal")
    assert sr.register_schema(first_subject, Schema(text(record()), "AVRO")) == first
    second = sr.register_schema(second_subject, Schema(text(record(name="Invoice")), "AVRO"))
    assert second > first
    assert sr.get_latest_version(first_subject).version == 1


CUSTOM_ASPECT = {
    "type": "record",
    "name": "WidgetQuality",
    "namespace": "com.example.widgets",
    "Aspect": {"name": "widgetQuality"},
    "fields": [
        {"name": "score", "type": "double"},
        {"name": "checkedBy", "type": ["null", "com.linkedin.pegasus2avro.common.AuditStamp"], "default": None},
        {"name": "notes", "type": {"type": "array", "items": "string"}, "default": []},
    ],
}


@pytest.mark.parametrize("pair", ["dataset.globalTags", "custom.widgetQuality"])
def test_per_aspect_event_schemas_round_trip_through_confluent_serdes(metaledger_process, registry, pair):
    """The generated v5 records of a built-in aspect and of a user's own (a `path:` aspect naming a DataHub type):
    registered by Confluent's AvroSerializer, a real value written, read back by AvroDeserializer through the
    registry metaledger serves, and by fastavro with the document alone."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from app.avro.per_aspect import event_schemas

    entity, aspect = pair.split(".")
    if entity == "dataset":
        documents = event_schemas(entity, aspect, registry.aspect_spec(aspect).schema)
        old, new = {"tags": [{"tag": "urn:li:tag:a"}]}, {"tags": [{"tag": "urn:li:tag:a"}, {"tag": "urn:li:tag:b"}]}
    else:
        documents = event_schemas("widget", aspect, CUSTOM_ASPECT)
        old = {"score": 0.5, "notes": []}
        new = {"score": 0.9, "checkedBy": {"time": 1, "actor": "urn:li:corpuser:qa"}, "notes": ["ok"]}
    sr = metaledger_process.registry()
    for record, value in [
        ("MetadataAuditEvent", {"urn": "urn:li:x:1", "oldValue": old, "newValue": new}),
        ("MetadataChangeEvent", {"urn": "urn:li:x:1", "proposedValue": new}),
        ("FailedMetadataChangeEvent", {"metadataChangeEvent": {"urn": "urn:li:x:1"}, "error": "no"}),
    ]:
        topic = f"{record}_v5.{pair}.{uuid.uuid4().hex[:6]}"
        context = SerializationContext(topic, MessageField.VALUE)
        written = AvroSerializer(sr, orjson.dumps(documents[record]).decode())(value, context)
        read = AvroDeserializer(sr)(written, context)
        assert _without_nulls(read) == _without_nulls(value), record
        alone = fastavro.schemaless_reader(io.BytesIO(written[5:]), fastavro.parse_schema(documents[record]))
        assert _without_nulls(alone) == _without_nulls(value)
    assert (
        documents["MetadataAuditEvent"]["namespace"]
        == f"com.linkedin.mxe.{'widget' if entity == 'custom' else entity}.{aspect}"
    )


def _without_nulls(value: Any) -> Any:
    """Avro readers give every field, absent optional ones as None (and defaults): compare what was set."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
