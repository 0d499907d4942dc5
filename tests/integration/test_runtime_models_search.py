"""The search fields of runtime-model aspects (their `Searchable` annotations) follow the model set, on both search
backends, over HTTP: after an apply, a runtime aspect's values are found by the text query and by filters (GraphQL
orFilters, the v3 GET filter parameters), counted in facets, and a new entity type is searchable; on Elasticsearch/
OpenSearch the new fields are added to the live index's mapping in place. Base fields are unaffected, and an aspect
the set no longer holds is no longer a search field."""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest

from app.registry import load_registry
from app.search import documents
from app.search.elastic_mappings import index_name
from app.search.service import make_backend
from app.settings import Settings
from tests.helpers import ds
from tests.search_server import backend_name, settings_overrides  # noqa: F401 - the module runs on both backends

MODELS = "/openapi/v1/models"
SYNC = {"X-DataHub-Sync-Index-Update": "true"}
GOLD, SILVER = ds("rated.gold"), ds("rated.silver")
RATING = {
    "type": "record",
    "name": "Rating",
    "namespace": "com.acme",
    "Aspect": {"name": "acmeRating"},
    "fields": [
        {"name": "stars", "type": "int", "Searchable": {"fieldType": "COUNT", "fieldName": "ratingStars"}},
        {
            "name": "grade",
            "type": "string",
            "Searchable": {"fieldType": "KEYWORD", "addToFilters": True, "fieldName": "ratingGrade"},
        },
        {
            "name": "note",
            "type": ["null", "string"],
            "default": None,
            "Searchable": {"fieldType": "TEXT", "fieldName": "ratingNote"},
        },
    ],
}
WIDGET_KEY = {
    "type": "record",
    "name": "WidgetKey",
    "namespace": "com.acme",
    "Aspect": {"name": "acmeWidgetKey"},
    "fields": [
        {
            "name": "id",
            "type": "string",
            "Searchable": {"fieldType": "TEXT_PARTIAL", "boostScore": 10.0, "fieldName": "widgetId"},
        }
    ],
}
MODEL_SET = {
    "aspects": [{"schema": RATING}, {"schema": WIDGET_KEY}],
    "entities": [
        {"name": "dataset", "aspects": ["acmeRating"]},
        {"name": "acmeWidget", "keyAspect": "acmeWidgetKey", "aspects": ["acmeRating", "status"]},
    ],
}
SEARCH = """query($orFilters: [AndFilterInput!], $query: String!) {
  searchAcrossEntities(input: {types: [DATASET], query: $query, count: 10, orFilters: $orFilters}) {
    total searchResults { entity { urn } } facets { field aggregations { value count } } } }"""


@pytest.fixture(scope="module")
def registry():
    """A registry of this module's own: the runtime models change it in place (the session's stays the base)."""
    return load_registry(Settings().registry_path)


async def apply(client, models: dict[str, Any]) -> None:
    applied = await client.post(MODELS, json=models)
    assert applied.status_code == 200, applied.text


async def write(client, entity: str, urn: str, **aspects: dict[str, Any]) -> httpx.Response:
    item: dict[str, Any] = {"urn": urn, **{name: {"value": value} for name, value in aspects.items()}}
    return await client.post(f"/openapi/v3/entity/{entity}", params={"async": "false"}, headers=SYNC, json=[item])


async def rated(client) -> None:
    """GOLD and SILVER, named (a base aspect) and rated (the runtime one)."""
    for urn, grade, stars, note in ((GOLD, "gold", 5, "crunchy ledger"), (SILVER, "silver", 3, "soggy ledger")):
        written = await write(
            client,
            "dataset",
            urn,
            datasetProperties={"name": f"{grade} orders"},
            acmeRating={"grade": grade, "stars": stars, "note": note},
        )
        assert written.status_code == 200 and written.headers["X-Metaledger-Index-Update"] == "UPDATED", written.text


async def graphql(client, *criteria: dict[str, Any], query: str = "*") -> dict[str, Any]:
    """The search's URNs and facets (field -> value -> count), with one AND group of `criteria`."""
    response = await client.post(
        "/api/graphql",
        json={
            "query": SEARCH,
            "variables": {"query": query, "orFilters": [{"and": list(criteria)}] if criteria else None},
        },
    )
    assert response.status_code == 200 and not response.json().get("errors"), response.text
    found = response.json()["data"]["searchAcrossEntities"]
    return {
        "urns": sorted(r["entity"]["urn"] for r in found["searchResults"]),
        "facets": {f["field"]: {a["value"]: a["count"] for a in f["aggregations"]} for f in found["facets"]},
    }


async def v3_urns(client, entity: str = "dataset", **params: Any) -> list[str]:
    response = await client.get(f"/openapi/v3/entity/{entity}", params=params)
    assert response.status_code == 200, response.text
    return sorted(e["urn"] for e in response.json()["entities"])


def live_mapping(app, entity: str) -> dict[str, Any]:
    """The properties of the entity index's mapping as the search server holds it (OpenSearch only)."""
    settings = app.state.settings
    (index,) = (
        httpx.get(f"{settings.search_url}/{index_name(settings.search_index_prefix, entity)}/_mapping", timeout=30)
        .json()
        .values()
    )
    return index["mappings"]["properties"]


def live_index(app, entity: str) -> str:
    """The concrete index behind the entity type's alias (OpenSearch only)."""
    settings = app.state.settings
    (index,) = httpx.get(
        f"{settings.search_url}/_alias/{index_name(settings.search_index_prefix, entity)}", timeout=30
    ).json()
    return index


async def warmed(client) -> None:
    """Searches answered before an apply, as a running service has: whatever they derived from the registry must not
    outlive the apply."""
    assert "ratingGrade" not in (await graphql(client, query="orders"))["facets"]
    assert await v3_urns(client, filter_platform="urn:li:dataPlatform:hive") == []


async def test_a_runtime_aspect_s_fields_are_searched_filtered_and_faceted(client, app, backend_name):
    await warmed(client)
    await apply(client, MODEL_SET)
    await rated(client)

    assert (await graphql(client, {"field": "ratingGrade", "values": ["gold"]}))["urns"] == [GOLD]
    assert (await graphql(client, {"field": "ratingStars", "values": ["4"], "condition": "GREATER_THAN"}))["urns"] == [
        GOLD
    ]
    assert (await graphql(client, query="soggy"))["urns"] == [SILVER]  # a TEXT field: queried by default
    assert (await graphql(client))["facets"]["ratingGrade"] == {"gold": 1, "silver": 1}
    assert await v3_urns(client, filter_ratingGrade="silver") == [SILVER]
    # the base fields answer as before, beside the new ones
    assert (await graphql(client, query="gold orders"))["urns"][0] == GOLD
    assert await v3_urns(client, filter_platform="urn:li:dataPlatform:hive") == sorted([GOLD, SILVER])
    if backend_name == "opensearch":  # mapped as the annotations say, not as dynamic mapping would guess
        mapping = live_mapping(app, "dataset")
        assert mapping["ratingGrade"] == {"type": "keyword"} and mapping["ratingStars"] == {"type": "long"}
        assert mapping["ratingNote"]["type"] == "text" and mapping["name"]["type"] == "text"


async def test_a_new_entity_type_is_searchable(client):
    await warmed(client)
    await apply(client, MODEL_SET)
    for name, grade in (("w1", "gold"), ("w2", "bronze")):
        written = await write(
            client,
            "acmeWidget",
            f"urn:li:acmeWidget:{name}",
            acmeWidgetKey={"id": name},
            acmeRating={"grade": grade, "stars": 1},
        )
        assert written.status_code == 200 and written.headers["X-Metaledger-Index-Update"] == "UPDATED", written.text

    assert await v3_urns(client, "acmeWidget", filter_ratingGrade="gold") == ["urn:li:acmeWidget:w1"]
    assert await v3_urns(client, "acmeWidget", query="w2") == ["urn:li:acmeWidget:w2"]
    scrolled = await client.post(
        "/openapi/v3/entity/scroll",
        params={"count": 10},
        json={
            "entities": ["acmeWidget"],
            "filter": {"and": [{"criteria": [{"field": "ratingGrade", "values": ["bronze"]}]}]},
        },
    )
    assert scrolled.status_code == 200, scrolled.text
    assert [e["urn"] for e in scrolled.json()["entities"]] == ["urn:li:acmeWidget:w2"]


async def test_a_later_apply_s_new_field_is_searchable_and_the_mapping_grows_in_place(client, app, backend_name):
    await apply(client, MODEL_SET)
    await rated(client)
    assert (await graphql(client, {"field": "ratingGrade", "values": ["gold"]}))["urns"] == [GOLD]
    before = live_mapping(app, "dataset") if backend_name == "opensearch" else None

    models = copy.deepcopy(MODEL_SET)
    models["aspects"][0]["schema"]["fields"].append(
        {
            "name": "reviewer",
            "type": "string",
            "default": "",
            "Searchable": {"fieldType": "KEYWORD", "addToFilters": True, "fieldName": "ratingReviewer"},
        }
    )
    await apply(client, models)
    written = await write(
        client, "dataset", SILVER, acmeRating={"grade": "silver", "stars": 3, "reviewer": "urn:li:corpuser:ann"}
    )
    assert written.status_code == 200 and written.headers["X-Metaledger-Index-Update"] == "UPDATED", written.text

    assert (await graphql(client, {"field": "ratingReviewer", "values": ["urn:li:corpuser:ann"]}))["urns"] == [SILVER]
    assert (await graphql(client, {"field": "ratingGrade", "values": ["gold"]}))["urns"] == [GOLD]
    if backend_name == "opensearch":
        after = live_mapping(app, "dataset")
        # one field added to the live index (no new index, nothing copied): everything else exactly as it was
        assert after.pop("ratingReviewer") == {"type": "keyword"}
        assert after == before and before["ratingGrade"] == {"type": "keyword"} and before["name"]["type"] == "text"
        # a process started now, on the same set, finds the grown index current: nothing created, nothing copied
        index = live_index(app, "dataset")
        started = make_backend(app.state.settings, app.state.registry, None)
        try:
            await started.start()
        finally:
            await started.close()
        assert live_index(app, "dataset") == index


async def test_an_aspect_the_set_no_longer_holds_is_refused_and_no_search_field(client, app):
    await warmed(client)
    await apply(client, MODEL_SET)
    assert "ratingGrade" in documents.filter_fields(app.state.registry, "dataset")
    without = {
        "aspects": [{"schema": WIDGET_KEY}],
        "entities": [{"name": "acmeWidget", "keyAspect": "acmeWidgetKey", "aspects": ["status"]}],
    }
    await apply(client, without)

    refused = await write(client, "dataset", GOLD, acmeRating={"grade": "gold", "stars": 5})
    assert refused.status_code == 400, refused.text
    assert "ratingGrade" not in documents.filter_fields(app.state.registry, "dataset")
    written = await write(client, "dataset", GOLD, datasetProperties={"name": "gold orders"})
    assert written.status_code == 200, written.text
    assert (await graphql(client, query="gold"))["urns"] == [GOLD]
    widget = await write(client, "acmeWidget", "urn:li:acmeWidget:w1", acmeWidgetKey={"id": "w1"})
    assert widget.status_code == 200, widget.text
    assert await v3_urns(client, "acmeWidget", query="w1") == ["urn:li:acmeWidget:w1"]
