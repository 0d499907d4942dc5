"""Aspect payload validation: the Pegasus JSON wire form, normalization, and precise issues."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from app.registry import AspectValidationError, FieldIssue, load_registry
from app.registry.schema import MISSING, AliasedUnion, Array, Enum, Fixed, Map, Record, Union

REGISTRY_YML = Path(__file__).resolve().parents[2] / "entity_registry.yml"
STAMP = {"time": 1700000000000, "actor": "urn:li:corpuser:jdoe"}
DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"
UPSTREAM = "urn:li:dataset:(urn:li:dataPlatform:kafka,orders_topic,PROD)"


@pytest.fixture(scope="module")
def registry():
    return load_registry(REGISTRY_YML)


@pytest.fixture(scope="module")
def trimming():
    return load_registry(REGISTRY_YML, trim_unknown_fields=True)


def issues_of(registry, entity, aspect, value) -> list[FieldIssue]:
    with pytest.raises(AspectValidationError) as e:
        registry.validate(entity, aspect, value)
    assert e.value.aspect == aspect
    return e.value.issues


def only_issue(registry, entity, aspect, value) -> FieldIssue:
    issues = issues_of(registry, entity, aspect, value)
    assert len(issues) == 1, issues
    return issues[0]


def schema_metadata() -> dict:
    return {
        "schemaName": "db.orders",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "created": STAMP,
        "lastModified": STAMP,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.KafkaSchema": {"documentSchema": "{}", "documentSchemaType": "AVRO"}},
        "fields": [
            {
                "fieldPath": "id",
                "nullable": False,
                "type": {"type": {"com.linkedin.schema.NumberType": {}}},
                "nativeDataType": "bigint",
                "recursive": False,
                "isPartOfKey": True,
            },
            {
                "fieldPath": "customer",
                "type": {"type": {"com.linkedin.schema.StringType": {}}},
                "nativeDataType": "varchar(64)",
                "description": "who ordered",
                "globalTags": {"tags": [{"tag": "urn:li:tag:pii"}]},
                "glossaryTerms": {"terms": [{"urn": "urn:li:glossaryTerm:Customer"}], "auditStamp": STAMP},
            },
            {
                "fieldPath": "items",
                "type": {"type": {"com.linkedin.schema.ArrayType": {"nestedType": ["struct"]}}},
                "nativeDataType": "array<struct<sku:string>>",
            },
            {
                "fieldPath": "attributes",
                "type": {"type": {"com.linkedin.schema.MapType": {"keyType": "string", "valueType": "string"}}},
                "nativeDataType": "map<string,string>",
                "jsonProps": "{}",
            },
            {
                "fieldPath": "status",
                "type": {"type": {"com.linkedin.schema.EnumType": {}}},
                "nativeDataType": "enum",
                "nullable": True,
            },
        ],
        "primaryKeys": ["id"],
        "foreignKeysSpecs": {
            "customer_fk": {
                "foreignKey": {"com.linkedin.schema.UrnForeignKey": {"currentFieldPath": "customer"}},
            }
        },
    }


# -- realistic payloads -------------------------------------------------------------------------------------------
def test_dataset_properties(registry):
    value = {
        "customProperties": {"owner_team": "payments", "retention": "30d"},
        "externalUrl": "https://example.com/orders",
        "name": "orders",
        "qualifiedName": "hive.db.orders",
        "description": "All orders",
        "created": {"time": 1700000000000, "actor": "urn:li:corpuser:jdoe"},
        "tags": [],
    }
    assert registry.validate("dataset", "datasetProperties", value) == value


def test_schema_metadata_with_nested_unions(registry):
    value = schema_metadata()
    out = registry.validate("dataset", "schemaMetadata", value)
    assert out["fields"][2]["type"] == {"type": {"com.linkedin.schema.ArrayType": {"nestedType": ["struct"]}}}
    assert out["platformSchema"] == {
        "com.linkedin.schema.KafkaSchema": {"documentSchema": "{}", "documentSchemaType": "AVRO"}
    }
    assert out["foreignKeysSpecs"]["customer_fk"]["foreignKey"] == {
        "com.linkedin.schema.UrnForeignKey": {"currentFieldPath": "customer"}
    }
    # defaults of SchemaField applied
    assert out["fields"][1]["nullable"] is False
    assert out["fields"][1]["recursive"] is False
    assert out["fields"][1]["isPartOfKey"] is False


def test_ownership_global_tags_upstream_lineage(registry):
    ownership = {
        "owners": [
            {"owner": "urn:li:corpuser:jdoe", "type": "TECHNICAL_OWNER", "source": {"type": "MANUAL"}},
            {"owner": "urn:li:corpGroup:payments", "type": "CUSTOM", "typeUrn": "urn:li:ownershipType:steward"},
        ],
        "ownerTypes": {},
        "lastModified": STAMP,
    }
    assert registry.validate("dataset", "ownership", ownership) == ownership

    tags = {"tags": [{"tag": "urn:li:tag:pii", "context": "auto"}, {"tag": "urn:li:tag:gold"}]}
    assert registry.validate("dataset", "globalTags", tags) == tags

    lineage = {
        "upstreams": [
            {"auditStamp": STAMP, "dataset": UPSTREAM, "type": "TRANSFORMED", "properties": {"job": "etl"}},
        ],
        "fineGrainedLineages": [
            {
                "upstreamType": "FIELD_SET",
                "upstreams": [f"urn:li:schemaField:({UPSTREAM},customer)"],
                "downstreamType": "FIELD",
                "downstreams": [f"urn:li:schemaField:({DATASET},customer)"],
                "transformOperation": "IDENTITY",
                "confidenceScore": 1,
            }
        ],
    }
    out = registry.validate("dataset", "upstreamLineage", lineage)
    assert out["fineGrainedLineages"][0]["confidenceScore"] == 1.0
    assert isinstance(out["fineGrainedLineages"][0]["confidenceScore"], float)


def test_dataset_profile_timeseries(registry):
    value = {
        "timestampMillis": 1700000000000,
        "eventGranularity": {"unit": "DAY"},
        "partitionSpec": {"partition": "FULL_TABLE_SNAPSHOT", "type": "FULL_TABLE"},
        "rowCount": 1200,
        "columnCount": 5,
        "fieldProfiles": [
            {
                "fieldPath": "customer",
                "uniqueCount": 800,
                "uniqueProportion": 0.66,
                "nullCount": 0,
                "nullProportion": 0,
                "sampleValues": ["a", "b"],
                "quantiles": [{"quantile": "0.5", "value": "42"}],
                "histogram": {"boundaries": ["0", "10"], "heights": [0.5, 1]},
            }
        ],
    }
    out = registry.validate("dataset", "datasetProfile", value)
    assert out["eventGranularity"] == {"unit": "DAY", "multiple": 1}  # default applied
    assert out["fieldProfiles"][0]["histogram"]["heights"] == [0.5, 1.0]
    assert out["fieldProfiles"][0]["nullProportion"] == 0.0


def test_unions_with_primitive_enum_and_single_members(registry):
    # StructuredProperties values: union[string, double]
    sp = {
        "properties": [{"propertyUrn": "urn:li:structuredProperty:tier", "values": [{"string": "gold"}, {"double": 2}]}]
    }
    out = registry.validate("dataset", "structuredProperties", sp)
    assert out["properties"][0]["values"] == [{"string": "gold"}, {"double": 2.0}]
    # DataJobInfo.type: union[AzkabanJobType (enum), string]
    for job_type in ({"com.linkedin.datajob.azkaban.AzkabanJobType": "COMMAND"}, {"string": "SQL"}):
        out = registry.validate("dataJob", "dataJobInfo", {"name": "load", "type": job_type})
        assert out == {"customProperties": {}, "name": "load", "type": job_type}
    # ChartInfo.inputs: array of a single-member union -> wrapped as well
    chart = {
        "title": "Revenue",
        "description": "",
        "lastModified": {"created": STAMP, "lastModified": STAMP},
        "inputs": [{"string": DATASET}],
    }
    assert registry.validate("chart", "chartInfo", chart)["inputs"] == [{"string": DATASET}]
    issue = only_issue(registry, "chart", "chartInfo", {**chart, "inputs": [DATASET]})
    assert issue.path == "$.inputs[0]"
    assert issue.message == "union value must be an object with exactly one member key, one of: string"


def test_union_with_aliases(registry):
    cost = registry.aspects["cost"]
    assert cost.validate({"costType": "ORG_COST_TYPE", "cost": {"costCode": "CC-1"}}) == {
        "costType": "ORG_COST_TYPE",
        "cost": {"costCode": "CC-1"},
    }
    assert cost.validate({"costType": "ORG_COST_TYPE", "cost": {"costId": 7}})["cost"] == {"costId": 7.0}
    with pytest.raises(AspectValidationError) as e:
        cost.validate({"costType": "ORG_COST_TYPE", "cost": {"costCode": "x", "fieldDiscriminator": "costCode"}})
    assert e.value.issues[0].path == "$.cost"
    assert "costId, costCode" in e.value.issues[0].message


# -- normalization ------------------------------------------------------------------------------------------------
def test_defaults_are_applied(registry):
    assert registry.validate("dataset", "status", {}) == {"removed": False}
    assert registry.validate("dataset", "datasetProperties", {}) == {"customProperties": {}, "tags": []}
    out = registry.validate("dataset", "ownership", {"owners": []})
    assert out == {"owners": [], "ownerTypes": {}, "lastModified": {"time": 0, "actor": "urn:li:corpuser:unknown"}}
    # an optional field with a non-null default: the default's own optional nulls are dropped
    out = registry.validate("dataset", "datasetUsageStatistics", {"timestampMillis": 1})
    assert out == {"timestampMillis": 1, "partitionSpec": {"partition": "FULL_TABLE_SNAPSHOT", "type": "FULL_TABLE"}}
    assert registry.validate("dataset", "datasetProfile", {"timestampMillis": 1, "eventGranularity": {"unit": "HOUR"}})[
        "eventGranularity"
    ] == {"unit": "HOUR", "multiple": 1}


def test_defaults_are_fresh_objects(registry):
    a = registry.validate("dataset", "datasetProperties", {})
    a["customProperties"]["x"] = "mutated"
    a["tags"].append("t")
    assert registry.validate("dataset", "datasetProperties", {}) == {"customProperties": {}, "tags": []}


def test_explicit_null_for_an_optional_field_is_dropped(registry):
    out = registry.validate("dataset", "datasetProperties", {"name": "orders", "description": None, "created": None})
    assert out == {"customProperties": {}, "name": "orders", "tags": []}
    # an optional field with a default gets its default
    assert registry.validate("dataset", "ownership", {"owners": [], "ownerTypes": None})["ownerTypes"] == {}


def test_output_is_a_new_object_and_the_input_is_untouched(registry):
    value = schema_metadata()
    value["fields"][0]["unknownButTrimmed"] = 1
    before = copy.deepcopy(value)
    trimming = load_registry(REGISTRY_YML, trim_unknown_fields=True)
    out = trimming.validate("dataset", "schemaMetadata", value)
    assert value == before
    assert out is not value and out["fields"] is not value["fields"]
    assert out["fields"][0] is not value["fields"][0]
    assert out["created"] is not value["created"]


def test_output_key_order_is_deterministic(registry):
    value = schema_metadata()
    shuffled = json.loads(json.dumps(value), object_pairs_hook=lambda pairs: dict(reversed(pairs)))
    a = registry.validate("dataset", "schemaMetadata", value)
    b = registry.validate("dataset", "schemaMetadata", shuffled)
    assert json.dumps(a) == json.dumps(b)
    assert list(a) == [k for k in registry.aspects["schemaMetadata"].field_names if k in a]
    props = registry.validate("dataset", "datasetProperties", {"customProperties": {"b": "2", "a": "1", "c": "3"}})
    assert list(props["customProperties"]) == ["a", "b", "c"]


def test_validation_is_idempotent(registry):
    out = registry.validate("dataset", "schemaMetadata", schema_metadata())
    assert registry.validate("dataset", "schemaMetadata", out) == out


# -- issues -------------------------------------------------------------------------------------------------------
def test_type_mismatch(registry):
    value = schema_metadata()
    value["version"] = "abc"
    issue = only_issue(registry, "dataset", "schemaMetadata", value)
    assert issue == FieldIssue("$.version", 'expected long, found string "abc"', "long", 'string "abc"')


@pytest.mark.parametrize(
    "aspect, value, path, message",
    [
        ("status", {"removed": "true"}, "$.removed", 'expected boolean, found string "true"'),
        ("status", {"removed": 1}, "$.removed", "expected boolean, found integer 1"),
        ("datasetProfile", {"timestampMillis": True}, "$.timestampMillis", "expected long, found boolean true"),
        ("datasetProfile", {"timestampMillis": 1.5}, "$.timestampMillis", "expected long, found number 1.5"),
        ("datasetProfile", {"timestampMillis": None}, "$.timestampMillis", "expected long, found null"),
        (
            "datasetProfile",
            {"timestampMillis": 2**63},
            "$.timestampMillis",
            f"expected long, found integer {2**63} (out of 64-bit range)",
        ),
        (
            "datasetUsageStatistics",
            {"timestampMillis": 1, "uniqueUserCount": 2**31},
            "$.uniqueUserCount",
            f"expected int, found integer {2**31} (out of 32-bit range)",
        ),
        (
            "datasetProfile",
            {"timestampMillis": 1, "fieldProfiles": [{"fieldPath": "a", "nullProportion": "x"}]},
            "$.fieldProfiles[0].nullProportion",
            'expected float, found string "x"',
        ),
        (
            "datasetProfile",
            {"timestampMillis": 1, "fieldProfiles": [{"fieldPath": "a", "nullProportion": 1e39}]},
            "$.fieldProfiles[0].nullProportion",
            "expected float, found number 1e+39 (out of range)",
        ),
        (
            "datasetProfile",
            {"timestampMillis": 1, "fieldProfiles": [{"fieldPath": "a", "nullProportion": float("nan")}]},
            "$.fieldProfiles[0].nullProportion",
            "expected float, found number nan (not finite)",
        ),
        ("datasetProperties", {"name": 5}, "$.name", "expected string, found integer 5"),
        ("datasetProperties", {"tags": {"a": 1}}, "$.tags", "expected array, found object"),
        ("datasetProperties", {"customProperties": []}, "$.customProperties", "expected object (map), found array"),
        (
            "datasetProperties",
            {"customProperties": {"a b": 1}},
            '$.customProperties["a b"]',
            "expected string, found integer 1",
        ),
        (
            "datasetProperties",
            {"customProperties": {"ok": "1", "n": None}},
            "$.customProperties.n",
            "expected string, found null",
        ),
        (
            "datasetProperties",
            {"created": "yesterday"},
            "$.created",
            'expected object (record com.linkedin.common.TimeStamp), found string "yesterday"',
        ),
        (
            "globalTags",
            {"tags": [{"tag": "urn:li:tag:a"}, "urn:li:tag:b"]},
            "$.tags[1]",
            'expected object (record com.linkedin.common.TagAssociation), found string "urn:li:tag:b"',
        ),
    ],
)
def test_issue_messages(registry, aspect, value, path, message):
    issue = only_issue(registry, "dataset", aspect, value)
    assert (issue.path, issue.message) == (path, message)


def test_int_and_double_coercion(registry):
    out = registry.validate(
        "dataset",
        "datasetProfile",
        {"timestampMillis": 1, "fieldProfiles": [{"fieldPath": "a", "uniqueProportion": 1}]},
    )
    assert out["fieldProfiles"][0]["uniqueProportion"] == 1.0 and isinstance(
        out["fieldProfiles"][0]["uniqueProportion"], float
    )


def test_unknown_field(registry):
    value = schema_metadata()
    value["fields"][0]["foo"] = 1
    issue = only_issue(registry, "dataset", "schemaMetadata", value)
    assert issue.path == "$.fields[0].foo"
    assert issue.message == 'unknown field "foo" (not in com.linkedin.schema.SchemaField)'
    issue = only_issue(registry, "dataset", "status", {"removed": False, "deleted": True})
    assert (issue.path, issue.message) == ("$.deleted", 'unknown field "deleted" (not in com.linkedin.common.Status)')
    # empty records reject unknown fields too
    value = schema_metadata()
    value["fields"][0]["type"]["type"] = {"com.linkedin.schema.NumberType": {"precision": 3}}
    issue = only_issue(registry, "dataset", "schemaMetadata", value)
    assert issue.path == '$.fields[0].type.type["com.linkedin.schema.NumberType"].precision'
    assert issue.message == 'unknown field "precision" (not in com.linkedin.schema.NumberType)'


def test_missing_required_field(registry):
    value = schema_metadata()
    del value["platform"]
    issue = only_issue(registry, "dataset", "schemaMetadata", value)
    assert (issue.path, issue.message, issue.expected) == ("$.platform", 'missing required field "platform"', "string")
    value = schema_metadata()
    del value["fields"][1]["type"]
    issue = only_issue(registry, "dataset", "schemaMetadata", value)
    assert (issue.path, issue.message) == ("$.fields[1].type", 'missing required field "type"')


def test_enum_symbol(registry):
    issue = only_issue(registry, "dataset", "ownership", {"owners": [{"owner": "urn:li:corpuser:a", "type": "OWNERZ"}]})
    assert issue.path == "$.owners[0].type"
    assert issue.message.startswith(
        '"OWNERZ" is not a symbol of enum com.linkedin.common.OwnershipType '
        "(allowed: CUSTOM, TECHNICAL_OWNER, BUSINESS_OWNER,"
    )
    assert issue.expected == "enum com.linkedin.common.OwnershipType"
    issue = only_issue(registry, "dataset", "ownership", {"owners": [{"owner": "urn:li:corpuser:a", "type": 3}]})
    assert issue.message == "expected enum com.linkedin.common.OwnershipType, found integer 3"


def test_union_shape_and_members(registry):
    value = schema_metadata()
    value["fields"][3]["type"]["type"] = "string"
    issue = only_issue(registry, "dataset", "schemaMetadata", value)
    assert issue.path == "$.fields[3].type.type"
    assert issue.message.startswith(
        "union value must be an object with exactly one member key, one of: com.linkedin.schema.BooleanType, "
        "com.linkedin.schema.FixedType, com.linkedin.schema.StringType,"
    )
    assert issue.found == 'string "string"'

    value["fields"][3]["type"]["type"] = {"com.linkedin.schema.StringType": {}, "com.linkedin.schema.NumberType": {}}
    issue = only_issue(registry, "dataset", "schemaMetadata", value)
    assert issue.found == "object with 2 keys"

    value["fields"][3]["type"]["type"] = {"com.linkedin.pegasus2avro.schema.StringType": {}}
    issue = only_issue(registry, "dataset", "schemaMetadata", value)
    assert issue.message.startswith(
        '"com.linkedin.pegasus2avro.schema.StringType" is not a member of the union (members: '
    )

    # errors inside a member carry the member key in the path
    value["fields"][3]["type"]["type"] = {"com.linkedin.schema.ArrayType": {"nestedType": [1]}}
    issue = only_issue(registry, "dataset", "schemaMetadata", value)
    assert issue.path == '$.fields[3].type.type["com.linkedin.schema.ArrayType"].nestedType[0]'


def test_urn_fields(registry):
    issue = only_issue(registry, "dataset", "ownership", {"owners": [{"owner": "jdoe", "type": "CUSTOM"}]})
    assert issue.path == "$.owners[0].owner"
    assert issue.message.startswith('invalid urn "jdoe": ')
    # typed URNs (TagUrn, DatasetUrn, ...) must be of their entity type
    issue = only_issue(registry, "dataset", "globalTags", {"tags": [{"tag": "urn:li:corpuser:jdoe"}]})
    assert (issue.path, issue.message) == (
        "$.tags[0].tag",
        'expected a urn of entity type tag, found "urn:li:corpuser:jdoe"',
    )
    # URN annotations on arrays apply to the items
    lineage = {
        "upstreams": [],
        "fineGrainedLineages": [{"upstreamType": "NONE", "downstreamType": "FIELD", "downstreams": ["oops"]}],
    }
    issue = only_issue(registry, "dataset", "upstreamLineage", lineage)
    assert issue.path == "$.fineGrainedLineages[0].downstreams[0]"
    # nested URNs are fine; a valid URN stays valid on repeated use (cache)
    for _ in range(2):
        registry.validate("dataset", "upstreamLineage", {"upstreams": [{"dataset": UPSTREAM, "type": "COPY"}]})
    issue = only_issue(
        registry, "dataset", "upstreamLineage", {"upstreams": [{"dataset": "urn:li:chart:(a,b)", "type": "COPY"}]}
    )
    assert issue.message == 'expected a urn of entity type dataset, found "urn:li:chart:(a,b)"'


def test_strict_urns_controls_reserved_characters(registry):
    value = {"owners": [{"owner": "urn:li:corpuser:a,b", "type": "CUSTOM"}]}
    issue = only_issue(registry, "dataset", "ownership", value)
    assert issue.path == "$.owners[0].owner" and "comma" in issue.message
    lenient = load_registry(REGISTRY_YML, strict_urns=False)
    assert lenient.validate("dataset", "ownership", value)["owners"][0]["owner"] == "urn:li:corpuser:a,b"
    with pytest.raises(AspectValidationError):
        lenient.validate("dataset", "ownership", {"owners": [{"owner": "nope", "type": "CUSTOM"}]})


def test_top_level_must_be_an_object(registry):
    for value, found in ([], "array"), ("x", 'string "x"'), (None, "null"):
        issue = only_issue(registry, "dataset", "status", value)
        assert issue == FieldIssue(
            "$",
            f"expected object (record com.linkedin.common.Status), found {found}",
            "object (record com.linkedin.common.Status)",
            found,
        )


def test_all_issues_are_collected_in_one_pass(registry):
    value = schema_metadata()
    value["version"] = "1"
    del value["hash"]
    value["fields"][0]["nullable"] = "no"
    value["fields"][1]["globalTags"]["tags"][0]["tag"] = "urn:li:dataset:x"
    value["fields"][4]["bogus"] = True
    issues = issues_of(registry, "dataset", "schemaMetadata", value)
    assert [i.path for i in issues] == [
        "$.version",
        "$.hash",
        "$.fields[0].nullable",
        "$.fields[1].globalTags.tags[0].tag",
        "$.fields[4].bogus",
    ]


def test_issues_are_capped(registry):
    value = {"tags": [{"tag": i} for i in range(500)]}
    with pytest.raises(AspectValidationError) as e:
        registry.validate("dataset", "globalTags", value)
    assert len(e.value.issues) == 50 and e.value.truncated
    assert e.value.issues[49].path == "$.tags[49].tag"
    assert "50+ issues" in str(e.value)


def test_error_message_summarizes_issues(registry):
    with pytest.raises(AspectValidationError) as e:
        registry.validate("dataset", "status", {"removed": "x"})
    assert str(e.value) == 'invalid value for aspect status (1 issue): $.removed: expected boolean, found string "x"'
    assert e.value.issues[0].to_json() == {
        "path": "$.removed",
        "message": 'expected boolean, found string "x"',
        "expected": "boolean",
        "found": 'string "x"',
    }


def test_recursive_schemas_and_too_deep_input(tmp_path):
    node = {
        "type": "record",
        "name": "Node",
        "namespace": "com.example",
        "Aspect": {"name": "tree"},
        "fields": [
            {"name": "label", "type": "string"},
            {"name": "children", "type": {"type": "array", "items": "com.example.Node"}, "default": []},
        ],
    }
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "Node.avsc").write_text(json.dumps(node))
    (tmp_path / "r.yml").write_text("modelSources: [{path: models}]\n")
    tree = load_registry(tmp_path / "r.yml").aspects["tree"]
    assert tree.validate({"label": "a", "children": [{"label": "b"}]}) == {
        "label": "a",
        "children": [{"label": "b", "children": []}],
    }
    with pytest.raises(AspectValidationError) as e:
        tree.validate({"label": "a", "children": [{"label": "b", "children": [{"label": 3}]}]})
    assert e.value.issues[0].path == "$.children[0].children[0].label"
    deep: dict = {"label": "root"}
    cur = deep
    for _ in range(5000):
        cur["children"] = [{"label": "x"}]
        cur = cur["children"][0]
    with pytest.raises(AspectValidationError) as e:
        tree.validate(deep)
    assert e.value.issues[-1].message == "value is nested too deeply"


def test_custom_schema_shapes(tmp_path):
    doc = {
        "type": "record",
        "name": "Gadget",
        "namespace": "com.example.pegasus2avro.gadget",
        "Aspect": {"name": "gadget"},
        "fields": [
            {"name": "choice", "type": ["null", "string", "double"], "default": None},
            {"name": "feature", "type": ["null", "string"], "default": None, "java": {"class": "x.urn.MLFeatureUrn"}},
            {"name": "blob", "type": "bytes", "default": ""},
            {"name": "digest", "type": {"type": "fixed", "name": "MD5", "size": 4}},
            {"name": "maybe", "type": {"type": "array", "items": ["null", "int"]}, "default": []},
            {"name": "shape", "type": ["Circle", {"type": "record", "name": "Dot", "fields": []}], "default": {"r": 1}},
            {"name": "level", "type": {"type": "enum", "name": "Level", "symbols": ["LOW", "HIGH"]}, "default": "LOW"},
            {
                "name": "parts",
                "type": {
                    "type": "map",
                    "values": {"type": "record", "name": "Part", "fields": [{"name": "n", "type": "int"}]},
                },
                "default": {},
            },
        ],
    }
    circle = {
        "type": "record",
        "name": "Circle",
        "namespace": "com.example.pegasus2avro.gadget",
        "fields": [{"name": "r", "type": "double"}],
    }
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "Gadget.avsc").write_text(json.dumps(doc))
    (tmp_path / "models" / "Circle.avsc").write_text(json.dumps(circle))  # a shared type in its own file
    (tmp_path / "r.yml").write_text("modelSources: [{path: models}]\n")
    gadget = load_registry(tmp_path / "r.yml").aspects["gadget"]
    assert gadget.record_name == "com.example.gadget.Gadget"

    out = gadget.validate({"digest": "abcd"})
    # the Avro default of a union is its first branch, unwrapped: it comes out in the wire form
    assert out == {
        "blob": "",
        "digest": "abcd",
        "maybe": [],
        "shape": {"com.example.gadget.Circle": {"r": 1.0}},
        "level": "LOW",
        "parts": {},
    }
    # optional multi-branch union: absent, null (dropped) or wrapped
    assert "choice" not in gadget.validate({"digest": "abcd", "choice": None})
    assert gadget.validate({"digest": "abcd", "choice": {"double": 1}})["choice"] == {"double": 1.0}
    assert gadget.validate({"digest": "abcd", "choice": {"string": "x"}})["choice"] == {"string": "x"}
    # a union with a null member outside a field: null is a value
    assert gadget.validate({"digest": "abcd", "maybe": [None, {"int": 3}]})["maybe"] == [None, {"int": 3}]
    assert gadget.validate({"digest": "abcd", "blob": "\u00e9\u00ff"})["blob"] == "\u00e9\u00ff"
    assert gadget.validate({"digest": "abcd", "shape": {"com.example.gadget.Dot": {}}})["shape"] == {
        "com.example.gadget.Dot": {}
    }

    def issue(value):
        with pytest.raises(AspectValidationError) as e:
            gadget.validate({"digest": "abcd", **value})
        assert len(e.value.issues) == 1, e.value.issues
        return e.value.issues[0].path, e.value.issues[0].message

    # a java.class ending in Urn makes a URN field, typed by the class name
    feature = "urn:li:mlFeature:(ns,f)"
    assert gadget.validate({"digest": "abcd", "feature": feature})["feature"] == feature
    assert issue({"feature": "urn:li:dataset:x"}) == (
        "$.feature",
        'expected a urn of entity type mlFeature, found "urn:li:dataset:x"',
    )
    assert issue({"feature": "f"})[1].startswith('invalid urn "f": ')
    assert issue({"choice": "x"}) == (
        "$.choice",
        "union value must be an object with exactly one member key, one of: string, double",
    )
    assert issue({"digest": "abc"}) == (
        "$.digest",
        'expected fixed com.example.gadget.MD5 (4 bytes), found string "abc" of length 3',
    )
    assert issue({"blob": "\u20ac"})[0] == "$.blob"
    assert issue({"maybe": [{"long": 1}]}) == ("$.maybe[0]", '"long" is not a member of the union (members: int)')
    assert issue({"level": "MID"}) == (
        "$.level",
        '"MID" is not a symbol of enum com.example.gadget.Level (allowed: LOW, HIGH)',
    )
    assert issue({"parts": {"p1": {"n": 1}, "p2": {}}}) == ("$.parts.p2.n", 'missing required field "n"')
    assert issue({"parts": {"p1": {"n": 1.0}}}) == ("$.parts.p1.n", "expected int, found number 1.0")


# -- trimming ---------------------------------------------------------------------------------------------------
def test_trim_mode_drops_unknown_fields_silently(trimming):
    value = schema_metadata()
    value["extra"] = {"anything": [1, 2]}
    value["fields"][0]["foo"] = 1
    value["fields"][0]["type"]["type"] = {"com.linkedin.schema.NumberType": {"precision": 3}}
    out = trimming.validate("dataset", "schemaMetadata", value)
    assert "extra" not in out and "foo" not in out["fields"][0]
    assert out["fields"][0]["type"] == {"type": {"com.linkedin.schema.NumberType": {}}}
    # ... but still reports everything else
    value["version"] = "x"
    with pytest.raises(AspectValidationError) as e:
        trimming.validate("dataset", "schemaMetadata", value)
    assert [i.path for i in e.value.issues] == ["$.version"]
    # optional nulls and defaults behave the same as without trimming
    assert trimming.validate("dataset", "datasetProperties", {"name": None, "x": 1}) == {
        "customProperties": {},
        "tags": [],
    }


# -- every aspect of the default set ------------------------------------------------------------------------------
def _sample(t, *, full: bool, urn: str | None = None, depth: int = 0) -> Any:
    if isinstance(t, Record):
        out = {}
        for f in t.fields:
            required = not f.optional and f.default is MISSING
            if required or (full and depth < 4):
                out[f.name] = _sample(f.type, full=full, urn=f.urn_entity, depth=depth + 1)
        return out
    if isinstance(t, (Union, AliasedUnion)):
        key, member = t.members[0]
        return {key: _sample(member, full=full, depth=depth + 1)}
    if isinstance(t, Array):
        return [_sample(t.items, full=full, urn=urn, depth=depth + 1)] if full and depth < 4 else []
    if isinstance(t, Map):
        return {"k": _sample(t.values, full=full, depth=depth + 1)} if full and depth < 4 else {}
    if isinstance(t, Enum):
        return t.symbols[-1]
    if isinstance(t, Fixed):
        return "x" * t.size
    kind = t.kind
    if kind == "string":
        if urn is not None:
            return f"urn:li:{urn or 'corpuser'}:sample"
        return "text"
    return {"boolean": True, "int": 7, "long": 2**40, "float": 0.5, "double": 2.5, "bytes": "\u00ff", "null": None}[
        kind
    ]


def test_every_aspect_accepts_minimal_and_full_values(registry):
    assert len(registry.aspects) >= 270
    for name, spec in registry.aspects.items():
        for full in (False, True):
            value = _sample(spec.type, full=full)
            try:
                out = spec.validate(value)
            except AspectValidationError as e:  # pragma: no cover - diagnostic
                pytest.fail(f"{name} (full={full}): {e}")
            assert spec.validate(out) == out, name
            assert json.loads(json.dumps(out)) == out
