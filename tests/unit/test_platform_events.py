"""Entity Change Events (app.changelog.entity_change_events) against DataHub's generator semantics."""

import json

import pytest

from app.changelog.entity_change_events import (
    ECE_ENTITY_EXCLUSIONS,
    KEY_ASPECTS,
    PLATFORM_EVENT_KEY_PREFIX,
    SUPPORTED_ASPECTS,
    aspect_changes,
    entity_change_events,
    platform_event,
    platform_event_key,
    schema_field_urn,
)
from app.java_text import java_double as _java_double

DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"
AUDIT = {"time": 1700000000123, "actor": "urn:li:corpuser:jdoe"}
LAST_MODIFIED = {"time": 1700000000000, "actor": "urn:li:corpuser:ingest"}


def ece(aspect_name, previous, current, *, change_type="UPSERT", entity_type="dataset", urn=DATASET, **kw):
    events = entity_change_events(
        entity_type=entity_type,
        urn=urn,
        aspect_name=aspect_name,
        change_type=change_type,
        previous=previous,
        current=current,
        audit=AUDIT,
        **kw,
    )
    for event in events:  # every payload is JSON and carries the common fields
        assert json.loads(json.dumps(event)) == event
        assert event["auditStamp"] == AUDIT
        assert event["version"] == 0
    return events


def brief(events):
    return [(e["category"], e["operation"], e.get("modifier")) for e in events]


def field(path, native="int", **extra):
    kind = "NumberType" if native in ("int", "bigint") else "StringType"
    return {"fieldPath": path, "nativeDataType": native, "type": {"type": {f"com.linkedin.schema.{kind}": {}}}, **extra}


def schema(*fields, **extra):
    return {
        "schemaName": "orders",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.OtherSchema": {"rawSchema": ""}},
        "fields": list(fields),
        **extra,
    }


# ---------------------------------------------------------------------------------------------------------------
# tags, terms


def test_global_tags_add_and_remove_in_tag_urn_order():
    prev = {"tags": [{"tag": "urn:li:tag:pii"}, {"tag": "urn:li:tag:gold"}]}
    cur = {
        "tags": [{"tag": "urn:li:tag:zeta", "context": "ctx"}, {"tag": "urn:li:tag:pii"}, {"tag": "urn:li:tag:alpha"}]
    }
    events = ece("globalTags", prev, cur)
    assert brief(events) == [
        ("TAG", "ADD", "urn:li:tag:alpha"),
        ("TAG", "REMOVE", "urn:li:tag:gold"),
        ("TAG", "ADD", "urn:li:tag:zeta"),
    ]
    assert events[0] == {
        "entityType": "dataset",
        "entityUrn": DATASET,
        "category": "TAG",
        "operation": "ADD",
        "modifier": "urn:li:tag:alpha",
        "parameters": {"tagUrn": "urn:li:tag:alpha", "context": "{}", "sourceDetails": "{}"},
        "auditStamp": AUDIT,
        "version": 0,
    }
    assert events[2]["parameters"]["context"] == "ctx"


def test_tag_attribution_source_detail_is_a_json_string():
    attribution = {
        "time": 1,
        "actor": "urn:li:corpuser:bot",
        "sourceDetail": {"origin": "urn:li:dataset:x", "depth": "1"},
    }
    events = ece(
        "globalTags", None, {"tags": [{"tag": "urn:li:tag:pii", "attribution": attribution}]}, change_type="CREATE"
    )
    assert json.loads(events[0]["parameters"]["sourceDetails"]) == {"origin": "urn:li:dataset:x", "depth": "1"}


def test_deleting_global_tags_removes_every_tag():
    prev = {"tags": [{"tag": "urn:li:tag:b"}, {"tag": "urn:li:tag:a"}]}
    assert brief(ece("globalTags", prev, None, change_type="DELETE")) == [
        ("TAG", "REMOVE", "urn:li:tag:a"),
        ("TAG", "REMOVE", "urn:li:tag:b"),
    ]


def test_glossary_terms_add_remove():
    prev = {"terms": [{"urn": "urn:li:glossaryTerm:Finance.Revenue"}], "auditStamp": LAST_MODIFIED}
    cur = {"terms": [{"urn": "urn:li:glossaryTerm:Classification.PII"}], "auditStamp": LAST_MODIFIED}
    events = ece("glossaryTerms", prev, cur)
    assert brief(events) == [
        ("GLOSSARY_TERM", "ADD", "urn:li:glossaryTerm:Classification.PII"),
        ("GLOSSARY_TERM", "REMOVE", "urn:li:glossaryTerm:Finance.Revenue"),
    ]
    assert events[0]["parameters"] == {
        "termUrn": "urn:li:glossaryTerm:Classification.PII",
        "context": "{}",
        "sourceDetails": "{}",
    }


def test_glossary_terms_audit_stamp_change_only_is_silent():
    prev = {"terms": [{"urn": "urn:li:glossaryTerm:A"}], "auditStamp": LAST_MODIFIED}
    cur = {"terms": [{"urn": "urn:li:glossaryTerm:A"}], "auditStamp": {**LAST_MODIFIED, "time": 2}}
    assert ece("glossaryTerms", prev, cur) == []


# ---------------------------------------------------------------------------------------------------------------
# ownership, domains, deprecation


def test_ownership_add_remove_with_category_ownership():
    prev = {"owners": [{"owner": "urn:li:corpuser:a", "type": "DATAOWNER"}], "lastModified": LAST_MODIFIED}
    cur = {
        "owners": [
            {
                "owner": "urn:li:corpGroup:eng",
                "type": "TECHNICAL_OWNER",
                "typeUrn": "urn:li:ownershipType:__system__technical_owner",
            },
        ],
        "lastModified": LAST_MODIFIED,
    }
    events = ece("ownership", prev, cur)
    assert brief(events) == [("OWNERSHIP", "REMOVE", "urn:li:corpuser:a"), ("OWNERSHIP", "ADD", "urn:li:corpGroup:eng")]
    assert events[0]["parameters"] == {"ownerUrn": "urn:li:corpuser:a", "ownerType": "DATAOWNER", "sourceDetails": "{}"}
    assert events[1]["parameters"] == {
        "ownerUrn": "urn:li:corpGroup:eng",
        "ownerType": "TECHNICAL_OWNER",
        "ownerTypeUrn": "urn:li:ownershipType:__system__technical_owner",
        "sourceDetails": "{}",
    }


def test_owner_type_change_is_remove_then_add():
    prev = {"owners": [{"owner": "urn:li:corpuser:a", "type": "DATAOWNER"}], "lastModified": LAST_MODIFIED}
    cur = {"owners": [{"owner": "urn:li:corpuser:a", "type": "BUSINESS_OWNER"}], "lastModified": LAST_MODIFIED}
    events = ece("ownership", prev, cur)
    assert [(e["operation"], e["parameters"]["ownerType"]) for e in events] == [
        ("REMOVE", "DATAOWNER"),
        ("ADD", "BUSINESS_OWNER"),
    ]


def test_ownership_order_is_deterministic():
    owners = [
        {"owner": f"urn:li:corpuser:u{i}", "type": t} for i, t in enumerate(["DATAOWNER", "NONE", "PRODUCER"] * 3)
    ]
    events = ece("ownership", None, {"owners": list(reversed(owners))}, change_type="CREATE")
    keys = [(e["parameters"]["ownerType"], e["modifier"]) for e in events]
    assert keys == sorted(keys) and len(keys) == 9
    assert events == ece("ownership", None, {"owners": owners}, change_type="CREATE")


def test_domain_set_change_unset():
    d1, d2 = "urn:li:domain:marketing", "urn:li:domain:finance"
    set_ = ece("domains", None, {"domains": [d1]}, change_type="CREATE")
    assert brief(set_) == [("DOMAIN", "ADD", d1)]
    assert set_[0]["parameters"] == {"domainUrn": d1, "context": "{}", "sourceDetails": "{}"}
    assert brief(ece("domains", {"domains": [d1]}, {"domains": [d2]})) == [
        ("DOMAIN", "REMOVE", d1),
        ("DOMAIN", "ADD", d2),
    ]
    assert brief(ece("domains", {"domains": [d2]}, {"domains": []})) == [("DOMAIN", "REMOVE", d2)]
    # only the first domain is compared (SingleDomainChangeEventGenerator)
    assert ece("domains", {"domains": [d1]}, {"domains": [d1, d2]}) == []


def test_domain_context_from_domain_associations():
    d1 = "urn:li:domain:marketing"
    cur = {"domains": [d1], "domainAssociations": [{"domain": d1, "context": '{"propagated":"true"}'}]}
    assert ece("domains", {"domains": []}, cur)[0]["parameters"]["context"] == '{"propagated":"true"}'


def test_deprecation_modify_parameters():
    dep = {
        "deprecated": True,
        "note": "use orders_v2",
        "actor": "urn:li:corpuser:jdoe",
        "decommissionTime": 1735689600000,
    }
    events = ece("deprecation", None, dep, change_type="CREATE")
    assert events == [
        {
            "entityType": "dataset",
            "entityUrn": DATASET,
            "category": "DEPRECATION",
            "operation": "MODIFY",
            "parameters": {"status": "DEPRECATED", "timestamp": "1735689600000", "note": "use orders_v2"},
            "auditStamp": AUDIT,
            "version": 0,
        }
    ]
    undep = {**dep, "deprecated": False}
    assert [e["parameters"] for e in ece("deprecation", dep, undep)] == [{"status": "ACTIVE"}]
    # staying deprecated with another note, or staying active: nothing
    assert ece("deprecation", dep, {**dep, "note": "other"}) == []
    assert ece("deprecation", None, undep, change_type="CREATE") == []


# ---------------------------------------------------------------------------------------------------------------
# documentation


@pytest.mark.parametrize("aspect_name", ["datasetProperties", "editableDatasetProperties"])
def test_description_add_modify_remove(aspect_name):
    base = {"customProperties": {"k": "v"}, "name": "orders"} if aspect_name == "datasetProperties" else {}
    added = ece(aspect_name, base, {**base, "description": "Orders"})
    assert [(e["category"], e["operation"], e["parameters"]) for e in added] == [
        ("DOCUMENTATION", "ADD", {"description": "Orders"})
    ]
    assert "modifier" not in added[0]
    modified = ece(aspect_name, {**base, "description": "Orders"}, {**base, "description": "All orders"})
    assert [(e["operation"], e["parameters"]) for e in modified] == [("MODIFY", {"description": "All orders"})]
    removed = ece(aspect_name, {**base, "description": "Orders"}, base)
    assert [(e["operation"], e["parameters"]) for e in removed] == [("REMOVE", {"description": "Orders"})]


def test_dataset_properties_other_changes_are_silent():
    prev = {"customProperties": {"k": "v"}, "description": "d"}
    assert ece("datasetProperties", prev, {**prev, "customProperties": {"k": "w"}}) == []


def test_documentation_aspect_keyed_by_attribution_source():
    src = "urn:li:dataHubAction:propagation"
    prev = {"documentations": [{"documentation": "manual"}]}
    cur = {
        "documentations": [
            {"documentation": "manual, edited"},
            {"documentation": "propagated", "attribution": {"time": 1, "actor": "urn:li:corpuser:bot", "source": src}},
        ]
    }
    events = ece("documentation", prev, cur)
    assert [(e["operation"], e.get("modifier"), e["parameters"]) for e in events] == [
        ("MODIFY", None, {"documentation": "manual, edited"}),
        ("ADD", src, {"documentation": "propagated"}),
    ]
    assert [(e["operation"], e.get("modifier")) for e in ece("documentation", cur, None, change_type="DELETE")] == [
        ("REMOVE", None),
        ("REMOVE", src),
    ]


# ---------------------------------------------------------------------------------------------------------------
# lifecycle


def test_status_soft_delete_and_reinstate():
    assert brief(ece("status", {"removed": False}, {"removed": True})) == [("LIFECYCLE", "SOFT_DELETE", None)]
    reinstated = ece("status", {"removed": True}, {"removed": False})
    assert brief(reinstated) == [("LIFECYCLE", "REINSTATE", None)]
    assert "parameters" not in reinstated[0] and "modifier" not in reinstated[0]


def test_status_creation():
    assert ece("status", None, {"removed": False}, change_type="CREATE") == []
    assert brief(ece("status", None, {"removed": True}, change_type="CREATE")) == [("LIFECYCLE", "SOFT_DELETE", None)]
    # deleting a removed status reinstates (DataHub: !isRemoved(null) && isRemoved(base))
    assert brief(ece("status", {"removed": True}, None, change_type="DELETE")) == [("LIFECYCLE", "REINSTATE", None)]


def test_status_soft_delete_repeats_on_any_change_while_removed():
    prev = {"removed": True}
    cur = {"removed": True, "lifecycleStage": "urn:li:lifecycleStage:archived"}
    assert brief(ece("status", prev, cur)) == [("LIFECYCLE", "SOFT_DELETE", None)]


def test_key_aspect_create_and_hard_delete():
    key = {"platform": "urn:li:dataPlatform:hive", "name": "db.orders", "origin": "PROD"}
    created = ece("datasetKey", None, key, change_type="UPSERT", is_key_aspect=True)
    assert created == [
        {
            "entityType": "dataset",
            "entityUrn": DATASET,
            "category": "LIFECYCLE",
            "operation": "CREATE",
            "auditStamp": AUDIT,
            "version": 0,
        }
    ]
    assert brief(ece("datasetKey", key, None, change_type="DELETE", is_key_aspect=True)) == [
        ("LIFECYCLE", "HARD_DELETE", None)
    ]
    assert ece("datasetKey", key, {**key, "origin": "DEV"}, is_key_aspect=True) == []


def test_key_aspects_outside_the_hook_list_emit_nothing():
    assert "corpUserKey" not in KEY_ASPECTS
    assert (
        ece("corpUserKey", None, {"username": "a"}, entity_type="corpuser", urn="urn:li:corpuser:a", is_key_aspect=True)
        == []
    )
    tag = ece("tagKey", None, {"name": "pii"}, entity_type="tag", urn="urn:li:tag:pii", is_key_aspect=True)
    assert [(e["entityType"], e["operation"]) for e in tag] == [("tag", "CREATE")]


# ---------------------------------------------------------------------------------------------------------------
# schemaMetadata


def field_urn(path):
    return schema_field_urn(DATASET, path)


def test_schema_field_add_remove():
    # different native types: same type + parent + description would be read as a rename (next tests)
    prev = schema(field("id"), field("old", "string"))
    cur = schema(field("id"), field("zip", "varchar(5)", nullable=True))
    events = ece("schemaMetadata", prev, cur)
    assert brief(events) == [
        ("TECHNICAL_SCHEMA", "REMOVE", field_urn("old")),
        ("TECHNICAL_SCHEMA", "ADD", field_urn("zip")),
    ]
    assert events[1]["entityType"] == "dataset" and events[1]["entityUrn"] == DATASET
    assert events[1]["parameters"] == {
        "fieldPath": "zip",
        "fieldUrn": f"urn:li:schemaField:({DATASET},zip)",
        "nullable": True,
        "modificationCategory": "OTHER",
    }
    assert events[0]["parameters"]["nullable"] is False


def test_schema_first_write_adds_every_field_in_path_order():
    events = ece("schemaMetadata", None, schema(field("b"), field("a", "string")), change_type="CREATE")
    assert [e["parameters"]["fieldPath"] for e in events] == ["a", "b"]
    assert {e["operation"] for e in events} == {"ADD"}


def test_schema_native_type_change_is_modify():
    events = ece("schemaMetadata", schema(field("id", "int")), schema(field("id", "bigint")))
    assert brief(events) == [("TECHNICAL_SCHEMA", "MODIFY", field_urn("id"))]
    assert events[0]["parameters"]["modificationCategory"] == "TYPE_CHANGE"


def test_schema_logical_type_change_alone_is_silent():
    changed = field("id", "int")
    changed["type"] = {"type": {"com.linkedin.schema.StringType": {}}}
    assert ece("schemaMetadata", schema(field("id", "int")), schema(changed)) == []


def test_schema_rename_detected():
    prev = schema(field("id"), field("customer_name", "varchar", description="who"))
    cur = schema(field("id"), field("client_name", "varchar", description="who"))
    events = ece("schemaMetadata", prev, cur)
    assert brief(events) == [("TECHNICAL_SCHEMA", "MODIFY", field_urn("customer_name"))]
    assert events[0]["parameters"]["modificationCategory"] == "RENAME"
    assert events[0]["parameters"]["fieldPath"] == "customer_name"


def test_schema_same_type_without_description_counts_as_rename():
    events = ece(
        "schemaMetadata", schema(field("id"), field("old", "string")), schema(field("id"), field("new", "string"))
    )
    assert [(e["operation"], e["parameters"]["modificationCategory"]) for e in events] == [("MODIFY", "RENAME")]


def test_schema_rename_not_across_parents():
    prev = schema(field("a.x", "string"))
    cur = schema(field("b.y", "string"))
    assert [e["operation"] for e in ece("schemaMetadata", prev, cur)] == ["REMOVE", "ADD"]


def test_schema_field_level_events_are_on_the_schema_field_entity():
    prev = schema(field("id", description="key"), field("email", "string"))
    cur = schema(
        field("id"),
        field(
            "email",
            "string",
            description="contact",
            globalTags={"tags": [{"tag": "urn:li:tag:pii"}]},
            glossaryTerms={"terms": [{"urn": "urn:li:glossaryTerm:Email"}], "auditStamp": LAST_MODIFIED},
        ),
    )
    events = ece("schemaMetadata", prev, cur)
    assert [(e["entityUrn"], e["category"], e["operation"], e.get("modifier")) for e in events] == [
        (field_urn("email"), "DOCUMENTATION", "ADD", None),
        (field_urn("email"), "TAG", "ADD", "urn:li:tag:pii"),
        (field_urn("email"), "GLOSSARY_TERM", "ADD", "urn:li:glossaryTerm:Email"),
        (field_urn("id"), "DOCUMENTATION", "REMOVE", None),
    ]
    assert {e["entityType"] for e in events} == {"schemaField"}
    assert events[0]["parameters"] == {"description": "contact", "fieldPath": "email", "parentUrn": DATASET}
    assert events[1]["parameters"] == {
        "fieldPath": "email",
        "parentUrn": DATASET,
        "tagUrn": "urn:li:tag:pii",
        "context": "{}",
    }
    assert events[2]["parameters"] == {
        "fieldPath": "email",
        "parentUrn": DATASET,
        "termUrn": "urn:li:glossaryTerm:Email",
        "context": "{}",
    }
    assert events[3]["parameters"] == {"description": "key", "fieldPath": "id", "parentUrn": DATASET}
    # the Kafka key follows the event's urn
    assert platform_event_key(events[1]) == PLATFORM_EVENT_KEY_PREFIX + field_urn("email")


def test_schema_primary_key_changes():
    prev = schema(field("id"), field("sku"), primaryKeys=["id"])
    cur = schema(field("id"), field("sku"), primaryKeys=["sku"])
    events = ece("schemaMetadata", prev, cur)
    assert [(e["operation"], e["parameters"]["fieldPath"]) for e in events] == [("MODIFY", "id"), ("MODIFY", "sku")]
    assert {e["parameters"]["modificationCategory"] for e in events} == {"OTHER"}


def test_schema_field_urn_encodes_reserved_characters():
    path = "[version=2.0].[type=struct].addr(1),zip"
    assert schema_field_urn(DATASET, path) == (
        f"urn:li:schemaField:({DATASET},[version=2.0].[type=struct].addr%281%29%2Czip)"
    )


def test_schema_unchanged_fields_with_new_hash_are_silent():
    prev = schema(field("id"), field("b", "string"))
    cur = {**schema(field("b", "string"), field("id")), "hash": "abc"}
    assert ece("schemaMetadata", prev, cur) == []


# ---------------------------------------------------------------------------------------------------------------
# editableSchemaMetadata


def test_editable_schema_metadata_passes_doc_then_tag_then_term():
    prev = {
        "editableSchemaFieldInfo": [
            {"fieldPath": "a", "description": "old a", "globalTags": {"tags": [{"tag": "urn:li:tag:x"}]}},
            {"fieldPath": "gone", "description": "bye"},
        ],
        "created": LAST_MODIFIED,
    }
    cur = {
        "editableSchemaFieldInfo": [
            {
                "fieldPath": "b",
                "description": "new b",
                "glossaryTerms": {"terms": [{"urn": "urn:li:glossaryTerm:T"}], "auditStamp": LAST_MODIFIED},
            },
            {"fieldPath": "a", "description": "new a", "globalTags": {"tags": [{"tag": "urn:li:tag:y"}]}},
        ],
        "created": LAST_MODIFIED,
    }
    events = ece("editableSchemaMetadata", prev, cur)
    assert [(e["entityUrn"], e["category"], e["operation"], e["modifier"]) for e in events] == [
        (field_urn("a"), "DOCUMENTATION", "MODIFY", "a"),
        (field_urn("b"), "DOCUMENTATION", "ADD", "b"),
        (field_urn("gone"), "DOCUMENTATION", "REMOVE", "gone"),
        (field_urn("a"), "TAG", "REMOVE", "urn:li:tag:x"),
        (field_urn("a"), "TAG", "ADD", "urn:li:tag:y"),
        (field_urn("b"), "GLOSSARY_TERM", "ADD", "urn:li:glossaryTerm:T"),
    ]
    assert {e["entityType"] for e in events} == {"schemaField"}
    assert events[0]["parameters"] == {"description": "new a", "fieldPath": "a", "parentUrn": DATASET}
    assert events[2]["parameters"] == {"description": "bye", "fieldPath": "gone", "parentUrn": DATASET}
    assert events[4]["parameters"] == {
        "fieldPath": "a",
        "parentUrn": DATASET,
        "tagUrn": "urn:li:tag:y",
        "context": "{}",
    }


# ---------------------------------------------------------------------------------------------------------------
# structured properties, runs, business attributes


def test_structured_properties_add_modify_remove():
    p1, p2, p3 = (f"urn:li:structuredProperty:io.acryl.p{i}" for i in (1, 2, 3))
    prev = {
        "properties": [{"propertyUrn": p1, "values": [{"string": "a"}]}, {"propertyUrn": p2, "values": [{"double": 1}]}]
    }
    cur = {
        "properties": [
            {"propertyUrn": p2, "values": [{"double": 2.5}, {"double": 1e7}]},
            {"propertyUrn": p3, "values": [{"string": "x"}]},
        ]
    }
    events = ece("structuredProperties", prev, cur)
    assert brief(events) == [
        ("STRUCTURED_PROPERTY", "REMOVE", p1),
        ("STRUCTURED_PROPERTY", "MODIFY", p2),
        ("STRUCTURED_PROPERTY", "ADD", p3),
    ]
    # DataHub quirk: a REMOVE found inside the merge loop carries no parameters
    assert "parameters" not in events[0]
    assert events[1]["parameters"] == {"propertyUrn": p2, "propertyValues": "[2.5,1.0E7]", "sourceDetails": "{}"}
    assert events[2]["parameters"]["propertyValues"] == '["x"]'
    # a trailing REMOVE does carry them
    trailing = ece("structuredProperties", cur, {"properties": [cur["properties"][0]]})
    assert [(e["operation"], e["parameters"]["propertyValues"]) for e in trailing] == [("REMOVE", '["x"]')]


@pytest.mark.parametrize(
    "value, text",
    [
        (1.0, "1.0"),
        (2.5, "2.5"),
        (0.001, "0.001"),
        (1e-4, "1.0E-4"),
        (1e7, "1.0E7"),
        (12345678.9, "1.23456789E7"),
        (-3.0, "-3.0"),
        (0.0, "0.0"),
    ],
)
def test_java_double_formatting(value, text):
    assert _java_double(value) == text


def test_assertion_run_event_completed():
    assertion = "urn:li:assertion:abc"
    run = {
        "timestampMillis": 1,
        "runId": "run-1",
        "asserteeUrn": DATASET,
        "assertionUrn": assertion,
        "status": "COMPLETE",
        "result": {"type": "FAILURE"},
    }
    events = ece("assertionRunEvent", None, run, entity_type="assertion", urn=assertion)
    assert [(e["entityType"], e["category"], e["operation"], e["parameters"]) for e in events] == [
        (
            "assertion",
            "RUN",
            "COMPLETED",
            {"asserteeUrn": DATASET, "assertionResult": "FAILURE", "runId": "run-1", "runResult": "COMPLETE"},
        )
    ]
    assert ece("assertionRunEvent", None, {**run, "status": "RUNNING"}, entity_type="assertion", urn=assertion) == []


def test_data_process_instance_run_event():
    dpi = "urn:li:dataProcessInstance:abc"
    started = ece(
        "dataProcessInstanceRunEvent",
        None,
        {"timestampMillis": 1, "status": "STARTED", "attempt": 1},
        entity_type="dataProcessInstance",
        urn=dpi,
    )
    assert [(e["operation"], e["parameters"]) for e in started] == [("STARTED", {"attempt": 1})]
    done = ece(
        "dataProcessInstanceRunEvent",
        None,
        {
            "timestampMillis": 2,
            "status": "COMPLETE",
            "attempt": 1,
            "result": {"type": "SUCCESS", "nativeResultType": "airflow"},
        },
        entity_type="dataProcessInstance",
        urn=dpi,
    )
    assert [(e["operation"], e["parameters"]) for e in done] == [("COMPLETED", {"attempt": 1, "runResult": "SUCCESS"})]


def test_business_attribute_info_description_removal_quirk():
    ba = "urn:li:businessAttribute:ssn"
    prev = {"fieldPath": "ssn", "name": "ssn", "description": "Social security number"}
    cur = {"fieldPath": "ssn", "name": "ssn", "globalTags": {"tags": [{"tag": "urn:li:tag:pii"}]}}
    events = ece("businessAttributeInfo", prev, cur, entity_type="businessAttribute", urn=ba)
    assert brief(events) == [
        ("DOCUMENTATION", "REMOVE", "ssn"),
        ("DOCUMENTATION", "MODIFY", "ssn"),
        ("TAG", "ADD", "urn:li:tag:pii"),
    ]
    assert "parameters" not in events[0]
    assert ece("businessAttributeInfo", prev, None, change_type="DELETE", entity_type="businessAttribute", urn=ba) == []


def test_business_attributes_on_schema_field_are_excluded():
    sf = field_urn("ssn")
    cur = {"businessAttribute": {"businessAttributeUrn": "urn:li:businessAttribute:ssn"}}
    assert ece("businessAttributes", None, cur, entity_type="schemaField", urn=sf) == []


# ---------------------------------------------------------------------------------------------------------------
# eligibility


def test_no_op_produces_nothing():
    tags = {"tags": [{"tag": "urn:li:tag:pii"}]}
    assert ece("globalTags", tags, {"tags": [{"tag": "urn:li:tag:pii"}]}) == []
    assert ece("status", {"removed": True}, {"removed": True}) == []
    assert ece("globalTags", None, None, change_type="DELETE") == []


@pytest.mark.parametrize("change_type", ["RESTATE", "PATCH", "CREATE_ENTITY", "UPDATE"])
def test_other_change_types_produce_nothing(change_type):
    assert ece("globalTags", None, {"tags": [{"tag": "urn:li:tag:pii"}]}, change_type=change_type) == []


def test_excluded_entity_type():
    assert "schemaField" in ECE_ENTITY_EXCLUSIONS
    sf = field_urn("email")
    assert ece("globalTags", None, {"tags": [{"tag": "urn:li:tag:pii"}]}, entity_type="schemaField", urn=sf) == []


@pytest.mark.parametrize(
    "aspect_name",
    [
        "upstreamLineage",
        "institutionalMemory",
        "glossaryTermInfo",
        "corpGroupKey",
        "containerProperties",
        "editableContainerProperties",
    ],
)
def test_aspects_the_hook_does_not_process(aspect_name):
    assert ece(aspect_name, None, {"description": "x", "elements": []}, change_type="CREATE") == []


def test_delete_change_type_is_eligible_for_any_generator():
    prev = {"domains": ["urn:li:domain:d"]}
    assert brief(ece("domains", prev, None, change_type="DELETE")) == [("DOMAIN", "REMOVE", "urn:li:domain:d")]


def test_inputs_are_not_mutated():
    prev = {"tags": [{"tag": "urn:li:tag:b"}, {"tag": "urn:li:tag:a"}]}
    cur = schema(field("z"), field("a"))
    snapshot = json.dumps([prev, cur])
    ece("globalTags", prev, None, change_type="DELETE")
    ece("schemaMetadata", None, cur, change_type="CREATE")
    assert json.dumps([prev, cur]) == snapshot


# ---------------------------------------------------------------------------------------------------------------
# envelope


def test_platform_event_envelope_and_key():
    [event] = ece("globalTags", None, {"tags": [{"tag": "urn:li:tag:pii"}]}, change_type="CREATE")
    envelope = platform_event(event)
    assert envelope["header"] == {"timestampMillis": AUDIT["time"]}
    assert envelope["name"] == "entityChangeEvent"
    assert envelope["payload"]["contentType"] == "application/json"
    assert isinstance(envelope["payload"]["value"], str)
    assert json.loads(envelope["payload"]["value"]) == event
    assert json.loads(json.dumps(envelope)) == envelope
    assert PLATFORM_EVENT_KEY_PREFIX == "entityChangeEvent-"
    assert platform_event_key(event) == "entityChangeEvent-" + DATASET


def test_envelope_keeps_non_ascii_text():
    [event] = ece("editableDatasetProperties", {}, {"description": "Café ☕"})
    assert "Café ☕" in platform_event(event)["payload"]["value"]


# --- the same differ for the Timeline API: semantic change and description per change -------------------------


def changes(aspect_name, previous, current, urn=DATASET):
    return [
        (c.category, c.operation, c.semver, c.description) for c in aspect_changes(urn, aspect_name, previous, current)
    ]


def test_timeline_changes_carry_datahubs_semantic_change_and_description():
    assert changes("globalTags", None, {"tags": [{"tag": "urn:li:tag:pii"}]}) == [
        ("TAG", "ADD", "MINOR", f"Tag 'pii' added to entity '{DATASET}'."),
    ]
    assert changes(
        "ownership", {"owners": [{"owner": "urn:li:corpuser:jdoe", "type": "DATAOWNER"}]}, {"owners": []}
    ) == [
        ("OWNERSHIP", "REMOVE", "MINOR", f"'jdoe' removed as a `DATAOWNER` of '{DATASET}'."),
    ]
    assert changes("datasetProperties", {"description": "a"}, {"description": "b"}) == [
        ("DOCUMENTATION", "MODIFY", "MINOR", f"Documentation of '{DATASET}' has been changed from 'a' to 'b'."),
    ]


def test_timeline_schema_changes_are_major_when_they_break_readers():
    before = schema(field("id"), field("amount"), field("note", "string"))
    after = schema(field("id", "bigint"), field("note", "string"), field("created", "string"), primaryKeys=["id"])
    got = changes("schemaMetadata", before, after)
    assert (
        "TECHNICAL_SCHEMA",
        "REMOVE",
        "MAJOR",
        "A backwards incompatible change due to removal of field: 'amount'.",
    ) in got
    assert (
        "TECHNICAL_SCHEMA",
        "ADD",
        "MINOR",
        "A forwards & backwards compatible change due to the newly added field 'created'.",
    ) in got
    assert (
        "TECHNICAL_SCHEMA",
        "MODIFY",
        "MAJOR",
        "A backwards incompatible change due to native datatype of the field 'id' changed from 'int' to 'bigint'.",
    ) in got
    assert (
        "TECHNICAL_SCHEMA",
        "MODIFY",
        "MAJOR",
        "A backwards incompatible change due to addition of the primary key field 'id'",
    ) in got


def test_timeline_v2_field_paths_are_shown_downgraded():
    v2 = "[version=2.0].[type=struct].[type=int].total"
    got = changes("schemaMetadata", schema(), schema(field(v2)))
    assert got == [
        (
            "TECHNICAL_SCHEMA",
            "ADD",
            "MINOR",
            "A forwards & backwards compatible change due to the newly added field 'total'.",
        )
    ]


def test_timeline_institutional_memory_is_diffed_but_never_a_platform_event():
    link = {"url": "https://wiki/orders", "description": "runbook", "createStamp": AUDIT}
    edited = {**link, "description": "the runbook"}
    assert changes("institutionalMemory", None, {"elements": [link]}) == [
        (
            "DOCUMENTATION",
            "ADD",
            "MINOR",
            f"Institutional Memory 'https://wiki/orders' with documentation of '{DATASET}' has been added: 'runbook'",
        ),
    ]
    assert [c[:3] for c in changes("institutionalMemory", {"elements": [link]}, {"elements": [edited]})] == [
        ("DOCUMENTATION", "MODIFY", "PATCH"),
    ]
    assert "institutionalMemory" not in SUPPORTED_ASPECTS
    assert ece("institutionalMemory", None, {"elements": [link]}) == []


def test_timeline_and_platform_events_come_from_the_same_changes():
    before = schema(field("id", globalTags={"tags": [{"tag": "urn:li:tag:a"}]}))
    after = schema(field("id", description="the key", globalTags={"tags": [{"tag": "urn:li:tag:b"}]}), field("x"))
    events = ece("schemaMetadata", before, after)
    timeline = aspect_changes(DATASET, "schemaMetadata", before, after)
    assert [
        (e["entityUrn"], e["category"], e["operation"], e.get("modifier"), e.get("parameters")) for e in events
    ] == [tuple(c[:5]) for c in timeline]
