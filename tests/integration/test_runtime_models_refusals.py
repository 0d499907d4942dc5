"""What a runtime model set may hold, checked identically by the dry run and the apply (one function,
app.write.runtime_models._checked), each refusal a 400 naming the rule and the path, nothing stored: names of
entities and aspects (one pattern, and lengths the columns, URNs, index names and topic names they reach can hold),
the nesting of a schema (METALEDGER_MAX_JSON_DEPTH), the annotations the indexer and GraphQL read (their properties'
types, search document fields of the search documents' own), and the GraphQL schema the set makes. A process that
meets a stored set whose GraphQL schema does not build (stored before these checks) goes on serving GraphQL."""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import httpx
import orjson
import pytest
from graphql import GraphQLError

from app.main import create_app
from app.registry import load_registry
from app.registry.runtime import MODELS_ASPECT, RuntimeModelSet
from app.settings import Settings
from app.write.rules import MODELS_URN
from tests.integration.test_runtime_models import DATASET, MODEL_SET, MODELS, RATING, WIDGET_KEY

# The longest names (app.registry.compatibility): an entity's goes into URNs, index and topic names with an aspect's.
MAX_ENTITY_NAME_CHARS, MAX_ASPECT_NAME_CHARS = 64, 100


@pytest.fixture(scope="module")
def registry():
    """A registry of this module's own: the runtime models change it in place (the session's stays the base)."""
    return load_registry(Settings().registry_path)


async def refused_alike(client, models: dict[str, Any]) -> list[dict[str, Any]]:
    """The dry run and the apply both refuse `models` with one 400 (the same issues), and nothing is stored."""
    dry = await client.post(MODELS, params={"dryRun": "true"}, json=models)
    applied = await client.post(MODELS, json=models)
    assert dry.status_code == 400, dry.text
    assert applied.status_code == 400, applied.text
    assert dry.json() == applied.json()
    assert (await client.get(MODELS)).json()["version"] == 0
    return applied.json()["issues"]


async def applies(client, models: dict[str, Any]) -> dict[str, Any]:
    dry = await client.post(MODELS, params={"dryRun": "true"}, json=models)
    assert dry.status_code == 200, dry.text
    applied = await client.post(MODELS, json=models)
    assert applied.status_code == 200, applied.text
    return applied.json()


def with_widget(name: str) -> dict[str, Any]:
    models = copy.deepcopy(MODEL_SET)
    models["entities"][1]["name"] = name
    return models


def aspect_named(name: str, **schema: Any) -> dict[str, Any]:
    return {**RATING, "Aspect": {"name": name}, **schema}


def rating_with(*fields: dict[str, Any], **aspect: Any) -> dict[str, Any]:
    return {
        "aspects": [{"schema": {**RATING, "fields": list(fields), **aspect}}],
        "entities": [{"name": "dataset", "aspects": ["acmeRating"]}],
    }


# --- names ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    ["acmé", "acme-widget", "1widget", "acme widget", "_acmeWidget", "acme.widget", "w" * (MAX_ENTITY_NAME_CHARS + 1)],
)
async def test_an_entity_name_outside_the_pattern_is_refused_naming_its_path(client, name):
    """`acmé` applied, then every GraphQL request of a process that started after it was a 500."""
    issues = await refused_alike(client, with_widget(name))
    assert issues[0]["path"] == "$.entities[1].name" and issues[0]["message"].startswith("InvalidName")
    assert issues[0]["expected"].startswith("^[A-Za-z][A-Za-z0-9_]*$")


async def test_an_entity_name_in_the_pattern_applies(client):
    name = "acme_Widget2" + "w" * (MAX_ENTITY_NAME_CHARS - 12)
    assert len(name) == MAX_ENTITY_NAME_CHARS
    await applies(client, with_widget(name))
    urn = f"urn:li:{name}:w1"
    written = await client.post(
        f"/openapi/v3/entity/{name}",
        params={"async": "false"},
        json=[{"urn": urn, "acmeRating": {"value": {"stars": 5}}}],
    )
    assert written.status_code == 200, written.text
    type_name = name[:1].upper() + name[1:]
    answer = await client.post(
        "/api/graphql",
        json={
            "query": f"query($urn: String!) {{ entity(urn: $urn) {{ urn "
            f"... on {type_name} {{ aspects {{ aspectName }} }} }} }}",
            "variables": {"urn": urn},
        },
    )
    assert answer.status_code == 200 and answer.json()["data"]["entity"]["urn"] == urn, answer.text


async def test_a_key_aspect_naming_its_entity_outside_the_pattern_is_refused(client):
    key = {**WIDGET_KEY, "Aspect": {"name": "acmeGizmoKey", "keyForEntity": "acmé"}}
    issues = await refused_alike(client, {"aspects": [{"schema": RATING}, {"schema": key}], "entities": []})
    assert issues[0]["path"] == "$.aspects[1].schema.Aspect.keyForEntity"
    assert issues[0]["message"].startswith("InvalidName")


@pytest.mark.parametrize("name", ["acmé", "acme-rating", "9rating", "r" * (MAX_ASPECT_NAME_CHARS + 1), "r" * 201])
async def test_an_aspect_name_outside_the_pattern_or_too_long_is_refused(client, name):
    """A 201-character aspect name applied, then every write of it was a 500 (metadata_aspect_v2.aspect holds 200)."""
    models = {"aspects": [{"schema": aspect_named(name)}], "entities": [{"name": "dataset", "aspects": [name]}]}
    issues = await refused_alike(client, models)
    assert issues[0]["path"] == "$.aspects[0].schema.Aspect.name" and issues[0]["message"].startswith("InvalidName")
    assert len(issues[0]["found"]) <= 250  # clipped


async def test_an_aspect_name_of_the_longest_length_applies_and_is_written(client):
    name = "r" * MAX_ASPECT_NAME_CHARS
    await applies(
        client, {"aspects": [{"schema": aspect_named(name)}], "entities": [{"name": "dataset", "aspects": [name]}]}
    )
    written = await client.post(f"/openapi/v3/entity/dataset/{DATASET}/{name}", json={"value": {"stars": 4}})
    assert written.status_code in (200, 201), written.text
    read = await client.get(f"/openapi/v3/entity/dataset/{DATASET}/{name}")
    assert read.status_code == 200 and read.json()["value"] == {"stars": 4}, read.text


# --- nesting ----------------------------------------------------------------------------------------------------
def nested(depth: int) -> dict[str, Any]:
    """An aspect schema nested `depth` JSON levels deep (the record, its fields, a field, then arrays)."""
    node: Any = "int"
    for _ in range(depth - 3):
        node = {"type": "array", "items": node}
    return {
        "type": "record",
        "name": "Deep",
        "namespace": "com.acme",
        "Aspect": {"name": "acmeDeep"},
        "fields": [{"name": "v", "type": node, "default": []}],
    }


@pytest.mark.parametrize("depth", [101, 300])
async def test_a_schema_nested_past_the_limit_is_refused_alike_by_the_dry_run_and_the_apply(client, depth):
    """A schema nested 300 levels (sent as JSON text) passed the dry run and the apply was a 500."""
    models = {
        "aspects": [{"schema": json.dumps(nested(depth))}],  # deeper than orjson writes
        "entities": [{"name": "dataset", "aspects": ["acmeDeep"]}],
    }
    issues = await refused_alike(client, models)
    assert issues[0]["message"].startswith("SchemaTooDeep") and issues[0]["aspect"] == "acmeDeep"
    assert (
        issues[0]["path"].startswith("$.fields[0].type.items.items") and issues[0]["expected"] == "at most 100 levels"
    )


async def test_a_schema_nested_to_the_limit_applies(client):
    applied = await applies(
        client,
        {
            "aspects": [{"schema": orjson.dumps(nested(100)).decode()}],
            "entities": [{"name": "dataset", "aspects": ["acmeDeep"]}],
        },
    )
    assert applied["diff"]["aspects"]["added"] == ["acmeDeep"] and applied["version"] == 1
    current = await client.get(MODELS)
    assert [a["name"] for a in current.json()["aspects"]] == ["acmeDeep"]


# --- annotations ------------------------------------------------------------------------------------------------
STARS = {"name": "stars", "type": "int"}


@pytest.mark.parametrize(
    ("field", "path"),
    [
        (
            {"name": "removed", "type": "boolean", "default": False, "Searchable": {"fieldType": "BOOLEAN"}},
            "$.fields.removed.Searchable",
        ),
        (
            {"name": "hidden", "type": "boolean", "default": False, "Searchable": {"fieldName": "removed"}},
            "$.fields.hidden.Searchable.fieldName",
        ),
        (
            {"name": "owner", "type": "string", "default": "", "Searchable": {"fieldName": "urn"}},
            "$.fields.owner.Searchable.fieldName",
        ),
        (
            {
                "name": "tags",
                "type": {"type": "array", "items": "string"},
                "default": [],
                "Searchable": {"/*": {"hasValuesFieldName": "entityRemoved"}},
            },
            '$.fields.tags.Searchable["/*"].hasValuesFieldName',
        ),
        (
            {
                "name": "tags",
                "type": {"type": "array", "items": "string"},
                "default": [],
                "Searchable": {"numValuesFieldName": "aspectVersions"},
            },
            "$.fields.tags.Searchable.numValuesFieldName",
        ),
        (
            {"name": "structuredProperties", "type": "string", "default": "", "Searchable": {}},
            "$.fields.structuredProperties.Searchable",
        ),
    ],
)
async def test_a_searchable_field_named_as_the_documents_own_fields_is_refused(client, field, path):
    """`removed` (the soft-delete flag the search reads) let a writer hide entities from search."""
    issues = await refused_alike(client, rating_with(STARS, field))
    assert issues[0]["message"].startswith("ReservedSearchField") and issues[0]["aspect"] == "acmeRating"
    assert issues[0]["path"] == path


@pytest.mark.parametrize(
    ("annotations", "path", "expected"),
    [
        ({"Relationship": {"name": 5}}, "$.fields.owner.Relationship.name", "a relationship name"),
        (
            {"Relationship": {"name": "OwnedBy", "entityTypes": "corpuser"}},
            "$.fields.owner.Relationship.entityTypes",
            "a list of strings",
        ),
        ({"Relationship": {"entityTypes": ["corpuser"]}}, "$.fields.owner.Relationship.name", "a relationship name"),
        ({"Relationship": "OwnedBy"}, "$.fields.owner.Relationship", "an object"),
        ({"Searchable": {"boostScore": "high"}}, "$.fields.owner.Searchable.boostScore", "a number"),
        ({"Searchable": {"fieldType": "FANCY"}}, "$.fields.owner.Searchable.fieldType", "one of"),
        ({"Searchable": {"fieldType": 7}}, "$.fields.owner.Searchable.fieldType", "one of"),
        ({"Searchable": {"addToFilters": "maybe"}}, "$.fields.owner.Searchable.addToFilters", "a boolean"),
        ({"Searchable": {"fieldName": "owner-name"}}, "$.fields.owner.Searchable.fieldName", "^[A-Za-z]"),
        ({"Searchable": {"/*": 5}}, '$.fields.owner.Searchable["/*"]', "an object"),
    ],
)
async def test_an_annotation_the_indexer_cannot_read_is_refused_naming_its_path(client, annotations, path, expected):
    """A Relationship whose name is not a string made every index update of its entities fail."""
    owner = {"name": "owner", "type": "string", "default": "", **annotations}
    issues = await refused_alike(client, rating_with(STARS, owner))
    assert issues[0]["message"].startswith("InvalidAnnotation") and issues[0]["aspect"] == "acmeRating"
    assert issues[0]["path"] == path and issues[0]["expected"].startswith(expected)


async def test_a_timeseries_field_named_as_the_points_own_fields_is_refused(client):
    usage = {
        "type": "record",
        "name": "Usage",
        "namespace": "com.acme",
        "Aspect": {"name": "acmeUsage", "type": "timeseries"},
        "fields": [
            {"name": "timestampMillis", "type": "long"},
            {"name": "urn", "type": "string", "TimeseriesField": {}},
        ],
    }
    issues = await refused_alike(
        client, {"aspects": [{"schema": usage}], "entities": [{"name": "dataset", "aspects": ["acmeUsage"]}]}
    )
    assert (
        issues[0]["message"].startswith("ReservedSearchField") and issues[0]["path"] == "$.fields.urn.TimeseriesField"
    )


async def test_a_render_spec_graphql_cannot_answer_is_refused(client):
    issues = await refused_alike(client, rating_with(STARS, Aspect={"name": "acmeRating", "renderSpec": {"key": 5}}))
    assert issues[0]["message"].startswith("InvalidAnnotation") and issues[0]["path"] == "$.Aspect.renderSpec.key"


async def test_valid_annotations_and_fields_named_as_document_fields_without_one_apply(client):
    """A field named `removed` that is not a search field, DataHub's own annotation forms (booleans as "true", path
    overrides, a Relationship with its properties) and a search field of another name apply."""
    fields = [
        STARS,
        {"name": "removed", "type": "boolean", "default": False},
        {
            "name": "hidden",
            "type": "boolean",
            "default": False,
            "Searchable": {
                "fieldName": "ratingHidden",
                "fieldType": "BOOLEAN",
                "addToFilters": True,
                "queryByDefault": "false",
                "boostScore": 2,
                "hasValuesFieldName": "hasRatingHidden",
            },
        },
        {
            "name": "owners",
            "type": {"type": "array", "items": "string"},
            "default": [],
            "Searchable": {"/*": {"fieldName": "ratingOwners", "fieldType": "URN"}},
            "Relationship": {"/*": {"name": "RatedBy", "entityTypes": ["corpuser"], "isLineage": False}},
        },
    ]
    await applies(client, rating_with(*fields, Aspect={"name": "acmeRating", "renderSpec": {"key": "stars"}}))
    written = await client.post(
        f"/openapi/v3/entity/dataset/{DATASET}/acmeRating",
        params={"async": "false"},
        headers={"X-DataHub-Sync-Index-Update": "true"},
        json={"value": {"stars": 1, "removed": True, "owners": ["urn:li:corpuser:ann"]}},
    )
    assert written.status_code in (200, 201), written.text
    found = await client.get("/openapi/v3/entity/dataset", params={"query": "*"})
    assert found.status_code == 200 and DATASET in found.text, found.text  # not hidden from search


# --- the GraphQL schema the set makes ----------------------------------------------------------------------------
async def test_a_set_whose_graphql_schema_does_not_build_is_refused(client, monkeypatch):
    """The backstop: whatever makes the GraphQL schema fail to build refuses the set, at the dry run and the apply."""
    from app.graphql import service

    real_build = service.build

    def build(runtime_sdl: str = "", runtime_types=None):
        if runtime_types and "acmeWidget" in runtime_types:
            raise GraphQLError("Syntax Error: Unexpected character: U+00E9.")
        return real_build(runtime_sdl, runtime_types)

    monkeypatch.setattr(service, "build", build)
    issues = await refused_alike(client, MODEL_SET)
    assert issues[0]["message"].startswith("GraphQLSchemaDoesNotBuild") and "U+00E9" in issues[0]["message"]
    assert issues[0]["path"] == "$.entities[1]"
    monkeypatch.setattr(service, "build", real_build)
    await applies(client, MODEL_SET)


async def test_graphql_serves_on_when_a_stored_set_does_not_build(client, app, db, caplog):
    """A set stored before these checks, whose entity type has no GraphQL name: a process that starts with it answers
    GraphQL (on the last schema that built: the base models'), and logs why."""
    written = await client.post(f"/openapi/v3/entity/dataset/{DATASET}/status", json={"value": {"removed": False}})
    assert written.status_code in (200, 201), written.text
    bad = RuntimeModelSet.from_json(with_widget("acmé"))
    await db.execute(
        """INSERT INTO metadata_aspect_v2 (urn, aspect, version, metadata, systemmetadata, createdon, createdby)
           VALUES ($1, $2, 0, $3, '{"version": "1"}', now(), 'urn:li:corpuser:datahub')""",
        MODELS_URN,
        MODELS_ASPECT,
        orjson.dumps(bad.to_stored()).decode(),
    )
    restarted_registry = load_registry(Settings().registry_path)
    restarted = create_app(app.state.settings, restarted_registry)
    async with restarted.router.lifespan_context(restarted):
        assert restarted_registry.has_entity("acmé") and restarted_registry.runtime_version == 1
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=restarted),
            base_url="http://metaledger",
            headers={"Authorization": client.headers["Authorization"]},
        ) as other:
            with caplog.at_level(logging.ERROR, logger="metaledger.graphql"):
                for _ in range(2):
                    answer = await other.post(
                        "/api/graphql",
                        json={
                            "query": "query($urn: String!) { dataset(urn: $urn) { urn } }",
                            "variables": {"urn": DATASET},
                        },
                    )
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["data"]["dataset"]["urn"] == DATASET
    # logged once by the restarted process (and by this module's app, when its watcher took the set up meanwhile)
    logged = [r for r in caplog.records if r.name == "metaledger.graphql" and "does not build" in r.getMessage()]
    assert 1 <= len(logged) <= 2 and logged[0].exc_info is not None, [r.getMessage() for r in caplog.records]
