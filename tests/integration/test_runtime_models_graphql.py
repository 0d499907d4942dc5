"""GraphQL follows the runtime model set: a runtime aspect is read through its entity's `aspects` (DataHub's
RawAspect), a runtime entity type is an object type of the schema (answered by `entity(urn:)` and searched as OTHER),
the base types stay as they are, and an aspect the set removed is answered as DataHub answers an unknown name."""

from __future__ import annotations

import copy

import orjson
import pytest

from app.registry import load_registry
from app.settings import Settings
from tests.integration.test_runtime_models import DATASET, MODEL_SET, MODELS

WIDGET = "urn:li:acmeWidget:w1"
SYNC = {"X-DataHub-Sync-Index-Update": "true"}
OTHER_DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,models.other,PROD)"
INTROSPECT = """{ dataset: __type(name: "Dataset") { fields { name args { name } type { name kind } } }
                  entityType: __type(name: "EntityType") { enumValues { name } } }"""
WIDGET_QUERY = """query($urn: String!) { entity(urn: $urn) { urn type
                    ... on AcmeWidget { aspects { aspectName payload } } } }"""


@pytest.fixture(scope="module")
def registry():
    """A registry of this module's own: the runtime models change it in place (the session's stays the base)."""
    return load_registry(Settings().registry_path)


async def graphql(client, query: str, **variables) -> dict:
    response = await client.post("/api/graphql", json={"query": query, "variables": variables})
    assert response.status_code == 200, response.text
    return response.json()


async def test_runtime_aspects_and_entities_through_graphql(client):
    before = await graphql(client, INTROSPECT)
    unknown = await graphql(client, WIDGET_QUERY, urn=WIDGET)
    assert "AcmeWidget" in unknown["errors"][0]["message"]  # not a type yet

    assert (await client.post(MODELS, json=MODEL_SET)).status_code == 200
    rated = await client.post(f"/openapi/v3/entity/dataset/{DATASET}/acmeRating", json={"value": {"stars": 4}})
    assert rated.status_code in (200, 201), rated.text
    widget = await client.post(
        "/openapi/v3/entity/acmeWidget",
        params={"async": "false"},
        headers=SYNC,
        json=[{"urn": WIDGET, "acmeRating": {"value": {"stars": 5}}}],
    )
    assert widget.status_code == 200, widget.text

    # a runtime aspect of a base entity, through the entity's `aspects`; an unknown name is left out
    answer = await graphql(
        client,
        """query($urn: String!) { dataset(urn: $urn) {
        aspects(input: {aspectNames: ["acmeRating", "noSuchAspect"]}) { aspectName payload renderSpec { key } } } }""",
        urn=DATASET,
    )
    assert answer["data"]["dataset"]["aspects"] == [
        {"aspectName": "acmeRating", "payload": '{"stars":4}', "renderSpec": None}
    ]

    # the new entity type: an object type implementing Entity, typed OTHER (DataHub's EntityType is unchanged)
    found = (await graphql(client, WIDGET_QUERY, urn=WIDGET))["data"]["entity"]
    assert found["urn"] == WIDGET and found["type"] == "OTHER"
    assert {a["aspectName"]: orjson.loads(a["payload"]) for a in found["aspects"]} == {
        "acmeWidgetKey": {"id": "w1"},
        "acmeRating": {"stars": 5},
    }
    searched = await graphql(
        client,
        """{ searchAcrossEntities(input: {types: [OTHER], query: "*"}) {
        total searchResults { entity { urn type ... on AcmeWidget { aspects(input: {aspectNames: ["acmeRating"]}) {
        payload } } } } } }""",
    )
    assert searched["data"]["searchAcrossEntities"]["searchResults"] == [
        {"entity": {"urn": WIDGET, "type": "OTHER", "aspects": [{"payload": '{"stars":5}'}]}}
    ]

    # the base types' schema is as it was
    assert await graphql(client, INTROSPECT) == before


async def test_a_removed_aspect_is_answered_as_an_unknown_name(client):
    assert (await client.post(MODELS, json=MODEL_SET)).status_code == 200
    query = """query($urn: String!, $names: [String!]) { dataset(urn: $urn) {
               aspects(input: {aspectNames: $names}) { aspectName } } }"""
    written = await client.post(
        f"/openapi/v3/entity/dataset/{OTHER_DATASET}/status", json={"value": {"removed": False}}
    )
    assert written.status_code in (200, 201), written.text
    unknown = await graphql(client, query, urn=OTHER_DATASET, names=["noSuchAspect"])
    assert unknown == {"data": {"dataset": {"aspects": []}}}

    removed = copy.deepcopy(MODEL_SET)  # no dataset holds a value of it: the removal is accepted
    removed["entities"] = [e for e in removed["entities"] if e["name"] != "dataset"]
    assert (await client.post(MODELS, json=removed)).status_code == 200, "removal refused"
    assert await graphql(client, query, urn=OTHER_DATASET, names=["acmeRating"]) == unknown
    # the entity type removed with the set: no longer a type of the schema
    assert (await graphql(client, query, urn=OTHER_DATASET, names=["status"]))["data"]["dataset"]["aspects"] == [
        {"aspectName": "status"}
    ]
    assert (await client.post(MODELS, json={"aspects": [], "entities": []})).status_code == 200
    assert "AcmeWidget" in (await graphql(client, WIDGET_QUERY, urn=WIDGET))["errors"][0]["message"]
