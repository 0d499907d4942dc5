"""The read rule (app.auth.reads): another user's PERSONAL DataHub View is absent on every read surface, for anyone
but its creator and admins; a GLOBAL view is everyone's. One table: each read surface answers, for a view and a
caller, whether the caller sees the view there; the owner, another reader and an admin ask of a PERSONAL and of a
GLOBAL view."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.helpers import bearer, eventually, mcp
from tests.integration.test_graphql import gql

OWNER = "urn:li:corpuser:alice"
OTHER = "urn:li:corpuser:bob"
PERSONAL = "urn:li:dataHubView:alice-private"
GLOBAL = "urn:li:dataHubView:alice-shared"
SYNC = {"X-DataHub-Sync-Index-Update": "true"}
NAMES = {PERSONAL: "zebra private view", GLOBAL: "zebra shared view"}


def view_info(urn: str, kind: str) -> dict[str, Any]:
    return {
        "name": NAMES[urn],
        "type": kind,
        "definition": {"entityTypes": ["dataset"], "filter": {"or": []}},
        "created": {"time": 1, "actor": OWNER},
        "lastModified": {"time": 1, "actor": OWNER},
    }


Seen = Callable[[Any, str, dict[str, Any]], Awaitable[bool]]


def _q(urn: str) -> str:
    return quote(urn, safe="")


async def v3_get_entity(c, urn, ctx):
    r = await c.get(f"/openapi/v3/entity/dataHubView/{_q(urn)}")
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200 and "dataHubViewInfo" in r.json()


async def v3_head_entity(c, urn, ctx):
    return (await c.head(f"/openapi/v3/entity/dataHubView/{_q(urn)}")).status_code == 204


async def v3_get_info(c, urn, ctx):
    r = await c.get(f"/openapi/v3/entity/dataHubView/{_q(urn)}/dataHubViewInfo")
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200


async def v3_get_info_version(c, urn, ctx):
    r = await c.get(f"/openapi/v3/entity/dataHubView/{_q(urn)}/dataHubViewInfo", params={"version": 1})
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200


async def v3_get_key(c, urn, ctx):  # another aspect of the view: the whole entity is absent
    return (await c.get(f"/openapi/v3/entity/dataHubView/{_q(urn)}/dataHubViewKey")).status_code == 200


async def v3_head_info(c, urn, ctx):
    return (await c.head(f"/openapi/v3/entity/dataHubView/{_q(urn)}/dataHubViewInfo")).status_code == 204


async def v3_batch_get(c, urn, ctx):
    r = await c.post("/openapi/v3/entity/dataHubView/batchGet", json=[{"urn": urn}])
    assert r.status_code == 200, r.text
    return any(e["urn"] == urn for e in r.json())


async def v3_list(c, urn, ctx):
    r = await c.get("/openapi/v3/entity/dataHubView", params={"query": "*", "count": 100, "aspects": "dataHubViewInfo"})
    assert r.status_code == 200, r.text
    listed = urn in {e["urn"] for e in r.json()["entities"]}
    assert r.json()["totalCount"] == len(r.json()["entities"])  # the count agrees with what is shown
    return listed


async def v3_scroll(c, urn, ctx):
    r = await c.post(
        "/openapi/v3/entity/scroll",
        params={"count": 100},
        json={"entities": ["dataHubView"], "aspects": ["dataHubViewInfo"]},
    )
    assert r.status_code == 200, r.text
    assert r.json()["totalCount"] == len(r.json()["entities"])
    return urn in {e["urn"] for e in r.json()["entities"]}


async def v2_batch_get(c, urn, ctx):
    r = await c.post("/openapi/v2/entity/batch/dataHubView", json={"urns": [urn], "aspectNames": []})
    assert r.status_code == 200, r.text
    return bool(r.json()["entities"][0]["aspects"])


async def autocomplete(c, urn, ctx):
    r = await c.get("/openapi/v1/search/dataHubView/autocomplete", params={"query": "zebra", "limit": 10})
    assert r.status_code == 200, r.text
    return urn in {e["urn"] for e in r.json()["entities"]}


async def restli_aspect(c, urn, ctx):
    r = await c.get(f"/aspects/{_q(urn)}", params={"aspect": "dataHubViewInfo"})
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200


async def restli_entity_v2(c, urn, ctx):
    r = await c.get(f"/entitiesV2/{_q(urn)}")
    assert r.status_code == 200, r.text
    return "dataHubViewInfo" in r.json()["aspects"]


ENTITY = """query($urn: String!) { entity(urn: $urn) { urn ... on DataHubView {
  aspects(input: {aspectNames: ["dataHubViewInfo", "dataHubViewKey"]}) { aspectName payload } } } }"""


async def graphql_entity_aspects(c, urn, ctx):
    body = await gql(c, ENTITY, {"urn": urn})
    entity = body["data"]["entity"]
    return entity is not None and any(a["aspectName"] == "dataHubViewInfo" for a in entity["aspects"])


SEARCH = """query { searchAcrossEntities(input: {types: [DATAHUB_VIEW], query: "*", count: 100}) {
  total searchResults { entity { urn } } facets { field aggregations { value count } } } }"""


async def graphql_search(c, urn, ctx):
    found = (await gql(c, SEARCH))["data"]["searchAcrossEntities"]
    urns = {r["entity"]["urn"] for r in found["searchResults"]}
    assert found["total"] == len(urns)
    type_counts = {
        a["value"]: a["count"] for f in found["facets"] if f["field"] == "_entityType" for a in f["aggregations"]
    }
    assert type_counts.get("DATAHUB_VIEW", 0) == len(urns)  # the facets count what is shown
    return urn in urns


VIEW_SEARCH = """query($view: String) { searchAcrossEntities(input: {query: "*", viewUrn: $view}) { total } }"""


async def graphql_view_urn(c, urn, ctx):
    body = await gql(c, VIEW_SEARCH, {"view": urn})
    if "errors" in body:
        assert body["errors"][0]["extensions"]["code"] == 404, body  # as a view that does not exist
        return False
    return True


async def change_feed(c, urn, ctx):
    r = await c.get("/openapi/v1/events/mcl", params={"after": 0, "limit": 1000})
    assert r.status_code == 200, r.text
    return any(e["urn"] == urn for e in r.json()["events"])


async def events_api(c, urn, ctx):
    r = await c.get(
        "/openapi/v1/events/poll",
        params={
            "topic": "MetadataChangeLog_Versioned_v1",
            "lookbackWindowDays": 1,
            "pollTimeoutSeconds": 0,
            "limit": 1000,
        },
    )
    assert r.status_code == 200, r.text
    return any(urn in e["value"] for e in r.json()["events"])


async def trace_of_urn(c, urn, ctx):
    r = await c.get(f"/openapi/v1/trace/write/{_q(urn)}")
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200


async def trace_of_write(c, urn, ctx):
    r = await c.post(
        f"/openapi/v1/trace/write/{ctx['trace'][urn]}",
        params={"onlyIncludeErrors": "false"},
        json={urn: ["dataHubViewInfo"]},
    )
    assert r.status_code == 200, r.text
    return r.json()[urn]["dataHubViewInfo"]["primaryStorage"]["writeStatus"] != "UNKNOWN"


SURFACES: list[tuple[str, Seen]] = [
    ("v3 GET entity", v3_get_entity),
    ("v3 HEAD entity", v3_head_entity),
    ("v3 GET aspect", v3_get_info),
    ("v3 GET aspect version", v3_get_info_version),
    ("v3 GET its key aspect", v3_get_key),
    ("v3 HEAD aspect", v3_head_info),
    ("v3 batchGet", v3_batch_get),
    ("v3 list", v3_list),
    ("v3 scroll", v3_scroll),
    ("v2 batch get", v2_batch_get),
    ("autocomplete", autocomplete),
    ("Rest.li /aspects", restli_aspect),
    ("Rest.li /entitiesV2", restli_entity_v2),
    ("GraphQL entity aspects(input:)", graphql_entity_aspects),
    ("GraphQL searchAcrossEntities", graphql_search),
    ("GraphQL viewUrn", graphql_view_urn),
    ("change feed", change_feed),
    ("Events API", events_api),
    ("trace API by urn", trace_of_urn),
    ("trace API by trace id", trace_of_write),
]


async def sequenced(db) -> None:
    """Every change log has its place in the feed (the sequencer's)."""

    async def done() -> bool:
        return await db.fetchval("SELECT count(*) FROM change_log_outbox WHERE feed_offset IS NULL") == 0

    assert await eventually(done)


EXPECTED = {
    ("owner", PERSONAL): True,
    ("owner", GLOBAL): True,
    ("other", PERSONAL): False,
    ("other", GLOBAL): True,
    ("admin", PERSONAL): True,
    ("admin", GLOBAL): True,
}


async def seen_by(app, client, db, seen: Seen) -> dict[tuple[str, str], bool]:
    """The owner writes a PERSONAL and a GLOBAL view; whether the owner, another reader and an admin each sees each
    view on the surface `seen` asks."""
    callers = {
        "owner": await bearer(app, "writer", actor=OWNER),
        "other": await bearer(app, "reader", actor=OTHER),
        "admin": {"Authorization": client.headers["Authorization"]},
    }
    ctx: dict[str, Any] = {"trace": {}}
    for urn, kind in ((PERSONAL, "PERSONAL"), (GLOBAL, "GLOBAL")):
        written = await client.post(
            "/openapi/v1/proposals",
            headers={**callers["owner"], **SYNC},
            json=[mcp("dataHubViewInfo", view_info(urn, kind), urn=urn, entity="dataHubView")],
        )
        assert written.status_code == 200, written.text
        ctx["trace"][urn] = written.headers["traceparent"].split("-")[1]
    await sequenced(db)
    table = {}
    for who, headers in callers.items():
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://metaledger", headers=headers
        ) as caller:
            for urn in (PERSONAL, GLOBAL):
                table[who, urn] = await seen(caller, urn, ctx)
    return table


@pytest.mark.parametrize("surface", SURFACES, ids=[name for name, _ in SURFACES])
async def test_a_personal_view_is_its_creators_on_every_read_surface(surface, app, client, db):
    assert await seen_by(app, client, db, surface[1]) == EXPECTED
