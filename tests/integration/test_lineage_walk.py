"""One lineage walk for every surface (app.search.lineage), on both search backends, written through the write path:

- column-level lineage: `fineGrainedLineages` (a dataset's upstreamLineage, a job's dataJobInputOutput) become
  DownstreamOf edges between schema fields; `searchAcrossLineage` from a schema field answers the datasets, each with
  the paths to its fields (DataHub's grouping, which DataHub's MCP server reads its `lineageColumns` from), multi-hop,
  both ways; a column without a fine-grained edge has none; the edges follow the aspect (replaced, deleted), and two
  jobs that declare the same field edge each keep theirs;
- every lineage result has a path, and a dataset-level one from the start to the result;
- the job between two datasets (dataJobInputOutput) is on `/openapi/v1/lineage`, `searchAcrossLineage` and
  `lineage(input:)` alike, and the surfaces agree on the same graph;
- `lineage(input:)` (DataHub's EntityLineageResult), `Dataset.assertions`, the root lookups (`dataJob(urn:)`), and one
  rule for entity names in v3 paths (any case)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest

from tests.helpers import ds, mcp, propose
from tests.integration.search_indices import (  # noqa: F401 - the module runs on both backends, on shared indices
    backend_name,
    opensearch_overrides,
    settings_overrides,
)

pytestmark = pytest.mark.asyncio

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
RAW, ORDERS, SUMMARY, OTHER = ds("lw.raw"), ds("lw.orders"), ds("lw.summary"), ds("lw.other")
SRC, DST = ds("lw.src"), ds("lw.dst")
NEVER = ds("lw.never_written")  # an upstream no aspect was written for: a ghost
FLOW = "urn:li:dataFlow:(airflow,lw_dag,PROD)"
JOB, JOB2 = f"urn:li:dataJob:({FLOW},load)", f"urn:li:dataJob:({FLOW},reload)"
QUERY = "urn:li:query:lw_orders_sql"
ASSERTION, DELETED_ASSERTION = "urn:li:assertion:lw_rows", "urn:li:assertion:lw_gone"


def field(dataset: str, path: str) -> str:
    return f"urn:li:schemaField:({dataset},{path})"


def fine(upstreams: list[str], downstreams: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "upstreamType": "FIELD_SET",
        "upstreams": upstreams,
        "downstreamType": "FIELD_SET",
        "downstreams": downstreams,
        **extra,
    }


def lineage_of(upstreams: list[str], fine_grained: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    value: dict[str, Any] = {"upstreams": [{"dataset": u, "type": "TRANSFORMED"} for u in upstreams]}
    if fine_grained is not None:
        value["fineGrainedLineages"] = fine_grained
    return value


def job_io(fine_grained: list[dict[str, Any]]) -> dict[str, Any]:
    return {"inputDatasets": [SRC], "outputDatasets": [DST], "fineGrainedLineages": fine_grained}


async def write_graph(client) -> None:
    """raw -> orders (customer_email, amount; via a query) -> summary (customer_email); raw.note has no column
    lineage. src -> load (a job) -> dst, src.id -> dst.id through the job. dst's other upstream was never written."""
    await propose(
        client,
        *(mcp("datasetProperties", {"name": u.split(",")[1]}, urn=u) for u in (RAW, ORDERS, SUMMARY, OTHER, SRC, DST)),
        mcp(
            "upstreamLineage",
            lineage_of(
                [RAW],
                [
                    fine([field(RAW, "customer_email")], [field(ORDERS, "customer_email")], query=QUERY),
                    fine([field(RAW, "amount")], [field(ORDERS, "amount")]),
                ],
            ),
            urn=ORDERS,
        ),
        mcp(
            "upstreamLineage",
            lineage_of([ORDERS], [fine([field(ORDERS, "customer_email")], [field(SUMMARY, "customer_email")])]),
            urn=SUMMARY,
        ),
        mcp("dataFlowInfo", {"name": "lw_dag"}, urn=FLOW, entity="dataFlow"),
        mcp("dataJobInfo", {"name": "load", "type": {"string": "COMMAND"}}, urn=JOB, entity="dataJob"),
        mcp("dataJobInputOutput", job_io([fine([field(SRC, "id")], [field(DST, "id")])]), urn=JOB, entity="dataJob"),
        headers=SYNC,
    )


async def gql(client, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    response = await client.post("/api/graphql", json={"query": query, "variables": variables or {}})
    assert response.status_code == 200, response.text
    body = response.json()
    assert "errors" not in body, body
    return body["data"]


ACROSS = """
query across($input: SearchAcrossLineageInput!) {
  searchAcrossLineage(input: $input) {
    total
    searchResults {
      entity { urn type }
      degree
      paths { path { urn type ... on SchemaFieldEntity { fieldPath parent { urn type } } } }
    }
  }
}"""


async def across(client, urn: str, direction: str, **extra: Any) -> list[dict[str, Any]]:
    degree = {"field": "degree", "condition": "EQUAL", "values": ["1", "2", "3+"]}
    variables = {"input": {"urn": urn, "direction": direction, "query": "*", "count": 100, **extra}}
    variables["input"].setdefault("orFilters", [{"and": [degree]}])
    return (await gql(client, ACROSS, variables))["searchAcrossLineage"]["searchResults"]


def ends(result: dict[str, Any]) -> list[str]:
    """The field paths the result's paths end at (what the MCP server makes its `lineageColumns` of)."""
    return sorted(p["path"][-1]["fieldPath"] for p in result["paths"] if p["path"][-1]["type"] == "SCHEMA_FIELD")


async def test_column_lineage_both_ways_multi_hop_with_paths(client):
    await write_graph(client)
    up = await across(client, field(SUMMARY, "customer_email"), "UPSTREAM")
    assert [(r["entity"]["urn"], r["entity"]["type"], r["degree"]) for r in up] == [
        (ORDERS, "DATASET", 1),
        (RAW, "DATASET", 2),
    ]
    assert [ends(r) for r in up] == [["customer_email"], ["customer_email"]]
    # the path: the start, each field on the way, the query the fine-grained entry names before the field it leads to
    (path,) = up[1]["paths"]
    assert [(e["urn"], e["type"]) for e in path["path"]] == [
        (field(SUMMARY, "customer_email"), "SCHEMA_FIELD"),
        (field(ORDERS, "customer_email"), "SCHEMA_FIELD"),
        (QUERY, "QUERY"),
        (field(RAW, "customer_email"), "SCHEMA_FIELD"),
    ]
    assert path["path"][-1]["parent"] == {"urn": RAW, "type": "DATASET"}

    down = await across(client, field(RAW, "customer_email"), "DOWNSTREAM")
    assert [(r["entity"]["urn"], r["degree"], ends(r)) for r in down] == [
        (ORDERS, 1, ["customer_email"]),
        (SUMMARY, 2, ["customer_email"]),
    ]
    # one hop only, when the degree filter says so
    one = await across(
        client,
        field(RAW, "customer_email"),
        "DOWNSTREAM",
        orFilters=[{"and": [{"field": "degree", "condition": "EQUAL", "values": ["1"]}]}],
    )
    assert [r["entity"]["urn"] for r in one] == [ORDERS]
    # amount reaches orders only; a column without a fine-grained edge has no column lineage
    assert [(r["entity"]["urn"], ends(r)) for r in await across(client, field(RAW, "amount"), "DOWNSTREAM")] == [
        (ORDERS, ["amount"])
    ]
    assert await across(client, field(RAW, "note"), "DOWNSTREAM") == []
    assert await across(client, field(SUMMARY, "amount"), "UPSTREAM") == []
    # a job's column lineage: through the job (its `via`)
    (through,) = await across(client, field(DST, "id"), "UPSTREAM")
    assert through["entity"]["urn"] == SRC
    assert [e["urn"] for e in through["paths"][0]["path"]] == [field(DST, "id"), JOB, field(SRC, "id")]


async def test_fields_unless_the_grouping_spec_says_otherwise(client):
    await write_graph(client)
    flags = {"groupingSpec": {"groupingCriteria": []}}
    fields = await across(client, field(RAW, "customer_email"), "DOWNSTREAM", types=["SCHEMA_FIELD"], searchFlags=flags)
    # schema fields have no search document of their own: DataHub's grouping is what makes them answers
    assert fields == []


async def test_column_edges_follow_their_aspect(client):
    await write_graph(client)
    # orders' lineage written again without its fine-grained entries: raw's columns lead nowhere
    await propose(client, mcp("upstreamLineage", lineage_of([RAW]), urn=ORDERS), headers=SYNC)
    assert await across(client, field(RAW, "customer_email"), "DOWNSTREAM") == []
    assert [r["entity"]["urn"] for r in await across(client, RAW, "DOWNSTREAM")] == [ORDERS, SUMMARY]
    # summary's aspect deleted: its field edges go with it
    await propose(client, mcp("upstreamLineage", None, urn=SUMMARY, change_type="DELETE"), headers=SYNC)
    assert await across(client, field(ORDERS, "customer_email"), "DOWNSTREAM") == []


async def test_two_owners_of_one_field_edge_each_keep_it(client):
    await write_graph(client)
    same = [fine([field(SRC, "id")], [field(DST, "id")])]
    await propose(
        client,
        mcp("dataJobInfo", {"name": "reload", "type": {"string": "COMMAND"}}, urn=JOB2, entity="dataJob"),
        mcp("dataJobInputOutput", job_io(same), urn=JOB2, entity="dataJob"),
        headers=SYNC,
    )
    # the first job no longer declares it; the second still does
    await propose(client, mcp("dataJobInputOutput", job_io([]), urn=JOB, entity="dataJob"), headers=SYNC)
    (through,) = await across(client, field(DST, "id"), "UPSTREAM")
    assert [e["urn"] for e in through["paths"][0]["path"]] == [field(DST, "id"), JOB2, field(SRC, "id")]


async def test_dataset_results_have_a_path_from_the_start(client):
    await write_graph(client)
    up = await across(client, SUMMARY, "UPSTREAM")
    assert [(r["entity"]["urn"], r["degree"], [[e["urn"] for e in p["path"]] for p in r["paths"]]) for r in up] == [
        (ORDERS, 1, [[SUMMARY, ORDERS]]),
        (RAW, 2, [[SUMMARY, ORDERS, RAW]]),
    ]


V1 = "/openapi/v1/lineage/{urn}?direction={direction}&maxHops={hops}"
ENTITY_LINEAGE = """
query lin($urn: String!, $input: LineageInput!) {
  entity(urn: $urn) {
    ... on EntityWithRelationships {
      lineage(input: $input) {
        start count total filtered
        relationships { type entity { urn type } degree createdOn isManual paths { path { urn } } }
      }
    }
  }
}"""


async def v1(client, urn: str, direction: str, hops: int) -> list[tuple[str, int]]:
    response = await client.get(V1.format(urn=quote(urn, safe=""), direction=direction, hops=hops))
    assert response.status_code == 200, response.text
    return [(e["urn"], e["hop"]) for e in response.json()["entities"]]


async def entity_lineage(client, urn: str, direction: str, **extra: Any) -> dict[str, Any]:
    data = await gql(client, ENTITY_LINEAGE, {"urn": urn, "input": {"direction": direction, **extra}})
    return data["entity"]["lineage"]


async def test_the_job_between_two_datasets_is_on_every_surface(client):
    await write_graph(client)
    assert await v1(client, DST, "UPSTREAM", 3) == [(JOB, 1), (SRC, 2)]
    assert await v1(client, SRC, "DOWNSTREAM", 3) == [(JOB, 1), (DST, 2)]
    assert [(r["entity"]["urn"], r["degree"]) for r in await across(client, DST, "UPSTREAM")] == [(JOB, 1), (SRC, 2)]
    assert [(r["entity"]["urn"], r["degree"]) for r in await across(client, SRC, "DOWNSTREAM")] == [
        (JOB, 1),
        (DST, 2),
    ]
    up = await entity_lineage(client, DST, "UPSTREAM")
    assert [(r["type"], r["entity"]["urn"], r["degree"]) for r in up["relationships"]] == [("Produces", JOB, 1)]
    down = await entity_lineage(client, SRC, "DOWNSTREAM")
    assert [(r["type"], r["entity"]["urn"]) for r in down["relationships"]] == [("Consumes", JOB)]


async def test_the_surfaces_agree_on_one_graph(client):
    await write_graph(client)
    for urn in (RAW, ORDERS, SUMMARY, SRC, DST, JOB):
        for direction in ("UPSTREAM", "DOWNSTREAM"):
            walked = await v1(client, urn, direction, 20)
            searched = [(r["entity"]["urn"], r["degree"]) for r in await across(client, urn, direction)]
            assert searched == walked, (urn, direction)
            one_hop = await entity_lineage(client, urn, direction)
            assert [(r["entity"]["urn"], r["degree"]) for r in one_hop["relationships"]] == await v1(
                client, urn, direction, 1
            ), (urn, direction)
    # and from a schema field: the walk's fields are the search's paths' ends
    walked = await v1(client, field(RAW, "customer_email"), "DOWNSTREAM", 20)
    assert walked == [(field(ORDERS, "customer_email"), 1), (field(SUMMARY, "customer_email"), 2)]
    searched = await across(client, field(RAW, "customer_email"), "DOWNSTREAM")
    assert [(r["paths"][0]["path"][-1]["urn"], r["degree"]) for r in searched] == walked


async def test_entity_lineage_pages_and_leaves_out_ghosts(client):
    await write_graph(client)
    await propose(client, mcp("upstreamLineage", lineage_of([SRC, NEVER]), urn=OTHER), headers=SYNC)
    result = await entity_lineage(client, OTHER, "UPSTREAM")
    assert (result["start"], result["count"], result["total"], result["filtered"]) == (0, 1, 1, 1)
    (relationship,) = result["relationships"]
    assert relationship["type"] == "DownstreamOf" and relationship["entity"]["urn"] == SRC
    assert relationship["isManual"] is False and relationship["paths"] == [{"path": [{"urn": OTHER}, {"urn": SRC}]}]
    ghosts = await entity_lineage(client, OTHER, "UPSTREAM", includeGhostEntities=True)
    assert [r["entity"]["urn"] for r in ghosts["relationships"]] == [NEVER, SRC] and ghosts["filtered"] == 0
    page = await entity_lineage(client, OTHER, "UPSTREAM", includeGhostEntities=True, start=1, count=1)
    assert (page["start"], page["count"], page["total"]) == (1, 1, 2)
    assert [r["entity"]["urn"] for r in page["relationships"]] == [SRC]


LOOKUPS = """
query lookups($job: String!, $flow: String!, $dataset: String!) {
  dataJob(urn: $job) { urn type jobId dataFlow { urn } }
  dataFlow(urn: $flow) { urn flowId }
  notAJob: dataJob(urn: $dataset) { urn }
  absent: dataJob(urn: "urn:li:dataJob:(urn:li:dataFlow:(airflow,lw_dag,PROD),never)") { urn }
}"""


async def test_root_lookups(client):
    await write_graph(client)
    data = await gql(client, LOOKUPS, {"job": JOB, "flow": FLOW, "dataset": SRC})
    assert data["dataJob"] == {"urn": JOB, "type": "DATA_JOB", "jobId": "load", "dataFlow": {"urn": FLOW}}
    assert data["dataFlow"] == {"urn": FLOW, "flowId": "lw_dag"}
    assert data["notAJob"] is None and data["absent"] is None


ASSERTIONS = """
query asserts($urn: String!, $soft: Boolean) {
  dataset(urn: $urn) {
    assertions(start: 0, count: 10, includeSoftDeleted: $soft) { start count total assertions { urn type } }
  }
}"""


def rows_assertion(dataset: str) -> dict[str, Any]:
    return {
        "type": "DATASET",
        "datasetAssertion": {"dataset": dataset, "scope": "DATASET_ROWS", "operator": "GREATER_THAN"},
    }


async def test_dataset_assertions(client):
    await write_graph(client)
    await propose(
        client,
        mcp("assertionInfo", rows_assertion(ORDERS), urn=ASSERTION, entity="assertion"),
        mcp("assertionInfo", rows_assertion(ORDERS), urn=DELETED_ASSERTION, entity="assertion"),
        mcp("status", {"removed": True}, urn=DELETED_ASSERTION, entity="assertion"),
        headers=SYNC,
    )
    shown = (await gql(client, ASSERTIONS, {"urn": ORDERS}))["dataset"]["assertions"]
    assert shown["assertions"] == [{"urn": ASSERTION, "type": "ASSERTION"}] and shown["total"] == 2
    every = (await gql(client, ASSERTIONS, {"urn": ORDERS, "soft": True}))["dataset"]["assertions"]
    assert sorted(a["urn"] for a in every["assertions"]) == sorted([ASSERTION, DELETED_ASSERTION])
    # an assertion of another dataset is not this one's
    none = (await gql(client, ASSERTIONS, {"urn": RAW}))["dataset"]["assertions"]
    assert (none["total"], none["assertions"]) == (0, [])


async def test_entity_names_in_v3_paths_in_any_case(client, app):
    await write_graph(client)
    for name, urn in (("dataFlow", FLOW), ("dataJob", JOB)):
        for spelling in (name, name.lower(), name.upper()):
            response = await client.get(f"/openapi/v3/entity/{spelling}/{quote(urn, safe='')}")
            assert response.status_code == 200, (spelling, response.text)
            assert response.json()["urn"] == urn
            aspect = f"/openapi/v3/entity/{spelling}/{quote(urn, safe='')}/{name}Key"
            assert (await client.get(aspect)).status_code == 200, spelling
    # a write in the lowercase form
    term = "urn:li:glossaryTerm:lw_revenue"
    response = await client.post(
        "/openapi/v3/entity/glossaryterm?async=false",
        json=[{"urn": term, "glossaryTermInfo": {"value": {"definition": "money in", "termSource": "INTERNAL"}}}],
    )
    assert response.status_code == 200, response.text
    assert (await client.get(f"/openapi/v3/entity/glossaryTerm/{quote(term, safe='')}")).status_code == 200
    # every entity name with capitals: both spellings answer alike (a missing entity: the same 404)
    registry = app.state.registry
    for name in sorted(n for n in registry.entities if n != n.lower()):
        urn = quote(f"urn:li:{name}:lw_absent", safe="")
        camel = await client.get(f"/openapi/v3/entity/{name}/{urn}")
        lower = await client.get(f"/openapi/v3/entity/{name.lower()}/{urn}")
        assert (lower.status_code, lower.json()) == (camel.status_code, camel.json()), name
        assert camel.json() != {"detail": "Not Found"}, name  # the entity route answered, not the router
    # one route per entity type in the API's description
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert "/openapi/v3/entity/dataFlow/{urn}" in paths and "/openapi/v3/entity/dataflow/{urn}" not in paths
