"""View authorization (METALEDGER_VIEW_AUTHORIZATION, DataHub's VIEW_AUTHORIZATION_ENABLED): a caller that is not an
admin reads only the entities an ACTIVE policy grants it VIEW_ENTITY_PAGE on — entity reads, searches with their
totals and facets, and the change feed alike."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import bearer, ds, eventually, mcp, policy_mcp, propose

ALICE, BOB, DAVE = "urn:li:corpuser:alice", "urn:li:corpuser:bob", "urn:li:corpuser:dave"
H1, H2, S1 = ds("views.a", "hive"), ds("views.b", "hive"), ds("views.c", "snowflake")
SEARCH = """query s($input: SearchAcrossEntitiesInput!) {
  searchAcrossEntities(input: $input) {
    total
    searchResults { entity { urn } }
    facets { field aggregations { value count } }
  }
}"""


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    return {"view_authorization": True}


def view_policy(name: str, actors: dict[str, Any], resources: dict[str, Any] | None = None) -> dict[str, Any]:
    return policy_mcp(
        name, privileges=["VIEW_ENTITY_PAGE"], actors=actors, **({"resources": resources} if resources else {})
    )


@pytest.fixture
async def catalog(client):
    hive = {
        "filter": {"criteria": [{"field": "PLATFORM", "values": ["urn:li:dataPlatform:hive"], "condition": "EQUALS"}]}
    }
    await propose(
        client,
        *(
            mcp("datasetProperties", {"name": urn.split(",")[1], "customProperties": {}, "tags": []}, urn, sync=True)
            for urn in (H1, H2, S1)
        ),
        mcp("ownership", {"owners": [{"owner": BOB, "type": "DATAOWNER"}]}, S1, sync=True),
        view_policy("alice-sees-hive", {"users": [ALICE]}, hive),
        view_policy("owners-see-theirs", {"resourceOwners": True}),
    )


async def search(anonymous, headers) -> dict[str, Any]:
    variables = {"input": {"types": ["DATASET"], "query": "views", "start": 0, "count": 10}}
    answer = await anonymous.post("/api/graphql", json={"query": SEARCH, "variables": variables}, headers=headers)
    assert "errors" not in answer.json(), answer.text
    return answer.json()["data"]["searchAcrossEntities"]


def platforms(found: dict[str, Any]) -> dict[str, int]:
    facet = next(f for f in found["facets"] if f["field"] == "platform")
    return {a["value"]: a["count"] for a in facet["aggregations"] if a["count"]}


async def test_entity_reads_show_only_what_a_policy_lets_the_caller_see(app, client, anonymous, catalog):
    callers = {name: await bearer(app, "reader", who) for name, who in (("alice", ALICE), ("bob", BOB), ("dave", DAVE))}
    seen = {
        who: {
            urn
            for urn in (H1, H2, S1)
            if (await anonymous.get(f"/openapi/v3/entity/dataset/{urn}", headers=headers)).status_code == 200
        }
        for who, headers in callers.items()
    }
    assert seen == {"alice": {H1, H2}, "bob": {S1}, "dave": set()}
    assert {
        urn for urn in (H1, H2, S1) if (await client.get(f"/openapi/v3/entity/dataset/{urn}")).status_code == 200
    } == {
        H1,
        H2,
        S1,
    }  # an admin sees everything


async def test_searches_count_and_facet_only_what_the_caller_may_see(app, client, anonymous, catalog):
    alice = await search(anonymous, await bearer(app, "reader", ALICE))
    assert alice["total"] == 2
    assert {r["entity"]["urn"] for r in alice["searchResults"]} == {H1, H2}
    assert platforms(alice) == {"urn:li:dataPlatform:hive": 2}
    bob = await search(anonymous, await bearer(app, "reader", BOB))
    assert bob["total"] == 1 and platforms(bob) == {"urn:li:dataPlatform:snowflake": 1}
    assert (await search(anonymous, await bearer(app, "reader", DAVE)))["total"] == 0
    admin = await search(client, {})
    assert admin["total"] == 3


async def test_a_writer_writes_what_it_may_not_see_but_does_not_read_it(app, client, anonymous, catalog):
    writer = await bearer(app, "writer", DAVE)
    written = await anonymous.post(
        "/openapi/v1/proposals", json=[mcp("status", {"removed": False}, H1)], headers=writer
    )
    assert written.status_code == 200  # editing is the writer role's; seeing is a policy's
    assert (await anonymous.get(f"/openapi/v3/entity/dataset/{H1}", headers=writer)).status_code == 404
    explained = await anonymous.get(
        "/openapi/v1/authz/explain", params={"privilege": "VIEW_ENTITY_PAGE", "resource": H1}, headers=writer
    )
    assert explained.json()["allowed"] is False
    assert "only a policy grants it" in explained.json()["reason"]


async def test_the_change_feed_carries_only_what_the_caller_may_see(app, anonymous, catalog, db):
    async def sequenced() -> bool:
        return await db.fetchval("SELECT count(*) FROM change_log_outbox WHERE feed_offset IS NULL") == 0

    assert await eventually(sequenced)
    alice = await bearer(app, "reader", ALICE)
    page = await anonymous.get("/openapi/v1/events/mcl", params={"after": 0, "limit": 1000}, headers=alice)
    assert page.status_code == 200, page.text
    urns = {event["urn"] for event in page.json()["events"] if event["urn"].startswith("urn:li:dataset:")}
    assert urns == {H1, H2}
