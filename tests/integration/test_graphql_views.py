"""DataHub Views in the GraphQL entity searches (`viewUrn`): the view's entity types and filter narrow the search,
a PERSONAL view is its creator's, and a view that does not exist is an error naming `viewUrn`."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import bearer, ds, mcp, propose
from tests.integration.test_graphql import chart, gql, key

pytestmark = pytest.mark.asyncio

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
SEARCH = """
query search($view: String, $types: [EntityType!], $orFilters: [AndFilterInput!]) {
  searchAcrossEntities(input: {query: "*", count: 100, viewUrn: $view, types: $types, orFilters: $orFilters}) {
    total searchResults { entity { urn } }
  }
}"""


def view(view_id: str, *, types: list[str], groups: list[list[dict[str, Any]]], personal_of: str | None = None) -> dict:
    info = {
        "name": view_id,
        "type": "PERSONAL" if personal_of else "GLOBAL",
        "definition": {"entityTypes": types, "filter": {"or": [{"and": group} for group in groups]}},
        "created": {"time": 1, "actor": personal_of or "urn:li:corpuser:admin"},
        "lastModified": {"time": 1, "actor": personal_of or "urn:li:corpuser:admin"},
    }
    return mcp("dataHubViewInfo", info, urn=f"urn:li:dataHubView:{view_id}", entity="dataHubView")


async def urns_of(client, headers: dict[str, str] | None = None, **variables: Any) -> set[str] | list[dict[str, Any]]:
    body = await gql(client, SEARCH, variables, **({"headers": headers} if headers else {}))
    if "errors" in body:
        return body["errors"]
    return {r["entity"]["urn"] for r in body["data"]["searchAcrossEntities"]["searchResults"]}


async def test_a_view_narrows_the_search(app, client):
    await propose(
        client,
        key("v.hive_prod"),
        key("v.hive_dev", env="DEV"),
        key("v.kafka", "kafka"),
        chart("v_chart"),
        view(
            "hive",
            types=["dataset"],
            groups=[[{"field": "platform", "values": ["urn:li:dataPlatform:hive"], "condition": "EQUAL"}]],
        ),
        view(
            "prod_or_kafka",
            types=[],
            groups=[
                [{"field": "origin", "values": ["PROD"]}],
                [{"field": "platform", "values": ["urn:li:dataPlatform:kafka"]}],
            ],
        ),
        view("mine", types=["chart"], groups=[], personal_of="urn:li:corpuser:alice"),
        headers=SYNC,
    )
    hive_prod, hive_dev, kafka, the_chart = (
        ds("v.hive_prod"),
        ds("v.hive_dev", env="DEV"),
        ds("v.kafka", "kafka"),
        "urn:li:chart:(looker,v_chart)",
    )
    everything = {hive_prod, hive_dev, kafka, the_chart}
    assert await urns_of(client) >= everything

    # the view's types and filter
    assert await urns_of(client, view="urn:li:dataHubView:hive") == {hive_prod, hive_dev}
    # its OR groups, each ANDed with each of the search's own groups
    assert await urns_of(client, view="urn:li:dataHubView:prod_or_kafka") >= {hive_prod, kafka}
    assert hive_dev not in await urns_of(client, view="urn:li:dataHubView:prod_or_kafka")
    narrowed = await urns_of(
        client,
        view="urn:li:dataHubView:prod_or_kafka",
        types=["DATASET"],
        orFilters=[{"and": [{"field": "platform", "values": ["urn:li:dataPlatform:hive"]}]}],
    )
    assert narrowed == {hive_prod}
    # types asked for outside the view's: nothing
    assert await urns_of(client, view="urn:li:dataHubView:hive", types=["CHART"]) == set()

    # a PERSONAL view is its creator's (and an admin's)
    alice = await bearer(app, "reader", actor="urn:li:corpuser:alice")
    bob = await bearer(app, "reader", actor="urn:li:corpuser:bob")
    assert await urns_of(client, alice, view="urn:li:dataHubView:mine") >= {the_chart}
    assert not (await urns_of(client, alice, view="urn:li:dataHubView:mine")) & {hive_prod, kafka}
    refused = await urns_of(client, bob, view="urn:li:dataHubView:mine")
    assert refused[0]["extensions"]["code"] == 404 and "urn:li:dataHubView:mine" in refused[0]["message"]
    assert await urns_of(client, view="urn:li:dataHubView:mine") >= {the_chart}  # the admin

    # a view that does not exist, or a URN that is not a view's: an error naming viewUrn, not a wider search
    for urn, code in (("urn:li:dataHubView:nope", 404), ("urn:li:tag:x", 400), ("not a urn", 400)):
        errors = await urns_of(client, view=urn)
        assert errors[0]["extensions"]["code"] == code, errors
