"""The OpenAPI document: the app's routes as declared (app.api) with the components generated from the entity registry
(app.openapi_spec).

Uses the real app and registry (entity_registry.yml + the .avsc files of acryl-datahub) and small stand-in registries
built from hand-written .avsc dicts for edge cases. No services. Needs ``jsonschema`` and ``openapi-spec-validator``.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from app.openapi_spec import (
    API_PREFIX,
    add_registry_components,
    aspect_components,
    dumps_spec,
)

REPO = Path(__file__).resolve().parents[2]
REGISTRY_FILE = REPO / "entity_registry.yml"
SPEC_URI = "urn:metaledger:openapi"


# ----------------------------------------------------------------------------------------------------------------
# Fixtures and helpers
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registry():
    from app.registry import load_registry

    return load_registry(REGISTRY_FILE)


def _fastapi_spec() -> dict[str, Any]:
    app = FastAPI(title="metaledger")

    @app.get("/health")
    def health(verbose: bool = False) -> dict[str, str]:  # pragma: no cover - never called
        return {}

    return app.openapi()


@pytest.fixture(scope="module")
def app(registry):
    from app.main import create_app
    from app.settings import Settings

    return create_app(Settings(), registry)


@pytest.fixture(scope="module")
def spec(app) -> dict[str, Any]:
    """The document the app serves and `metaledger openapi export` commits."""
    from app.main import build_openapi

    return build_openapi(app)


@pytest.fixture(scope="module")
def schemas(spec) -> dict[str, Any]:
    return spec["components"]["schemas"]


def validator_for(spec_or_components: dict[str, Any], name: str) -> Draft202012Validator:
    """A validator for one component, $refs resolved against the whole document."""
    if "components" in spec_or_components:
        document = spec_or_components
    else:
        document = {"components": {"schemas": spec_or_components}}
    resource = Resource.from_contents(document, default_specification=DRAFT202012)
    resources = Registry().with_resource(SPEC_URI, resource)
    return Draft202012Validator({"$ref": f"{SPEC_URI}#/components/schemas/{name}"}, registry=resources)


def is_valid(spec_or_components: dict[str, Any], name: str, instance: Any) -> bool:
    return validator_for(spec_or_components, name).is_valid(instance)


def errors(spec_or_components: dict[str, Any], name: str, instance: Any) -> list[str]:
    return [e.message for e in validator_for(spec_or_components, name).iter_errors(instance)]


def all_refs(node: Any) -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            out.append(node["$ref"])
        for v in node.values():
            out.extend(all_refs(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(all_refs(v))
    return out


@dataclass(frozen=True)
class StubEntity:
    name: str
    key_aspect: str
    aspect_names: frozenset[str]
    doc: str | None = None


@dataclass(frozen=True)
class StubAspect:
    name: str
    record_name: str
    schema: dict[str, Any]
    is_timeseries: bool = False
    is_key: bool = False


@dataclass
class StubRegistry:
    entities: dict[str, StubEntity]
    aspects: dict[str, StubAspect]
    _documents: list[tuple[str, Any]] = field(default_factory=list)


def stub_registry(
    *schemas: dict[str, Any], entity: str = "thing", documents: tuple[dict[str, Any], ...] | list[dict[str, Any]] = ()
) -> StubRegistry:
    """One entity owning every given aspect schema (the first one is its key aspect)."""
    aspects = {}
    for raw in schemas:
        name = raw["Aspect"]["name"]
        record = f"{raw['namespace']}.{raw['name']}".replace("pegasus2avro.", "", 1)
        aspects[name] = StubAspect(name, record, raw, is_key=name == schemas[0]["Aspect"]["name"])
    key = schemas[0]["Aspect"]["name"]
    return StubRegistry(
        entities={entity: StubEntity(entity, key, frozenset(aspects), doc=f"The {entity} entity")},
        aspects=aspects,
        _documents=[(f"doc{i}", d) for i, d in enumerate(documents)],
    )


def record(
    name: str,
    fields: list[dict[str, Any]],
    *,
    aspect: str | None = None,
    namespace: str = "com.linkedin.pegasus2avro.test",
    **extra,
) -> dict[str, Any]:
    raw: dict[str, Any] = {"type": "record", "name": name, "namespace": namespace, "fields": fields, **extra}
    if aspect:
        raw["Aspect"] = {"name": aspect}
    return raw


KEY = record("ThingKey", [{"name": "id", "type": "string"}], aspect="thingKey")


# ----------------------------------------------------------------------------------------------------------------
# Validity of the document
# ----------------------------------------------------------------------------------------------------------------


def test_document_is_valid_openapi_31(spec):
    from openapi_spec_validator import validate

    assert spec["openapi"].startswith("3.1")
    validate(spec)  # raises on an invalid document


def operations(app):
    """(path, method, route) of every documented operation, through included routers and each entity type's routes."""
    from fastapi.routing import APIRoute

    from app.api.entities import expanded

    def walk(route):
        contexts = getattr(route, "effective_route_contexts", None)
        if contexts is not None:  # an included router (FastAPI >= 0.160 includes lazily)
            for context in contexts():
                yield from walk(context)
        elif isinstance(getattr(route, "original_route", route), APIRoute) and route.include_in_schema:
            for method in sorted(route.methods):
                yield route.path_format, method.lower(), route

    for route in expanded(app.router.routes):
        yield from walk(route)


def test_parameter_defaults_are_the_handlers_defaults(app, spec):
    """The document is derived from the declarations: every query parameter's documented default is the default of
    the handler's parameter, and a parameter without a default in the handler has none in the document."""
    checked = 0
    for path, method, route in operations(app):
        documented = {p["name"]: p for p in spec["paths"][path][method].get("parameters", []) if p.get("in") == "query"}
        for param in route.dependant.query_params:
            if not param.field_info.include_in_schema:
                continue  # an alias kept for old clients
            default = param.field_info.default
            schema = documented[param.alias]["schema"]
            if param.field_info.is_required() or default is None:
                assert "default" not in schema, (path, method, param.alias)
            else:
                assert schema.get("default") == default, (path, method, param.alias)
            checked += 1
    assert checked > 500  # the entity routes of every entity type among them


def test_boolean_parameters_refuse_anything_but_true_and_false(app, spec):
    """One boolean convention: every boolean query parameter is documented `boolean` and parsed by the one Flag."""
    from app.api.http import strict_flag

    booleans = 0
    for path, method, route in operations(app):
        for param in route.dependant.query_params:
            annotation = param.field_info.annotation
            if annotation is bool or annotation == bool | None:
                validators = [getattr(m, "func", None) for m in param.field_info.metadata]
                assert strict_flag in validators, (path, method, param.alias)
                booleans += 1
    assert booleans > 300


def test_every_component_schema_is_valid_and_every_ref_resolves(spec, schemas):
    for schema in schemas.values():
        Draft202012Validator.check_schema(schema)
    for ref in all_refs(spec):
        section, _, name = ref.removeprefix("#/components/").partition("/")
        assert name in spec["components"][section], ref
    # and nothing is emitted that nothing uses
    referenced = {r.rpartition("/")[2] for r in all_refs(spec)}
    unused = {n for n in schemas if n not in referenced}
    assert unused <= {"HTTPValidationError", "ValidationError"}


def test_operation_ids_are_unique_and_stable(spec, registry):
    ids = [op["operationId"] for item in spec["paths"].values() for op in item.values() if isinstance(op, dict)]
    assert len(ids) == len(set(ids))
    expected = {
        "createDataset",
        "getDataset",
        "headDataset",
        "deleteDataset",
        "createDatasetAspect",
        "getDatasetAspect",
        "headDatasetAspect",
        "deleteDatasetAspect",
        "batchGetDataset",
        "getCorpuser",
        "createMlModelAspect",
    }
    assert expected <= set(ids)
    # every entity of the registry has its 4 paths
    for entity in registry.entities:
        base = f"{API_PREFIX}/{entity}"
        for path in (base, f"{base}/batchGet", f"{base}/{{urn}}", f"{base}/{{urn}}/{{aspectName}}"):
            assert path in spec["paths"], path


def test_deterministic_idempotent_fast_and_small(registry):
    t0 = time.process_time()  # CPU time: a loaded machine does not make it slow
    first = dumps_spec(add_registry_components(_fastapi_spec(), registry))
    elapsed = time.process_time() - t0
    assert elapsed < 2.0, f"generation took {elapsed:.2f}s of CPU"

    # a registry whose dicts are in another order gives the same document
    @dataclass
    class Shuffled:
        entities: dict
        aspects: dict

    shuffled = Shuffled(dict(reversed(list(registry.entities.items()))), dict(reversed(list(registry.aspects.items()))))
    doc = add_registry_components(_fastapi_spec(), shuffled)
    assert dumps_spec(doc) == first
    # a second call on the same document changes nothing
    assert dumps_spec(add_registry_components(doc, registry)) == first
    # a few MB at most
    assert len(first.encode()) < 4_000_000
    # components are sorted
    parsed = json.loads(first)
    assert list(parsed["components"]["schemas"]) == sorted(parsed["components"]["schemas"])


def test_fastapi_parts_are_kept(registry):
    spec = add_registry_components(_fastapi_spec(), registry)
    assert "/health" in spec["paths"]
    assert "HTTPValidationError" in spec["components"]["schemas"]
    assert spec["info"]["title"] == "metaledger"


# ----------------------------------------------------------------------------------------------------------------
# Components
# ----------------------------------------------------------------------------------------------------------------


def test_one_component_per_aspect_and_nested_named_type(registry, schemas):
    components = aspect_components(registry)
    for aspect in registry.aspects.values():
        short = aspect.record_name.rpartition(".")[2]
        assert short in components, aspect.name
    # nested named types are components, referenced rather than inlined
    for name in ("AuditStamp", "TagAssociation", "SchemaField", "SchemaFieldDataType", "StringType", "FabricType"):
        assert name in components, name
    assert components["GlobalTags"]["properties"]["tags"]["items"] == {"$ref": "#/components/schemas/TagAssociation"}
    # emitted once; the same as in the document
    assert all(schemas[k] == v for k, v in components.items())
    assert list(components) == sorted(components)


def test_scalar_mappings(schemas):
    dataset_key = schemas["DatasetKey"]
    assert dataset_key["properties"]["origin"] == {
        "$ref": "#/components/schemas/FabricType",
        "description": dataset_key["properties"]["origin"]["description"],
    }
    assert schemas["FabricType"]["type"] == "string"
    assert "PROD" in schemas["FabricType"]["enum"]
    audit = schemas["AuditStamp"]
    assert audit["properties"]["time"]["type"] == "integer"
    assert audit["properties"]["time"]["format"] == "int64"
    assert audit["required"] == ["time", "actor"]
    assert audit["additionalProperties"] is False
    assert audit["description"].startswith("Data captured")
    custom = schemas["DatasetProperties"]["properties"]["customProperties"]
    assert custom["type"] == "object" and custom["additionalProperties"] == {"type": "string"}
    assert custom["default"] == {}
    # int32
    int_fields = [
        p
        for s in schemas.values()
        for p in (s.get("properties") or {}).values()
        if isinstance(p, dict) and p.get("format") == "int32"
    ]
    assert int_fields and all(p["type"] == "integer" for p in int_fields)


def test_optional_fields_and_defaults(schemas):
    tag = schemas["TagAssociation"]
    assert tag["required"] == ["tag"]  # context / attribution are optional
    assert tag["properties"]["context"] == {"type": "string", "description": "Additional context about the association"}
    sm = schemas["SystemMetadata"]
    assert "required" not in sm
    assert sm["properties"]["lastObserved"]["default"] == 0  # ["long", "null"] with default 0
    assert sm["properties"]["runId"]["default"] == "no-run-id-provided"
    assert "default" not in sm["properties"]["pipelineName"]  # default null = absent
    status = schemas["Status"]
    assert status["properties"]["removed"]["default"] is False


def test_every_default_validates_against_its_schema(spec, schemas):
    checked = 0
    for name, schema in schemas.items():
        for prop_name, prop in (schema.get("properties") or {}).items():
            if isinstance(prop, dict) and "default" in prop:
                sub = {k: v for k, v in prop.items() if k != "default"}
                doc = {"components": {"schemas": {**schemas, "__probe": sub}}}
                assert is_valid(doc, "__probe", prop["default"]), f"{name}.{prop_name} default {prop['default']!r}"
                checked += 1
    assert checked > 100


def test_deprecated_fields_are_marked(schemas):
    uri = schemas["DatasetProperties"]["properties"]["uri"]
    assert uri["deprecated"] is True
    assert "Deprecated: Use ExternalReference.externalUrl" in uri["description"]


def test_system_metadata_component(schemas):
    sm = schemas["SystemMetadata"]
    props = sm["properties"]
    for f in (
        "lastObserved",
        "runId",
        "lastRunId",
        "pipelineName",
        "registryName",
        "registryVersion",
        "properties",
        "version",
        "schemaVersion",
        "aspectCreated",
        "aspectModified",
    ):
        assert f in props, f
    assert props["aspectCreated"]["$ref"] == "#/components/schemas/AuditStamp"
    assert props["properties"]["additionalProperties"] == {"type": "string"}
    assert props["schemaVersion"]["format"] == "int64"
    assert is_valid(schemas, "SystemMetadata", {"lastObserved": 1700000000000, "runId": "r1", "properties": {"a": "b"}})
    assert not is_valid(schemas, "SystemMetadata", {"lastObserved": "yesterday"})


def test_error_response_component(schemas):
    err = schemas["ErrorResponse"]
    assert err["required"] == ["error", "message"]
    assert err["properties"]["issues"]["items"] == {"$ref": "#/components/schemas/ErrorIssue"}
    assert schemas["ErrorIssue"]["required"] == ["message"]
    body = {
        "error": "Validation Error",
        "message": "bad",
        "issues": [{"message": "x", "index": 0, "urn": "urn:li:tag:a", "aspect": "globalTags", "path": "$.tags"}],
    }
    assert is_valid(schemas, "ErrorResponse", body)
    assert not is_valid(schemas, "ErrorResponse", {"error": "x", "message": "y", "issues": [{"index": 0}]})


# ----------------------------------------------------------------------------------------------------------------
# Realistic Pegasus JSON payloads
# ----------------------------------------------------------------------------------------------------------------

SCHEMA_METADATA = {
    "schemaName": "db.orders",
    "platform": "urn:li:dataPlatform:hive",
    "version": 0,
    "hash": "",
    "created": {"time": 0, "actor": "urn:li:corpuser:unknown"},
    "platformSchema": {"com.linkedin.schema.MySqlDDL": {"tableSchema": "CREATE TABLE orders (id INT)"}},
    "fields": [
        {
            "fieldPath": "id",
            "nativeDataType": "INT",
            "type": {"type": {"com.linkedin.schema.NumberType": {}}},
            "nullable": False,
            "isPartOfKey": True,
            "globalTags": {"tags": [{"tag": "urn:li:tag:pii"}]},
        },
        {
            "fieldPath": "name",
            "nativeDataType": "VARCHAR(64)",
            "type": {"type": {"com.linkedin.schema.StringType": {}}},
            "description": "customer name",
            "glossaryTerms": {
                "terms": [{"urn": "urn:li:glossaryTerm:Name"}],
                "auditStamp": {"time": 1700000000000, "actor": "urn:li:corpuser:jdoe"},
            },
        },
        {
            "fieldPath": "tags",
            "nativeDataType": "ARRAY<STRING>",
            "type": {"type": {"com.linkedin.schema.ArrayType": {"nestedType": ["string"]}}},
        },
    ],
}

GLOBAL_TAGS = {
    "tags": [
        {"tag": "urn:li:tag:pii", "context": "from ingestion"},
        {
            "tag": "urn:li:tag:gold",
            "attribution": {"time": 1, "actor": "urn:li:corpuser:datahub", "sourceDetail": {"rule": "x"}},
        },
    ]
}

DATASET_PROPERTIES = {
    "name": "orders",
    "description": "All orders",
    "customProperties": {"owner_team": "sales", "retention": "30d"},
    "externalUrl": "https://example.com/orders",
    "created": {"time": 1700000000000, "actor": "urn:li:corpuser:jdoe"},
    "tags": [],
}


@pytest.mark.parametrize(
    ("component", "payload"),
    [
        ("SchemaMetadata", SCHEMA_METADATA),
        ("GlobalTags", GLOBAL_TAGS),
        ("DatasetProperties", DATASET_PROPERTIES),
        ("DatasetProperties", {}),
        ("Status", {"removed": True}),
        ("DatasetKey", {"platform": "urn:li:dataPlatform:hive", "name": "db.orders", "origin": "PROD"}),
        ("Cost", {"costType": "ORG_COST_TYPE", "cost": {"costCode": "CC-1"}}),
        ("Cost", {"costType": "ORG_COST_TYPE", "cost": {"costId": 12}}),
    ],
)
def test_realistic_payloads_validate(schemas, component, payload):
    assert errors(schemas, component, payload) == []


def test_unknown_field_is_rejected(schemas):
    assert not is_valid(schemas, "GlobalTags", {**GLOBAL_TAGS, "extra": 1})
    assert not is_valid(schemas, "DatasetProperties", {"name": "x", "nmae": "typo"})
    nested = copy.deepcopy(SCHEMA_METADATA)
    nested["fields"][0]["typo"] = True
    assert not is_valid(schemas, "SchemaMetadata", nested)


def test_missing_required_field_and_wrong_types_are_rejected(schemas):
    assert not is_valid(schemas, "GlobalTags", {})
    assert not is_valid(schemas, "GlobalTags", {"tags": [{"context": "no tag urn"}]})
    assert not is_valid(schemas, "DatasetKey", {"platform": "p", "name": "n", "origin": "NOT_A_FABRIC"})
    assert not is_valid(schemas, "SchemaMetadata", {**SCHEMA_METADATA, "version": "1"})
    assert not is_valid(schemas, "DatasetProperties", {"customProperties": {"a": 1}})


@pytest.mark.parametrize(
    "bad_type",
    [
        {"com.linkedin.schema.NoSuchType": {}},  # unknown member
        {"com.linkedin.pegasus2avro.schema.StringType": {}},  # Avro name, not the Pegasus one
        {"StringType": {}},  # short name
        {"com.linkedin.schema.StringType": {}, "com.linkedin.schema.NumberType": {}},  # two members
        {},  # no member
        {"com.linkedin.schema.StringType": {"unexpected": 1}},  # bad member value
    ],
)
def test_wrong_union_shapes_are_rejected(schemas, bad_type):
    payload = copy.deepcopy(SCHEMA_METADATA)
    payload["fields"][1]["type"] = {"type": bad_type}
    assert not is_valid(schemas, "SchemaMetadata", payload)


def test_aliased_union_rejects_the_avro_form(schemas):
    avro_form = {"costType": "ORG_COST_TYPE", "cost": {"costCode": "CC-1", "fieldDiscriminator": "costCode"}}
    assert not is_valid(schemas, "Cost", avro_form)
    assert not is_valid(schemas, "Cost", {"costType": "ORG_COST_TYPE", "cost": {"costCode": 5}})
    assert "CostCostDiscriminator" not in schemas


def test_optional_field_is_not_nullable(schemas):
    # Pegasus clients omit optional fields; null is not part of the documented wire form.
    assert not is_valid(schemas, "TagAssociation", {"tag": "urn:li:tag:a", "context": None})


# ----------------------------------------------------------------------------------------------------------------
# Typed request / response wrappers and paths
# ----------------------------------------------------------------------------------------------------------------


def test_entity_request_and_response_components(schemas, registry):
    dataset = registry.entities["dataset"]
    request = schemas["DatasetEntityRequest"]
    assert request["required"] == ["urn"]
    assert set(request["properties"]) == {"urn"} | set(dataset.aspect_names)
    assert request["properties"]["globalTags"] == {"$ref": "#/components/schemas/GlobalTagsAspectRequest"}
    aspect_request = schemas["GlobalTagsAspectRequest"]
    assert aspect_request["properties"]["value"] == {"$ref": "#/components/schemas/GlobalTags"}
    assert aspect_request["properties"]["systemMetadata"] == {"$ref": "#/components/schemas/SystemMetadata"}
    assert aspect_request["required"] == ["value"]
    response = schemas["GlobalTagsAspectResponse"]
    assert set(response["properties"]) == {"value", "systemMetadata", "auditStamp", "version", "status", "message"}
    assert set(schemas["DatasetEntityResponse"]["properties"]) == {"urn"} | set(dataset.aspect_names)

    body_item = {
        "urn": "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)",
        "globalTags": {"value": GLOBAL_TAGS, "headers": {"If-Version-Match": "3"}},
        "schemaMetadata": {"value": SCHEMA_METADATA, "systemMetadata": {"runId": "r1"}},
        "datasetProperties": {"value": DATASET_PROPERTIES},
    }
    assert errors(schemas, "DatasetEntityRequest", body_item) == []
    assert not is_valid(
        schemas, "DatasetEntityRequest", {**body_item, "chartInfo": {"value": {}}}
    )  # not a dataset aspect
    assert not is_valid(schemas, "DatasetEntityRequest", {"globalTags": {"value": GLOBAL_TAGS}})  # no urn
    assert not is_valid(schemas, "DatasetEntityRequest", {**body_item, "globalTags": {"value": {"tags": "x"}}})

    answer = {
        "urn": body_item["urn"],
        "globalTags": {
            "value": GLOBAL_TAGS,
            "systemMetadata": {"lastObserved": 1},
            "version": "2",
            "status": "UPDATED",
        },
    }
    assert errors(schemas, "DatasetEntityResponse", answer) == []
    batch_get = {"urn": body_item["urn"], "globalTags": {}, "status": {"headers": {"X-A": "b"}}}
    assert errors(schemas, "DatasetBatchGetRequest", batch_get) == []


def test_single_aspect_body_is_any_of_the_entity_aspects(schemas, registry):
    body = schemas["DatasetEntityAspectRequest"]
    refs = {r["$ref"].rpartition("/")[2] for r in body["properties"]["value"]["anyOf"]}
    expected = {registry.aspects[a].record_name.rpartition(".")[2] for a in registry.entities["dataset"].aspect_names}
    assert refs == expected
    assert errors(schemas, "DatasetEntityAspectRequest", {"value": GLOBAL_TAGS}) == []
    assert errors(schemas, "DatasetEntityAspectRequest", {"value": SCHEMA_METADATA}) == []
    assert not is_valid(schemas, "DatasetEntityAspectRequest", {"value": {"noSuchField": 1}})
    # matches several aspects with no required fields (datasetProperties, editableDatasetProperties, ...)
    assert is_valid(schemas, "DatasetEntityAspectRequest", {"value": {"description": "x"}})
    assert set(schemas["DatasetEntityAspectResponse"]["properties"]) == {
        "value",
        "systemMetadata",
        "auditStamp",
        "version",
        "status",
        "message",
    }


def test_dataset_paths(spec, registry):
    base = f"{API_PREFIX}/dataset"
    paths = spec["paths"]
    aspects = sorted(registry.entities["dataset"].aspect_names)
    assert spec["components"]["schemas"]["DatasetAspectName"]["enum"] == aspects

    def params(op):
        out = {}
        for p in op["parameters"]:
            if "$ref" in p:
                p = spec["components"]["parameters"][p["$ref"].rpartition("/")[2]]
            out[p["name"]] = p
        return out

    def resolve_response(r):
        if "$ref" in r:
            return spec["components"]["responses"][r["$ref"].rpartition("/")[2]]
        return r

    create = paths[base]["post"]
    assert create["tags"] == ["dataset"] and create["operationId"] == "createDataset"
    p = params(create)
    assert p["async"]["schema"]["type"] == "boolean" and p["async"]["schema"]["default"] is True
    assert p["systemMetadata"]["schema"]["default"] is True  # a write echoes its system metadata
    body = create["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"type": "array", "items": {"$ref": "#/components/schemas/DatasetEntityRequest"}}
    for code in ("200", "202"):
        schema = create["responses"][code]["content"]["application/json"]["schema"]
        assert schema == {"type": "array", "items": {"$ref": "#/components/schemas/DatasetEntityResponse"}}
    for code in ("400", "409", "412", "413"):
        schema = resolve_response(create["responses"][code])["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorResponse"}

    get = paths[f"{base}/{{urn}}"]["get"]
    p = params(get)
    assert p["urn"]["in"] == "path" and p["urn"]["required"] is True
    aspects = p["aspects"]["schema"]
    assert (aspects["type"], aspects["items"]) == ("array", {"$ref": "#/components/schemas/DatasetAspectName"})
    assert p["systemMetadata"]["schema"]["default"] is False  # a read leaves it out unless asked
    assert set(get["responses"]) == {"200", "400", "401", "403", "404", "503"}
    assert set(paths[f"{base}/{{urn}}"]["head"]["responses"]) == {"204", "400", "401", "403", "404", "503"}
    delete = paths[f"{base}/{{urn}}"]["delete"]
    assert set(params(delete)) == {"urn", "aspects", "clear"}
    assert delete["responses"]["200"]["content"]["application/json"]["schema"]["required"] == ["urn", "deleted"]

    aspect_path = paths[f"{base}/{{urn}}/{{aspectName}}"]
    post = aspect_path["post"]
    p = params(post)
    assert p["aspectName"]["schema"] == {"$ref": "#/components/schemas/DatasetAspectName"}
    assert p["async"]["schema"]["default"] is False
    # true unless a precondition header is present: no single default, and the description says so
    assert "default" not in p["createIfNotExists"]["schema"] and p["createIfNotExists"]["schema"]["type"] == "boolean"
    assert "If-Version-Match" in p["createIfNotExists"]["description"]
    assert p["createIfEntityNotExists"]["schema"]["default"] is False
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/DatasetEntityAspectRequest"
    }
    assert {"200", "202", "400", "409", "412", "413", "415", "429", "503"} <= set(post["responses"])
    get_aspect = aspect_path["get"]
    version = params(get_aspect)["version"]["schema"]
    assert (version["type"], version["default"], version["minimum"], version["maximum"]) == ("integer", 0, 0, 2**63 - 1)
    assert {k: p["urn"]["schema"][k] for k in ("type", "pattern", "maxLength")} == {
        "type": "string",
        "pattern": "^urn:li:dataset:.",
        "maxLength": 512,
    }
    assert get_aspect["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/DatasetEntityAspectResponse"
    }
    assert "204" in aspect_path["head"]["responses"] and "404" in aspect_path["head"]["responses"]
    assert aspect_path["delete"]["responses"]["200"]["content"]["application/json"]["schema"]["required"] == [
        "urn",
        "aspect",
        "status",
    ]

    batch = paths[f"{base}/batchGet"]["post"]
    assert batch["requestBody"]["content"]["application/json"]["schema"] == {
        "type": "array",
        "items": {"$ref": "#/components/schemas/DatasetBatchGetRequest"},
    }
    assert batch["responses"]["200"]["content"]["application/json"]["schema"]["items"] == {
        "$ref": "#/components/schemas/DatasetEntityResponse"
    }

    tags = {t["name"]: t for t in spec["tags"]}
    assert "dataset" in tags and tags["dataset"].get("description")


# ----------------------------------------------------------------------------------------------------------------
# Stand-in registries: naming, defaults, cross-document references
# ----------------------------------------------------------------------------------------------------------------


def test_short_name_collisions_are_qualified_deterministically():
    a = record("Info", [{"name": "x", "type": "string"}], namespace="com.linkedin.pegasus2avro.alpha")
    b = record("Info", [{"name": "y", "type": "int"}], namespace="com.linkedin.pegasus2avro.beta")
    aspect = record("Holder", [{"name": "a", "type": a}, {"name": "b", "type": b}], aspect="holder")
    components = aspect_components(stub_registry(KEY, aspect))
    assert "Info" not in components
    assert components["alpha.Info"]["required"] == ["x"]
    assert components["beta.Info"]["properties"]["y"] == {"type": "integer", "format": "int32"}
    assert components["Holder"]["properties"]["a"] == {"$ref": "#/components/schemas/alpha.Info"}
    # the same type defined inline in two documents is one component
    other = record("Other", [{"name": "i", "type": "com.linkedin.pegasus2avro.alpha.Info"}], aspect="other")
    other["fields"][0]["type"] = copy.deepcopy(a)
    components = aspect_components(stub_registry(KEY, aspect, other))
    assert components["Other"]["properties"]["i"] == {"$ref": "#/components/schemas/alpha.Info"}


def test_names_reserved_for_generated_components_are_qualified():
    clash = record("ErrorResponse", [{"name": "x", "type": "string"}], aspect="errorResponse")
    doc = add_registry_components(_fastapi_spec(), stub_registry(KEY, clash))
    schemas = doc["components"]["schemas"]
    assert schemas["ErrorResponse"]["required"] == ["error", "message"]
    assert schemas["test.ErrorResponse"]["required"] == ["x"]
    assert schemas["ErrorResponseAspectRequest"]["properties"]["value"] == {
        "$ref": "#/components/schemas/test.ErrorResponse"
    }


def test_clash_with_a_fastapi_component_qualifies_ours():
    clash = record("ValidationError", [{"name": "x", "type": "string"}], aspect="validationError")
    base = _fastapi_spec()
    fastapi_validation_error = copy.deepcopy(base["components"]["schemas"]["ValidationError"])
    doc = add_registry_components(base, stub_registry(KEY, clash))
    assert doc["components"]["schemas"]["ValidationError"] == fastapi_validation_error
    assert doc["components"]["schemas"]["test.ValidationError"]["required"] == ["x"]


def test_unions_defaults_and_scalars():
    color = {
        "type": "enum",
        "name": "Color",
        "namespace": "com.linkedin.pegasus2avro.test",
        "symbols": ["RED", "BLUE"],
        "symbolDocs": {"RED": "red!"},
    }
    inner = record("Inner", [{"name": "n", "type": "long", "default": 7}])
    md5 = {"type": "fixed", "name": "MD5", "namespace": "com.linkedin.pegasus2avro.test", "size": 16}
    aspect = record(
        "Everything",
        [
            {"name": "i", "type": "int"},
            {"name": "f", "type": "float"},
            {"name": "d", "type": "double", "default": 1.5},
            {"name": "b", "type": "bytes"},
            {"name": "flag", "type": "boolean", "default": True},
            {"name": "color", "type": color, "default": "BLUE"},
            {"name": "inner", "type": inner, "default": {"n": 3}},
            {"name": "hash", "type": ["null", md5], "default": None},
            {"name": "choice", "type": ["com.linkedin.pegasus2avro.test.Inner", "string"], "default": {"n": 1}},
            {"name": "maybeChoice", "type": ["null", "int", "com.linkedin.pegasus2avro.test.Color"], "default": None},
            {"name": "list", "type": {"type": "array", "items": ["string", {"type": "map", "values": "long"}]}},
            {"name": "lastSeen", "type": ["long", "null"], "default": 0},
        ],
        aspect="everything",
        doc="All the shapes",
    )
    components = aspect_components(stub_registry(KEY, aspect))
    e = components["Everything"]
    props = e["properties"]
    assert e["description"] == "All the shapes"
    assert e["required"] == ["i", "f", "b", "list"]  # fields with a default are not required
    assert props["i"] == {"type": "integer", "format": "int32"}
    assert props["f"] == {"type": "number", "format": "float"}
    assert props["d"] == {"type": "number", "format": "double", "default": 1.5}
    assert props["b"] == {"type": "string"}
    assert props["color"] == {"$ref": "#/components/schemas/Color", "default": "BLUE"}
    assert props["inner"] == {"$ref": "#/components/schemas/Inner", "default": {"n": 3}}
    assert props["hash"] == {"$ref": "#/components/schemas/MD5"}
    assert components["MD5"] == {"type": "string", "minLength": 16, "maxLength": 16}
    assert components["Color"] == {"type": "string", "enum": ["RED", "BLUE"], "x-enum-descriptions": ["red!", ""]}
    # a union default is the first member, wrapped with its Pegasus key
    assert props["choice"]["default"] == {"com.linkedin.test.Inner": {"n": 1}}
    assert [list(m["properties"]) for m in props["choice"]["oneOf"]] == [["com.linkedin.test.Inner"], ["string"]]
    assert [list(m["properties"]) for m in props["maybeChoice"]["oneOf"]] == [["int"], ["com.linkedin.test.Color"]]
    assert props["lastSeen"] == {"type": "integer", "format": "int64", "default": 0}

    good = {
        "i": 1,
        "f": 2,
        "b": "\u0000\u00ff",
        "hash": "0123456789abcdef",
        "choice": {"string": "x"},
        "maybeChoice": {"com.linkedin.test.Color": "RED"},
        "list": [{"string": "a"}, {"map": {"k": 1}}],
    }
    assert errors(components, "Everything", good) == []
    for bad in (
        {**good, "i": 1.5},
        {**good, "hash": "short"},
        {**good, "choice": "x"},  # unwrapped union member
        {**good, "maybeChoice": {"int": 1, "com.linkedin.test.Color": "RED"}},
        {**good, "list": ["a"]},
        {**good, "color": "GREEN"},
    ):
        assert not is_valid(components, "Everything", bad), bad
    # all defaults validate
    for name, prop in props.items():
        if "default" in prop:
            probe = {**components, "__p": {k: v for k, v in prop.items() if k != "default"}}
            assert is_valid(probe, "__p", prop["default"]), name


def test_recursive_types_are_supported():
    node = record(
        "Node",
        [
            {"name": "label", "type": "string"},
            {
                "name": "children",
                "type": {"type": "array", "items": "com.linkedin.pegasus2avro.test.Node"},
                "default": [],
            },
        ],
        aspect="node",
    )
    components = aspect_components(stub_registry(KEY, node))
    tree = {"label": "a", "children": [{"label": "b", "children": [{"label": "c"}]}]}
    assert errors(components, "Node", tree) == []
    assert not is_valid(components, "Node", {"label": "a", "children": [{"children": []}]})


def test_references_to_types_defined_in_other_documents():
    # A user aspect referencing DataHub's AuditStamp by name; AuditStamp is defined in a non-aspect document.
    # A user aspect referencing a DataHub type by name (Pegasus or pegasus2avro form) that is defined only in a
    # non-aspect document of the registry's model sources.
    stamp = record(
        "Stamp",
        [{"name": "time", "type": "long"}, {"name": "actor", "type": "string"}],
        namespace="com.linkedin.pegasus2avro.common",
    )
    holder = record("Lib", [{"name": "stamp", "type": stamp}])
    mine = record(
        "MyAspect",
        [
            {"name": "created", "type": "com.linkedin.common.Stamp"},
            {"name": "modified", "type": "com.linkedin.pegasus2avro.common.Stamp"},
        ],
        aspect="myAspect",
        namespace="com.example",
    )
    components = aspect_components(stub_registry(KEY, mine, documents=[holder]))
    assert components["MyAspect"]["properties"]["created"] == {"$ref": "#/components/schemas/Stamp"}
    assert components["MyAspect"]["properties"]["modified"] == {"$ref": "#/components/schemas/Stamp"}
    assert components["Stamp"]["required"] == ["time", "actor"]
    assert "Lib" not in components  # only reachable types are emitted

    with pytest.raises(ValueError, match="defined nowhere"):
        aspect_components(stub_registry(KEY, mine))


def test_unknown_aspect_of_an_entity_is_an_error():
    reg = stub_registry(KEY)
    reg.entities["thing"] = StubEntity("thing", "thingKey", frozenset({"thingKey", "nope"}))
    with pytest.raises(ValueError, match="nope"):
        add_registry_components(_fastapi_spec(), reg)


def test_generated_component_name_collisions_are_reported():
    # entities "thing" and "Thing" would both make ThingEntityRequest, ThingEntityResponse, ...
    reg = stub_registry(KEY)
    reg.entities["Thing"] = StubEntity("Thing", "thingKey", frozenset({"thingKey"}))
    with pytest.raises(ValueError, match="collide"):
        aspect_components(reg)


def test_patch_operations_are_typed(spec, schemas):
    base = f"{API_PREFIX}/dataset"
    assert spec["paths"][base]["patch"]["operationId"] == "patchDataset"
    assert spec["paths"][f"{base}/{{urn}}/{{aspectName}}"]["patch"]["operationId"] == "patchDatasetAspect"
    item = {
        "urn": "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)",
        "globalTags": {
            "value": {
                "patch": [{"op": "add", "path": "/tags/urn:li:tag:x", "value": {"tag": "urn:li:tag:x"}}],
                "arrayPrimaryKeys": {"tags": ["tag"]},
            }
        },
    }
    assert errors(schemas, "DatasetEntityPatchRequest", item) == []
    assert not is_valid(schemas, "DatasetEntityPatchRequest", {**item, "globalTags": {"value": {"ops": []}}})


def test_every_operation_declares_the_statuses_it_can_answer():
    from app.openapi_spec import declare_statuses

    spec = {
        "paths": {
            "/health": {"get": {"security": [], "responses": {"200": {"description": "ok"}}}},
            "/x/{urn}": {
                "head": {"responses": {"204": {"description": "Exists"}}},
                "post": {
                    "requestBody": {},
                    "responses": {"200": {"description": "ok"}, "422": {"description": "FastAPI's"}},
                },
            },
        }
    }
    paths = declare_statuses(spec)["paths"]
    assert list(paths["/health"]["get"]["responses"]) == ["200", "400", "503"]
    head = paths["/x/{urn}"]["head"]["responses"]
    assert list(head) == ["204", "400", "401", "403", "404", "503"] and all("$ref" not in r for r in head.values())
    post = paths["/x/{urn}"]["post"]["responses"]
    assert list(post) == ["200", "400", "401", "403", "404", "409", "412", "413", "415", "429", "503"]
    assert post["415"] == {"$ref": "#/components/responses/UnsupportedMediaType"}


def test_an_operation_taking_an_idempotency_key_declares_the_keys_reuse():
    """422: the key was used with another request (app.idempotency); only where the operation takes the key — a write
    without it, and a read, never answer it (FastAPI's own 422 is dropped everywhere)."""
    from app.openapi_spec import declare_statuses

    key = {"in": "header", "name": "Idempotency-Key", "schema": {"type": "string"}}
    other = {"in": "header", "name": "If-Match", "schema": {"type": "string"}}
    spec = {
        "paths": {
            "/keyed": {"patch": {"parameters": [other, key], "responses": {"200": {"description": "ok"}}}},
            "/unkeyed": {
                "patch": {"parameters": [other], "responses": {"422": {"description": "FastAPI's"}}},
                "get": {"parameters": [{**key, "in": "query"}], "responses": {"200": {"description": "ok"}}},
            },
        }
    }
    paths = declare_statuses(spec)["paths"]
    assert paths["/keyed"]["patch"]["responses"]["422"] == {"$ref": "#/components/responses/IdempotencyKeyReused"}
    assert "422" not in paths["/unkeyed"]["patch"]["responses"]
    assert "422" not in paths["/unkeyed"]["get"]["responses"]


def test_every_idempotent_write_of_the_document_declares_the_keys_reuse(spec):
    keyed = [
        (path, method)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if any(p.get("name") == "Idempotency-Key" for p in op.get("parameters", ()))
    ]
    assert ("/openapi/v3/entity/dataset", "patch") in keyed
    assert all("422" in spec["paths"][path][method]["responses"] for path, method in keyed)
    assert spec["components"]["responses"]["IdempotencyKeyReused"]["content"]
