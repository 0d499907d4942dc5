"""The cost limit on /api/graphql (METALEDGER_GRAPHQL_MAX_COST): the attack of issue 25 (50 aliased searches of
10,000 results, a reader's token) is refused with a 400 naming the limit before anything runs, while `datahub
search`'s bundled query and DataHub's client's URN scroll run."""

from __future__ import annotations

from pathlib import Path

import datahub.cli

from tests.helpers import bearer, ds, mcp, propose

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
ALIASES = (
    "query { "
    + " ".join(
        f'a{i}: searchAcrossEntities(input: {{query: "*", count: 10000}}) {{ searchResults {{ entity {{ urn }} }} }}'
        for i in range(50)
    )
    + " }"
)


async def test_fifty_aliased_searches_are_refused_and_real_clients_are_not(app, client):
    await propose(
        client,
        *(
            mcp(
                "datasetKey",
                {"platform": "urn:li:dataPlatform:hive", "name": f"c{i}", "origin": "PROD"},
                urn=ds(f"c{i}"),
            )
            for i in range(3)
        ),
        headers=SYNC,
    )
    reader = await bearer(app, "reader")
    refused = await client.post("/api/graphql", json={"query": ALIASES}, headers=reader)
    assert refused.status_code == 400, refused.text
    error = refused.json()["errors"][0]
    assert (
        "costs 1500050" in error["message"] and "the limit is 100000 (METALEDGER_GRAPHQL_MAX_COST)" in error["message"]
    )
    assert error["extensions"]["code"] == 400

    gql = Path(datahub.cli.__file__).with_name("gql")
    cli = (gql / "search.gql").read_text() + (gql / "fragments.gql").read_text()
    answered = await client.post(
        "/api/graphql",
        headers=reader,
        json={"query": cli, "variables": {"query": "*", "count": 50, "start": 0, "types": ["DATASET"]}},
    )
    assert answered.status_code == 200 and answered.json()["data"]["searchAcrossEntities"]["total"] >= 3, answered.text
    scroll = """query($n: Int!) { scrollAcrossEntities(input: {query: "*", count: $n, searchFlags: {skipAggregates: true}})
                { nextScrollId searchResults { entity { urn } extraProperties { name value } } } }"""
    urns = await client.post("/api/graphql", headers=reader, json={"query": scroll, "variables": {"n": 10000}})
    assert urns.status_code == 200 and len(urns.json()["data"]["scrollAcrossEntities"]["searchResults"]) >= 3
