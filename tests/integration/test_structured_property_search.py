"""Structured property values in search, on both search backends, over HTTP: found by `structuredProperties.<qualified
name>` filters on every protocol (GraphQL orFilters, the v3 scroll body, the v3 GET filter parameters), never by the
text query; a soft-deleted definition's filters refused and its values hidden from every read, an undelete bringing
both back at once."""

from __future__ import annotations

from typing import Any

from tests.helpers import ds, mcp, propose
from tests.search_server import backend_name, settings_overrides  # noqa: F401 - the module runs on both backends

TIER = "urn:li:structuredProperty:io.acryl.tier"
RETENTION = "urn:li:structuredProperty:retention"
TIER_FIELD = "structuredProperties.io.acryl.tier"
SYNC = {"X-DataHub-Sync-Index-Update": "true"}
GOLD, SILVER, PLAIN = ds("orders"), ds("customers"), ds("plain")
SEARCH = """query($orFilters: [AndFilterInput!], $query: String!) {
  searchAcrossEntities(input: {types: [DATASET], query: $query, count: 10, orFilters: $orFilters}) {
    total searchResults { entity { urn } } } }"""


def definition(urn: str, qualified_name: str, value_type: str, **extra: Any) -> dict[str, Any]:
    return mcp(
        "propertyDefinition",
        {
            "qualifiedName": qualified_name,
            "valueType": f"urn:li:dataType:datahub.{value_type}",
            "entityTypes": ["urn:li:entityType:datahub.dataset"],
            **extra,
        },
        urn=urn,
        entity="structuredProperty",
    )


def assigned(urn: str, *pairs: tuple[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return mcp("structuredProperties", {"properties": [{"propertyUrn": p, "values": v} for p, v in pairs]}, urn=urn)


def removed(urn: str, flag: bool) -> dict[str, Any]:
    return mcp("status", {"removed": flag}, urn=urn, entity="structuredProperty")


async def given_values(client) -> None:
    await propose(client, definition(TIER, "io.acryl.tier", "string"), definition(RETENTION, "retention", "number"))
    await propose(
        client,
        assigned(GOLD, (TIER, [{"string": "gold"}]), (RETENTION, [{"double": 30.0}])),
        assigned(SILVER, (TIER, [{"string": "silver"}]), (RETENTION, [{"double": 90.0}])),
        mcp("datasetKey", {"platform": "urn:li:dataPlatform:hive", "name": "plain", "origin": "PROD"}, urn=PLAIN),
        headers=SYNC,
    )


async def graphql_urns(client, *criteria: dict[str, Any], query: str = "*") -> list[str] | dict[str, Any]:
    """The URNs a search with one AND group of `criteria` finds, or the GraphQL errors."""
    response = await client.post(
        "/api/graphql",
        json={
            "query": SEARCH,
            "variables": {"query": query, "orFilters": [{"and": list(criteria)}] if criteria else None},
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    if body.get("errors"):
        return body
    return sorted(r["entity"]["urn"] for r in body["data"]["searchAcrossEntities"]["searchResults"])


async def scroll(client, criteria: list[dict[str, Any]], **body: Any) -> Any:
    return await client.post(
        "/openapi/v3/entity/scroll",
        params={"count": 10},
        json={"entities": ["dataset"], "filter": {"and": [{"criteria": criteria}]}, **body},
    )


async def test_values_are_found_by_their_filters_on_every_protocol_and_not_by_the_text_query(client):
    await given_values(client)
    assert await graphql_urns(client, {"field": TIER_FIELD, "values": ["gold"]}) == [GOLD]
    assert await graphql_urns(client, {"field": TIER_FIELD + ".keyword", "values": ["gold", "silver"]}) == sorted(
        [GOLD, SILVER]
    )
    assert await graphql_urns(client, {"field": TIER_FIELD, "values": ["gold"], "negated": True}) == sorted(
        [SILVER, PLAIN]
    )
    assert await graphql_urns(
        client, {"field": "structuredProperties.retention", "values": ["45"], "condition": "GREATER_THAN"}
    ) == [SILVER]
    assert await graphql_urns(client, {"field": "structuredProperties.retention", "values": ["30"]}) == [GOLD]
    assert await graphql_urns(client, {"field": TIER_FIELD, "values": [], "condition": "EXISTS"}) == sorted(
        [GOLD, SILVER]
    )
    assert await graphql_urns(client, query="silver") == []  # filters find values, the text query does not

    response = await scroll(client, [{"field": TIER_FIELD, "values": ["silver"]}])
    assert response.status_code == 200, response.text
    assert [e["urn"] for e in response.json()["entities"]] == [SILVER]
    response = await client.get("/openapi/v3/entity/dataset", params={f"filter_{TIER_FIELD}": "gold"})
    assert response.status_code == 200, response.text
    assert [e["urn"] for e in response.json()["entities"]] == [GOLD]

    # a value changed or removed is found by what it is now
    await propose(client, assigned(GOLD, (RETENTION, [{"double": 30.0}])), headers=SYNC)
    assert await graphql_urns(client, {"field": TIER_FIELD, "values": ["gold"]}) == []
    assert await graphql_urns(client, {"field": "structuredProperties.retention", "values": ["30"]}) == [GOLD]


async def test_a_soft_deleted_definition_s_filters_are_refused_and_its_values_hidden_until_it_is_undeleted(client):
    await given_values(client)
    await propose(client, removed(TIER, True))

    errors = await graphql_urns(client, {"field": TIER_FIELD, "values": ["gold"]})
    assert isinstance(errors, dict) and f"Cannot filter on deleted Structured Property {TIER}" in str(errors["errors"])
    response = await scroll(client, [{"field": TIER_FIELD, "values": ["gold"]}])
    assert response.status_code == 400, response.text
    (issue,) = response.json()["issues"]
    assert TIER in issue["message"] and issue["path"] == "$.filter.and[0].criteria[0].field"
    response = await client.get("/openapi/v3/entity/dataset", params={f"filter_{TIER_FIELD}": "gold"})
    assert response.status_code == 400 and TIER in response.text
    # another property's filters still answer
    assert await graphql_urns(client, {"field": "structuredProperties.retention", "values": ["30"]}) == [GOLD]

    # every read that hydrates entities leaves the deleted property's values out
    def shown(entities: list[dict[str, Any]]) -> dict[str, list[str]]:
        return {
            e["urn"]: [a["propertyUrn"] for a in e["structuredProperties"]["value"]["properties"]]
            for e in entities
            if "structuredProperties" in e
        }

    response = await scroll(
        client, [{"field": "structuredProperties.retention", "values": ["30"]}], aspects=["structuredProperties"]
    )
    assert shown(response.json()["entities"]) == {GOLD: [RETENTION]}
    response = await client.get("/openapi/v3/entity/dataset", params={"aspects": ["structuredProperties"], "count": 10})
    assert shown(response.json()["entities"]) == {GOLD: [RETENTION], SILVER: [RETENTION]}
    response = await client.post(
        "/openapi/v2/entity/batch/dataset", json={"urns": [GOLD], "aspectNames": ["structuredProperties"]}
    )
    (entity,) = response.json()["entities"]
    assert [a["propertyUrn"] for a in entity["aspects"]["structuredProperties"]["value"]["properties"]] == [RETENTION]

    await propose(client, removed(TIER, False))
    assert await graphql_urns(client, {"field": TIER_FIELD, "values": ["gold"]}) == [GOLD]
    response = await client.get("/openapi/v3/entity/dataset", params={"aspects": ["structuredProperties"], "count": 10})
    assert shown(response.json()["entities"]) == {GOLD: [TIER, RETENTION], SILVER: [TIER, RETENTION]}


AGGREGATE = """query($facets: [String], $orFilters: [AndFilterInput!]) {
  aggregateAcrossEntities(input: {types: [DATASET], query: "*", facets: $facets, orFilters: $orFilters}) {
    facets { field aggregations { value count } } } }"""


async def aggregate(client, facets: list[str], *criteria: dict[str, Any]) -> dict[str, dict[str, int]] | dict[str, Any]:
    """The facets aggregateAcrossEntities answers (field → value → count), or the GraphQL errors."""
    response = await client.post(
        "/api/graphql",
        json={
            "query": AGGREGATE,
            "variables": {"facets": facets, "orFilters": [{"and": list(criteria)}] if criteria else None},
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    if body.get("errors"):
        return body
    return {
        f["field"]: {a["value"]: a["count"] for a in f["aggregations"]}
        for f in body["data"]["aggregateAcrossEntities"]["facets"]
    }


async def test_facets_count_a_property_s_values_under_its_qualified_name(client):
    await given_values(client)
    await propose(client, assigned(ds("more"), (TIER, [{"string": "gold"}])), headers=SYNC)
    retention = "structuredProperties.retention"
    assert await aggregate(client, [TIER_FIELD, retention, "platform"]) == {
        TIER_FIELD: {"gold": 2, "silver": 1},
        retention: {"30.0": 1, "90.0": 1},
        "platform": {"urn:li:dataPlatform:hive": 4},
    }  # only the facets asked for
    # over the search's matches only
    assert await aggregate(
        client, [TIER_FIELD], {"field": retention, "values": ["45"], "condition": "GREATER_THAN"}
    ) == {TIER_FIELD: {"silver": 1}}
    # a property no match holds a value of has no facet; without `facets`, the filter fields' (no property's)
    assert await aggregate(client, ["structuredProperties.unused"]) == {}
    default = await aggregate(client, [])
    assert (
        "_entityType" in default
        and "platform" in default
        and not any(f.startswith("structuredProperties") for f in default)
    )


async def test_a_soft_deleted_property_s_facet_is_refused(client):
    await given_values(client)
    await propose(client, removed(TIER, True))
    errors = await aggregate(client, ["platform", TIER_FIELD])
    assert isinstance(errors, dict) and f"Cannot aggregate on deleted Structured Property {TIER}" in str(
        errors["errors"]
    )
    assert "$input.facets[1]" in str(errors["errors"])
    assert await aggregate(client, ["structuredProperties.retention"]) == {
        "structuredProperties.retention": {"30.0": 1, "90.0": 1}
    }
