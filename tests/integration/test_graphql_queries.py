"""DataHub's queries over GraphQL, on both search backends: `listQueries` (a search of the `query` entities: by
`source`, by `datasetUrn`, by the `entities` filter DataHub's MCP server sends, newest first) and the query entity's
`properties`, `subjects` and `platform` (its queryProperties, querySubjects and dataPlatformInstance aspects). The
operations DataHub's MCP server sends are sent as it sends them (its text, its variables). Data is written over HTTP,
as a client writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import mcp_python  # noqa: F401 - DataHub's MCP server's virtualenv (a session fixture)
from tests.helpers import bearer, ds, mcp, propose
from tests.integration.search_indices import (  # noqa: F401 - the module runs on both backends, on shared indices
    backend_name,
    opensearch_overrides,
    settings_overrides,
)

pytestmark = pytest.mark.asyncio

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
ORDERS, USERS = ds("shop.orders"), ds("shop.users")
ORDERS_ID = f"urn:li:schemaField:({ORDERS},order_id)"
BY_HAND, CRAWLED, OTHER = "urn:li:query:by_hand", "urn:li:query:crawled", "urn:li:query:users_only"
GONE = "urn:li:query:gone"

# mcp-server-datahub 0.8.0, gql/queries.gql and gql/query_entity.gql, verbatim
LIST_QUERIES = """
fragment platformFields on DataPlatform {
  urn
  name
  __typename
}

fragment query on QueryEntity {
  urn
  properties {
    name
    description
    source
    statement {
      value
      language
    }
    customProperties {
      key
      value
    }
    origin {
      urn
      type
    }
    lastModified {
      actor
    }
  }
  platform {
    ...platformFields
  }
  subjects {
    dataset {
      urn
      type
      ... on Dataset {
        name
      }
    }
    schemaField {
      urn
      type
      fieldPath
    }
  }
}

query listQueries($input: ListQueriesInput!) {
  listQueries(input: $input) {
    start
    total
    count
    queries {
      ...query
    }
  }
}
"""
GET_QUERY_ENTITY = """
query GetQueryEntity($urn: String!) {
  entity(urn: $urn) {
    urn
    type
    ... on QueryEntity {
      urn
      properties {
        name
        description
        source
        statement {
          value
          language
        }
        customProperties {
          key
          value
        }
        origin {
          urn
          type
        }
        lastModified {
          actor
        }
      }
      platform {
        urn
        name
      }
      subjects {
        dataset {
          urn
          type
          ... on Dataset {
            name
          }
        }
        schemaField {
          urn
          type
          fieldPath
        }
      }
    }
  }
}
"""


def entities_filter(urn: str) -> list[dict[str, Any]]:
    """What the MCP server's get_dataset_queries sends (datahub SDK compile_filters of `entities EQUAL <urn>`)."""
    return [
        {
            "and": [
                {"field": "entities", "condition": "EQUAL", "values": [urn], "negated": False},
                {"field": "removed", "condition": "EQUAL", "values": ["true"], "negated": True},
            ]
        }
    ]


def query(urn: str, statement: str, source: str, time: int, subjects: list[str], **properties: Any) -> list[dict]:
    value = {
        "statement": {"value": statement, "language": "SQL"},
        "source": source,
        "created": {"time": time, "actor": "urn:li:corpuser:alice"},
        "lastModified": {"time": time + 1, "actor": "urn:li:corpuser:bob"},
        **properties,
    }
    return [
        mcp("queryProperties", value, urn=urn, entity="query"),
        mcp("querySubjects", {"subjects": [{"entity": s} for s in subjects]}, urn=urn, entity="query"),
    ]


async def write_queries(client) -> None:
    await propose(
        client,
        mcp("datasetProperties", {"name": "orders"}, urn=ORDERS),
        *query(
            BY_HAND,
            "SELECT order_id FROM shop.orders",
            "MANUAL",
            1_000,
            [ORDERS, ORDERS_ID],
            name="Order ids",
            description="every order",
            customProperties={"team": "sales"},
            origin=USERS,
        ),
        mcp("dataPlatformInstance", {"platform": "urn:li:dataPlatform:snowflake"}, urn=BY_HAND, entity="query"),
        *query(CRAWLED, "SELECT * FROM shop.orders JOIN shop.users", "SYSTEM", 2_000, [ORDERS, USERS]),
        *query(OTHER, "SELECT 1 FROM shop.users", "MANUAL", 3_000, [USERS]),
        *query(GONE, "SELECT 2 FROM shop.orders", "MANUAL", 4_000, [ORDERS]),
        mcp("status", {"removed": True}, urn=GONE, entity="query"),
        headers=SYNC,
    )


async def gql(client, text: str, variables: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    response = await client.post("/api/graphql", json={"query": text, "variables": variables or {}}, **kw)
    assert response.status_code == 200, response.text
    return response.json()


async def data(client, text: str, variables: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    body = await gql(client, text, variables, **kw)
    assert "errors" not in body, body
    return body["data"]


BY_HAND_ANSWER = {
    "urn": BY_HAND,
    "properties": {
        "name": "Order ids",
        "description": "every order",
        "source": "MANUAL",
        "statement": {"value": "SELECT order_id FROM shop.orders", "language": "SQL"},
        "customProperties": [{"key": "team", "value": "sales"}],
        "origin": {"urn": USERS, "type": "DATASET"},
        "lastModified": {"actor": "urn:li:corpuser:bob"},
    },
    "platform": {"urn": "urn:li:dataPlatform:snowflake", "name": "snowflake", "__typename": "DataPlatform"},
    "subjects": [
        {"dataset": {"urn": ORDERS, "type": "DATASET", "name": "shop.orders"}, "schemaField": None},
        {
            "dataset": {"urn": ORDERS, "type": "DATASET", "name": "shop.orders"},
            "schemaField": {"urn": ORDERS_ID, "type": "SCHEMA_FIELD", "fieldPath": "order_id"},
        },
    ],
}


async def test_the_operations_are_the_mcp_servers(mcp_python: Path):
    """The texts above are the installed server's (its virtualenv made by the fixture if need be)."""
    gql = mcp_python.parents[1] / "lib" / "python3.11" / "site-packages" / "mcp_server_datahub" / "gql"
    strip = lambda text: [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]  # noqa: E731
    assert strip((gql / "queries.gql").read_text()) == strip(LIST_QUERIES)
    assert strip((gql / "query_entity.gql").read_text()) == strip(GET_QUERY_ENTITY)


async def test_list_queries_of_a_dataset_as_the_mcp_server_asks(app, client):
    await write_queries(client)
    reader = await bearer(app, "reader", actor="urn:li:corpuser:carol")

    # get_dataset_queries(urn): the dataset's queries, newest first; the soft-deleted one left out
    answer = await data(
        client, LIST_QUERIES, {"input": {"start": 0, "count": 10, "orFilters": entities_filter(ORDERS)}}, headers=reader
    )
    listed = answer["listQueries"]
    assert (listed["start"], listed["count"], listed["total"]) == (0, 2, 2)
    assert [q["urn"] for q in listed["queries"]] == [CRAWLED, BY_HAND]
    assert listed["queries"][1] == BY_HAND_ANSWER
    crawled = listed["queries"][0]
    assert crawled["properties"]["source"] == "SYSTEM"
    assert crawled["platform"] is None
    assert [s["dataset"]["urn"] for s in crawled["subjects"]] == [ORDERS, USERS]

    # source="MANUAL"
    manual = await data(
        client,
        LIST_QUERIES,
        {"input": {"start": 0, "count": 10, "orFilters": entities_filter(ORDERS), "source": "MANUAL"}},
        headers=reader,
    )
    assert [q["urn"] for q in manual["listQueries"]["queries"]] == [BY_HAND]
    # column="order_id": the schema field's URN
    column = await data(
        client, LIST_QUERIES, {"input": {"start": 0, "count": 10, "orFilters": entities_filter(ORDERS_ID)}}
    )
    assert [q["urn"] for q in column["listQueries"]["queries"]] == [BY_HAND]
    # a dataset no query names
    none = await data(client, LIST_QUERIES, {"input": {"orFilters": entities_filter(ds("shop.nothing"))}})
    assert none["listQueries"] == {"start": 0, "total": 0, "count": 0, "queries": []}


async def test_list_queries_by_dataset_urn_paging_and_sort(client):
    await write_queries(client)
    text = """query($input: ListQueriesInput!) {
        listQueries(input: $input) { start count total queries { urn properties {
            created { time actor } createdOn { time actor { urn username } } } } } }"""

    by_dataset = (await data(client, text, {"input": {"datasetUrn": USERS}}))["listQueries"]
    assert [q["urn"] for q in by_dataset["queries"]] == [OTHER, CRAWLED]
    assert by_dataset["queries"][0]["properties"]["created"] == {"time": 3_000, "actor": "urn:li:corpuser:alice"}
    # the same stamp resolved: its actor a CorpUser (whether or not that user was written)
    assert by_dataset["queries"][0]["properties"]["createdOn"] == {
        "time": 3_000,
        "actor": {"urn": "urn:li:corpuser:alice", "username": "alice"},
    }

    everything = (await data(client, text, {"input": {}}))["listQueries"]
    assert [q["urn"] for q in everything["queries"]] == [OTHER, CRAWLED, BY_HAND]
    assert everything["total"] == 3

    page = (await data(client, text, {"input": {"start": 1, "count": 1}}))["listQueries"]
    assert (page["start"], page["count"], page["total"]) == (1, 1, 3)
    assert [q["urn"] for q in page["queries"]] == [CRAWLED]

    oldest_first = {"sortCriterion": {"field": "createdAt", "sortOrder": "ASCENDING"}}
    ascending = (await data(client, text, {"input": {"sortInput": oldest_first, "source": "MANUAL"}}))["listQueries"]
    assert [q["urn"] for q in ascending["queries"]] == [BY_HAND, OTHER]

    # a bad filter is a 400 naming its place
    refused = await gql(client, text, {"input": {"orFilters": [{"and": [{"field": "bad field!", "values": ["x"]}]}]}})
    assert refused["errors"][0]["extensions"]["code"] == 400
    assert refused["errors"][0]["extensions"]["issues"][0]["path"].startswith("$input.orFilters[0]")


async def test_get_query_entity_as_the_mcp_server_asks(app, client, anonymous):
    await write_queries(client)
    reader = await bearer(app, "reader", actor="urn:li:corpuser:carol")

    entity = (await data(client, GET_QUERY_ENTITY, {"urn": BY_HAND}, headers=reader))["entity"]
    assert entity == {
        "type": "QUERY",
        **BY_HAND_ANSWER,
        "platform": {"urn": "urn:li:dataPlatform:snowflake", "name": "snowflake"},
    }

    # a query never written, and one with no properties nor subjects: nothing made up
    assert (await data(client, GET_QUERY_ENTITY, {"urn": "urn:li:query:never"}, headers=reader))["entity"] is None
    await propose(client, mcp("status", {"removed": False}, urn="urn:li:query:bare", entity="query"), headers=SYNC)
    bare = (await data(client, GET_QUERY_ENTITY, {"urn": "urn:li:query:bare"}, headers=reader))["entity"]
    assert bare == {"urn": "urn:li:query:bare", "type": "QUERY", "properties": None, "platform": None, "subjects": None}

    # no token: refused before anything is read
    response = await anonymous.post("/api/graphql", json={"query": GET_QUERY_ENTITY, "variables": {"urn": BY_HAND}})
    assert response.status_code == 401
    response = await anonymous.post(
        "/api/graphql", json={"query": LIST_QUERIES, "variables": {"input": {"orFilters": entities_filter(ORDERS)}}}
    )
    assert response.status_code == 401


async def test_an_origin_the_caller_may_not_see_is_null(app, client):
    """A query's origin that is a PERSONAL view is its creator's to see: to another reader it is null."""
    alice_view = "urn:li:dataHubView:alice_private"
    info = {
        "name": "mine",
        "type": "PERSONAL",
        "definition": {"entityTypes": [], "filter": {"or": []}},
        "created": {"time": 1, "actor": "urn:li:corpuser:alice"},
        "lastModified": {"time": 1, "actor": "urn:li:corpuser:alice"},
    }
    await propose(
        client,
        mcp("dataHubViewInfo", info, urn=alice_view, entity="dataHubView"),
        *query("urn:li:query:from_view", "SELECT 3", "MANUAL", 5_000, [ORDERS], origin=alice_view),
        headers=SYNC,
    )
    alice = await bearer(app, "reader", actor="urn:li:corpuser:alice")
    bob = await bearer(app, "reader", actor="urn:li:corpuser:bob")
    variables = {"input": {"orFilters": entities_filter(ORDERS)}}
    mine = (await data(client, LIST_QUERIES, variables, headers=alice))["listQueries"]["queries"]
    assert mine[0]["properties"]["origin"] == {"urn": alice_view, "type": "DATAHUB_VIEW"}
    theirs = (await data(client, LIST_QUERIES, variables, headers=bob))["listQueries"]["queries"]
    assert theirs[0]["urn"] == "urn:li:query:from_view" and theirs[0]["properties"]["origin"] is None
    entity = (await data(client, GET_QUERY_ENTITY, {"urn": "urn:li:query:from_view"}, headers=bob))["entity"]
    assert entity["properties"]["origin"] is None
