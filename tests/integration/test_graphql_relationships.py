"""`relationships(input:)` on every entity type (DataHub's Entity interface): the graph's edges the service derives from
the aspects written (their Relationship annotations), OUTGOING and INCOMING, by type, paged, with what the edge
records of its creation; a related entity the caller may not see is left out of the page and of `total` (as DataHub
leaves out what its caller cannot view), and so, with `includeSoftDelete: false`, is one soft-deleted or absent.
On both search backends (the graph is theirs)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers import bearer, ds, mcp, propose
from tests.integration.search_indices import (  # noqa: F401 - the module runs on both backends, on shared indices
    backend_name,
    opensearch_overrides,
    settings_overrides,
)

pytestmark = pytest.mark.asyncio

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
ALICE, BOB = "urn:li:corpuser:alice", "urn:li:corpuser:bob"
SALES, NEVER = "urn:li:domain:sales", "urn:li:domain:never_written"
PRIVATE = "urn:li:dataHubView:alice_private"  # alice's PERSONAL view
T1, T2, T3, T4 = (ds(f"rel.t{i}") for i in range(1, 5))

RELATIONSHIPS = """
query rel($urn: String!, $types: [String!]!, $direction: RelationshipDirection!, $start: Int, $count: Int,
          $soft: Boolean) {
  entity(urn: $urn) {
    relationships(input: {types: $types, direction: $direction, start: $start, count: $count,
                          includeSoftDelete: $soft}) {
      start count total
      relationships { type direction entity { urn type } created { time actor } }
    }
  }
}"""


async def gql(client, query: str, variables: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    response = await client.post("/api/graphql", json={"query": query, "variables": variables or {}}, **kw)
    assert response.status_code == 200, response.text
    return response.json()


async def relationships(client, urn: str, direction: str, types: list[str], **variables: Any) -> dict[str, Any]:
    body = await gql(client, RELATIONSHIPS, {"urn": urn, "direction": direction, "types": types, **variables})
    assert "errors" not in body, body
    return body["data"]["entity"]["relationships"]


def related(result: dict[str, Any]) -> list[str]:
    return sorted(r["entity"]["urn"] if r["entity"] else None for r in result["relationships"])


async def write_graph(client) -> None:
    private = {
        "name": "private",
        "type": "PERSONAL",
        "definition": {"entityTypes": [], "filter": {"or": []}},
        "created": {"time": 1, "actor": ALICE},
        "lastModified": {"time": 1, "actor": ALICE},
    }
    upstream = {
        "upstreams": [
            {
                "dataset": T1,
                "type": "TRANSFORMED",
                "auditStamp": {"time": 5, "actor": BOB},
                "created": {"time": 1234, "actor": ALICE},
            }
        ]
    }
    await propose(
        client,
        mcp("domainProperties", {"name": "Sales"}, urn=SALES, entity="domain"),
        mcp("dataHubViewInfo", private, urn=PRIVATE, entity="dataHubView"),
        *(mcp("domains", {"domains": [SALES]}, urn=t) for t in (T1, T2, T3)),
        mcp("domains", {"domains": [SALES, NEVER, PRIVATE]}, urn=T4),
        mcp("status", {"removed": True}, urn=T3),  # soft-deleted
        mcp("upstreamLineage", upstream, urn=T2),
        mcp("glossaryNodeInfo", {"definition": "money"}, urn="urn:li:glossaryNode:finance", entity="glossaryNode"),
        mcp(
            "glossaryTermInfo",
            {"definition": "money in", "termSource": "INTERNAL", "parentNode": "urn:li:glossaryNode:finance"},
            urn="urn:li:glossaryTerm:revenue",
            entity="glossaryTerm",
        ),
        headers=SYNC,
    )


async def test_incoming_and_outgoing_by_type_paged(client):
    await write_graph(client)
    incoming = await relationships(client, SALES, "INCOMING", ["AssociatedWith"])
    assert (incoming["start"], incoming["count"], incoming["total"]) == (0, 4, 4)
    assert related(incoming) == sorted([T1, T2, T3, T4])
    assert {(r["type"], r["direction"], r["entity"]["type"]) for r in incoming["relationships"]} == {
        ("AssociatedWith", "INCOMING", "DATASET")
    }
    # pages: the same order every time, each relationship once
    pages = [await relationships(client, SALES, "INCOMING", ["AssociatedWith"], start=s, count=2) for s in (0, 2, 4)]
    assert [(p["start"], p["count"], p["total"]) for p in pages] == [(0, 2, 4), (2, 2, 4), (4, 0, 4)]
    assert sorted(u for p in pages for u in related(p)) == sorted([T1, T2, T3, T4])
    # no such relationship type, or no such entity's edges: an empty page
    assert (await relationships(client, SALES, "INCOMING", ["OwnedBy"]))["total"] == 0
    assert (await relationships(client, SALES, "OUTGOING", ["AssociatedWith"]))["relationships"] == []

    # outgoing, every type (types: []), and the related entity's type whatever it is
    outgoing = await relationships(client, T4, "OUTGOING", [])
    assert {r["type"] for r in outgoing["relationships"]} == {"AssociatedWith"}
    assert related(outgoing) == sorted([SALES, NEVER, PRIVATE])
    assert {r["entity"]["urn"]: r["entity"]["type"] for r in outgoing["relationships"]}[PRIVATE] == "DATAHUB_VIEW"

    # what the edge records of its creation (upstreamLineage's `created`), both ways
    lineage = await relationships(client, T2, "OUTGOING", ["DownstreamOf"])
    assert lineage["relationships"] == [
        {
            "type": "DownstreamOf",
            "direction": "OUTGOING",
            "entity": {"urn": T1, "type": "DATASET"},
            "created": {"time": 1234, "actor": ALICE},
        }
    ]
    assert related(await relationships(client, T1, "INCOMING", ["DownstreamOf"])) == [T2]
    # a domain association records none
    assert {r["created"] is None for r in incoming["relationships"]} == {True}

    # a glossary term IsPartOf its node
    node = await relationships(client, "urn:li:glossaryNode:finance", "INCOMING", ["IsPartOf"])
    assert [(r["entity"]["urn"], r["entity"]["type"]) for r in node["relationships"]] == [
        ("urn:li:glossaryTerm:revenue", "GLOSSARY_TERM")
    ]


async def test_what_the_caller_may_not_see_and_soft_deleted_ones_are_left_out(app, client):
    await write_graph(client)
    bob = await bearer(app, "reader", actor=BOB)
    alice = await bearer(app, "reader", actor=ALICE)
    variables = {"urn": T4, "direction": "OUTGOING", "types": ["AssociatedWith"]}

    # alice's PERSONAL view is absent to bob: left out of the page and of the total
    as_bob = (await gql(client, RELATIONSHIPS, variables, headers=bob))["data"]["entity"]["relationships"]
    assert related(as_bob) == sorted([SALES, NEVER]) and (as_bob["count"], as_bob["total"]) == (2, 2)
    as_alice = (await gql(client, RELATIONSHIPS, variables, headers=alice))["data"]["entity"]["relationships"]
    assert related(as_alice) == sorted([SALES, NEVER, PRIVATE]) and as_alice["total"] == 3
    # from the view's side: bob cannot reach it at all
    view_side = {"urn": PRIVATE, "direction": "INCOMING", "types": ["AssociatedWith"]}
    assert (await gql(client, RELATIONSHIPS, view_side, headers=bob))["data"] == {"entity": None}
    assert related((await gql(client, RELATIONSHIPS, view_side, headers=alice))["data"]["entity"]["relationships"]) == [
        T4
    ]

    # includeSoftDelete false: a domain never written is left out too (DataHub's default, true, keeps it), and so is
    # a soft-deleted dataset
    live = await relationships(client, T4, "OUTGOING", ["AssociatedWith"], soft=False)
    assert related(live) == sorted([SALES, PRIVATE]) and (live["count"], live["total"]) == (2, 2)
    live_bob = (await gql(client, RELATIONSHIPS, {**variables, "soft": False}, headers=bob))["data"]["entity"]
    assert related(live_bob["relationships"]) == [SALES] and live_bob["relationships"]["total"] == 1
    assert related(await relationships(client, SALES, "INCOMING", ["AssociatedWith"])) == sorted([T1, T2, T3, T4])
    live = await relationships(client, SALES, "INCOMING", ["AssociatedWith"], soft=False)
    assert related(live) == sorted([T1, T2, T4]) and live["total"] == 3


async def test_every_entity_type_has_them_and_bad_input_is_refused(client):
    await write_graph(client)
    # the interface declares it: a query through `Entity` alone, on types with no other field than urn and type
    body = await gql(
        client,
        """query($urns: [String!]!) { entities(urns: $urns) { urn
             relationships(input: {types: ["IsPartOf", "AssociatedWith"], direction: INCOMING}) { total } } }""",
        {"urns": ["urn:li:glossaryNode:finance", SALES, "urn:li:glossaryTerm:revenue"]},
    )
    assert [e["relationships"]["total"] for e in body["data"]["entities"]] == [1, 4, 0]
    for name, value in (("count", -1), ("start", -5)):
        refused = await gql(client, RELATIONSHIPS, {"urn": SALES, "direction": "INCOMING", "types": [], name: value})
        assert refused["errors"][0]["extensions"]["code"] == 400
        assert refused["errors"][0]["extensions"]["issues"][0]["path"] == f"$input.{name}"
    missing = await gql(client, '{ entity(urn: "urn:li:domain:sales") { relationships { total } } }')
    assert missing["errors"][0]["extensions"]["classification"] == "ValidationError"  # input is required
