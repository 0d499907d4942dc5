"""DataHub's structured query, `/q <Lucene query string>` (app.search.query_syntax), in the GraphQL searches and the
search route, on both backends: the prefix is not searched for, words are ANDed, OR/NOT/-/+, phrases, wildcards,
groups and `field:value` work as DataHub answers them; a query that does not parse is a 400 naming it. And DataHub's
MCP server's `search` operation (its text, its variables) with such a query and its facets."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import ValidationFailed
from app.search.query_syntax import (
    MAX_DEPTH,
    MAX_TERMS,
    And,
    Every,
    InvalidQuery,
    Not,
    Nothing,
    Or,
    Term,
    check,
    lucene_word,
    parse,
    structured,
)
from tests.helpers import ds, mcp, propose
from tests.integration.search_indices import (  # noqa: F401 - the module runs on both backends, on shared indices
    backend_name,
    opensearch_overrides,
    settings_overrides,
)

pytestmark = pytest.mark.asyncio

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
POS, MONTHLY, QUARTERLY, PETS = (ds(f"sq.{n}") for n in ("pos_usage", "revenue_monthly", "revenue_quarterly", "pets"))
CONTAINER = "urn:li:container:sq_db"
SEARCH = """
query search($query: String!, $types: [EntityType!]) {
  searchAcrossEntities(input: {query: $query, types: $types, count: 50, searchFlags: {skipAggregates: true}}) {
    total searchResults { entity { urn } }
  }
}"""
# mcp-server-datahub 0.8.0, gql/search.gql, verbatim
MCP_SEARCH = """
fragment SearchEntityInfo on Entity {
  urn
  ... on Dataset {
    properties {
      name
    }
  }
  ... on Chart {
    properties {
      name
    }
  }
  ... on Dashboard {
    properties {
      name
    }
  }
  ... on Container {
    properties {
      name
    }
  }
  ... on GlossaryTerm {
    properties {
      name
    }
  }
  ... on GlossaryNode {
    properties {
      name
    }
  }
  ... on Domain {
    properties {
      name
    }
  }
  ... on DataProduct {
    properties {
      name
    }
  }
}

fragment FacetEntityInfo on Entity {
  ... on Dataset {
    name
    properties {
      name
    }
  }
  ... on Container {
    subTypes {
      typeNames
    }
    properties {
      name
    }
  }
  ... on GlossaryTerm {
    properties {
      name
    }
  }
}

query search(
  $types: [EntityType!]
  $query: String!
  $orFilters: [AndFilterInput!]
  $count: Int!
  $start: Int!
  $viewUrn: String
  $sortInput: SearchSortInput
) {
  searchAcrossEntities(
    input: {
      query: $query
      count: $count
      start: $start
      types: $types
      orFilters: $orFilters
      viewUrn: $viewUrn
      sortInput: $sortInput
      searchFlags: { skipHighlighting: true, maxAggValues: 5 }
    }
  ) {
    start
    count
    total
    searchResults {
      entity {
        ...SearchEntityInfo
      }
    }
    facets {
      field
      displayName
      aggregations {
        value
        count
        displayName
        entity {
          ...FacetEntityInfo
        }
      }
    }
  }
}
"""


async def gql(client, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    response = await client.post("/api/graphql", json={"query": query, "variables": variables or {}})
    assert response.status_code == 200, response.text
    return response.json()


def described(urn: str, name: str, description: str) -> dict[str, Any]:
    return mcp("datasetProperties", {"name": name, "description": description}, urn=urn)


async def write_datasets(client) -> None:
    await propose(
        client,
        described(POS, "pos_usage", "point of sale app usage per store"),
        described(MONTHLY, "revenue_monthly", "monthly revenue by region"),
        described(QUARTERLY, "revenue_quarterly", "quarterly revenue and sales"),
        described(PETS, "pets", "wizard and pet registry"),
        mcp("globalTags", {"tags": [{"tag": "urn:li:tag:PII"}]}, urn=POS),
        mcp("container", {"container": CONTAINER}, urn=MONTHLY),
        mcp("containerProperties", {"name": "sq_db"}, urn=CONTAINER, entity="container"),
        mcp("subTypes", {"typeNames": ["Database"]}, urn=CONTAINER, entity="container"),
        headers=SYNC,
    )


async def found(client, query: str) -> set[str]:
    body = await gql(client, SEARCH, {"query": query, "types": ["DATASET"]})
    assert "errors" not in body, (query, body)
    return {r["entity"]["urn"] for r in body["data"]["searchAcrossEntities"]["searchResults"]}


async def test_the_prefix_is_stripped_and_the_rest_is_a_lucene_query(client):
    await write_datasets(client)
    every = {POS, MONTHLY, QUARTERLY, PETS}
    # with and without the prefix: the same words found (the prefix is not a word searched for)
    assert await found(client, "/q revenue") == await found(client, "revenue") == {MONTHLY, QUARTERLY}
    assert await found(client, "/q registry") == await found(client, "registry") == {PETS}
    assert await found(client, "/q *") == await found(client, "/q") == await found(client, "*") == every
    assert await found(client, "/q *:*") == every
    cases = {
        "/q monthly revenue": {MONTHLY},  # AND is the default
        "/q revenue AND quarterly": {QUARTERLY},
        "/q quarterly OR wizard": {QUARTERLY, PETS},
        "/q quarterly || wizard": {QUARTERLY, PETS},
        "/q revenue -monthly": {QUARTERLY},
        "/q revenue NOT monthly": {QUARTERLY},
        "/q revenue AND NOT monthly": {QUARTERLY},
        "/q +revenue +region": {MONTHLY},
        '/q "monthly revenue"': {MONTHLY},
        '/q "revenue monthly region"': set(),
        "/q reven*": {MONTHLY, QUARTERLY},
        "/q rev?nue": {MONTHLY, QUARTERLY},
        "/q point+sale+app": {POS},  # one word that is three: all three
        "/q point+sale+nothing": set(),
        "/q (monthly OR quarterly) AND sales": {QUARTERLY},
        "/q (monthly OR wizard) -region": {PETS},
        "/q tags:pii": {POS},  # an URN's part
        "/q tags:PII revenue": set(),
        "/q tags:*": {POS},
        "/q nosuchfield:revenue": set(),
        "/q revenue^2 quarterly~": {QUARTERLY},  # boosts and fuzziness read, not acted on
        "/q _": set(),  # no word in it: matches nothing
        "/q revenue OR _": {MONTHLY, QUARTERLY},
        "/q nothing-like-this": set(),
    }
    for query, expected in cases.items():
        assert await found(client, query) == expected, query

    # the search route takes it too
    response = await client.get("/openapi/v3/entity/dataset", params={"query": "/q revenue -monthly", "count": 10})
    assert response.status_code == 200, response.text
    assert [e["urn"] for e in response.json()["entities"]] == [QUARTERLY]

    # the other searches: scroll, facets only, lineage
    body = await gql(
        client,
        """{ scrollAcrossEntities(input: {types: [DATASET], query: "/q revenue -monthly", count: 10}) {
               searchResults { entity { urn } } }
             aggregateAcrossEntities(input: {types: [DATASET], query: "/q revenue", facets: ["_entityType"]}) {
               facets { field aggregations { value count } } } }""",
    )
    assert body["data"]["scrollAcrossEntities"]["searchResults"] == [{"entity": {"urn": QUARTERLY}}]
    assert body["data"]["aggregateAcrossEntities"]["facets"] == [
        {"field": "_entityType", "aggregations": [{"value": "DATASET", "count": 2}]}
    ]
    upstreams = [
        {"dataset": urn, "type": "TRANSFORMED", "auditStamp": {"time": 1, "actor": "urn:li:corpuser:datahub"}}
        for urn in (MONTHLY, POS)
    ]
    await propose(client, mcp("upstreamLineage", {"upstreams": upstreams}, urn=QUARTERLY), headers=SYNC)
    lineage = """query($u: String!, $q: String) { searchAcrossLineage(input: {urn: $u, direction: UPSTREAM, query: $q}) {
                   searchResults { entity { urn } } } }"""
    for query, expected in (
        ("/q *", {MONTHLY, POS}),
        ("/q revenue", {MONTHLY}),
        ("/q tags:pii OR region", {MONTHLY, POS}),
    ):
        body = await gql(client, lineage, {"u": QUARTERLY, "q": query})
        assert {r["entity"]["urn"] for r in body["data"]["searchAcrossLineage"]["searchResults"]} == expected, query


async def test_a_query_that_does_not_parse_is_a_400_naming_it(client):
    await write_datasets(client)
    for query in ("/q (revenue", "/q revenue)", "/q revenue AND", "/q OR revenue", '/q "open', "/q [a TO b]"):
        body = await gql(client, SEARCH, {"query": query})
        error = body["errors"][0]
        assert error["extensions"]["code"] == 400, (query, body)
        assert error["extensions"]["issues"][0]["path"] == "$input.query", body
        assert "at character" in error["message"], body
        response = await client.get("/openapi/v3/entity/dataset", params={"query": query})
        assert response.status_code == 400, (query, response.text)
        assert response.json()["issues"][0]["path"] == "$query"
    # without the prefix the same text is full text, never refused
    assert (await gql(client, SEARCH, {"query": "(revenue"}))["data"]["searchAcrossEntities"] is not None


async def test_the_mcp_servers_search_operation(client):
    await write_datasets(client)
    variables = {
        "types": ["DATASET", "CONTAINER"],
        "query": "/q revenue",
        "orFilters": [{"and": [{"field": "removed", "values": ["true"], "condition": "EQUAL", "negated": True}]}],
        "count": 10,
        "start": 0,
        "viewUrn": None,
        "sortInput": None,
    }
    body = await gql(client, MCP_SEARCH, variables)
    assert "errors" not in body, body
    result = body["data"]["searchAcrossEntities"]
    assert (result["start"], result["count"], result["total"]) == (0, 2, 2)
    assert {r["entity"]["urn"]: r["entity"]["properties"]["name"] for r in result["searchResults"]} == {
        MONTHLY: "revenue_monthly",
        QUARTERLY: "revenue_quarterly",
    }
    facets = {f["field"]: f["aggregations"] for f in result["facets"]}
    assert facets["_entityType"] == [{"value": "DATASET", "count": 2, "displayName": "dataset", "entity": None}]
    container = [a for a in facets["container"] if a["value"] == CONTAINER]
    assert container == [
        {
            "value": CONTAINER,
            "count": 1,
            "displayName": None,
            "entity": {"subTypes": {"typeNames": ["Database"]}, "properties": {"name": "sq_db"}},
        }
    ]


# --- the parser alone (no service): what each query means, and where a refusal points ----------------------------


async def test_what_a_structured_query_means():
    assert structured("orders") is None and structured("/qorders") is None and structured(" /q ") == "*"
    assert structured("/q  user data ") == "user data"
    word = Term
    assert parse("/q a b") == And((word("a"), word("b")))
    assert parse("/q a OR b c") == Or((word("a"), And((word("b"), word("c")))))  # AND binds tighter than OR
    assert parse("/q a -b !c NOT d") == And((word("a"), Not(word("b")), Not(word("c")), Not(word("d"))))
    assert parse("/q a && (b || c)") == And((word("a"), Or((word("b"), word("c")))))
    assert parse('/q name:(a "b c")') == And((word("a", "name"), word("b c", "name", phrase=True)))
    assert parse("/q name:*") == Every("name") and parse("/q *:*") == Every() and parse("/q") == Every()
    assert parse("/q re\\*v* x?") == And((word("re*v*", wild=frozenset({4})), word("x?", wild=frozenset({1}))))
    assert parse("/q & _") == Nothing() and parse("/q a OR &") == word("a") and parse("/q -&") == Nothing()
    assert parse("/q a^2 b~ c~0.5") == And((word("a"), word("b"), word("c")))
    # a word to Lucene's query string: its reserved characters escaped, its wildcards kept, `<`/`>` left out
    assert lucene_word(word("a:b(c)<d>", wild=frozenset())) == "a\\:b\\(c\\)d"
    assert lucene_word(word("re*v", wild=frozenset({2}))) == "re*v"
    assert lucene_word(word('say "hi"', phrase=True)) == '"say \\"hi\\""'


async def test_where_a_refusal_points():
    refused = {
        "/q (a": "a `(` without its `)` (at character 3",
        "/q a)": "a `)` without its `(` (at character 4",
        "/q a AND": "an operator without an operand after it",
        "/q OR a": "OR without an operand before it (at character 3",
        "/q ()": "an empty group",
        '/q a "b': "a phrase's quote is not closed (at character 5",
        "/q [a TO b]": "range queries",
        "/q /ab+/": "regular expressions",
        "/q f:g:h": "a field inside a field's group",
        "/q bad-name!:x": "unexpected ':'",
        "/q a\\": "escapes nothing",
        "/q " + "(" * (MAX_DEPTH + 2) + "a" + ")" * (MAX_DEPTH + 2): f"nested more than {MAX_DEPTH} deep",
        "/q " + " ".join(f"w{i}" for i in range(MAX_TERMS + 1)): f"more than {MAX_TERMS} words",
    }
    for query, message in refused.items():
        with pytest.raises(InvalidQuery) as caught:
            parse(query)
        assert message in str(caught.value), (query, str(caught.value))
        with pytest.raises(ValidationFailed) as answered:
            check(query, "$input.query")
        assert answered.value.issues[0].path == "$input.query"
    check("(not structured", "$input.query")  # full text: nothing to refuse
