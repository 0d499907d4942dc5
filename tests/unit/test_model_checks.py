"""The checks of what a runtime model set may hold (app.modelset.service.check_model_set: app.registry.compatibility's
rules and app.search.annotations'), each alone: where it
fires (naming the rule and the path) and where it must not. Over HTTP, the dry run and the apply:
tests/integration/test_runtime_models_refusals.py."""

from __future__ import annotations

from typing import Any

import pytest

from app.modelset.service import check_model_set as check_models
from app.registry import load_registry
from app.registry.compatibility import MAX_ASPECT_NAME_CHARS, MAX_ENTITY_NAME_CHARS, NAME_PATTERN
from app.registry.runtime import EMPTY, RuntimeModelSet
from app.search.annotations import FIELD_ANNOTATIONS, MAX_FIELD_PATHS
from app.settings import Settings

DEPTH = 100


@pytest.fixture(scope="module")
def registry():
    return load_registry(Settings().registry_path)


def aspect(*fields: dict[str, Any], name: str = "acmeRating", **annotation: Any) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "Rating",
        "namespace": "com.acme",
        "Aspect": {"name": name, **annotation},
        "fields": list(fields) or [{"name": "stars", "type": "int"}],
    }


def model_set(*schemas: dict[str, Any], entities: list[dict[str, Any]] | None = None) -> RuntimeModelSet:
    names = [s["Aspect"]["name"] for s in schemas]
    return RuntimeModelSet.from_json(
        {
            "aspects": [{"schema": s} for s in schemas],
            "entities": [{"name": "dataset", "aspects": names}] if entities is None else entities,
        }
    )


def refusals(registry, models: RuntimeModelSet) -> list[tuple[str, str]]:
    return [(r.rule, r.path) for r in check_models(registry, EMPTY, models, max_depth=DEPTH).refusals]


def key(name: str = "acmeWidgetKey", **annotation: Any) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "WidgetKey",
        "namespace": "com.acme",
        "Aspect": {"name": name, **annotation},
        "fields": [{"name": "id", "type": "string"}],
    }


# --- names ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "fires"),
    [
        ("acmeWidget", False),
        ("acme_Widget2", False),
        ("w" * MAX_ENTITY_NAME_CHARS, False),
        ("dataset", False),
        ("acmé", True),
        ("acme-widget", True),
        ("2widgets", True),
        ("_widget", True),
        ("acme.widget", True),
        ("", True),
        ("w" * (MAX_ENTITY_NAME_CHARS + 1), True),
    ],
)
def test_entity_names(registry, name, fires):
    models = model_set(key(), entities=[{"name": name, "keyAspect": "acmeWidgetKey"}])
    assert (("InvalidName", "$.entities[0].name") in refusals(registry, models)) is fires


@pytest.mark.parametrize(
    ("name", "fires"),
    [
        ("acmeRating", False),
        ("r" * MAX_ASPECT_NAME_CHARS, False),
        ("acmé", True),
        ("acme-rating", True),
        ("r" * (MAX_ASPECT_NAME_CHARS + 1), True),
        ("r" * 201, True),
    ],
)
def test_aspect_names(registry, name, fires):
    found = refusals(registry, model_set(aspect(name=name)))
    assert (found == [("InvalidName", "$.aspects[0].schema.Aspect.name")]) is fires
    assert fires or not found


def test_the_entity_a_key_aspect_declares(registry):
    assert refusals(registry, model_set(key(keyForEntity="acmé"), entities=[])) == [
        ("InvalidName", "$.aspects[0].schema.Aspect.keyForEntity")
    ]
    assert refusals(registry, model_set(key(keyForEntity="acmeGizmo"), entities=[])) == []


def test_a_refused_name_is_echoed_clipped(registry):
    refusal = check_models(registry, EMPTY, model_set(aspect(name="é" * 100_000)), max_depth=DEPTH).refusals[0]
    assert len(refusal.found) < 150 and len(refusal.message) < 300 and refusal.expected.startswith(NAME_PATTERN)


# --- nesting ------------------------------------------------------------------------------------------------------
def nested(depth: int) -> dict[str, Any]:
    node: Any = "int"
    for _ in range(depth - 3):
        node = {"type": "array", "items": node}
    return aspect({"name": "v", "type": node, "default": []})


def test_nesting_past_the_limit_is_refused_before_any_walk(registry):
    assert refusals(registry, model_set(nested(DEPTH))) == []
    [(rule, path)] = refusals(registry, model_set(nested(DEPTH + 1)))
    assert rule == "SchemaTooDeep" and path.startswith("$.fields[0].type.items.items")
    assert refusals(registry, model_set(nested(5000)))[0][0] == "SchemaTooDeep"  # no RecursionError anywhere


def chain(records: int) -> dict[str, Any]:
    """A shallow document whose types nest `records` deep: each record's field names the next one."""
    members = [
        {
            "type": "record",
            "name": f"R{i}",
            "namespace": "com.acme",
            "fields": [
                {"name": "next", "type": ["null", f"com.acme.R{i + 1}"], "default": None}
                if i + 1 < records
                else {"name": "end", "type": "int"}
            ],
        }
        for i in range(records)
    ]
    return aspect({"name": "all", "type": {"type": "array", "items": members}, "default": []})


def test_types_nested_past_the_limit_through_named_references_are_refused(registry):
    assert refusals(registry, model_set(chain(60))) == []
    [(rule, path)] = refusals(registry, model_set(chain(120)))
    assert rule == "SchemaTooDeep" and path.startswith("$.fields.all.type.items[com.acme.R0].fields.next.type")


def doubling(levels: int) -> dict[str, Any]:
    """Each record has two fields of the next one: 2**levels field paths as the indexer walks them."""
    node: Any = "int"
    for i in reversed(range(levels)):
        node = {
            "type": "record",
            "name": f"D{i}",
            "namespace": "com.acme",
            "fields": [
                {"name": "a", "type": node},
                {"name": "b", "type": f"com.acme.D{i + 1}" if i + 1 < levels else "int"},
            ],
        }
    return aspect({"name": "root", "type": node})


def test_a_schema_the_indexer_would_walk_too_long_is_refused(registry):
    assert 2**12 < MAX_FIELD_PATHS < 2**14
    assert refusals(registry, model_set(doubling(11))) == []
    assert refusals(registry, model_set(doubling(14))) == [("SchemaTooLarge", "$")]


# --- annotations --------------------------------------------------------------------------------------------------
STARS = {"name": "stars", "type": "int"}
TAGS = {"type": "array", "items": "string"}
OWNER = {
    "type": "record",
    "name": "Owner",
    "fields": [{"name": "urn", "type": "string"}, {"name": "removed", "type": "boolean"}],
}


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        # the search documents' own fields
        (
            {"name": "removed", "type": "boolean", "Searchable": {}},
            ("ReservedSearchField", "$.fields.removed.Searchable"),
        ),
        (
            {"name": "x", "type": "string", "Searchable": {"fieldName": "urn"}},
            ("ReservedSearchField", "$.fields.x.Searchable.fieldName"),
        ),
        (
            {"name": "x", "type": "string", "Searchable": {"fieldName": "entityRemoved"}},
            ("ReservedSearchField", "$.fields.x.Searchable.fieldName"),
        ),
        (
            {"name": "x", "type": "string", "Searchable": {"hasValuesFieldName": "aspectFields"}},
            ("ReservedSearchField", "$.fields.x.Searchable.hasValuesFieldName"),
        ),
        (
            {"name": "x", "type": TAGS, "Searchable": {"/*": {"numValuesFieldName": "aspectVersions"}}},
            ("ReservedSearchField", '$.fields.x.Searchable["/*"].numValuesFieldName'),
        ),
        (
            {
                "name": "owner",
                "type": OWNER,
                "Searchable": {"/removed": {"fieldType": "BOOLEAN"}},
            },  # an override's field
            ("ReservedSearchField", '$.fields.owner.Searchable["/removed"]'),
        ),
        (
            {
                "name": "owner",
                "type": {**OWNER, "fields": [{**OWNER["fields"][0], "Searchable": {}}]},
            },  # a nested field
            ("ReservedSearchField", "$.fields.owner.type.fields.urn.Searchable"),
        ),
        # the types of the properties the indexer reads
        ({"name": "x", "type": "string", "Searchable": "yes"}, ("InvalidAnnotation", "$.fields.x.Searchable")),
        (
            {"name": "x", "type": "string", "Searchable": {"fieldType": "text"}},
            ("InvalidAnnotation", "$.fields.x.Searchable.fieldType"),
        ),
        (
            {"name": "x", "type": "string", "Searchable": {"boostScore": -1}},
            ("InvalidAnnotation", "$.fields.x.Searchable.boostScore"),
        ),
        (
            {"name": "x", "type": "string", "Searchable": {"boostScore": True}},
            ("InvalidAnnotation", "$.fields.x.Searchable.boostScore"),
        ),
        (
            {"name": "x", "type": "string", "Searchable": {"enableAutocomplete": 1}},
            ("InvalidAnnotation", "$.fields.x.Searchable.enableAutocomplete"),
        ),
        (
            {"name": "x", "type": "string", "Searchable": {"fieldName": 5}},
            ("InvalidAnnotation", "$.fields.x.Searchable.fieldName"),
        ),
        (
            {"name": "x", "type": "string", "Searchable": {"fieldName": "_id"}},
            ("InvalidAnnotation", "$.fields.x.Searchable.fieldName"),
        ),
        (
            {"name": "x", "type": "string", "Searchable": {"fieldName": "a.b"}},
            ("InvalidAnnotation", "$.fields.x.Searchable.fieldName"),
        ),
        ({"name": "_x", "type": "string", "Searchable": {}}, ("InvalidAnnotation", "$.fields._x.Searchable")),
        (
            {"name": "x", "type": "string", "Searchable": {"weightsPerFieldValue": {"true": "high"}}},
            ("InvalidAnnotation", "$.fields.x.Searchable.weightsPerFieldValue"),
        ),
        (
            {"name": "x", "type": "string", "Relationship": {"name": ["OwnedBy"]}},
            ("InvalidAnnotation", "$.fields.x.Relationship.name"),
        ),
        (
            {"name": "x", "type": "string", "Relationship": {"name": "Owned By"}},
            ("InvalidAnnotation", "$.fields.x.Relationship.name"),
        ),
        (
            {"name": "x", "type": "string", "Relationship": {"name": "OwnedBy", "isLineage": "yes"}},
            ("InvalidAnnotation", "$.fields.x.Relationship.isLineage"),
        ),
        (
            {"name": "x", "type": "string", "Relationship": {"name": "OwnedBy", "via": 3}},
            ("InvalidAnnotation", "$.fields.x.Relationship.via"),
        ),
        (
            {"name": "x", "type": TAGS, "Relationship": {"/*": {"entityTypes": ["corpuser"]}}},
            ("InvalidAnnotation", '$.fields.x.Relationship["/*"].name'),
        ),
        ({"name": "x", "type": "string", "TimeseriesField": []}, ("InvalidAnnotation", "$.fields.x.TimeseriesField")),
    ],
)
def test_annotations_the_indexer_reads(registry, field, expected):
    assert refusals(registry, model_set(aspect(STARS, field))) == [expected]


@pytest.mark.parametrize(
    "field",
    [
        {"name": "removed", "type": "boolean"},  # not a search field
        {"name": "removed", "type": "boolean", "Searchable": {"fieldName": "ratingRemoved", "addToFilters": "true"}},
        {"name": "x", "type": "string", "Searchable": {"fieldType": "MAP_ARRAY", "fieldName": "removed"}},  # no field
        {"name": "x", "type": TAGS, "Searchable": {"/*": {"v3": {"searchLabel": "urn"}}}},  # search-v3 hints only
        {
            "name": "x",
            "type": TAGS,
            "Searchable": {
                "/*": {
                    "fieldName": "ratingTags",
                    "fieldType": "URN",
                    "boostScore": 2,
                    "queryByDefault": False,
                    "hasValuesFieldName": "hasTags",
                }
            },
            "Relationship": {"/*": {"name": "RatedBy", "entityTypes": ["corpuser"], "isLineage": False, "via": "x"}},
        },
        {
            "name": "urn",
            "type": "string",
            "TimeseriesField": {},
        },  # a timeseries point's own field, of a versioned aspect
    ],
)
def test_valid_annotations_pass(registry, field):
    assert refusals(registry, model_set(aspect(STARS, field))) == []


def test_a_timeseries_field_named_as_a_point_s_own(registry):
    usage = aspect(
        {"name": "timestampMillis", "type": "long"},
        {"name": "urn", "type": "string", "TimeseriesField": {}},
        name="acmeUsage",
        type="timeseries",
    )
    assert refusals(registry, model_set(usage)) == [("ReservedSearchField", "$.fields.urn.TimeseriesField")]
    usage["fields"][1]["name"] = "runId"  # DataHub's own timeseries aspects declare it
    assert refusals(registry, model_set(usage)) == []


@pytest.mark.parametrize(
    ("annotation", "path"),
    [
        ({"renderSpec": {"key": 5}}, "$.Aspect.renderSpec.key"),
        ({"renderSpec": "table"}, "$.Aspect.renderSpec"),
        ({"autoRender": "sometimes"}, "$.Aspect.autoRender"),
        ({"type": "timeSeries"}, "$.Aspect.type"),
        ({"entityAspects": "acmeRating"}, "$.Aspect.entityAspects"),
    ],
)
def test_the_aspect_annotation(registry, annotation, path):
    assert refusals(registry, model_set(aspect(**annotation))) == [("InvalidAnnotation", path)]


def test_datahub_s_own_aspects_pass_but_for_the_soft_delete_flag(registry):
    """DataHub's aspects copied as runtime ones: only `status` (whose `removed` is the search documents' flag) is
    refused."""
    refused = {
        (r.aspect, r.rule, r.path) for spec in registry.aspects.values() for r in FIELD_ANNOTATIONS.check(spec, DEPTH)
    }
    assert refused == {("status", "ReservedSearchField", "$.fields.removed.Searchable")}


def test_a_build_that_raises_is_a_refusal(registry, monkeypatch):
    """Whatever the build raises (not only the problems it lists) refuses the set: never a 500."""
    from app.registry import compatibility

    def build_registry(base, models):
        raise AttributeError("'int' object has no attribute 'lower'")

    monkeypatch.setattr(compatibility, "build_registry", build_registry)
    found = check_models(registry, EMPTY, model_set(aspect()), max_depth=DEPTH).refusals
    assert [(r.rule, r.message) for r in found] == [
        ("DoesNotCompile", "the model set does not build: AttributeError: 'int' object has no attribute 'lower'")
    ]
