"""DataHub's OpenAPI scroll APIs (entities across types, relationships, lineage) and the v2 entity batch get, over
HTTP against both search backends; the cursor guarantee under concurrent writes; 401s and 400s."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.helpers import ds, mcp, propose
from tests.integration.test_search_api import (  # noqa: F401 - the backend parametrization and its fixtures
    _backend_started,
    backend_name,
    caught_up,
    opensearch_overrides,
    settings_overrides,
    upstreams,
    write,
)

pytestmark = pytest.mark.asyncio


async def scroll(client, body: dict[str, Any] | None = None, **params) -> dict[str, Any]:
    response = await client.post("/openapi/v3/entity/scroll", params=params, json=body or {})
    assert response.status_code == 200, response.text
    return response.json()


async def scroll_all(client, body: dict[str, Any], **params) -> list[dict[str, Any]]:
    entities, scroll_id = [], None
    for _ in range(1000):
        page = await scroll(client, body, **({"scrollId": scroll_id} if scroll_id else {}), **params)
        entities += page["entities"]
        scroll_id = page.get("scrollId")
        if not scroll_id:
            return entities
    raise AssertionError("the scroll never ended")


def props(description: str) -> dict[str, Any]:
    return {"description": description, "customProperties": {}, "tags": []}


# --- entities ---------------------------------------------------------------------------------------------------------


async def test_entity_scroll_pages_across_types_in_datahubs_shape(client):
    datasets = sorted(ds(f"scroll.t{i}") for i in range(5))
    for urn in datasets:
        await write(client, urn, {"datasetProperties": props(f"about {urn}")}, sync=True)
    tags = sorted(f"urn:li:tag:scroll{i}" for i in range(3))
    for urn in tags:
        await write(client, urn, {"tagProperties": {"name": urn[-7:]}}, sync=True, entity="tag")

    body = {"entities": ["dataset", "tag"], "aspects": ["datasetProperties", "tagProperties"]}
    first = await scroll(client, body, count=3, systemMetadata="true")
    assert first["totalCount"] == 8 and first["scrollId"]
    assert [e["urn"] for e in first["entities"]] == datasets[:3]  # by URN (DataHub's default sort), type by type
    assert first["entities"][0]["datasetProperties"]["value"]["description"] == f"about {datasets[0]}"
    assert "systemMetadata" in first["entities"][0]["datasetProperties"]

    pages = [first]
    while pages[-1].get("scrollId"):
        pages.append(await scroll(client, body, count=3, scrollId=pages[-1]["scrollId"]))
    urns = [e["urn"] for p in pages for e in p["entities"]]
    assert urns == datasets + tags
    assert all(p["totalCount"] == 8 for p in pages)
    assert all("systemMetadata" not in e.get("tagProperties", {}) for p in pages[1:] for e in p["entities"])

    # No `aspects`: URNs only; `aspects: []`: every aspect (DataHub's expandEmpty).
    bare = await scroll(client, {"entities": ["tag"]}, count=10)
    assert bare["entities"] == [{"urn": u} for u in tags] and "scrollId" not in bare
    full = await scroll(client, {"entities": ["tag"], "aspects": []}, count=10)
    assert {"tagProperties", "tagKey"} <= set(full["entities"][0])

    # Descending, through the body's sortCriteria; and the query parameters' form.
    down = await scroll_all(
        client, {"entities": ["dataset"], "sortCriteria": [{"field": "urn", "order": "DESCENDING"}]}, count=2
    )
    assert [e["urn"] for e in down] == datasets[::-1]
    down = await scroll_all(client, {"entities": ["dataset"]}, count=4, sortCriteria="urn", sortOrder="DESCENDING")
    assert [e["urn"] for e in down] == datasets[::-1]


async def test_entity_scroll_filters_query_and_soft_delete(client):
    hive = [ds(f"scrollf.h{i}", "hive") for i in range(3)]
    kafka = [ds(f"scrollf.k{i}", "kafka") for i in range(2)]
    for urn in hive + kafka:
        await write(client, urn, {"datasetProperties": props("filtered")}, sync=True)
    await write(client, hive[0], {"status": {"removed": True}}, sync=True)

    only_kafka = {
        "entities": ["dataset"],
        "filter": {
            "and": [
                {"criteria": [{"field": "platform", "values": ["urn:li:dataPlatform:kafka"], "condition": "EQUAL"}]}
            ]
        },
    }
    assert sorted(e["urn"] for e in await scroll_all(client, only_kafka, count=1)) == sorted(kafka)

    hive_all = {
        "entities": ["dataset"],
        "filter": {"and": [{"criteria": [{"field": "platform", "values": ["urn:li:dataPlatform:hive"]}]}]},
    }
    assert sorted(e["urn"] for e in await scroll_all(client, hive_all)) == sorted(hive[1:])
    with_deleted = await scroll_all(client, hive_all, includeSoftDelete="true")
    assert sorted(e["urn"] for e in with_deleted) == sorted(hive)

    by_urn = {
        "entities": ["dataset"],
        "filter": {"and": [{"criteria": [{"field": "urn", "values": [kafka[1]], "condition": "IN"}]}]},
    }
    assert [e["urn"] for e in await scroll_all(client, by_urn)] == [kafka[1]]
    # every type, as the SDK asks when given no entity names; pitKeepAlive and friends accepted
    everything = await scroll_all(client, {}, count=50, pitKeepAlive="5m", skipCache="true", skipAggregation="true")
    assert set(hive[1:] + kafka) <= {e["urn"] for e in everything}


async def test_entity_scroll_or_of_and_clauses_with_conditions(client):
    a, b, c, d = (
        ds(f"scrollc.{name}", platform)
        for name, platform in (("a", "hive"), ("b", "kafka"), ("c", "kafka"), ("d", "hive"))
    )
    values = {
        a: {"name": "Orders_2024", "customProperties": {"tier": "gold"}, "created": {"time": 1_700_000_000_000}},
        b: {"name": "orders old", "customProperties": {"tier": "silver"}, "created": {"time": 1_600_000_000_000}},
        c: {"name": "users", "customProperties": {}},
        d: {"name": "audit%log", "customProperties": {}},
    }
    for urn, value in values.items():
        await write(client, urn, {"datasetProperties": {**props("conditions"), **value}}, sync=True)

    async def urns(filter_: dict[str, Any]) -> list[str]:
        return sorted(e["urn"] for e in await scroll_all(client, {"entities": ["dataset"], "filter": filter_}, count=1))

    # DataHub's v3 form (what the SDK sends): `and` is an OR of its clauses, each an AND of its criteria
    kafka = {"field": "platform", "values": ["urn:li:dataPlatform:kafka"], "condition": "EQUAL"}
    assert await urns(
        {
            "and": [
                {
                    "criteria": [
                        {"field": "name", "values": ["ORDERS"], "condition": "START_WITH"},
                        {**kafka, "negated": True},
                    ]
                },
                {
                    "criteria": [
                        {"field": "customProperties", "condition": "EXISTS", "negated": True},
                        {"field": "name", "values": ["%"], "condition": "CONTAIN", "negated": True},
                    ]
                },
            ]
        }
    ) == sorted([a, c])
    # DataHub's Rest.li form and v3 spellings: comparisons on a datetime (epoch ms), ENDS_WITH
    assert await urns(
        {
            "or": [
                {"and": [{"field": "createdAt", "values": ["1650000000000"], "condition": "GREATER_THAN"}]},
                {"and": [{"field": "name.keyword", "values": ["LOG"], "condition": "ENDS_WITH"}]},
            ]
        }
    ) == sorted([a, d])
    # the deprecated one-clause form, the deprecated single value
    assert await urns({"criteria": [{"field": "name", "value": "ORDERS OLD", "condition": "IEQUAL"}]}) == [b]
    assert await urns(
        {
            "and": [
                {"criteria": [{"field": "customProperties", "values": ["tier=g"], "condition": "STARTS_WITH"}]},
                {"criteria": [kafka, {"field": "name", "values": ["users"], "condition": "LESS_THAN"}]},
            ]
        }
    ) == sorted([a, b])
    for nothing in ({"and": []}, {}, {"and": None}):  # no clause: no condition
        assert await urns(nothing) == sorted(values)


async def test_scroll_route_is_not_an_entity_write_nor_a_search(client):
    """POST /openapi/v3/entity/scroll is the scroll, not an upsert of entity type `scroll` (the v3 entity routes
    come after it); GET /openapi/v3/entity/dataset is still the one-type search."""
    response = await client.post("/openapi/v3/entity/scroll", json={"entities": ["dataset"]})
    assert response.status_code == 200 and "entities" in response.json(), response.text
    response = await client.get("/openapi/v3/entity/dataset")
    assert response.status_code == 200 and "entities" in response.json()


# --- the cursor guarantee under concurrent writes --------------------------------------------------------------------


@pytest.mark.parametrize("backend_name", ["postgres"], indirect=False)
async def test_ten_thousand_entities_each_seen_once_while_a_writer_changes_them(client, db):
    """10,000 entities paged 500 at a time while, between pages, a writer changes descriptions and tags of random
    ones, creates entities and soft-deletes others (both interleaved with them, ahead of and behind the cursor: an
    offset cursor would repeat or skip entities). Each of the 10,000 comes back exactly once."""
    n = 10_000
    rng = random.Random(17)
    urns = [ds(f"bulk.e{i:05d}") for i in range(n)]
    doomed = [ds(f"bulk.e{i:05d}d") for i in rng.sample(range(n), 1000)]  # sort right after one of the 10,000
    await propose(
        client,
        *(mcp("datasetProperties", props("v0"), urn=u, content_type=None) for u in urns + doomed),
        batch_size=1000,
    )
    await caught_up(db)

    seen: list[str] = []
    scroll_id = None
    pages = 0
    body = {"entities": ["dataset"], "aspects": ["datasetProperties"]}
    while True:
        page = await scroll(client, body, count=500, **({"scrollId": scroll_id} if scroll_id else {}))
        seen += [e["urn"] for e in page["entities"]]
        pages += 1
        changed = rng.sample(urns, 40)
        await propose(
            client,
            *(mcp("datasetProperties", props(f"v{pages}"), urn=u, content_type=None, sync=True) for u in changed[:20]),
            *(
                mcp("globalTags", {"tags": [{"tag": f"urn:li:tag:p{pages}"}]}, urn=u, content_type=None, sync=True)
                for u in changed[20:]
            ),
            *(mcp("status", {"removed": True}, urn=doomed.pop(), content_type=None, sync=True) for _ in range(20)),
            *(
                mcp(
                    "datasetProperties",
                    props("new"),
                    urn=ds(f"bulk.e{rng.randrange(n):05d}n{pages}"),
                    content_type=None,
                    sync=True,
                )
                for _ in range(20)
            ),
        )
        scroll_id = page.get("scrollId")
        if not scroll_id:
            break
    assert len(seen) == len(set(seen)), "an entity came back twice"
    originals = [u for u in seen if u in set(urns)]
    assert len(originals) == n and pages > 20, f"{len(originals)} of the {n} entities in {pages} pages"


# --- relationships and lineage ---------------------------------------------------------------------------------------


async def test_relationship_and_lineage_scroll(client):
    a, b, c, d = (ds(f"rel.{x}") for x in "abcd")
    await write(client, b, {"upstreamLineage": upstreams(a)}, sync=True)
    await write(client, c, {"upstreamLineage": upstreams(a, b)}, sync=True)
    await write(
        client, d, {"upstreamLineage": upstreams(c), "globalTags": {"tags": [{"tag": "urn:li:tag:rel"}]}}, sync=True
    )

    async def rel_scroll(body, **params):
        results, scroll_id = [], None
        while True:
            response = await client.post(
                "/openapi/v3/relationship/scroll",
                json=body,
                params={**params, **({"scrollId": scroll_id} if scroll_id else {})},
            )
            assert response.status_code == 200, response.text
            page = response.json()
            assert len(page["results"]) <= int(params.get("count", 10))
            results += page["results"]
            scroll_id = page.get("scrollId")
            if not scroll_id:
                return results

    # Who references `a` (the SDK's migration helper: destination_urns, default direction OUTGOING).
    into_a = await rel_scroll(
        {"destinationFilter": {"and": [{"criteria": [{"field": "urn", "values": [a], "condition": "EQUAL"}]}]}}, count=1
    )
    assert sorted((r["source"]["urn"], r["relationshipType"]) for r in into_a) == [
        (b, "DownstreamOf"),
        (c, "DownstreamOf"),
    ]
    assert into_a[0]["destination"] == {"urn": a, "entityType": "dataset"}
    # INCOMING: the source filter is the entity the edges come into.
    incoming = await rel_scroll(
        {"sourceFilter": {"and": [{"criteria": [{"field": "urn", "values": [a]}]}]}}, direction="INCOMING"
    )
    assert sorted(r["source"]["urn"] for r in incoming) == [b, c]
    tagged = await rel_scroll({}, relationshipTypes="TaggedWith", destinationTypes="tag")
    assert [(r["source"]["urn"], r["destination"]["urn"]) for r in tagged] == [(d, "urn:li:tag:rel")]
    everything = await rel_scroll({}, count=2)
    assert (
        len(everything)
        == len({(r["source"]["urn"], r["relationshipType"], r["destination"]["urn"]) for r in everything})
        >= 5
    )

    async def lineage(body, **params):
        response = await client.post("/openapi/v3/lineage/scroll", json=body, params={"count": 100, **params})
        assert response.status_code == 200, response.text
        return response.json()["results"]

    around_c = await lineage({"urns": [c]})
    assert sorted((r["upstream"], r["downstream"]) for r in around_c) == sorted([(a, c), (b, c), (c, d)])
    assert all(r["relationshipType"] == "DownstreamOf" and r["source"]["urn"] == r["downstream"] for r in around_c)
    assert [(r["upstream"], r["downstream"]) for r in await lineage({"urns": [c]}, direction="DOWNSTREAM")] == [(c, d)]
    assert sorted(r["upstream"] for r in await lineage({"urns": [c]}, direction="UPSTREAM")) == [a, b]
    assert all(r["relationshipType"] != "TaggedWith" for r in await lineage({}))  # lineage edges only


# --- v2 batch get ---------------------------------------------------------------------------------------------------


async def test_v2_entity_batch(client):
    one, two, missing = ds("batch2.one"), ds("batch2.two"), ds("batch2.missing")
    await write(client, one, {"datasetProperties": props("one"), "status": {"removed": False}})
    await write(client, two, {"datasetProperties": props("two")})
    response = await client.post(
        "/openapi/v2/entity/batch/dataset",
        json={"urns": [one, two, missing, one], "aspectNames": ["datasetProperties"], "withSystemMetadata": True},
    )
    assert response.status_code == 200, response.text
    entities = response.json()["entities"]
    assert [e["urn"] for e in entities] == [one, two, missing]
    assert set(entities[0]["aspects"]) == {"datasetProperties"}
    assert entities[0]["aspects"]["datasetProperties"]["value"]["description"] == "one"
    assert "systemMetadata" in entities[0]["aspects"]["datasetProperties"]
    assert entities[2]["aspects"] == {}
    every = (await client.post("/openapi/v2/entity/batch/dataset", json={"urns": [one]})).json()["entities"][0]
    assert {"datasetProperties", "status"} <= set(every["aspects"]) and "systemMetadata" not in every["aspects"][
        "status"
    ]


# --- 401 and 400 ------------------------------------------------------------------------------------------------------


ROUTES = [
    ("/openapi/v3/entity/scroll", {}),
    ("/openapi/v3/relationship/scroll", {}),
    ("/openapi/v3/lineage/scroll", {}),
    ("/openapi/v2/entity/batch/dataset", {"urns": []}),
]


@pytest.mark.parametrize("backend_name", ["postgres"], indirect=False)
@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_401_without_a_token(anonymous, path, body):
    response = await anonymous.post(path, json=body)
    assert response.status_code == 401, response.text


@pytest.mark.parametrize("backend_name", ["postgres"], indirect=False)
@pytest.mark.parametrize(
    ("path", "params", "body", "where"),
    [
        ("/openapi/v3/entity/scroll", {"scrollId": "not-a-cursor!"}, {}, "$scrollId"),
        (
            "/openapi/v3/entity/scroll",
            {"scrollId": "eyJ2IjoxLCJ0IjoiZGF0YXNldCIsImMiOiJ4IiwibiI6MX0"},
            {"entities": ["dataset"]},
            "$scrollId",
        ),
        (
            "/openapi/v3/entity/scroll",
            {"scrollId": "eyJ2IjoxLCJ0IjoidGFnIiwiYyI6bnVsbCwibiI6MX0"},
            {"entities": ["dataset"]},
            "$scrollId",
        ),
        ("/openapi/v3/entity/scroll", {}, {"entities": ["noSuchType"]}, "$.entities[0]"),
        ("/openapi/v3/entity/scroll", {"count": "10001"}, {}, "count"),
        ("/openapi/v3/entity/scroll", {"count": "0"}, {}, "count"),
        ("/openapi/v3/entity/scroll", {"sortOrder": "UP"}, {}, "$sortOrder"),
        ("/openapi/v3/entity/scroll", {}, {"sortCriteria": [{"field": "a b"}]}, "$.sortCriteria[0].field"),
        (
            "/openapi/v3/entity/scroll",
            {},
            {"sortCriteria": [{"field": "urn", "order": "SIDEWAYS"}]},
            "$.sortCriteria[0].order",
        ),
        ("/openapi/v3/entity/scroll", {}, {"entities": ["dataset"], "aspects": ["tagProperties"]}, "$.aspects[0]"),
        (
            "/openapi/v3/entity/scroll",
            {},
            {
                "filter": {
                    "and": [
                        {"criteria": []},
                        {
                            "criteria": [
                                {
                                    "field": "container",
                                    "values": ["urn:li:container:x"],
                                    "condition": "DESCENDANTS_INCL",
                                }
                            ]
                        },
                    ]
                }
            },
            "$.filter.and[1].criteria[0].condition",
        ),
        (
            "/openapi/v3/entity/scroll",
            {},
            {"filter": {"or": [{"and": [{"field": "x", "values": ["y"], "condition": "LIKE"}]}]}},
            "$.filter.or[0].and[0].condition",
        ),
        (
            "/openapi/v3/entity/scroll",
            {},
            {"filter": {"criteria": [{"field": "x", "values": ["y" * 257], "condition": "CONTAIN"}]}},
            "$.filter.criteria[0].values[0]",
        ),
        ("/openapi/v3/entity/scroll", {}, {"filter": {"and": [], "or": []}}, "$.filter"),
        (
            "/openapi/v3/entity/scroll",
            {},
            {"filter": {"and": [{"criteria": [{"field": "x", "values": ["y"], "negated": "yes"}]}]}},
            "$.filter.and[0].criteria[0].negated",
        ),
        (
            "/openapi/v3/entity/scroll",
            {},
            {"filter": {"and": [{"criteria": [{"field": "urn", "values": ["v"] * 1025}]}]}},
            "limit is 1024",
        ),
        (
            "/openapi/v3/relationship/scroll",
            {},
            {"sourceFilter": {"and": [{"criteria": []}, {"criteria": []}]}},
            "$.sourceFilter.and[1]",
        ),
        (
            "/openapi/v3/relationship/scroll",
            {},
            {
                "sourceFilter": {
                    "and": [{"criteria": [{"field": "urn", "values": ["urn:li:tag:x"], "condition": "CONTAIN"}]}]
                }
            },
            "$.sourceFilter.and[0].criteria[0].condition",
        ),
        ("/openapi/v3/entity/scroll", {"sliceId": "0", "sliceMax": "2"}, {}, "$sliceId"),
        ("/openapi/v3/entity/scroll", {}, {"what": 1}, "$.what"),
        ("/openapi/v3/relationship/scroll", {"scrollId": "WyJhIl0"}, {}, "$scrollId"),
        ("/openapi/v3/relationship/scroll", {"direction": "SIDEWAYS"}, {}, "direction"),
        ("/openapi/v3/relationship/scroll", {"count": "100000"}, {}, "count"),
        (
            "/openapi/v3/relationship/scroll",
            {},
            {"sourceFilter": {"and": [{"criteria": [{"field": "platform", "values": ["x"]}]}]}},
            "$.sourceFilter.and[0].criteria[0].field",
        ),
        (
            "/openapi/v3/relationship/scroll",
            {},
            {"edgeFilter": {"and": [{"criteria": [{"field": "x", "values": ["y"]}]}]}},
            "$.edgeFilter.and[0].criteria",
        ),
        ("/openapi/v3/lineage/scroll", {}, {"urns": ["not-a-urn"]}, "$.urns[0]"),
        ("/openapi/v3/lineage/scroll", {"scrollId": "%%%"}, {}, "$scrollId"),
        ("/openapi/v2/entity/batch/noSuchType", {}, {"urns": []}, "$entityName"),
        ("/openapi/v2/entity/batch/dataset", {}, {"urns": ["nope"]}, "$.urns[0]"),
        ("/openapi/v2/entity/batch/dataset", {}, {"urns": [], "aspectNames": ["tagProperties"]}, "$.aspectNames[0]"),
        ("/openapi/v2/entity/batch/dataset", {}, {}, "$.urns"),
    ],
)
async def test_400_naming_the_field(client, path, params, body, where):
    response = await client.post(path, params=params, json=body)
    assert response.status_code == 400, response.text
    text = response.text
    assert where in text, text


@pytest.mark.parametrize("backend_name", ["postgres"], indirect=False)
async def test_400_for_a_body_that_is_not_json(client):
    response = await client.post(
        "/openapi/v3/entity/scroll", content=b"{", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    response = await client.post(
        "/openapi/v3/entity/scroll", content=b"[]", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "$" in response.text
