"""The index model: change logs -> index changes (app.search.documents)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from app.registry import load_registry
from app.search import documents as d
from app.search import elastic_mappings as em
from app.search.model import (
    DOWNSTREAM_LINEAGE,
    AspectEdges,
    AspectFields,
    Edge,
    EntityRemoval,
    TimeseriesPoint,
    upstream_downstream,
)

ROOT = Path(__file__).resolve().parents[2]
U = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"
RAW = "urn:li:dataset:(urn:li:dataPlatform:hive,db.raw,PROD)"


@pytest.fixture(scope="module")
def registry():
    return load_registry(ROOT / "entity_registry.yml")


def mcl(aspect, value, version=1, change_type="UPSERT", urn=U, entity="dataset", **extra):
    m = {
        "entityType": entity,
        "entityUrn": urn,
        "changeType": change_type,
        "aspectName": aspect,
        "systemMetadata": {"version": str(version), "runId": "no-run-id-provided", "lastObserved": 1},
        "created": {"time": 1700000000000, "actor": "urn:li:corpuser:datahub"},
        "headers": {},
    }
    if value is not None:
        m["aspect"] = {"value": json.dumps(value), "contentType": "application/json"}
    m.update(extra)
    return m


def one(changes, kind):
    got = [c for c in changes if isinstance(c, kind)]
    assert len(got) == 1, changes
    return got[0]


def test_dataset_key_fields(registry):
    changes = d.changes_from_mcl(
        mcl("datasetKey", {"platform": "urn:li:dataPlatform:hive", "name": "db.orders", "origin": "PROD"}), registry
    )
    f = one(changes, AspectFields)
    assert f.fields == {"id": "db.orders", "origin": "PROD", "platform": "urn:li:dataPlatform:hive", "urn": U}
    assert f.version == 1 and not f.deleted


def test_dataset_properties(registry):
    value = {
        "name": "orders",
        "description": "All orders",
        "customProperties": {"owner_team": "sales", "tier": "gold"},
        "created": {"time": 1690000000000},
    }
    [f] = d.changes_from_mcl(mcl("datasetProperties", value, version=3), registry)
    assert f.aspect == "datasetProperties" and f.version == 3
    assert f.fields["name"] == "orders"
    assert f.fields["description"] == "All orders"
    assert f.fields["hasDescription"] is True
    assert f.fields["createdAt"] == 1690000000000
    assert sorted(f.fields["customProperties"]) == ["owner_team=sales", "tier=gold"]
    assert "qualifiedName" not in f.fields


def test_schema_metadata_field_paths_and_field_tags(registry):
    value = {
        "schemaName": "orders",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.MySqlDDL": {"tableSchema": ""}},
        "fields": [
            {
                "fieldPath": "id",
                "nativeDataType": "int",
                "type": {"type": {"com.linkedin.schema.NumberType": {}}},
                "description": "primary key",
                "globalTags": {"tags": [{"tag": "urn:li:tag:pii"}]},
            },
            {
                "fieldPath": "amount",
                "nativeDataType": "double",
                "type": {"type": {"com.linkedin.schema.NumberType": {}}},
            },
        ],
    }
    changes = d.changes_from_mcl(mcl("schemaMetadata", value), registry)
    f = one(changes, AspectFields)
    assert f.fields["fieldPaths"] == ["id", "amount"]
    assert f.fields["fieldDescriptions"] == ["primary key"]
    # SchemaField.globalTags overrides GlobalTags' own annotation (Pegasus path override, outermost wins)
    assert f.fields["fieldTags"] == ["urn:li:tag:pii"]
    assert "tags" not in f.fields
    e = one(changes, AspectEdges)
    assert [(x.destination, x.relationship, x.destination_type) for x in e.edges] == [
        ("urn:li:tag:pii", "SchemaFieldTaggedWith", "tag")
    ]


def test_global_tags(registry):
    value = {"tags": [{"tag": "urn:li:tag:pii"}, {"tag": "urn:li:tag:gold"}]}
    changes = d.changes_from_mcl(mcl("globalTags", value, version=2), registry)
    f = one(changes, AspectFields)
    assert f.fields["tags"] == ["urn:li:tag:pii", "urn:li:tag:gold"]
    assert f.fields["hasTags"] is True
    e = one(changes, AspectEdges)
    assert e.version == 2
    assert {(x.destination, x.relationship) for x in e.edges} == {
        ("urn:li:tag:pii", "TaggedWith"),
        ("urn:li:tag:gold", "TaggedWith"),
    }
    # none left: the complete (empty) set replaces the previous one
    changes = d.changes_from_mcl(mcl("globalTags", {"tags": []}, version=3), registry)
    assert one(changes, AspectEdges).edges == ()
    assert one(changes, AspectFields).fields.get("hasTags") is False


def test_ownership(registry):
    value = {
        "owners": [
            {"owner": "urn:li:corpuser:alice", "type": "TECHNICAL_OWNER"},
            {"owner": "urn:li:corpGroup:data", "type": "BUSINESS_OWNER"},
        ],
        "lastModified": {"time": 0, "actor": "urn:li:corpuser:unknown"},
    }
    changes = d.changes_from_mcl(mcl("ownership", value), registry)
    f = one(changes, AspectFields)
    assert f.fields["owners"] == ["urn:li:corpuser:alice", "urn:li:corpGroup:data"]
    assert f.fields["hasOwners"] is True
    e = one(changes, AspectEdges)
    assert [(x.destination, x.relationship, x.destination_type, x.is_lineage) for x in e.edges] == [
        ("urn:li:corpuser:alice", "OwnedBy", "corpuser", False),
        ("urn:li:corpGroup:data", "OwnedBy", "corpGroup", False),
    ]


def test_upstream_lineage_edges(registry):
    value = {
        "upstreams": [
            {
                "dataset": RAW,
                "type": "TRANSFORMED",
                "auditStamp": {"time": 1700000000002, "actor": "urn:li:corpuser:etl"},
                "created": {"time": 1700000000001, "actor": "urn:li:corpuser:creator"},
                "properties": {"source": "sql"},
                "query": "urn:li:query:abc",
            },
            {
                "dataset": "urn:li:dataset:(urn:li:dataPlatform:hive,db.dim,PROD)",
                "type": "COPY",
                "auditStamp": {"time": 0, "actor": "urn:li:corpuser:unknown"},
            },
        ]
    }
    changes = d.changes_from_mcl(mcl("upstreamLineage", value, version=4), registry)
    f = one(changes, AspectFields)
    assert f.fields["upstreams"] == [RAW, "urn:li:dataset:(urn:li:dataPlatform:hive,db.dim,PROD)"]
    assert f.fields["hasUpstreams"] is True
    e = one(changes, AspectEdges)
    assert e.source == U and e.aspect == "upstreamLineage" and e.version == 4
    first, second = e.edges
    assert first.relationship == "DownstreamOf" and first.is_lineage
    assert (first.source, first.destination, first.source_type, first.destination_type) == (
        U,
        RAW,
        "dataset",
        "dataset",
    )
    assert (first.created_on, first.created_actor) == (1700000000001, "urn:li:corpuser:creator")
    assert (first.updated_on, first.updated_actor) == (1700000000002, "urn:li:corpuser:etl")
    assert first.properties == {"source": "sql"} and first.via == "urn:li:query:abc"
    # fields of the second element come from the second element only
    assert second.created_on is None and second.via is None and second.updated_on == 0 and second.properties == {}


def test_container(registry):
    changes = d.changes_from_mcl(mcl("container", {"container": "urn:li:container:abc"}), registry)
    assert one(changes, AspectFields).fields == {"container": "urn:li:container:abc", "hasContainer": True}
    [edge] = one(changes, AspectEdges).edges
    assert (edge.relationship, edge.destination, edge.destination_type) == (
        "IsPartOf",
        "urn:li:container:abc",
        "container",
    )


def test_data_job_input_output(registry):
    job = "urn:li:dataJob:(urn:li:dataFlow:(airflow,dag,prod),task)"
    value = {"inputDatasets": [RAW], "outputDatasets": [U], "inputDatajobs": []}
    changes = d.changes_from_mcl(mcl("dataJobInputOutput", value, urn=job, entity="dataJob"), registry)
    f = one(changes, AspectFields)
    assert f.fields["inputs"] == [RAW] and f.fields["outputs"] == [U]
    assert f.fields["numInputDatasets"] == 1 and f.fields["numOutputDatasets"] == 1
    e = one(changes, AspectEdges)
    assert {(x.relationship, x.destination, x.source_type, x.is_lineage) for x in e.edges} == {
        ("Consumes", RAW, "dataJob", True),
        ("Produces", U, "dataJob", True),
    }


def test_downstream_lineage_is_what_the_relationship_annotations_say(registry):
    # every lineage relationship of the model points upstream unless its annotation says `isUpstream: false`; the
    # backends and the lineage scroll go by the relationship's name, so no name may be declared both ways
    upstream: set[str] = set()
    downstream: set[str] = set()
    for aspect in registry.aspects.values():
        for by_name in d._effective_annotations(aspect).values():
            r = by_name.get("Relationship")
            if isinstance(r, dict) and r.get("name") and d._bool(r.get("isLineage"), False):
                (upstream if d._bool(r.get("isUpstream"), True) else downstream).add(r["name"])
    assert {"Produces", "DataProcessInstanceProduces"} <= downstream and {"DownstreamOf", "Consumes"} <= upstream
    assert DOWNSTREAM_LINEAGE == downstream
    assert not upstream & downstream


def test_upstream_downstream_ends_of_lineage_edges():
    job, instance = "urn:li:dataJob:(urn:li:dataFlow:(airflow,dag,prod),task)", "urn:li:dataProcessInstance:run1"
    assert upstream_downstream(Edge(U, RAW, "DownstreamOf", "dataset", "dataset", is_lineage=True)) == (RAW, U)
    assert upstream_downstream(Edge(job, RAW, "Consumes", "dataJob", "dataset", is_lineage=True)) == (RAW, job)
    assert upstream_downstream(Edge(job, U, "Produces", "dataJob", "dataset", is_lineage=True)) == (job, U)
    assert upstream_downstream(
        Edge(instance, U, "DataProcessInstanceProduces", "dataProcessInstance", "dataset", is_lineage=True)
    ) == (instance, U)


def test_status_removed(registry):
    [f] = d.changes_from_mcl(mcl("status", {"removed": True}, version=2), registry)
    assert f.fields == {"removed": True} and f.version == 2


def test_aspect_delete_uses_previous_version(registry):
    m = mcl(
        "globalTags",
        None,
        version=5,
        change_type="DELETE",
        previousAspectValue={
            "value": json.dumps({"tags": [{"tag": "urn:li:tag:pii"}]}),
            "contentType": "application/json",
        },
        previousSystemMetadata={"version": "5", "runId": "x"},
    )
    changes = d.changes_from_mcl(m, registry)
    f = one(changes, AspectFields)
    assert f.deleted and f.fields == {} and f.version == 5
    e = one(changes, AspectEdges)
    assert e.edges == () and e.version == 5


def test_delete_without_relationships_has_no_edges(registry):
    changes = d.changes_from_mcl(
        mcl("datasetProperties", None, change_type="DELETE", previousSystemMetadata={"version": "2"}), registry
    )
    assert changes == [AspectFields("dataset", U, "datasetProperties", 2, {}, deleted=True)]


def test_key_delete_removes_entity(registry):
    m = mcl("datasetKey", None, change_type="DELETE", previousSystemMetadata={"version": "1"})
    assert d.changes_from_mcl(m, registry) == [EntityRemoval("dataset", U, 1, "datasetKey")]  # the key aspect named


def test_timeseries_profile(registry):
    value = {
        "timestampMillis": 1700000000000,
        "eventGranularity": {"unit": "DAY", "multiple": 1},
        "partitionSpec": {"partition": "FULL_TABLE_SNAPSHOT", "type": "FULL_TABLE"},
        "rowCount": 1000,
        "columnCount": 4,
    }
    m = mcl("datasetProfile", value)
    m["systemMetadata"] = {"runId": "run-1", "lastObserved": 1}
    changes = d.changes_from_mcl(m, registry)
    p = one(changes, TimeseriesPoint)
    assert p.urn == U and p.entity_type == "dataset" and p.timestamp_ms == 1700000000000
    assert p.value == value
    assert p.fields["timestampMillis"] == 1700000000000
    assert p.fields["partition"] == "FULL_TABLE_SNAPSHOT"
    assert p.fields["partitionSpec"] == {"partition": "FULL_TABLE_SNAPSHOT"}
    assert p.fields["eventGranularity"] == '{"unit":"DAY","multiple":1}'
    assert p.fields["runId"] == "run-1"
    # DataHub's recipe (TimeseriesAspectTransformer.getDocId), md5 by default
    raw = '1700000000000"{\\"unit\\":\\"DAY\\",\\"multiple\\":1}""' + U + '"{"partition":"FULL_TABLE_SNAPSHOT"}'
    assert p.doc_id == hashlib.md5(raw.encode()).hexdigest()
    assert p.doc_id == d.timeseries_doc_id(U, value)
    # a re-sent point (new run, other metrics) overwrites the same document
    again = dict(value, rowCount=1001)
    p2 = one(d.changes_from_mcl(mcl("datasetProfile", again), registry), TimeseriesPoint)
    assert p2.doc_id == p.doc_id
    # another time or partition is another document
    assert d.timeseries_doc_id(U, dict(value, timestampMillis=1700000000001)) != p.doc_id
    assert d.timeseries_doc_id(U, dict(value, messageId="m1")) != p.doc_id
    # the latest profile's Searchable fields feed the entity document, versioned by timestamp
    f = one(changes, AspectFields)
    assert f.version == 1700000000000 and f.fields["rowCount"] == 1000 and f.fields["hasRowCount"] is True


def test_timeseries_doc_id_minimal(registry):
    raw = '5"' + U + '"'
    assert d.timeseries_doc_id(U, {"timestampMillis": 5}) == hashlib.md5(raw.encode()).hexdigest()


def test_nothing_to_index(registry):
    assert d.changes_from_mcl(mcl("noSuchAspect", {"a": 1}), registry) == []
    assert d.changes_from_mcl(mcl("status", {"removed": True}, entity="noSuchEntity"), registry) == []
    # aspect not of this entity
    assert d.changes_from_mcl(mcl("dataJobInputOutput", {"inputDatasets": []}), registry) == []


def test_search_fields_and_filters(registry):
    specs = {s.name: s for s in d.search_fields(registry, "dataset")}
    assert specs["name"].field_type == "WORD_GRAM" and specs["name"].boost == 10.0 and specs["name"].autocomplete
    assert specs["id"].aspect == "datasetKey"
    assert specs["description"].field_type == "TEXT" and specs["description"].query_by_default
    assert specs["owners"].query_by_default is False
    assert specs["removed"].field_type == "BOOLEAN"
    assert specs["tags"].has_values_field == "hasTags"
    filters = d.filter_fields(registry, "dataset")
    assert {"platform", "tags", "owners", "container", "glossaryTerms", "origin"} <= set(filters)
    assert filters["tags"].filter_name == "Tagged With"
    assert d.search_fields(registry, "dataset") == d.search_fields(registry, "dataset")


def test_index_mapping_shapes(registry):
    m = em.index_mapping(registry, "dataset")["properties"]
    assert m["urn"] == {"type": "keyword"}
    assert m["removed"] == {"type": "boolean"}
    assert m["aspectVersions"]["type"] == "object"
    assert m["name"]["type"] == "text" and m["name"]["fields"]["keyword"]["type"] == "keyword"
    assert "ngram" in m["name"]["fields"]  # autocomplete
    assert m["tags"]["type"] == "keyword"
    assert m["hasTags"] == {"type": "boolean"}
    assert m["createdAt"] == {"type": "date", "format": "epoch_millis"}
    assert m["rowCount"] == {"type": "long"}
    assert m["externalUrl"]["type"] == "keyword"
    for name, spec in m.items():
        assert "type" in spec, name


def test_timeseries_mapping_and_names(registry):
    m = em.timeseries_mapping(registry, "datasetUsageStatistics")["properties"]
    assert m["timestampMillis"]["type"] == "date"
    assert m["urn"] == {"type": "keyword"}
    assert m["uniqueUserCount"] == {"type": "long"}
    assert em.index_name("", "dataset") == "datasetindex_v2"
    assert em.index_name("p_", "dataJob") == "p_datajobindex_v2"
    assert em.timeseries_index_name("", "dataset", "datasetProfile") == "dataset_datasetprofileaspect_v1"


# DataHub's SearchableAnnotation.FieldType values, and the Elasticsearch types the mappings use
FIELD_TYPES = {
    "KEYWORD",
    "TEXT",
    "TEXT_PARTIAL",
    "BROWSE_PATH",
    "URN",
    "URN_PARTIAL",
    "BOOLEAN",
    "COUNT",
    "DATETIME",
    "OBJECT",
    "BROWSE_PATH_V2",
    "WORD_GRAM",
    "DOUBLE",
    "MAP_ARRAY",
}
ES_TYPES = {"keyword", "text", "boolean", "long", "double", "date", "object"}


def declares_searchable(schema) -> bool:
    """Whether an aspect's raw schema carries a `Searchable` annotation anywhere."""
    if isinstance(schema, dict):
        return "Searchable" in schema or any(declares_searchable(v) for v in schema.values())
    return isinstance(schema, list) and any(declares_searchable(v) for v in schema)


def test_every_aspect_compiles(registry):
    """Every entity's aspects compile into search fields of DataHub's field types, each mapped in the entity's
    index; an entity has fields exactly when one of its aspects is annotated `Searchable`; every timeseries aspect's
    fields are mapped in its index."""
    for entity in registry.entities:
        spec = registry.entity(entity)
        fields = d.search_fields(registry, entity)
        annotated = any(declares_searchable(registry.aspect(entity, a).schema) for a in spec.aspect_names)
        assert bool(fields) == annotated, entity
        mapping = em.index_mapping(registry, entity)["properties"]
        for field in fields:
            assert field.field_type in FIELD_TYPES and field.aspect in spec.aspect_names, (entity, field)
            assert mapping[field.name]["type"] in ES_TYPES, (entity, field.name, mapping[field.name])
            if field.has_values_field:
                assert mapping[field.has_values_field] == {"type": "boolean"}, (entity, field)
            if field.num_values_field:
                assert mapping[field.num_values_field] == {"type": "long"}, (entity, field)
    assert registry.timeseries_aspects
    for aspect in registry.timeseries_aspects:
        fields = d.timeseries_fields(registry, aspect)
        mapping = em.timeseries_mapping(registry, aspect)["properties"]
        assert fields, aspect
        for name, kind, _ in fields:
            assert kind in ("scalar", "json") and mapping[name]["type"] in ES_TYPES, (aspect, name, kind)


def test_merge_aspect_fields():
    doc = d.merge_aspect_fields(
        {
            "datasetProperties": {"hasDescription": True, "name": "x"},
            "schemaMetadata": {"hasDescription": False},
            "globalTags": {"tags": ["a"]},
            "editableSchemaMetadata": {"tags": ["b", "a"]},
        },
        {"datasetProperties": 2},
    )
    assert doc["hasDescription"] is True and sorted(doc["tags"]) == ["a", "b"]
    assert doc["removed"] is False and doc["aspectVersions"] == {"datasetProperties": 2}


# --- index limits: what the backends cannot hold is made storable (issue 13) ---------------------------------------


def props_fields(registry, value, limits=d.DEFAULT_LIMITS):
    return one(d.changes_from_mcl(mcl("datasetProperties", value), registry, limits), AspectFields).fields


def test_nul_is_stripped_from_the_index_copy_only(registry):
    m = mcl(
        "datasetProperties", {"name": "a\u0000b", "description": "x\u0000y", "customProperties": {"k\u0000": "v\u0000"}}
    )
    raw = m["aspect"]["value"]
    fields = one(d.changes_from_mcl(m, registry), AspectFields).fields
    assert fields["name"] == "ab" and fields["description"] == "xy" and fields["customProperties"] == ["k=v"]
    assert m["aspect"]["value"] == raw  # the change log (and the stored aspect) are not touched


def test_a_clean_value_is_indexed_as_it_is(registry):
    value = {"name": "orders", "description": "All orders", "customProperties": {"owner": "sales"}}
    assert props_fields(registry, value) == props_fields(registry, value, d.IndexLimits(10**9, 10**9))


def test_each_string_is_capped_keyword_values_to_a_lucene_term(registry):
    fields = props_fields(registry, {"name": "n" * 50_000, "description": "d" * 50_000, "externalUrl": "u" * 50_000})
    assert len(fields["name"]) == len(fields["description"]) == 32_768  # search_max_field_chars
    assert len(fields["externalUrl"]) == d.KEYWORD_MAX_CHARS == 8_191  # KEYWORD: one term, at most 32,764 bytes
    small = props_fields(registry, {"name": "n" * 500, "description": "d" * 500}, d.IndexLimits(field_chars=100))
    assert len(small["name"]) == len(small["description"]) == 100


def test_the_document_budget_is_spent_on_the_boosted_fields_first(registry):
    limits = d.IndexLimits(field_chars=1_000, document_chars=1_500)
    fields = props_fields(
        registry,
        {"description": "d" * 5_000, "name": "n" * 5_000, "customProperties": {f"k{i}": "v" for i in range(100)}},
        limits,
    )
    assert len(fields["name"]) == 1_000  # boost 10: spent first
    assert len(fields["description"]) == 500  # what was left
    assert fields["customProperties"] == []  # the list stops where the budget ends
    total = sum(
        len(v) if isinstance(v, str) else sum(map(len, v)) if isinstance(v, list) else 1 for v in fields.values()
    )
    assert total <= 1_500 + len(fields)


def test_edges_lose_nul_and_urns_too_long_to_be_keys(registry):
    good, long_urn = "urn:li:dataset:(urn:li:dataPlatform:hive,db.a\u0000,PROD)", "urn:li:dataset:" + "x" * 2_000
    value = {
        "upstreams": [
            {"auditStamp": {"time": 1, "actor": "urn:li:corpuser:x"}, "dataset": u, "type": "COPY"}
            for u in (good, long_urn)
        ]
    }
    edges = one(d.changes_from_mcl(mcl("upstreamLineage", value), registry), AspectEdges).edges
    assert [e.destination for e in edges] == ["urn:li:dataset:(urn:li:dataPlatform:hive,db.a,PROD)"]
    assert edges[0].destination_type == "dataset"


def test_timeseries_values_lose_nul_only(registry):
    value = {
        "timestampMillis": 1_700_000_000_000,
        "rowCount": 3,
        "partitionSpec": {"partition": "p\u0000"},
        "fieldProfiles": [{"fieldPath": "c\u0000", "sampleValues": ["s" * 50_000]}],
    }
    m = mcl("datasetProfile", value, systemMetadata={"version": "1", "runId": "run\u0000"})
    point = one(d.changes_from_mcl(m, registry), TimeseriesPoint)
    assert point.value["fieldProfiles"][0]["fieldPath"] == "c"
    assert len(point.value["fieldProfiles"][0]["sampleValues"][0]) == 50_000  # the only store: nothing cut
    assert (
        point.fields["partition"] == "p" and point.fields["runId"] == "run" and point.system_metadata["runId"] == "run"
    )
    # DataHub's document id is the id of the point as sent
    assert (
        point.doc_id
        == one(
            d.changes_from_mcl(
                mcl("datasetProfile", {**value, "fieldProfiles": []}, systemMetadata={"version": "1"}), registry
            ),
            TimeseriesPoint,
        ).doc_id
    )


def test_huge_lists_are_extracted_in_linear_time(registry):
    import time

    fields = [
        {"fieldPath": f"col_{i}", "nativeDataType": "int", "type": {"type": {"com.linkedin.schema.NumberType": {}}}}
        for i in range(100_000)
    ]
    value = {
        "schemaName": "s",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.OtherSchema": {"rawSchema": ""}},
        "fields": fields,
    }
    started = time.process_time()  # this process's CPU time: other processes on the machine do not count
    got = one(d.changes_from_mcl(mcl("schemaMetadata", value), registry), AspectFields).fields
    assert time.process_time() - started < 5  # quadratic de-duplication took minutes
    assert got["fieldPaths"][:2] == ["col_0", "col_1"]
    assert sum(len(p) for p in got["fieldPaths"]) <= d.DEFAULT_LIMITS.document_chars
