"""GraphQL (`POST /api/graphql`) in process: scrollAcrossEntities over several types (composite cursor, orFilters,
stability under concurrent writes), searchAcrossEntities, entity lookups, the tag mutations and their policies, and
hostile input (GraphQL errors, never a 5xx). The scroll and filter behaviour runs on both search backends."""

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
SCROLL = """
query scroll($types: [EntityType!], $query: String!, $orFilters: [AndFilterInput!], $count: Int!, $scrollId: String,
             $includeSoftDeleted: Boolean) {
  scrollAcrossEntities(input: {query: $query, count: $count, scrollId: $scrollId, types: $types, orFilters: $orFilters,
                               searchFlags: {skipHighlighting: true, skipAggregates: true,
                                             includeSoftDeleted: $includeSoftDeleted}}) {
    nextScrollId count total searchResults { entity { urn type } }
  }
}"""


async def gql(client, query: str, variables: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    response = await client.post("/api/graphql", json={"query": query, "variables": variables or {}}, **kw)
    assert response.status_code == 200, response.text
    return response.json()


def key(name: str, platform: str = "hive", env: str = "PROD") -> dict[str, Any]:
    urn = ds(name, platform, env)
    return mcp("datasetKey", {"platform": f"urn:li:dataPlatform:{platform}", "name": name, "origin": env}, urn=urn)


def chart(name: str) -> dict[str, Any]:
    urn = f"urn:li:chart:(looker,{name})"
    return mcp("chartKey", {"dashboardTool": "looker", "chartId": name}, urn=urn, entity="chart")


async def scroll_all(client, count: int, **variables: Any) -> tuple[list[str], list[dict[str, Any]]]:
    urns: list[str] = []
    pages: list[dict[str, Any]] = []
    scroll_id = None
    while True:
        body = await gql(client, SCROLL, {"query": "*", "count": count, "scrollId": scroll_id, **variables})
        assert "errors" not in body, body
        page = body["data"]["scrollAcrossEntities"]
        pages.append(page)
        urns += [r["entity"]["urn"] for r in page["searchResults"]]
        scroll_id = page["nextScrollId"]
        if not scroll_id:
            return urns, pages


async def test_scroll_across_types_with_filters(client):
    datasets = [key(f"db.t{i}", "hive" if i % 2 else "kafka", "PROD" if i < 6 else "DEV") for i in range(9)]
    charts = [chart(f"c{i}") for i in range(4)]
    gone = key("db.gone", "hive")
    await propose(
        client, *datasets, *charts, gone, mcp("status", {"removed": True}, urn=gone["entityUrn"]), headers=SYNC
    )
    every = {p["entityUrn"] for p in datasets + charts}

    urns, pages = await scroll_all(client, 4, types=["DATASET", "CHART"])
    assert sorted(urns) == sorted(every) and len(urns) == len(set(urns))  # soft-deleted hidden, nothing twice
    assert all(page["total"] == len(every) for page in pages) and len(pages) >= 4
    types = {r["entity"]["urn"]: r["entity"]["type"] for page in pages for r in page["searchResults"]}
    assert types[charts[0]["entityUrn"]] == "CHART" and types[datasets[0]["entityUrn"]] == "DATASET"

    # the client's get_urns_by_filter(platform="hive", env="PROD"): the env groups, the status filter negated
    not_removed = {"field": "removed", "values": ["true"], "condition": "EQUAL", "negated": True}
    platform = {"field": "platform.keyword", "values": ["urn:li:dataPlatform:hive"], "condition": "EQUAL"}
    env_groups = [
        {"field": "origin", "values": ["PROD"], "condition": "EQUAL"},
        {"field": "customProperties", "values": ["env=PROD"]},
        {"field": "env", "values": ["PROD"]},
    ]
    or_filters = [{"and": [platform, not_removed, extra]} for extra in env_groups]
    urns, _ = await scroll_all(client, 2, orFilters=or_filters)  # every searchable type
    assert sorted(urns) == sorted(p["entityUrn"] for p in datasets[:6] if "hive" in p["entityUrn"])

    # soft-deleted too; `_entityType` picks the types a group applies to
    urns, _ = await scroll_all(client, 50, includeSoftDeleted=True, orFilters=[{"and": [platform]}])
    assert gone["entityUrn"] in urns
    by_type = [
        {"and": [{"field": "_entityType", "values": ["CHART"]}]},
        {"and": [{"field": "_entityType", "values": ["DATASET"]}, {"field": "origin", "values": ["DEV"]}]},
    ]
    urns, _ = await scroll_all(client, 3, types=["DATASET", "CHART"], orFilters=by_type)
    assert sorted(urns) == sorted([p["entityUrn"] for p in charts] + [p["entityUrn"] for p in datasets[6:]])

    # get_results_by_filter: fetchExtraFields as extraProperties (JSON values)
    extra = await gql(
        client,
        """query { scrollAcrossEntities(input: {types: [DATASET], query: "*", count: 1,
        searchFlags: {fetchExtraFields: ["platform", "nope"]}}) { searchResults { extraProperties { name value } } } }""",
    )
    assert extra["data"]["scrollAcrossEntities"]["searchResults"][0]["extraProperties"][0]["name"] == "platform"
    assert extra["data"]["scrollAcrossEntities"]["searchResults"][0]["extraProperties"][0]["value"].startswith(
        '"urn:li:dataPlatform:'
    )


async def test_or_filters_with_patterns_exists_and_comparisons(client):
    await propose(
        client,
        key("sales.orders_2024"),
        key("sales.Returns", "kafka"),
        key("ops.Orders", "kafka"),
        key("ops.users"),
        chart("c_orders"),
        headers=SYNC,
    )
    # (the id CONTAINS "orders", any case, on kafka) OR (it STARTS WITH "sales." and does not contain "orders")
    contain = {"field": "id", "values": ["ORDERS"], "condition": "CONTAIN"}
    kafka = {"field": "platform", "values": ["urn:li:dataPlatform:kafka"], "condition": "IN"}
    sales = {"field": "id.keyword", "values": ["sales."], "condition": "START_WITH"}
    urns, _ = await scroll_all(
        client,
        1,
        types=["DATASET", "CHART"],
        orFilters=[{"and": [contain, kafka]}, {"and": [sales, {**contain, "negated": True}]}],
    )
    assert sorted(urns) == sorted([ds("ops.Orders", "kafka"), ds("sales.Returns", "kafka")])
    # EXISTS: values are not needed; negated, the entities without the field (charts have no `origin`)
    urns, _ = await scroll_all(
        client,
        10,
        types=["DATASET", "CHART"],
        orFilters=[{"and": [{"field": "origin", "condition": "EXISTS", "negated": True}]}],
    )
    assert urns == ["urn:li:chart:(looker,c_orders)"]
    urns, _ = await scroll_all(
        client,
        10,
        types=["DATASET"],
        orFilters=[
            {
                "and": [
                    {"field": "origin", "condition": "EXISTS"},
                    {"field": "id", "values": ["_2024", "users"], "condition": "END_WITH"},
                    {
                        "field": "urn",
                        "values": ["urn:li:dataset:(urn:li:dataPlatform:hive,ops."],
                        "condition": "GREATER_THAN",
                    },
                ]
            }
        ],
    )
    assert sorted(urns) == [ds("ops.users"), ds("sales.orders_2024")]
    body = await gql(
        client,
        SCROLL,
        {
            "query": "*",
            "count": 1,
            "types": ["DATASET"],
            "orFilters": [{"and": [{"field": "id", "values": ["x"], "condition": "IEQUAL"}]}],
        },
    )
    assert body["data"]["scrollAcrossEntities"]["total"] == 0


async def test_unsupported_conditions_are_errors_naming_the_place(client):
    for criterion, where, words in [
        (
            {"field": "container", "values": ["urn:li:container:x"], "condition": "DESCENDANTS_INCL"},
            "$input.orFilters[1].and[1].condition",
            ["DESCENDANTS_INCL", "'container'"],
        ),
        (
            {"field": "id", "values": ["a", "x" * 300], "condition": "CONTAIN"},
            "$input.orFilters[1].and[1].values[1]",
            ["300 characters", "'id'"],
        ),
        (
            {"field": "_entityType", "values": ["DATA"], "condition": "START_WITH"},
            "$input.orFilters[1].and[1].condition",
            ["START_WITH", "_entityType"],
        ),
    ]:
        or_filters = [
            {"and": [{"field": "origin", "values": ["PROD"]}]},
            {"and": [{"field": "origin", "values": ["PROD"]}, criterion]},
        ]
        body = await gql(client, SCROLL, {"query": "*", "count": 2, "orFilters": or_filters})
        error = body["errors"][0]
        assert error["extensions"]["code"] == 400 and all(w in error["message"] for w in words), error
        assert error["extensions"]["issues"][0]["path"] == where, error


async def test_scroll_is_stable_under_concurrent_writes(client):
    first = [key(f"s.{i:03d}") for i in range(0, 60, 2)]
    await propose(client, *first, headers=SYNC)
    seen: list[str] = []
    scroll_id = None
    page_no = 0
    while True:
        body = await gql(
            client, SCROLL, {"query": "*", "count": 7, "scrollId": scroll_id, "types": ["DATASET", "CHART"]}
        )
        page = body["data"]["scrollAcrossEntities"]
        seen += [r["entity"]["urn"] for r in page["searchResults"]]
        scroll_id = page["nextScrollId"]
        if not scroll_id:
            break
        page_no += 1
        # between pages: new entities on both sides of the cursor, and charts (the next type)
        await propose(
            client,
            key(f"s.{page_no * 10 - 1:03d}"),
            key(f"s.{page_no * 10 + 1:03d}"),
            chart(f"n{page_no}"),
            headers=SYNC,
        )
    assert len(seen) == len(set(seen))  # nothing twice
    assert {p["entityUrn"] for p in first} <= set(seen)  # nothing that existed throughout is skipped


async def test_bad_scroll_ids_are_graphql_errors(client):
    await propose(client, *(key(f"b.{i}") for i in range(5)), headers=SYNC)
    body = await gql(client, SCROLL, {"query": "*", "count": 2, "types": ["DATASET"]})
    good = body["data"]["scrollAcrossEntities"]["nextScrollId"]
    for bad in ["x", "e30", good[:-3], "A" * 70_000]:
        body = await gql(client, SCROLL, {"query": "*", "count": 2, "types": ["DATASET"], "scrollId": bad})
        assert body["errors"][0]["extensions"]["code"] == 400, body
    body = await gql(client, SCROLL, {"query": "*", "count": 2, "types": ["CHART"], "scrollId": good})
    assert "another search" in body["errors"][0]["message"]


async def test_search_across_entities_offsets_and_entity_fields(client):
    urns = [key(f"o.{i}")["entityUrn"] for i in range(6)]
    await propose(
        client,
        *(key(f"o.{i}") for i in range(6)),
        mcp(
            "datasetProperties",
            {"name": "orders", "description": "all orders", "customProperties": {"team": "sales"}},
            urn=urns[0],
        ),
        headers=SYNC,
    )
    query = """query($start: Int) { searchAcrossEntities(input: {types: [DATASET], query: "*", start: $start, count: 4}) {
                 start count total searchResults { entity { urn } } } }"""
    first = (await gql(client, query, {"start": 0}))["data"]["searchAcrossEntities"]
    second = (await gql(client, query, {"start": 4}))["data"]["searchAcrossEntities"]
    assert first["total"] == 6 and first["count"] == 4 and second["count"] == 2
    assert sorted(r["entity"]["urn"] for r in first["searchResults"] + second["searchResults"]) == sorted(urns)

    body = await gql(
        client,
        """query($urn: String!) { dataset(urn: $urn) { urn type name origin platform { name }
        properties { name description customProperties { key value } } }
        entity(urn: $urn) { urn type ... on Dataset { name } } }""",
        {"urn": urns[0]},
    )
    assert body["data"]["dataset"] == {
        "urn": urns[0],
        "type": "DATASET",
        "name": "o.0",
        "origin": "PROD",
        "platform": {"name": "hive"},
        "properties": {
            "name": "orders",
            "description": "all orders",
            "customProperties": [{"key": "team", "value": "sales"}],
        },
    }
    assert body["data"]["entity"] == {"urn": urns[0], "type": "DATASET", "name": "o.0"}
    schema = {
        "schemaName": "o",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.OtherSchema": {"rawSchema": ""}},
        "fields": [
            {"fieldPath": "id", "nativeDataType": "bigint", "type": {"type": {"com.linkedin.schema.NumberType": {}}}},
            {
                "fieldPath": "name",
                "nativeDataType": "varchar",
                "type": {"type": {"com.linkedin.schema.StringType": {}}},
            },
        ],
    }
    await propose(client, mcp("schemaMetadata", schema, urn=urns[0]))
    fields = """query($urn: String!, $v: Long) { dataset(urn: $urn) { schemaMetadata(version: $v) {
                  name platformUrn fields { fieldPath nativeDataType type nullable } } } }"""
    body = await gql(client, fields, {"urn": urns[0], "v": 0})
    assert body["data"]["dataset"]["schemaMetadata"] == {
        "name": "o",
        "platformUrn": "urn:li:dataPlatform:hive",
        "fields": [
            {"fieldPath": "id", "nativeDataType": "bigint", "type": "NUMBER", "nullable": False},
            {"fieldPath": "name", "nativeDataType": "varchar", "type": "STRING", "nullable": False},
        ],
    }
    assert (await gql(client, fields, {"urn": urns[0], "v": 7}))["data"]["dataset"]["schemaMetadata"] is None
    assert "Long" in (await gql(client, fields, {"urn": urns[0], "v": "x"}))["errors"][0]["message"]
    assert (
        "Long"
        in (await gql(client, fields.replace("$v)", "1.5)").replace(", $v: Long", ""), {"urn": urns[0]}))["errors"][0][
            "message"
        ]
    )
    missing = await gql(client, 'query { entity(urn: "urn:li:dataset:(urn:li:dataPlatform:hive,nope,PROD)") { urn } }')
    assert missing == {"data": {"entity": None}}


async def test_tag_mutations_and_policies(app, client):
    create = "mutation($t: CreateTagInput!) { createTag(input: $t) }"
    writer, reader = await bearer(app, "writer"), await bearer(app, "reader")
    body = await gql(client, create, {"t": {"id": "pii", "name": "PII", "description": "personal"}}, headers=writer)
    assert body == {"data": {"createTag": "urn:li:tag:pii"}}
    tag = await gql(client, 'query { tag(urn: "urn:li:tag:pii") { name description properties { name description } } }')
    assert tag["data"]["tag"] == {
        "name": "PII",
        "description": "personal",
        "properties": {"name": "PII", "description": "personal"},
    }
    again = await gql(client, create, {"t": {"id": "pii", "name": "PII"}}, headers=writer)
    assert again["errors"][0]["message"] == "This Tag already exists!"
    refused = await gql(client, create, {"t": {"id": "x", "name": "X"}}, headers=reader)
    assert refused["errors"][0]["extensions"]["code"] == 403

    # removeTag: from an entity's globalTags
    urn = ds("tagged")
    await propose(
        client,
        key("tagged"),
        mcp("globalTags", {"tags": [{"tag": "urn:li:tag:pii"}, {"tag": "urn:li:tag:gold"}]}, urn=urn),
    )
    removed = await gql(
        client,
        'mutation($u: String!) { removeTag(input: {tagUrn: "urn:li:tag:pii", resourceUrn: $u}) }',
        {"u": urn},
        headers=writer,
    )
    assert removed == {"data": {"removeTag": True}}
    stored = (await client.get(f"/openapi/v3/entity/dataset/{urn}/globalTags")).json()
    assert stored["value"]["tags"] == [{"tag": "urn:li:tag:gold"}]

    # deleteTag: the key aspect (the whole entity) — ADMIN under metaledger's policy
    delete = 'mutation { deleteTag(urn: "urn:li:tag:pii") }'
    assert (await gql(client, delete, headers=writer))["errors"][0]["extensions"]["code"] == 403
    assert await gql(client, delete) == {"data": {"deleteTag": True}}
    assert (await gql(client, 'query { tag(urn: "urn:li:tag:pii") { urn } }')) == {"data": {"tag": None}}
    assert (await gql(client, delete))["errors"][0]["extensions"]["code"] == 404


@pytest.mark.parametrize("backend_name", ["postgres"])
async def test_hostile_input_is_a_graphql_error_never_a_5xx(client, anonymous, backend_name):
    async def errors_of(query: str, status: int = 200) -> list[dict[str, Any]]:
        response = await client.post("/api/graphql", json={"query": query})
        assert response.status_code == status, response.text
        return response.json()["errors"]

    assert (await errors_of("query { scrollAcrossEntities("))[0]["extensions"]["classification"] == "InvalidSyntax"
    unknown = await errors_of('query { scrollAcrossEntities(input: {query: "*"}) { nextScrollId schemaMetadata } }')
    assert "schemaMetadata" in unknown[0]["message"]
    assert "'bogus'" in (await errors_of("query { bogus }"))[0]["message"]
    fragment = 'query { entity(urn: "urn:li:tag:x") { urn ... on Tag { properties { name } } } }'
    assert (await client.post("/api/graphql", json={"query": fragment})).json() == {"data": {"entity": None}}
    nested = "query { __schema { types { " + "fields { type { " * 12 + "name" + " } }" * 12 + " } } }"
    assert "nested" in (await errors_of(nested))[0]["message"]
    aliases = "query { " + " ".join(f"a{i}: __typename" for i in range(60)) + " }"
    assert "aliased" in (await errors_of(aliases))[0]["message"]
    # fragments spread twice at each of 30 levels: 2^30 aliased fields when executed, counted without expanding
    fragments = "query { ...F30 } fragment F0 on Query { __typename } " + " ".join(
        f"fragment F{i} on Query {{ ...F{i - 1} x{i}: __typename ...F{i - 1} }}" for i in range(1, 31)
    )
    assert "aliased" in (await errors_of(fragments))[0]["message"]
    assert "characters" in (await errors_of("query { __typename " + " " * 70_000 + "}"))[0]["message"]
    assert await errors_of("{" * 5000 + "}" * 5000)  # too many tokens or too deep: an error, not a crash
    assert await errors_of("query { __typename " + "[" * 3000 + "}")
    cyclic = "query { ...A } fragment A on Query { ...B } fragment B on Query { ...A }"
    assert (
        "cycle" in (await errors_of(cyclic))[0]["message"].lower()
        or "spread" in (await errors_of(cyclic))[0]["message"]
    )

    # what variables carry is bounded too
    many = [{"and": [{"field": "urn", "values": [f"urn:li:tag:{i}" for i in range(600)]}]}] * 2
    body = (
        await client.post(
            "/api/graphql", json={"query": SCROLL, "variables": {"query": "*", "count": 1, "orFilters": many}}
        )
    ).json()
    assert "limit is 1024" in body["errors"][0]["message"]
    body = (
        await client.post("/api/graphql", json={"query": SCROLL, "variables": {"query": "x" * 20_000, "count": 1}})
    ).json()
    assert "limit is 10000" in body["errors"][0]["message"]

    # the body itself: a 400 (DataHub answers a request without a query so)
    for body in [[], {"query": 1}, {"query": "{ __typename }", "variables": []}, {}]:
        assert (await client.post("/api/graphql", json=body)).status_code == 400
    bad_variables = await client.post("/api/graphql", json={"query": SCROLL, "variables": {"query": "*", "count": "x"}})
    assert bad_variables.status_code == 200 and bad_variables.json()["errors"]
    assert (await anonymous.post("/api/graphql", json={"query": "{ __typename }"})).status_code == 401
    introspection = await client.post(
        "/api/graphql", json={"query": 'query { __type(name: "SearchFlags") { inputFields { name } } }'}
    )
    assert {"name": "includeSoftDeleted"} in introspection.json()["data"]["__type"]["inputFields"]


def upstreams(urn: str, *ups: str) -> dict[str, Any]:
    stamp = {"time": 0, "actor": "urn:li:corpuser:unknown"}
    return mcp(
        "upstreamLineage",
        {"upstreams": [{"dataset": u, "type": "TRANSFORMED", "auditStamp": stamp} for u in ups]},
        urn=urn,
    )


async def test_scroll_across_lineage_degrees_paths_and_filters(client):
    a, b, c, d = (ds(n) for n in "abcd")
    kafka_c = ds("c2", "kafka")
    await propose(
        client,
        key("a"),
        key("b"),
        key("c"),
        key("d"),
        key("c2", "kafka"),
        upstreams(b, a),
        upstreams(c, b),
        upstreams(kafka_c, b),
        upstreams(d, c),
        headers=SYNC,
    )
    query = """query($input: ScrollAcrossLineageInput!) { scrollAcrossLineage(input: $input) {
                 nextScrollId total searchResults { degree entity { urn type ... on Dataset { platform { name } } }
                 paths { path { urn } } } } }"""
    degree = {"field": "degree", "condition": "EQUAL", "values": ["1", "2"]}
    results, scroll_id = [], None
    while True:
        body = await gql(
            client,
            query,
            {
                "input": {
                    "urn": a,
                    "direction": "DOWNSTREAM",
                    "count": 2,
                    "scrollId": scroll_id,
                    "orFilters": [{"and": [degree]}],
                }
            },
        )
        page = body["data"]["scrollAcrossLineage"]
        results += page["searchResults"]
        scroll_id = page["nextScrollId"]
        if not scroll_id:
            break
    assert [(r["entity"]["urn"], r["degree"]) for r in results] == [(b, 1), (c, 2), (kafka_c, 2)]  # d is 3 hops
    assert [p["urn"] for p in results[1]["paths"][0]["path"]] == [a, b, c]
    assert results[2]["entity"]["platform"] == {"name": "kafka"} and results[0]["entity"]["type"] == "DATASET"

    kafka_only = [
        {"and": [{"field": "degree", "values": ["3+"]}]},
        {"and": [{"field": "platform", "values": ["urn:li:dataPlatform:kafka"]}]},
    ]
    body = await gql(client, query, {"input": {"urn": a, "direction": "DOWNSTREAM", "orFilters": kafka_only}})
    assert {r["entity"]["urn"] for r in body["data"]["scrollAcrossLineage"]["searchResults"]} == {d, kafka_c}
    body = await gql(client, query, {"input": {"urn": d, "direction": "UPSTREAM", "types": ["DATASET"]}})
    assert [r["entity"]["urn"] for r in body["data"]["scrollAcrossLineage"]["searchResults"]] == [c, b, a]
    further = [{"and": [{"field": "degree", "values": ["1"], "condition": "GREATER_THAN"}]}]
    body = await gql(client, query, {"input": {"urn": a, "direction": "DOWNSTREAM", "orFilters": further}})
    assert "degree filter takes EQUAL or IN" in body["errors"][0]["message"]


@pytest.mark.parametrize("backend_name", ["postgres"])
async def test_no_search_backend_is_a_503_the_client_retries(app, client, backend_name):
    runtime, app.state.search = app.state.search, None
    try:
        response = await client.post("/api/graphql", json={"query": SCROLL, "variables": {"query": "*", "count": 1}})
    finally:
        app.state.search = runtime
    assert response.status_code == 503 and "Retry-After" in response.headers, response.text
