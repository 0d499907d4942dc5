"""Unbundling legacy MetadataChangeEvents into drafts (app.ingest.mce): pure, no services."""

from __future__ import annotations

import pytest

from app.errors import Issue, ValidationFailed
from app.ingest.gateway import in_callers_terms
from app.ingest.mce import (
    aspect_names_by_record,
    canonical_class,
    unbundle_mce,
    unbundle_restli_entity,
    unbundle_snapshot,
)
from app.registry import load_registry
from app.settings import Settings

DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,db.legacy,PROD)"
SNAPSHOT = "com.linkedin.metadata.snapshot.DatasetSnapshot"


@pytest.fixture(scope="module")
def registry():
    return load_registry(Settings().registry_path)


def issues(excinfo) -> list[dict]:
    return [i.to_json() for i in excinfo.value.issues]


def test_client_capture_unbundles_into_one_upsert_per_aspect(registry):
    # The body DataHub's Python client sends (client-protocol notes §5.3, capture A_emitter_restli #7).
    body = {
        "entity": {
            "value": {
                SNAPSHOT: {
                    "urn": DATASET,
                    "aspects": [
                        {"com.linkedin.common.Status": {"removed": False}},
                        {
                            "com.linkedin.dataset.DatasetProperties": {
                                "customProperties": {"a": "b"},
                                "description": "legacy mce",
                                "tags": [],
                            }
                        },
                        {
                            "com.linkedin.dataset.UpstreamLineage": {
                                "upstreams": [
                                    {
                                        "auditStamp": {"time": 0, "actor": "urn:li:corpuser:unknown"},
                                        "dataset": "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)",
                                        "type": "TRANSFORMED",
                                    }
                                ]
                            }
                        },
                    ],
                }
            }
        },
        "systemMetadata": {"lastObserved": 1795288480532, "runId": "no-run-id-provided"},
    }
    event = unbundle_restli_entity(body, registry)
    assert (event.urn, event.entity_type, event.snapshot_class) == (DATASET, "dataset", SNAPSHOT)
    assert [(d.index, d.entity_type, d.aspect_name, d.change_type, d.urn) for d in event.drafts] == [
        (0, "dataset", "status", "UPSERT", DATASET),
        (1, "dataset", "datasetProperties", "UPSERT", DATASET),
        (2, "dataset", "upstreamLineage", "UPSERT", DATASET),
    ]
    assert event.drafts[1].value == {"customProperties": {"a": "b"}, "description": "legacy mce", "tags": []}
    assert all(d.system_metadata == body["systemMetadata"] for d in event.drafts)
    assert all(d.content_type == "application/json" for d in event.drafts)
    assert (
        event.drafts[2].location.value
        == f'$.entity.value["{SNAPSHOT}"].aspects[2]["com.linkedin.dataset.UpstreamLineage"]'
    )


def test_avro_spelling_of_snapshot_aspects_and_nested_unions(registry):
    mce = {
        "proposedSnapshot": {
            "com.linkedin.pegasus2avro.metadata.snapshot.DatasetSnapshot": {
                "urn": DATASET,
                "aspects": [
                    {
                        "com.linkedin.pegasus2avro.schema.SchemaMetadata": {
                            "schemaName": "x",
                            "platform": "urn:li:dataPlatform:hive",
                            "version": 0,
                            "hash": "",
                            "platformSchema": {"com.linkedin.pegasus2avro.schema.OtherSchema": {"rawSchema": ""}},
                            "fields": [
                                {
                                    "fieldPath": "id",
                                    "nativeDataType": "int",
                                    "type": {"type": {"com.linkedin.pegasus2avro.schema.NumberType": {}}},
                                }
                            ],
                        }
                    }
                ],
            }
        }
    }
    event = unbundle_mce(mce, registry, first_index=7)
    assert event.snapshot_class == SNAPSHOT
    (draft,) = event.drafts
    assert (draft.index, draft.aspect_name) == (7, "schemaMetadata")
    assert draft.value["platformSchema"] == {"com.linkedin.schema.OtherSchema": {"rawSchema": ""}}
    assert draft.value["fields"][0]["type"] == {"type": {"com.linkedin.schema.NumberType": {}}}
    assert draft.system_metadata is None
    # the value validates against the registry once unbundled
    registry.validate("dataset", "schemaMetadata", draft.value)


def test_snapshot_names_are_matched_case_insensitively_to_the_urn_entity(registry):
    cases = {
        "com.linkedin.metadata.snapshot.CorpUserSnapshot": (
            "urn:li:corpuser:jdoe",
            "corpuser",
            "com.linkedin.identity.CorpUserInfo",
            {"active": True},
        ),
        "com.linkedin.metadata.snapshot.MLModelSnapshot": (
            "urn:li:mlModel:(urn:li:dataPlatform:sagemaker,m,PROD)",
            "mlModel",
            "com.linkedin.common.Status",
            {"removed": False},
        ),
        "com.linkedin.metadata.snapshot.GlossaryTermSnapshot": (
            "urn:li:glossaryTerm:t",
            "glossaryTerm",
            "com.linkedin.common.Status",
            {"removed": False},
        ),
    }
    for snapshot_class, (urn, entity, record, value) in cases.items():
        event = unbundle_snapshot({snapshot_class: {"urn": urn, "aspects": [{record: value}]}}, registry)
        assert event.entity_type == entity
        assert event.drafts[0].aspect_name == aspect_names_by_record(registry)[record]


def test_reverse_map_covers_every_aspect_once(registry):
    by_record = aspect_names_by_record(registry)
    assert len(by_record) == len(registry.aspects)
    assert by_record["com.linkedin.common.Status"] == "status"
    assert by_record["com.linkedin.metadata.key.DatasetKey"] == "datasetKey"
    assert aspect_names_by_record(registry) is by_record  # built once
    assert canonical_class("com.linkedin.pegasus2avro.common.Status") == "com.linkedin.common.Status"
    assert canonical_class("com.linkedin.common.Status") == "com.linkedin.common.Status"


def test_unknown_snapshot_class(registry):
    with pytest.raises(ValidationFailed) as excinfo:
        unbundle_snapshot(
            {"com.linkedin.metadata.snapshot.FooSnapshot": {"urn": "urn:li:foo:x", "aspects": []}}, registry
        )
    (issue,) = issues(excinfo)
    assert issue["path"] == "$.proposedSnapshot" and "unknown snapshot class" in issue["message"]
    assert issue["found"] == "com.linkedin.metadata.snapshot.FooSnapshot"

    with pytest.raises(ValidationFailed) as excinfo:
        unbundle_snapshot({"com.example.Dataset": {"urn": DATASET, "aspects": []}}, registry)
    assert "unknown snapshot class" in issues(excinfo)[0]["message"]

    with pytest.raises(ValidationFailed) as excinfo:
        unbundle_snapshot({SNAPSHOT: {}, "com.linkedin.metadata.snapshot.ChartSnapshot": {}}, registry)
    assert issues(excinfo)[0]["path"] == "$.proposedSnapshot"


def test_snapshot_class_must_match_the_urn(registry):
    with pytest.raises(ValidationFailed) as excinfo:
        unbundle_snapshot(
            {
                "com.linkedin.metadata.snapshot.ChartSnapshot": {
                    "urn": DATASET,
                    "aspects": [{"com.linkedin.common.Status": {"removed": False}}],
                }
            },
            registry,
        )
    (issue,) = issues(excinfo)
    assert "does not match the URN's entity type 'dataset'" in issue["message"]
    assert issue["expected"].startswith("com.linkedin.metadata.snapshot.DatasetSnapshot")


def test_bad_urn_and_missing_parts_name_their_path(registry):
    base = f'$.proposedSnapshot["{SNAPSHOT}"]'
    for snapshot, path in [
        ({"aspects": []}, f"{base}.urn"),
        ({"urn": "not-a-urn", "aspects": []}, f"{base}.urn"),
        ({"urn": DATASET}, f"{base}.aspects"),
        ({"urn": DATASET, "aspects": []}, f"{base}.aspects"),
        ({"urn": DATASET, "aspects": [], "extra": 1}, base),
    ]:
        with pytest.raises(ValidationFailed) as excinfo:
            unbundle_snapshot({SNAPSHOT: snapshot}, registry)
        assert issues(excinfo)[0]["path"] == path, snapshot


def test_every_bad_aspect_is_reported_with_its_path(registry):
    with pytest.raises(ValidationFailed) as excinfo:
        unbundle_mce(
            {
                "proposedSnapshot": {
                    SNAPSHOT: {
                        "urn": DATASET,
                        "aspects": [
                            {"com.linkedin.common.Status": {"removed": False}},
                            {"com.linkedin.chart.ChartInfo": {"title": "t", "description": "d"}},
                            {"com.example.Unknown": {}},
                            {"com.linkedin.common.Status": {}, "com.linkedin.common.Ownership": {}},
                        ],
                    }
                }
            },
            registry,
        )
    found = issues(excinfo)
    base = f'$.proposedSnapshot["{SNAPSHOT}"].aspects'
    assert [(i["index"], i["path"]) for i in found] == [(1, f"{base}[1]"), (2, f"{base}[2]"), (3, f"{base}[3]")]
    assert "'chartInfo' (com.linkedin.chart.ChartInfo) is not an aspect of entity 'dataset'" in found[0]["message"]
    assert found[0]["aspect"] == "chartInfo"
    assert found[1]["message"] == "unknown aspect class 'com.example.Unknown'"


def test_event_envelope_errors(registry):
    for mce, path in [
        ([], "$"),
        ({}, "$.proposedSnapshot"),
        ({"proposedSnapshot": {}, "bogus": 1}, "$"),
        ({"proposedDelta": {"x": 1}, "proposedSnapshot": {}}, "$.proposedDelta"),
        (
            {
                "proposedSnapshot": {SNAPSHOT: {"urn": DATASET, "aspects": [{"com.linkedin.common.Status": {}}]}},
                "systemMetadata": "x",
            },
            "$.systemMetadata",
        ),
    ]:
        with pytest.raises(ValidationFailed) as excinfo:
            unbundle_mce(mce, registry)
        assert issues(excinfo)[0]["path"] == path, mce
    for body in [{"entity": {SNAPSHOT: {}}}, {"entity": {"value": {}}, "other": 1}, []]:
        with pytest.raises(ValidationFailed):
            unbundle_restli_entity(body, registry)


def test_write_path_issues_are_relocated_into_the_event(registry):
    event = unbundle_restli_entity(
        {
            "entity": {
                "value": {
                    SNAPSHOT: {
                        "urn": DATASET,
                        "aspects": [
                            {"com.linkedin.common.Status": {"removed": False}},
                            {"com.linkedin.dataset.DatasetProperties": {"description": 5}},
                        ],
                    }
                }
            }
        },
        registry,
    )
    error = ValidationFailed(
        "1 of 2 proposals are invalid",
        [
            Issue("expected string", 1, DATASET, "datasetProperties", "$.aspect.value.description", "string", "int 5"),
            Issue("bad urn", 0, DATASET, "status", "$.entityUrn"),
        ],
    )
    moved = in_callers_terms(error, event.drafts)
    assert isinstance(moved, ValidationFailed)
    base = f'$.entity.value["{SNAPSHOT}"]'
    assert [(i.index, i.path) for i in moved.issues] == [
        (1, f'{base}.aspects[1]["com.linkedin.dataset.DatasetProperties"].description'),
        (0, f"{base}.urn"),
    ]
