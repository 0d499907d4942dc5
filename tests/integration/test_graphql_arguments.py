"""What the arguments of GraphQL root fields carry is checked once, before a resolver runs
(app.graphql.limits.check_arguments), on both search backends: a NUL character (`\\u0000`) anywhere (a facet name, the
query text, a filter's field or value, a sort field, a scrollId, a viewUrn, a URN, a mutation's input), and a search
field name that is not one (an overlong facet or sort field), is a GraphQL error naming the argument's place and the
reason (code 400), never a 500 with a logged traceback; ordinary facets, sorts and filters are answered."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.helpers import ds, mcp, propose
from tests.integration.search_indices import (  # noqa: F401 - the module runs on both backends, on shared indices
    backend_name,
    opensearch_overrides,
    settings_overrides,
)

pytestmark = pytest.mark.asyncio

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
AGGREGATE = """query($facets: [String]) { aggregateAcrossEntities(input: {types: [DATASET], query: "*", facets: $facets}) {
                 facets { field aggregations { value count } } } }"""
SEARCH = """query($input: SearchAcrossEntitiesInput!) { searchAcrossEntities(input: $input) {
              total searchResults { entity { urn } } } }"""
SCROLL = """query($input: ScrollAcrossEntitiesInput!) { scrollAcrossEntities(input: $input) { total } }"""
LINEAGE = """query($urn: String!) { scrollAcrossLineage(input: {urn: $urn, direction: UPSTREAM}) { total } }"""
ENTITY = """query($urn: String!) { entity(urn: $urn) { urn } }"""
CREATE_TAG = """mutation($t: CreateTagInput!) { createTag(input: $t) }"""
NUL = "\u0000"


def search(**input: Any) -> dict[str, Any]:
    return {"types": ["DATASET"], "query": "*", **input}


def sort(name: str) -> dict[str, Any]:
    return {"sortCriterion": {"field": name, "sortOrder": "ASCENDING"}}


# (query, variables, the argument's place, words of the reason)
REFUSED = [
    (AGGREGATE, {"facets": [f"platform{NUL}"]}, "$input.facets[0]", "NUL"),
    (AGGREGATE, {"facets": ["platform", f"structuredProperties.io.acryl.a{NUL}b"]}, "$input.facets[1]", "NUL"),
    (AGGREGATE, {"facets": ["structuredProperties." + "a" * 300]}, "$input.facets[0]", "not a facet name"),
    (SEARCH, {"input": search(query=f"orders{NUL}")}, "$input.query", "NUL"),
    (
        SEARCH,
        {"input": search(orFilters=[{"and": [{"field": f"platform{NUL}", "values": ["x"]}]}])},
        "$input.orFilters[0].and[0].field",
        "NUL",
    ),
    (
        SEARCH,
        {"input": search(orFilters=[{"and": [{"field": "platform", "values": ["a", f"b{NUL}"]}]}])},
        "$input.orFilters[0].and[0].values[1]",
        "NUL",
    ),
    (SEARCH, {"input": search(sortInput=sort(f"name{NUL}"))}, "$input.sortInput.sortCriterion.field", "NUL"),
    (
        SEARCH,
        {"input": search(sortInput={"sortCriteria": [{"field": "a" * 100_000, "sortOrder": "DESCENDING"}]})},
        "$input.sortInput.sortCriteria[0].field",
        "not a field name",
    ),
    (SCROLL, {"input": search(scrollId=f"x{NUL}")}, "$input.scrollId", "NUL"),
    (SCROLL, {"input": search(viewUrn=f"urn:li:dataHubView:v{NUL}")}, "$input.viewUrn", "NUL"),
    (SCROLL, {"input": search(sortInput=sort("a b"))}, "$input.sortInput.sortCriterion.field", "not a field name"),
    (LINEAGE, {"urn": ds(f"a{NUL}")}, "$input.urn", "NUL"),
    (ENTITY, {"urn": f"urn:li:tag:a{NUL}"}, "$urn", "NUL"),
    (CREATE_TAG, {"t": {"id": "t1", "name": f"T{NUL}"}}, "$input.name", "NUL"),
    # a literal in the query text, not a variable
    (
        'query { aggregateAcrossEntities(input: {query: "*", facets: ["platform\\u0000"]}) { facets { field } } }',
        {},
        "$input.facets[0]",
        "NUL",
    ),
]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_nul_and_overlong_arguments_are_errors_naming_the_argument(client):
    await propose(
        client,
        mcp("datasetKey", {"platform": "urn:li:dataPlatform:hive", "name": "arg.a", "origin": "PROD"}, urn=ds("arg.a")),
        headers=SYNC,
    )
    logged = Records()
    logging.getLogger("metaledger").addHandler(logged)
    try:
        for query, variables, where, reason in REFUSED:
            response = await client.post("/api/graphql", json={"query": query, "variables": variables})
            assert response.status_code == 200, response.text
            error = response.json()["errors"][0]
            assert error["extensions"]["code"] == 400 and error["extensions"]["type"] == "BAD_REQUEST", (where, error)
            assert error["extensions"]["issues"][0]["path"] == where, (where, error)
            assert reason in error["message"] and where in error["message"], (where, error)
    finally:
        logging.getLogger("metaledger").removeHandler(logged)
    assert not logged.records, [r.getMessage() for r in logged.records]  # no traceback, no resolver failure
    assert (await client.get("/openapi/v3/entity/tag/urn:li:tag:t1")).status_code == 404  # the mutation did not run


async def test_ordinary_facets_sorts_and_filters_are_answered(client):
    await propose(
        client,
        *(
            mcp(
                "datasetKey",
                {"platform": f"urn:li:dataPlatform:{p}", "name": f"arg.{p}{i}", "origin": "PROD"},
                urn=ds(f"arg.{p}{i}", p),
            )
            for p in ("hive", "kafka")
            for i in range(2)
        ),
        headers=SYNC,
    )
    body = (
        await client.post(
            "/api/graphql",
            json={
                "query": AGGREGATE,
                "variables": {
                    "facets": ["platform", "", "_entityType\u241etypeNames", "structuredProperties.io.acryl.tier"]
                },
            },
        )
    ).json()
    assert "errors" not in body, body
    facets = {f["field"]: f["aggregations"] for f in body["data"]["aggregateAcrossEntities"]["facets"]}
    assert {a["value"]: a["count"] for a in facets["platform"]} == {
        "urn:li:dataPlatform:hive": 2,
        "urn:li:dataPlatform:kafka": 2,
    }
    body = (
        await client.post(
            "/api/graphql",
            json={
                "query": SEARCH,
                "variables": {
                    "input": search(
                        sortInput={"sortCriteria": [{"field": "urn", "sortOrder": "DESCENDING"}]},
                        orFilters=[{"and": [{"field": "platform.keyword", "values": ["urn:li:dataPlatform:kafka"]}]}],
                    )
                },
            },
        )
    ).json()
    assert "errors" not in body, body
    assert [r["entity"]["urn"] for r in body["data"]["searchAcrossEntities"]["searchResults"]] == [
        ds("arg.kafka1", "kafka"),
        ds("arg.kafka0", "kafka"),
    ]
