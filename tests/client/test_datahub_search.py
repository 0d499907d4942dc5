"""`datahub search` and `datahub graphql` (DataHub's CLI, PyPI `acryl-datahub`, pinned) against a running
metaledger. The bundled search query selects some 90 fields over 16 entity types (the associated tags, terms,
owners, domains, containers and platforms) and the facets with their entities; metaledger serves every one.

The client tests share one metaledger: every entity here carries the word `zebrafinch`, which nothing else has."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.client

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
ORDERS = "urn:li:dataset:(urn:li:dataPlatform:searchcli,zf.orders,PROD)"
CLICKS = "urn:li:dataset:(urn:li:dataPlatform:searchcli,zf.clicks,DEV)"
CHART = "urn:li:chart:(looker,zf_revenue)"
FLOW = "urn:li:dataFlow:(airflow,zf_dag,prod)"
JOB = f"urn:li:dataJob:({FLOW},zf_load)"
TAG = "urn:li:tag:zf_pii"
TERM = "urn:li:glossaryTerm:zf.Revenue"
USER = "urn:li:corpuser:zf_jdoe"
GROUP = "urn:li:corpGroup:zf_team"
DOMAIN = "urn:li:domain:zf_sales"
CONTAINER = "urn:li:container:zf0123456789"


def mcp(urn: str, aspect: str, value: dict) -> dict:
    return {
        "entityType": urn.split(":")[2],
        "entityUrn": urn,
        "changeType": "UPSERT",
        "aspectName": aspect,
        "aspect": {"value": value},
    }


@pytest.fixture(scope="module")
def loaded(metaledger) -> None:
    owners = {
        "owners": [{"owner": USER, "type": "TECHNICAL_OWNER"}, {"owner": GROUP, "type": "BUSINESS_OWNER"}],
        "lastModified": {"time": 1_700_000_000_000, "actor": USER},
    }
    proposals = [
        mcp(
            ORDERS,
            "datasetProperties",
            {
                "name": "zebrafinch orders",
                "description": "orders of the zebrafinch shop",
                "customProperties": {"tier": "gold"},
            },
        ),
        mcp(ORDERS, "globalTags", {"tags": [{"tag": TAG}]}),
        mcp(ORDERS, "glossaryTerms", {"terms": [{"urn": TERM}], "auditStamp": {"time": 1, "actor": USER}}),
        mcp(ORDERS, "ownership", owners),
        mcp(ORDERS, "domains", {"domains": [DOMAIN]}),
        mcp(ORDERS, "container", {"container": CONTAINER}),
        mcp(CLICKS, "datasetProperties", {"name": "zebrafinch clicks"}),
        mcp(
            CHART,
            "chartInfo",
            {
                "title": "zebrafinch revenue",
                "description": "revenue by day",
                "lastModified": {"created": {"time": 0, "actor": USER}, "lastModified": {"time": 0, "actor": USER}},
            },
        ),
        mcp(CHART, "globalTags", {"tags": [{"tag": TAG}]}),
        mcp(CHART, "ownership", owners),
        mcp(FLOW, "dataFlowInfo", {"name": "zebrafinch dag"}),
        mcp(JOB, "dataJobInfo", {"name": "zebrafinch load", "type": {"string": "COMMAND"}}),
        mcp(TAG, "tagProperties", {"name": "PII", "description": "personal data"}),
        mcp(TERM, "glossaryTermInfo", {"name": "Revenue", "definition": "money in", "termSource": "INTERNAL"}),
        mcp(USER, "corpUserInfo", {"active": True, "displayName": "Jane Doe", "email": "jane@example.com"}),
        mcp(GROUP, "corpGroupInfo", {"displayName": "The team", "admins": [], "members": [], "groups": []}),
        mcp(DOMAIN, "domainProperties", {"name": "Sales", "description": "selling things"}),
        mcp(CONTAINER, "containerProperties", {"name": "zf_schema"}),
        mcp(CONTAINER, "dataPlatformInstance", {"platform": "urn:li:dataPlatform:searchcli"}),
    ]
    with metaledger.http() as http:
        response = http.post("/openapi/v1/proposals", json=proposals, headers=SYNC, timeout=120)
        assert response.status_code == 200, response.text[:2000]


def search(datahub, *args: str) -> dict:
    result = datahub.cli("search", "zebrafinch", *args)
    return json.loads(result.stdout)


def test_datahub_search_gets_every_field_it_selects(datahub, loaded):
    body = search(datahub, "--limit", "20")
    entities = {r["entity"]["urn"]: r["entity"] for r in body["searchResults"]}
    assert set(entities) == {ORDERS, CLICKS, CHART, FLOW, JOB}, sorted(entities)
    assert body["total"] == 5

    orders = entities[ORDERS]
    assert (orders["type"], orders["name"], orders["origin"]) == ("DATASET", "zf.orders", "PROD")
    assert orders["platform"]["urn"] == "urn:li:dataPlatform:searchcli" and orders["platform"]["name"] == "searchcli"
    assert orders["properties"]["description"] == "orders of the zebrafinch shop"
    assert orders["properties"]["customProperties"] == [{"key": "tier", "value": "gold"}]
    assert orders["tags"]["tags"] == [
        {"tag": {"urn": TAG, "name": "PII", "properties": {"name": "PII", "description": "personal data"}}}
    ]
    assert orders["glossaryTerms"]["terms"] == [
        {"term": {"urn": TERM, "name": "zf.Revenue", "properties": {"name": "Revenue", "description": "money in"}}}
    ]
    assert orders["ownership"]["owners"] == [
        {"owner": {"urn": USER, "username": "zf_jdoe"}},
        {"owner": {"urn": GROUP, "name": "zf_team"}},
    ]
    assert orders["domain"]["domain"] == {
        "urn": DOMAIN,
        "properties": {"name": "Sales", "description": "selling things"},
    }
    assert orders["container"]["urn"] == CONTAINER and orders["container"]["properties"] == {"name": "zf_schema"}
    assert orders["container"]["platform"]["urn"] == "urn:li:dataPlatform:searchcli"
    clicks = entities[CLICKS]
    assert (clicks["tags"], clicks["ownership"], clicks["domain"], clicks["container"]) == (None, None, None, None)

    chart = entities[CHART]
    assert chart["type"] == "CHART" and chart["properties"] == {
        "name": "zebrafinch revenue",
        "description": "revenue by day",
    }
    assert chart["platform"]["urn"] == "urn:li:dataPlatform:looker"
    assert chart["tags"]["tags"] == [{"tag": {"urn": TAG, "name": "PII"}}]
    assert [o["owner"]["urn"] for o in chart["ownership"]["owners"]] == [USER, GROUP]
    job = entities[JOB]
    assert (job["jobId"], job["dataFlow"], job["properties"]["name"]) == ("zf_load", {"urn": FLOW}, "zebrafinch load")
    flow = entities[FLOW]
    assert (flow["flowId"], flow["cluster"], flow["platform"]["urn"]) == (
        "zf_dag",
        "prod",
        "urn:li:dataPlatform:airflow",
    )


def test_datahub_search_facets_name_their_entities(datahub, loaded):
    facets = {f["field"]: f for f in search(datahub, "--facets-only")["facets"]}
    types = {a["value"]: a["count"] for a in facets["_entityType"]["aggregations"]}
    assert types == {"DATASET": 2, "CHART": 1, "DATA_FLOW": 1, "DATA_JOB": 1}
    tags = facets["tags"]["aggregations"]
    assert [(a["value"], a["count"]) for a in tags] == [(TAG, 2)]  # the orders dataset and the chart
    assert tags[0]["entity"] == {
        "urn": TAG,
        "type": "TAG",
        "name": "PII",
        "properties": {"name": "PII", "description": "personal data", "colorHex": None},
    }
    owners = {a["value"]: a["entity"] for a in facets["owners"]["aggregations"]}
    assert owners[USER]["properties"] == {"displayName": "Jane Doe"}
    assert owners[GROUP]["properties"] == {"displayName": "The team"}
    assert facets["domains"]["aggregations"][0]["entity"]["properties"]["name"] == "Sales"
    assert facets["platform"]["displayName"] == "Platform"
    assert all(f["aggregations"] for f in facets.values())  # a field no match has a value in is left out


def test_datahub_search_filters_and_table(datahub, loaded):
    body = search(datahub, "--filter", "platform=searchcli", "--filter", "env=PROD")
    assert [r["entity"]["urn"] for r in body["searchResults"]] == [ORDERS]
    table = datahub.cli("search", "zebrafinch", "--filter", "entity_type=chart", "--format", "table").stdout
    assert "zebrafinch revenue" in table and "looker" in table and "zf.orders" not in table
    urns = datahub.cli("search", "zebrafinch", "--urns-only").stdout.split()
    assert sorted(urns) == sorted([ORDERS, CLICKS, CHART, FLOW, JOB])


def test_datahub_graphql_command(datahub, loaded):
    """`datahub graphql` lists and describes the operations by introspection, runs a query and a named mutation."""
    listed = json.loads(datahub.cli("graphql", "--list-operations", "--format", "json", "--no-pretty").stdout)
    names = json.dumps(listed)
    assert all(name in names for name in ("searchAcrossEntities", "scrollAcrossEntities", "createTag", "removeTag"))
    described = datahub.cli("graphql", "--describe", "createTag").stdout
    assert "CreateTagInput!" in described

    query = '{ dataset(urn: "' + ORDERS + '") { name tags { tags { tag { urn name } } } domain { domain { urn } } } }'
    answer = json.loads(datahub.cli("graphql", "--query", query, "--format", "json").stdout)
    assert answer["dataset"] == {
        "name": "zf.orders",
        "tags": {"tags": [{"tag": {"urn": TAG, "name": "PII"}}]},
        "domain": {"domain": {"urn": DOMAIN}},
    }

    created = datahub.cli(
        "graphql",
        "--operation",
        "createTag",
        "--variables",
        json.dumps({"input": {"id": "zf_created", "name": "made by the CLI"}}),
        "--format",
        "json",
    )
    assert json.loads(created.stdout) == {"createTag": "urn:li:tag:zf_created"}
    unknown = datahub.cli("graphql", "--query", '{ dataset(urn: "' + ORDERS + '") { nosuchfield } }', check=False)
    assert unknown.returncode != 0 and "nosuchfield" in unknown.stdout + unknown.stderr


def test_datahub_search_diagnose(datahub, loaded):
    report = json.loads(datahub.cli("search", "diagnose", "--format", "json").stdout)
    keyword, semantic = report["keyword"], report["semantic"]
    assert (keyword["connected"], keyword["search_works"], keyword["search_error"]) == (True, True, None)
    assert keyword["total_entities"] >= 5  # this module's at least (the client tests share one service)
    # as DataHub with semantic search off: the field is in the schema, its search answers the "disabled" error
    assert (semantic["semantic_available"], semantic["semantic_enabled"], semantic["config"]["enabled"]) == (
        True,
        False,
        False,
    )
    assert "Semantic search is disabled" in semantic["semantic_error"]
