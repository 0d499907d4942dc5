"""What GraphQL entity searches say about their results, on both search backends: the facets (`_entityType`, each
filter field's counts summed over the types, the values' entities, `maxAggValues`, `skipAggregates`) and the
matched fields of a text query (`matchedFields`, none with `skipHighlighting`)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import ds, mcp, propose
from tests.integration.test_graphql import (  # noqa: F401 - both backends, on the module's shared indices
    backend_name,
    chart,
    gql,
    key,
    opensearch_overrides,
    settings_overrides,
)

pytestmark = pytest.mark.asyncio

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
SEARCH = """
query search($query: String!, $flags: SearchFlags) {
  searchAcrossEntities(input: {query: $query, count: 20, types: [DATASET, CHART], searchFlags: $flags}) {
    total
    searchResults { entity { urn } matchedFields { name value } }
    facets { field displayName aggregations { value count displayName entity { urn type ... on Tag { name } } } }
  }
}"""


def tagged(urn: str, *tags: str, entity: str = "dataset") -> dict[str, Any]:
    return mcp("globalTags", {"tags": [{"tag": f"urn:li:tag:{t}"} for t in tags]}, urn=urn, entity=entity)


async def search(client, query: str, **flags: Any) -> dict[str, Any]:
    body = await gql(client, SEARCH, {"query": query, "flags": flags or None})
    assert "errors" not in body, body
    return body["data"]["searchAcrossEntities"]


async def test_facets_count_every_match_by_type_and_field(client):
    hive = [key(f"f.h{i}") for i in range(3)]
    kafka = [key(f"f.k{i}", "kafka") for i in range(2)]
    charts = [chart(f"f_c{i}") for i in range(2)]
    await propose(
        client,
        *hive,
        *kafka,
        *charts,
        tagged(hive[0]["entityUrn"], "pii", "gold"),
        tagged(hive[1]["entityUrn"], "pii"),
        tagged(charts[0]["entityUrn"], "pii", entity="chart"),
        mcp("tagProperties", {"name": "Personal data"}, urn="urn:li:tag:pii", entity="tag"),
        headers=SYNC,
    )

    result = await search(client, "*")
    facets = {f["field"]: f for f in result["facets"]}
    assert result["facets"][0]["field"] == "_entityType"
    assert {a["value"]: a["count"] for a in facets["_entityType"]["aggregations"]} == {"DATASET": 5, "CHART": 2}
    assert [(a["value"], a["count"]) for a in facets["platform"]["aggregations"]] == [
        ("urn:li:dataPlatform:hive", 3),
        ("urn:li:dataPlatform:kafka", 2),
    ]  # most frequent first
    assert facets["platform"]["displayName"] == "Platform"
    tags = facets["tags"]["aggregations"]
    assert [(a["value"], a["count"]) for a in tags] == [("urn:li:tag:pii", 3), ("urn:li:tag:gold", 1)]  # summed
    assert tags[0]["entity"] == {"urn": "urn:li:tag:pii", "type": "TAG", "name": "Personal data"}
    assert all(f["aggregations"] for f in result["facets"])

    top = {f["field"]: f for f in (await search(client, "*", maxAggValues=1))["facets"]}
    assert [a["value"] for a in top["tags"]["aggregations"]] == ["urn:li:tag:pii"]
    assert (await search(client, "*", skipAggregates=True))["facets"] == []


async def test_matched_fields_of_a_text_query(client):
    urn = ds("m.orders")
    await propose(
        client,
        key("m.orders"),
        key("m.other"),
        mcp("datasetProperties", {"name": "Orders", "description": "every sold item"}, urn=urn),
        headers=SYNC,
    )
    result = await search(client, "orders")
    hits = {r["entity"]["urn"]: r["matchedFields"] for r in result["searchResults"]}
    assert urn in hits and ds("m.other") not in hits
    assert {"name": "name", "value": "Orders"} in hits[urn]
    assert all("orders" in m["value"].lower() for m in hits[urn])
    skipped = await search(client, "orders", skipHighlighting=True)
    assert all(r["matchedFields"] == [] for r in skipped["searchResults"])
    browse = await search(client, "*")
    assert all(r["matchedFields"] == [] for r in browse["searchResults"])
