"""Entity registry: loading, lookups, URN <-> key, custom model sources, the registry check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.registry import (
    AspectNotAllowedError,
    AspectValidationError,
    KeyValidationError,
    RegistryConfigError,
    RegistryError,
    UnknownAspectError,
    UnknownEntityError,
    UrnKeyError,
    check_registry,
    load_registry,
)
from app.registry.schema import Enum, Primitive

REGISTRY_YML = Path(__file__).resolve().parents[2] / "entity_registry.yml"

TIMESERIES = {
    "assertionRunEvent",
    "chartUsageStatistics",
    "dashboardUsageStatistics",
    "dataProcessInstanceRunEvent",
    "datahubIngestionCheckpoint",
    "datahubIngestionRunSummary",
    "datasetProfile",
    "datasetUsageStatistics",
    "documentUsageStatistics",
    "operation",
    "queryUsageStatistics",
}


@pytest.fixture(scope="module")
def registry():
    return load_registry(REGISTRY_YML)


# -- counts and the default model set ---------------------------------------------------------------------------
def test_counts_of_the_default_model_set(registry):
    c = registry.counts()
    assert c["entities"] >= 72
    assert c["aspects"] >= 270
    assert c["timeseries"] == 11
    assert c["key_aspects"] == c["entities"]
    assert registry.timeseries_aspects == TIMESERIES
    assert len(registry.entities) == c["entities"] and len(registry.aspects) == c["aspects"]


def test_common_aspects_are_attached_as_in_datahub(registry):
    dataset = registry.entity("dataset")
    for a in (
        "datasetKey",
        "status",
        "ownership",
        "globalTags",
        "glossaryTerms",
        "schemaMetadata",
        "datasetProperties",
        "editableDatasetProperties",
        "upstreamLineage",
        "datasetProfile",
        "datasetUsageStatistics",
        "operation",
        "structuredProperties",
        "browsePathsV2",
        "container",
    ):
        assert a in dataset.aspect_names, a
    assert {"chartInfo", "chartUsageStatistics", "inputFields"} <= registry.entity("chart").aspect_names
    assert {"dataJobInfo", "dataJobInputOutput", "datahubIngestionRunSummary"} <= registry.entity(
        "dataJob"
    ).aspect_names
    assert {"corpUserInfo", "corpUserEditableInfo", "groupMembership", "status"} <= registry.entity(
        "corpuser"
    ).aspect_names
    assert "ownership" not in registry.entity("corpuser").aspect_names
    assert "status" not in registry.entity("domain").aspect_names
    assert "schemaMetadata" in registry.entity("glossaryTerm").aspect_names


def test_entity_spec_fields(registry):
    dataset = registry.entity("dataset")
    assert dataset.name == "dataset"
    assert dataset.key_aspect == "datasetKey"
    assert dataset.category == "core"
    assert dataset.doc and "Datasets" in dataset.doc
    assert dataset.aspects_in_order[0] == "datasetKey"
    assert isinstance(dataset.aspect_names, frozenset)
    # entityCategory "_unset_" in the schemas means no category
    assert registry.entity("corpuser").category is None
    assert registry.entity("dataHubPolicy").category == "internal"


def test_aspect_spec_fields(registry):
    tags = registry.aspect("dataset", "globalTags")
    assert tags.name == "globalTags"
    assert tags.record_name == "com.linkedin.common.GlobalTags"
    assert not tags.is_timeseries and not tags.is_key
    assert tags.schema["name"] == "GlobalTags" and tags.schema["Aspect"]["name"] == "globalTags"
    profile = registry.aspect("dataset", "datasetProfile")
    assert profile.is_timeseries
    assert profile.record_name == "com.linkedin.dataset.DatasetProfile"
    key = registry.aspect("dataset", "datasetKey")
    assert key.is_key and key.key_for == "dataset"
    assert key.record_name == "com.linkedin.metadata.key.DatasetKey"
    assert registry.aspects["schemaMetadata"].record_name == "com.linkedin.schema.SchemaMetadata"


def test_schema_version_from_the_aspect_annotation(registry):
    versions = {a.name: a.schema_version for a in registry.aspects.values()}
    # DataHub's `@Aspect` schemaVersion, where its schemas give one; 1 where they do not
    assert {
        name: versions[name]
        for name in ("upstreamLineage", "editableSchemaMetadata", "dataHubViewInfo", "incidentInfo", "assertionInfo")
    } == {
        "upstreamLineage": 2,
        "editableSchemaMetadata": 2,
        "dataHubViewInfo": 3,
        "incidentInfo": 4,
        "assertionInfo": 7,
    }
    assert "schemaVersion" not in registry.aspects["corpUserInfo"].annotation
    assert versions["status"] == versions["corpUserInfo"] == 1
    assert all(v == int(registry.aspects[name].annotation.get("schemaVersion", 1)) for name, v in versions.items())


@pytest.mark.parametrize(
    "key, fields",
    [
        ("datasetKey", ["platform", "name", "origin"]),
        ("chartKey", ["dashboardTool", "chartId"]),
        ("dashboardKey", ["dashboardTool", "dashboardId"]),
        ("dataJobKey", ["flow", "jobId"]),
        ("dataFlowKey", ["orchestrator", "flowId", "cluster"]),
        ("corpUserKey", ["username"]),
        ("tagKey", ["name"]),
        ("glossaryTermKey", ["name"]),
        ("domainKey", ["id"]),
        ("schemaFieldKey", ["parent", "fieldPath"]),
        ("containerKey", ["guid"]),
        ("dataPlatformKey", ["platformName"]),
        ("dataPlatformInstanceKey", ["platform", "instance"]),
    ],
)
def test_key_aspect_field_order(registry, key, fields):
    assert list(registry.aspects[key].field_names) == fields


# -- field annotations ----------------------------------------------------------------------------------------
def test_field_annotations_are_kept_raw_with_their_paths(registry):
    by_path = {fa.path: fa for fa in registry.aspects["globalTags"].field_annotations}
    tags = by_path["/tags"]  # Pegasus path overrides stay raw here
    assert tags.record == "com.linkedin.common.GlobalTags"
    assert tags.annotations["Relationship"]["/*/tag"]["name"] == "TaggedWith"
    tag = by_path["/tags/*/tag"]
    assert tag.record == "com.linkedin.common.TagAssociation"
    assert tag.annotations["Urn"] == "TagUrn"
    # ... and are applied to the path they target in annotations_by_path
    effective = registry.aspects["globalTags"].annotations_by_path["/tags/*/tag"]
    assert effective["Relationship"] == {"entityTypes": ["tag"], "name": "TaggedWith"}
    assert effective["Searchable"]["fieldName"] == "tags"
    assert effective["Urn"] == "TagUrn"

    lineage = {fa.path: fa for fa in registry.aspects["upstreamLineage"].field_annotations}
    rel = lineage["/upstreams/*/dataset"].annotations["Relationship"]
    assert rel["name"] == "DownstreamOf" and rel["isLineage"] is True

    usage = registry.aspects["datasetUsageStatistics"].annotations_by_path
    assert "TimeseriesField" in usage["/uniqueUserCount"]
    assert usage["/userCounts"]["TimeseriesFieldCollection"] == {"key": "user"}

    schema = {fa.path: fa for fa in registry.aspects["schemaMetadata"].field_annotations}
    assert "Searchable" in schema["/fields/*/fieldPath"].annotations
    assert "/fields/*/globalTags/tags/*/tag" in schema
    # union members appear in paths by their member key
    assert "/foreignKeysSpecs/*/foreignKey/com.linkedin.schema.DatasetFieldForeignKey/parentDataset" in schema

    key = {fa.path: fa for fa in registry.aspects["datasetKey"].field_annotations}
    assert key["/platform"].annotations["java"]["class"].endswith("Urn")
    assert any("UrnValidation" in fa.annotations for a in registry.aspects.values() for fa in a.field_annotations)


# -- lookups ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, canonical",
    [
        ("dataset", "dataset"),
        ("DATASET", "dataset"),
        ("DataJob", "dataJob"),
        ("datajob", "dataJob"),
        ("CORPUSER", "corpuser"),
    ],
)
def test_entity_lookup_is_case_insensitive(registry, name, canonical):
    assert registry.entity(name).name == canonical
    assert registry.has_entity(name)


def test_unknown_entity(registry):
    with pytest.raises(UnknownEntityError) as e:
        registry.entity("notAnEntity")
    assert str(e.value) == "Failed to find entity with name notAnEntity in EntityRegistry"
    assert isinstance(e.value, RegistryError)
    with pytest.raises(UnknownEntityError):
        registry.aspect("notAnEntity", "status")
    assert not registry.has_entity("notAnEntity")


def test_unknown_aspect(registry):
    with pytest.raises(UnknownAspectError) as e:
        registry.aspect("dataset", "noSuchAspect")
    assert not isinstance(e.value, AspectNotAllowedError)
    assert str(e.value) == "Unknown aspect noSuchAspect for entity dataset"
    assert e.value.entity == "dataset" and e.value.aspect == "noSuchAspect"


def test_aspect_of_another_entity_is_not_allowed(registry):
    with pytest.raises(AspectNotAllowedError) as e:
        registry.aspect("dataset", "chartInfo")
    assert isinstance(e.value, UnknownAspectError)  # callers may catch both at once
    assert "Unknown aspect chartInfo for entity dataset" in str(e.value)


def test_aspect_names_are_case_sensitive(registry):
    with pytest.raises(UnknownAspectError):
        registry.aspect("dataset", "DatasetProperties")


def test_aspect_lookup_uses_the_canonical_entity_name(registry):
    assert registry.aspect("DATASET", "status") is registry.aspects["status"]


# -- URN <-> key --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "entity, urn, key",
    [
        (
            "dataset",
            "urn:li:dataset:(urn:li:dataPlatform:hive,db.table,PROD)",
            {"platform": "urn:li:dataPlatform:hive", "name": "db.table", "origin": "PROD"},
        ),
        (
            "dataJob",
            "urn:li:dataJob:(urn:li:dataFlow:(airflow,daily_dag,prod),task_1)",
            {"flow": "urn:li:dataFlow:(airflow,daily_dag,prod)", "jobId": "task_1"},
        ),
        (
            "schemaField",
            "urn:li:schemaField:(urn:li:dataset:(urn:li:dataPlatform:hive,db.table,PROD),user_id)",
            {"parent": "urn:li:dataset:(urn:li:dataPlatform:hive,db.table,PROD)", "fieldPath": "user_id"},
        ),
        ("chart", "urn:li:chart:(looker,dashboards.42)", {"dashboardTool": "looker", "chartId": "dashboards.42"}),
        ("corpuser", "urn:li:corpuser:jdoe@example.com", {"username": "jdoe@example.com"}),
        (
            "dataPlatformInstance",
            "urn:li:dataPlatformInstance:(urn:li:dataPlatform:mysql,prod_cluster)",
            {"platform": "urn:li:dataPlatform:mysql", "instance": "prod_cluster"},
        ),
        ("container", "urn:li:container:9a1b2c", {"guid": "9a1b2c"}),
        (
            "dataProcess",
            "urn:li:dataProcess:(proc,airflow,DEV)",
            {"name": "proc", "orchestrator": "airflow", "origin": "DEV"},
        ),
    ],
)
def test_urn_key_round_trip(registry, entity, urn, key):
    assert registry.urn_to_key(entity, urn) == key
    assert registry.key_to_urn(entity, key) == urn
    # entity names are case-insensitive here too; the URN uses the canonical entity name
    assert registry.key_to_urn(entity.upper(), key) == urn


def _sample_key_value(registry, entity):
    spec = registry.key_aspect(entity)
    value = {}
    for f in spec.type.fields:
        if isinstance(f.type, Enum):
            value[f.name] = f.type.symbols[0]
        elif f.urn_entity is not None:
            value[f.name] = "urn:li:dataPlatform:hive"
        elif isinstance(f.type, Primitive) and f.type.kind == "string":
            value[f.name] = f"{f.name}-1"
        else:  # pragma: no cover - no such key field in the default set
            pytest.fail(f"unexpected key field type {f.type.kind} in {spec.name}")
    return value


def test_every_default_key_shape_round_trips(registry):
    for entity in registry.entities:
        key = _sample_key_value(registry, entity)
        urn = registry.key_to_urn(entity, key)
        assert urn.startswith(f"urn:li:{entity}:")
        assert registry.urn_to_key(entity, urn) == key, entity
        assert registry.key_to_urn(entity, registry.urn_to_key(entity, urn)) == urn


def test_urn_part_count_mismatch(registry):
    with pytest.raises(UrnKeyError) as e:
        registry.urn_to_key("dataset", "urn:li:dataset:(urn:li:dataPlatform:hive,db.table)")
    assert not isinstance(e.value, AspectValidationError)
    msg = str(e.value)
    assert "urn parts and key fields do not have the same length" in msg
    assert "2 part(s)" in msg and "3 field(s)" in msg
    with pytest.raises(UrnKeyError, match="1 part"):
        registry.urn_to_key("chart", "urn:li:chart:lonely")


def test_urn_key_is_validated_against_the_key_schema(registry):
    with pytest.raises(UrnKeyError) as e:
        registry.urn_to_key("dataset", "urn:li:dataset:(urn:li:dataPlatform:hive,db.table,NOPE)")
    # a key-schema failure is also an AspectValidationError of the key aspect
    assert isinstance(e.value, KeyValidationError) and isinstance(e.value, AspectValidationError)
    assert e.value.aspect == "datasetKey"
    assert [i.path for i in e.value.issues] == ["$.origin"]
    assert "is not a symbol of enum com.linkedin.common.FabricType" in e.value.issues[0].message
    with pytest.raises(UrnKeyError) as e:
        registry.urn_to_key("dataset", "urn:li:dataset:(hive,db.table,PROD)")
    assert e.value.issues[0].path == "$.platform"
    assert "invalid urn" in e.value.issues[0].message


def test_urn_of_another_entity_type_or_invalid(registry):
    with pytest.raises(UrnKeyError, match="does not match"):
        registry.urn_to_key("dataset", "urn:li:chart:(looker,1)")
    with pytest.raises(UrnKeyError, match="invalid urn"):
        registry.urn_to_key("dataset", "not-a-urn")
    with pytest.raises(UnknownEntityError):
        registry.urn_to_key("nope", "urn:li:nope:1")


@pytest.fixture
def counted() -> tuple[object, list[tuple[str, str]]]:
    """A registry of its own whose urn_to_key calls are recorded (check_urn_key's memo starts empty)."""
    own = load_registry(REGISTRY_YML)
    calls: list[tuple[str, str]] = []
    real = own.urn_to_key

    def urn_to_key(entity: str, urn: str) -> dict:
        calls.append((entity, urn))
        return real(entity, urn)

    own.urn_to_key = urn_to_key  # type: ignore[method-assign]
    return own, calls


DATASET_URN = "urn:li:dataset:(urn:li:dataPlatform:hive,db.table,PROD)"


def test_check_urn_key_remembers_a_valid_pair(counted):
    own, calls = counted
    own.check_urn_key("dataset", DATASET_URN)
    own.check_urn_key("dataset", DATASET_URN)
    assert calls == [("dataset", DATASET_URN)]


def test_check_urn_key_never_remembers_an_invalid_urn(counted):
    own, calls = counted
    bad = "urn:li:dataset:(urn:li:dataPlatform:hive,db.table,NOPE)"
    for _ in range(2):
        with pytest.raises(KeyValidationError):
            own.check_urn_key("dataset", bad)
    assert calls == [("dataset", bad)] * 2


def test_check_urn_key_forgets_when_the_models_change(counted):
    own, calls = counted
    own.check_urn_key("dataset", DATASET_URN)
    own.replace_with(load_registry(REGISTRY_YML), runtime_version=1)
    own.check_urn_key("dataset", DATASET_URN)
    assert calls == [("dataset", DATASET_URN)] * 2


def test_check_urn_key_keeps_a_bounded_number_of_pairs(counted, monkeypatch):
    from app.registry import registry as registry_module

    monkeypatch.setattr(registry_module, "VALID_KEYS_KEPT", 2)
    own, calls = counted
    urns = [f"urn:li:dataset:(urn:li:dataPlatform:hive,db.t{i},PROD)" for i in range(3)]
    for urn in urns:  # the third starts the memo again
        own.check_urn_key("dataset", urn)
    own.check_urn_key("dataset", urns[0])
    assert len(own._valid_keys) <= 2 and calls[-1] == ("dataset", urns[0])


def test_key_to_urn_rejects_invalid_keys(registry):
    with pytest.raises(UrnKeyError) as e:
        registry.key_to_urn("dataset", {"platform": "urn:li:dataPlatform:hive", "name": "t", "origin": "MARS"})
    assert e.value.issues[0].path == "$.origin"
    with pytest.raises(UrnKeyError) as e:
        registry.key_to_urn("dataset", {"platform": "urn:li:dataPlatform:hive", "name": "t"})
    assert e.value.issues[0].message == 'missing required field "origin"'
    # unknown fields are never trimmed on keys, even in trim mode
    trimming = load_registry(REGISTRY_YML, trim_unknown_fields=True)
    with pytest.raises(UrnKeyError) as e:
        trimming.key_to_urn("corpuser", {"username": "a", "extra": 1})
    assert e.value.issues[0].path == "$.extra"
    with pytest.raises(UrnKeyError, match="absent"):
        registry.key_to_urn("container", {})
    # values that would not split back into the same parts
    for name in ("a,b", "x)"):
        with pytest.raises(UrnKeyError, match="percent-encode"):
            registry.key_to_urn("dataset", {"platform": "urn:li:dataPlatform:hive", "name": name, "origin": "PROD"})
    key = {"platform": "urn:li:dataPlatform:hive", "name": "a%2Cb", "origin": "PROD"}
    assert registry.urn_to_key("dataset", registry.key_to_urn("dataset", key)) == key


# -- custom model sources and the yml ----------------------------------------------------------------------------
WIDGET_KEY = {
    "type": "record",
    "name": "WidgetKey",
    "namespace": "com.example.key",
    "Aspect": {
        "name": "widgetKey",
        "keyForEntity": "widget",
        "entityCategory": "core",
        "entityAspects": ["widgetInfo", "status"],
        "entityDoc": "A widget.",
    },
    "fields": [
        {
            "name": "maker",
            "type": "string",
            "Urn": "Urn",
            "java": {"class": "com.linkedin.pegasus2avro.common.urn.Urn"},
        },
        {"name": "serial", "type": "string"},
        {"name": "env", "type": "com.linkedin.pegasus2avro.common.FabricType"},
    ],
}
WIDGET_INFO = {
    "type": "record",
    "name": "WidgetInfo",
    "namespace": "com.example",
    "Aspect": {"name": "widgetInfo"},
    "fields": [
        {"name": "title", "type": "string", "Searchable": {"fieldType": "TEXT"}},
        {"name": "size", "type": "int", "default": 3},
        {"name": "created", "type": "com.linkedin.common.AuditStamp"},
        {
            "name": "shape",
            "type": [
                {"type": "record", "name": "Circle", "fields": [{"name": "radius", "type": "double"}]},
                {"type": "record", "name": "Square", "fields": [{"name": "side", "type": "double"}]},
            ],
        },
        {"name": "labels", "type": {"type": "map", "values": "string"}, "default": {}},
    ],
}
WIDGET_USAGE = {
    "type": "record",
    "name": "WidgetUsage",
    "namespace": "com.example",
    "Aspect": {"name": "widgetUsage", "type": "timeseries"},
    "fields": [
        {"name": "timestampMillis", "type": "long"},
        {"name": "uses", "type": ["null", "long"], "default": None},
    ],
}


def _write_models(folder: Path, *docs: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for doc in docs:
        (folder / f"{doc['name']}.avsc").write_text(json.dumps(doc))


def _write_yml(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def test_custom_entity_and_aspects_from_a_folder_of_avsc(tmp_path):
    _write_models(tmp_path / "models", WIDGET_KEY, WIDGET_INFO, WIDGET_USAGE)
    yml = _write_yml(
        tmp_path / "registry.yml",
        """
modelSources:
  - package: acryl-datahub
  - path: ./models
entities:
  - name: widget
    aspects: [widgetUsage, ownership]
  - name: dataset
    aspects: [widgetInfo]
events: []
plugins: {}
""",
    )
    reg = load_registry(yml)
    c = reg.counts()
    assert c["entities"] == 74 and c["timeseries"] == 12  # DataHub's 72, metaledgerSystem, widget

    widget = reg.entity("WIDGET")
    assert widget.name == "widget" and widget.key_aspect == "widgetKey" and widget.category == "core"
    assert widget.doc == "A widget."
    assert widget.aspect_names == {"widgetKey", "widgetInfo", "status", "widgetUsage", "ownership"}
    assert "widgetInfo" in reg.entity("dataset").aspect_names  # extended package entity
    assert reg.aspects["widgetUsage"].is_timeseries
    assert reg.aspects["widgetInfo"].record_name == "com.example.WidgetInfo"

    info = reg.validate(
        "widget",
        "widgetInfo",
        {
            "title": "w",
            "created": {"time": 1, "actor": "urn:li:corpuser:me"},
            "shape": {"com.example.Circle": {"radius": 2}},
        },
    )
    assert info == {
        "title": "w",
        "size": 3,
        "created": {"time": 1, "actor": "urn:li:corpuser:me"},
        "shape": {"com.example.Circle": {"radius": 2.0}},
        "labels": {},
    }
    with pytest.raises(AspectValidationError) as e:
        reg.validate(
            "widget",
            "widgetInfo",
            {"title": "w", "created": {"time": 1, "actor": "me"}, "shape": {"com.example.Triangle": {}}},
        )
    assert [i.path for i in e.value.issues] == ["$.created.actor", "$.shape"]

    # the key uses a FabricType defined only in the package's files
    urn = "urn:li:widget:(urn:li:corpuser:acme,sn-1,PROD)"
    assert reg.urn_to_key("widget", urn) == {"maker": "urn:li:corpuser:acme", "serial": "sn-1", "env": "PROD"}
    assert reg.key_to_urn("widget", reg.urn_to_key("widget", urn)) == urn
    with pytest.raises(UrnKeyError):
        reg.urn_to_key("widget", "urn:li:widget:(urn:li:corpuser:acme,sn-1,MARS)")

    annotations = {fa.path: fa.annotations for fa in reg.aspects["widgetInfo"].field_annotations}
    assert annotations["/title"] == {"Searchable": {"fieldType": "TEXT"}}
    ok, report = check_registry(yml)
    assert ok and report.startswith("OK")


def test_a_new_entity_declared_in_the_yml(tmp_path):
    thing_key = {
        "type": "record",
        "name": "ThingKey",
        "namespace": "com.example",
        "Aspect": {"name": "thingKey"},
        "fields": [{"name": "id", "type": "string"}],
    }
    _write_models(tmp_path / "m", thing_key)
    yml = _write_yml(
        tmp_path / "r.yml",
        """
modelSources: [{package: acryl-datahub}, {path: m}]
entities:
  - name: thing
    keyAspect: thingKey
    category: internal
    doc: A thing
    searchGroup: primary
    aspects: [status, ownership]
""",
    )
    reg = load_registry(yml)
    thing = reg.entity("thing")
    assert thing.aspect_names == {"thingKey", "status", "ownership"}
    assert thing.category == "internal" and thing.doc == "A thing" and thing.extra == {"searchGroup": "primary"}
    assert reg.aspects["thingKey"].is_key
    assert reg.key_to_urn("thing", {"id": "x"}) == "urn:li:thing:x"


def test_without_model_sources_the_package_is_used(tmp_path):
    yml = _write_yml(tmp_path / "r.yml", "entities: []\n")
    assert load_registry(yml).counts()["entities"] >= 72


@pytest.mark.parametrize(
    "entities, expected",
    [
        ("[{name: dataset, aspects: [noSuchAspect]}]", "entity dataset: aspect noSuchAspect is not defined"),
        ("[{name: thing, aspects: [status]}]", "entity thing: a new entity needs a keyAspect"),
        ("[{name: thing, keyAspect: nope}]", "entity thing: keyAspect nope is not a defined aspect"),
        ("[{name: thing, keyAspect: datasetKey}]", "keyAspect datasetKey is already the key of another entity"),
        ("[{name: dataset, keyAspect: chartKey}]", "entity dataset: keyAspect chartKey in the yml"),
    ],
)
def test_yml_problems_are_reported(tmp_path, entities, expected):
    yml = _write_yml(tmp_path / "r.yml", f"entities: {entities}\n")
    with pytest.raises(RegistryConfigError) as e:
        load_registry(yml)
    assert any(expected in p for p in e.value.problems), e.value.problems
    ok, report = check_registry(yml)
    assert not ok
    assert report.startswith("FAILED (1 problem)")
    assert expected in report


def test_source_problems_are_reported(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "Broken.avsc").write_text("{not json")
    (tmp_path / "m" / "Status2.avsc").write_text(json.dumps({**WIDGET_USAGE, "Aspect": {"name": "status"}}))
    yml = _write_yml(
        tmp_path / "r.yml",
        "modelSources: [{package: acryl-datahub}, {path: m}, {path: missing}, {package: no-such-dist-xyz}]\n",
    )
    with pytest.raises(RegistryConfigError) as e:
        load_registry(yml)
    text = "\n".join(e.value.problems)
    assert "Broken.avsc: not valid JSON" in text
    assert "aspect status is defined twice" in text
    assert "does not exist" in text
    assert "no-such-dist-xyz" in text and "not installed" in text


def test_broken_schemas_are_reported_at_load(tmp_path):
    bad_ref = {
        "type": "record",
        "name": "A",
        "Aspect": {"name": "a"},
        "fields": [{"name": "x", "type": "com.example.Missing"}],
    }
    no_fields = {"type": "record", "name": "B", "Aspect": {"name": "b"}, "fields": [{"type": "string"}]}
    _write_models(tmp_path / "m", bad_ref, no_fields)
    yml = _write_yml(tmp_path / "r.yml", "modelSources: [{path: m}]\n")
    with pytest.raises(RegistryConfigError) as e:
        load_registry(yml)
    text = "\n".join(e.value.problems)
    assert "aspect a" in text and "unknown type 'com.example.Missing'" in text
    assert "aspect b" in text


def test_missing_registry_file(tmp_path):
    with pytest.raises(RegistryConfigError, match="does not exist"):
        load_registry(tmp_path / "nope.yml")
    ok, report = check_registry(tmp_path / "nope.yml")
    assert not ok and "does not exist" in report


def test_check_registry_summary_of_the_committed_file():
    result = check_registry(REGISTRY_YML)
    ok, report = result
    assert ok and str(result) == report
    first = report.splitlines()[0]
    assert first.startswith("OK")
    assert "73 entities" in report and "11 timeseries" in report  # DataHub's 72 and metaledgerSystem
    assert "metaledger system models" in report
    assert "acryl-datahub==" in report


def test_committed_yml_is_in_datahub_format():
    import yaml

    config = yaml.safe_load(REGISTRY_YML.read_text())
    assert config["events"] == [] and config["plugins"] == {}
    assert isinstance(config["entities"], list)
    assert config["modelSources"][0] == {"package": "acryl-datahub"}
