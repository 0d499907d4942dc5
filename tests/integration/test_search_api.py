"""The search, lineage and timeseries read APIs and the indexing runtime, end to end through the HTTP API: one
behaviour suite, run against both backends (the embedded Postgres backend and Elasticsearch-API on the osmem
OpenSearch test server). A backend that cannot be built or started fails its parametrization (never a skip)."""

from __future__ import annotations

import time
from functools import partial
from typing import Any
from urllib.parse import quote

import orjson
import pytest

from app.embedded_pg import free_port
from tests import helpers
from tests.helpers import ds, eventually, propose
from tests.integration.search_indices import (  # noqa: F401 - the module runs on both backends, on shared indices
    backend_name,
    opensearch_overrides,
    settings_overrides,
)

pytestmark = pytest.mark.asyncio

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
INDEX_DEADLINE_S = 5.0
# proposals without `aspect.contentType` (JSON by default)
mcp = partial(helpers.mcp, content_type=None)


def q(urn: str) -> str:
    return quote(urn, safe="")


@pytest.fixture(autouse=True)
def _backend_started(request, backend_name):
    """A backend that did not start is a failure of this parametrization, loudly."""
    if backend_name.endswith("-down") or "client" not in request.fixturenames:
        return
    runtime = request.getfixturevalue("app").state.search
    assert runtime.started, f"the {backend_name} search backend did not start: {runtime.last_error}"


# --- helpers --------------------------------------------------------------------------------------------------------


async def write(client, urn: str, aspects: dict[str, Any], *, sync: bool = False, entity: str = "dataset"):
    item: dict[str, Any] = {"urn": urn}
    for name, value in aspects.items():
        item[name] = {"value": value, **({"headers": SYNC} if sync else {})}
    response = await client.post(f"/openapi/v3/entity/{entity}?async=false", json=[item])
    assert response.status_code == 200, response.text
    return response


async def search(client, entity: str = "dataset", **params) -> dict[str, Any]:
    response = await client.get(f"/openapi/v3/entity/{entity}", params=params)
    assert response.status_code == 200, response.text
    return response.json()


async def urns_of(client, **params) -> list[str]:
    return [e["urn"] for e in (await search(client, **params))["entities"]]


async def caught_up(db) -> None:
    """Wait until the indexing worker has applied every sequenced outbox row (and every row is sequenced)."""

    async def done():
        pending = await db.fetchval("SELECT count(*) FROM change_log_outbox WHERE feed_offset IS NULL")
        last = await db.fetchval("SELECT last_offset FROM feed_reader_state WHERE reader = 'search-indexer'")
        top = await db.fetchval("SELECT coalesce(max(feed_offset), 0) FROM change_log_outbox")
        return pending == 0 and last is not None and last >= top

    await eventually(done, timeout=30, interval=0.05, what="indexing worker caught up")


# --- search -------------------------------------------------------------------------------------------------------


async def test_a_write_is_searchable_through_the_worker_within_a_second(client):
    urn = ds("sales.orders")
    started = time.monotonic()
    await write(client, urn, {"datasetProperties": {"name": "orders", "description": "All orders"}})
    body = await eventually(lambda: _found(client, "orders", urn), timeout=3, interval=0.05, what="searchable")
    elapsed = time.monotonic() - started
    assert elapsed < 1.5, f"searchable after {elapsed:.2f}s"
    entity = next(e for e in body["entities"] if e["urn"] == urn)
    assert entity["datasetProperties"]["value"]["name"] == "orders"  # aspects as in GET entity
    assert body["totalCount"] >= 1


async def _found(client, query: str, urn: str):
    body = await search(client, query=query)
    return body if any(e["urn"] == urn for e in body["entities"]) else None


async def test_sync_header_is_visible_in_the_very_next_search(client):
    urn = ds("sync.one")
    body = await propose(client, mcp("datasetProperties", {"name": "zebracorn", "description": "d"}, urn, sync=True))
    assert body["index"] == {"status": "UPDATED"}
    assert urn in await urns_of(client, query="zebracorn")
    # v3 with the HTTP header (extension) answers in a response header
    urn2 = ds("sync.two")
    response = await client.post(
        "/openapi/v3/entity/dataset?async=false",
        headers=SYNC,
        json=[{"urn": urn2, "datasetProperties": {"value": {"name": "okapicorn"}}}],
    )
    assert response.status_code == 200 and response.headers["X-Metaledger-Index-Update"] == "UPDATED"
    assert urn2 in await urns_of(client, query="okapicorn")
    # Rest.li ingestProposal with the MCP header
    urn3 = ds("sync.three")
    response = await client.post(
        "/aspects?action=ingestProposal",
        json={
            "proposal": {
                "entityType": "dataset",
                "entityUrn": urn3,
                "changeType": "UPSERT",
                "aspectName": "datasetProperties",
                "aspect": {"value": orjson.dumps({"name": "quokkacorn"}).decode(), "contentType": "application/json"},
                "headers": SYNC,
            }
        },
    )
    assert response.status_code == 200 and response.headers["X-Metaledger-Index-Update"] == "UPDATED"
    assert urn3 in await urns_of(client, query="quokkacorn")
    # without the header: no index field
    plain = await propose(client, mcp("datasetProperties", {"name": "x"}, ds("sync.four")))
    assert "index" not in plain


async def test_exact_name_beats_a_description_match(client):
    named, described = ds("rel.a"), ds("rel.b")
    await write(
        client,
        described,
        {"datasetProperties": {"name": "misc", "description": "holds every invoices row of the shop"}},
        sync=True,
    )
    await write(client, named, {"datasetProperties": {"name": "invoices", "description": "money"}}, sync=True)
    hits = await urns_of(client, query="invoices")
    assert hits[:2] == [named, described]


async def test_filters_on_filter_fields(client):
    hive, snow = ds("f.one", "hive"), ds("f.two", "snowflake")
    for urn in (hive, snow):
        await write(client, urn, {"datasetProperties": {"name": "filtered thing"}}, sync=True)
    assert await urns_of(client, query="filtered", filter_platform="urn:li:dataPlatform:hive") == [hive]
    assert await urns_of(client, query="filtered", filter_platform="urn:li:dataPlatform:snowflake") == [snow]
    both = await urns_of(
        client, query="filtered", filter_platform=["urn:li:dataPlatform:hive", "urn:li:dataPlatform:snowflake"]
    )
    assert sorted(both) == sorted([hive, snow])


async def test_soft_deleted_entities_are_hidden(client):
    urn = ds("soft.gone")
    await write(client, urn, {"datasetProperties": {"name": "ghostly"}}, sync=True)
    assert await urns_of(client, query="ghostly") == [urn]
    await write(client, urn, {"status": {"removed": True}}, sync=True)
    assert await urns_of(client, query="ghostly") == []
    assert await urns_of(client, query="ghostly", includeSoftDelete="true") == [urn]
    await write(client, urn, {"status": {"removed": False}}, sync=True)
    assert await urns_of(client, query="ghostly") == [urn]


async def test_scroll_through_every_document(client, db):
    total = 2_000
    batch = 500
    for start in range(0, total, batch):
        await propose(
            client,
            *[
                mcp("datasetProperties", {"name": f"scrolly {i}"}, ds(f"scroll.t{i:05d}"))
                for i in range(start, start + batch)
            ],
        )
    await caught_up(db)
    seen: list[str] = []
    scroll_id = None
    pages = 0
    while True:
        params = {"query": "*", "count": 300, "aspects": "datasetProperties"}
        if scroll_id:
            params["scrollId"] = scroll_id
        body = await search(client, **params)
        seen.extend(e["urn"] for e in body["entities"])
        pages += 1
        scroll_id = body.get("scrollId")
        if not scroll_id:
            break
        assert pages < 100
    assert len(seen) == len(set(seen)) == total
    assert body["totalCount"] == total


async def test_autocomplete(client):
    urn = ds("ac.customers")
    await write(client, urn, {"datasetProperties": {"name": "customer_accounts"}}, sync=True)
    response = await client.get("/openapi/v1/search/dataset/autocomplete", params={"query": "customer_acc", "limit": 5})
    assert response.status_code == 200, response.text
    body = response.json()
    assert urn in [e["urn"] for e in body["entities"]]
    assert body["suggestions"]


# --- graph --------------------------------------------------------------------------------------------------------


def upstreams(*urns: str) -> dict[str, Any]:
    return {
        "upstreams": [
            {"dataset": u, "type": "TRANSFORMED", "auditStamp": {"time": 0, "actor": "urn:li:corpuser:unknown"}}
            for u in urns
        ]
    }


async def test_lineage_three_hops_both_ways(client):
    a, b, c, d, e = (ds(f"lin.{x}") for x in "abcde")
    await write(client, b, {"upstreamLineage": upstreams(a)}, sync=True)
    await write(client, c, {"upstreamLineage": upstreams(b)}, sync=True)
    await write(client, d, {"upstreamLineage": upstreams(c)}, sync=True)
    await write(client, e, {"upstreamLineage": upstreams(d)}, sync=True)

    async def lineage(urn, direction, hops=3):
        response = await client.get(f"/openapi/v1/lineage/{q(urn)}", params={"direction": direction, "maxHops": hops})
        assert response.status_code == 200, response.text
        return [(x["urn"], x["hop"]) for x in response.json()["entities"]]

    assert await lineage(e, "UPSTREAM") == [(d, 1), (c, 2), (b, 3)]
    assert await lineage(e, "UPSTREAM", 1) == [(d, 1)]
    assert await lineage(a, "DOWNSTREAM") == [(b, 1), (c, 2), (d, 3)]
    # replacing an aspect replaces its edges
    await write(client, c, {"upstreamLineage": upstreams()}, sync=True)
    assert await lineage(e, "UPSTREAM") == [(d, 1), (c, 2)]


async def test_relationships_in_both_directions(client):
    urn, owner = ds("rel.owned"), "urn:li:corpuser:jdoe"
    await write(
        client,
        urn,
        {
            "ownership": {
                "owners": [{"owner": owner, "type": "DATAOWNER"}],
                "lastModified": {"time": 1, "actor": "urn:li:corpuser:admin"},
            }
        },
        sync=True,
    )
    out = await client.get(
        f"/openapi/v3/relationship/dataset/{q(urn)}", params={"relationshipType[]": "OwnedBy", "direction": "OUTGOING"}
    )
    assert out.status_code == 200, out.text
    results = out.json()["results"]
    assert [(r["source"]["urn"], r["destination"]["urn"], r["relationshipType"]) for r in results] == [
        (urn, owner, "OwnedBy")
    ]
    assert results[0]["destination"]["entityType"] == "corpuser"
    incoming = await client.get(f"/openapi/v3/relationship/corpuser/{q(owner)}", params={"direction": "INCOMING"})
    assert incoming.status_code == 200, incoming.text
    assert [(r["source"]["urn"], r["relationshipType"]) for r in incoming.json()["results"]] == [(urn, "OwnedBy")]
    none = await client.get(f"/openapi/v3/relationship/dataset/{q(urn)}", params={"relationshipType[]": "DownstreamOf"})
    assert none.json()["results"] == []


# --- timeseries -----------------------------------------------------------------------------------------------------

DAY = 86_400_000
T0 = 1_700_000_000_000 - (1_700_000_000_000 % DAY)  # a UTC midnight


def profile(ts: int, rows: int) -> dict[str, Any]:
    return {"timestampMillis": ts, "rowCount": rows, "columnCount": 3}


async def test_timeseries_range_query_through_the_restli_action(client):
    urn = ds("ts.profiled")
    points = [(T0 + i * 3_600_000, 100 + i) for i in range(5)] + [(T0 + DAY + 60_000, 500)]
    await propose(client, *[mcp("datasetProfile", profile(ts, rows), urn, sync=True) for ts, rows in points])

    async def action(**body):
        response = await client.post(
            "/aspects?action=getTimeseriesAspectValues",
            json={"urn": urn, "entity": "dataset", "aspect": "datasetProfile", **body},
        )
        assert response.status_code == 200, response.text
        return [orjson.loads(v["aspect"]["value"]) for v in response.json()["value"]["values"]]

    everything = await action()
    assert [v["timestampMillis"] for v in everything] == sorted((ts for ts, _ in points), reverse=True)
    ranged = await action(startTimeMillis=T0 + 3_600_000, endTimeMillis=T0 + 3 * 3_600_000)
    assert [v["rowCount"] for v in ranged] == [103, 102, 101]
    assert [v["rowCount"] for v in await action(limit=2)] == [500, 104]
    assert [v["rowCount"] for v in await action(latestValue=True)] == [500]
    filtered = await action(filter={"or": [{"and": [{"field": "rowCount", "condition": "EQUAL", "values": ["102"]}]}]})
    assert [v["rowCount"] for v in filtered] == [102]
    greater = await action(
        filter={"or": [{"and": [{"field": "rowCount", "condition": "GREATER_THAN", "values": ["103"]}]}]}
    )
    assert [v["rowCount"] for v in greater] == [500, 104]
    # re-sending a point overwrites it (DataHub's document id)
    await propose(client, mcp("datasetProfile", profile(T0, 999), urn, sync=True))
    assert [v["rowCount"] for v in await action(startTimeMillis=T0, endTimeMillis=T0)] == [999]

    latest = await client.get("/openapi/v1/timeseries/dataset/datasetProfile/latest", params={"urn": urn})
    assert latest.status_code == 200 and latest.json()["value"]["rowCount"] == 500
    daily = await client.get(
        "/openapi/v1/timeseries/dataset/datasetProfile/daily", params={"urn": urn, "field": "rowCount"}
    )
    assert daily.status_code == 200, daily.text
    buckets = daily.json()["buckets"]
    assert [(b["startMillis"], b["count"], b["sum"], b["latest"]) for b in buckets] == [
        (T0, 5, 999 + 101 + 102 + 103 + 104, 104),
        (T0 + DAY, 1, 500, 500),
    ]
    missing = await client.get("/openapi/v1/timeseries/dataset/datasetProfile/latest", params={"urn": ds("ts.none")})
    assert missing.status_code == 404


# --- trace, replay, order -----------------------------------------------------------------------------------------


async def test_trace_reports_primary_and_search_storage(client):
    urn = ds("trace.me")
    await write(client, urn, {"datasetProperties": {"name": "traced"}}, sync=True)
    response = await client.get(f"/openapi/v1/trace/write/{q(urn)}", params={"aspect": "datasetProperties"})
    assert response.status_code == 200, response.text
    status = response.json()["aspects"]["datasetProperties"]
    assert status == {
        "primaryStorage": {"writeStatus": "ACTIVE_STATE", "version": "1"},
        "searchStorage": {"writeStatus": "ACTIVE_STATE", "version": "1"},
    }
    # a change the index has not seen yet is PENDING: write around the index (backend apply skipped)
    runtime = client._transport.app.state.search
    original = runtime.backend.apply

    async def failing(changes):
        raise ConnectionError("index down")

    runtime.backend.apply = failing
    try:
        body = await propose(client, mcp("datasetProperties", {"name": "traced again"}, urn, sync=True))
        assert body["index"]["status"] == "PENDING" and "index down" in body["index"]["error"]
        response = await client.get(f"/openapi/v1/trace/write/{q(urn)}", params={"aspect": "datasetProperties"})
        status = response.json()["aspects"]["datasetProperties"]
        assert status["primaryStorage"]["version"] == "2"
        assert status["searchStorage"]["writeStatus"] == "PENDING"
    finally:
        runtime.backend.apply = original

    async def active():
        r = await client.get(f"/openapi/v1/trace/write/{q(urn)}", params={"aspect": "datasetProperties"})
        return r.json()["aspects"]["datasetProperties"]["searchStorage"]["writeStatus"] == "ACTIVE_STATE"

    await eventually(
        active, timeout=INDEX_DEADLINE_S, interval=0.05, what="the worker caught up after the failed sync update"
    )


async def test_out_of_order_and_replayed_change_logs_never_regress(client, db):
    urn = ds("order.me")
    await write(client, urn, {"datasetProperties": {"name": "firstname"}})
    await write(client, urn, {"datasetProperties": {"name": "secondname"}})
    await caught_up(db)
    rows = await db.fetch(
        "SELECT payload FROM change_log_outbox WHERE urn = $1 AND aspect = 'datasetProperties' AND topic = $2 ORDER BY version",
        urn,
        "MetadataChangeLog_Versioned_v1",
    )
    mcls = [orjson.loads(r["payload"]) for r in rows]
    assert len(mcls) == 2
    runtime = client._transport.app.state.search
    await runtime.indexer.apply_mcls([mcls[1], mcls[0]])  # newer, then older
    await runtime.indexer.apply_mcls([mcls[0]])
    assert await urns_of(client, query="secondname") == [urn]
    assert await urns_of(client, query="firstname") == []
    # replay the whole feed through the worker
    await db.execute("UPDATE feed_reader_state SET last_offset = 0 WHERE reader = 'search-indexer'")
    await caught_up(db)
    assert await urns_of(client, query="secondname") == [urn]
    assert await urns_of(client, query="firstname") == []
    assert (await runtime.backend.document_versions(urn))["datasetProperties"] == 2


async def test_hard_delete_removes_the_document_and_edges(client, db):
    urn, up = ds("del.me"), ds("del.up")
    await write(client, urn, {"datasetProperties": {"name": "doomed"}, "upstreamLineage": upstreams(up)}, sync=True)
    assert await urns_of(client, query="doomed") == [urn]
    # (the worker must have applied the writes first: a replay of an older change log after an entity's hard delete
    # re-creates what it carried; see the report)
    await caught_up(db)
    response = await client.delete(f"/openapi/v3/entity/dataset/{q(urn)}", headers=SYNC)
    assert response.status_code == 200 and response.headers["X-Metaledger-Index-Update"] == "UPDATED"
    assert await urns_of(client, query="doomed") == []
    lineage = await client.get(f"/openapi/v1/lineage/{q(up)}", params={"direction": "DOWNSTREAM"})
    assert lineage.json()["entities"] == []


async def test_get_entity_by_urn_still_routes_next_to_search(client):
    urn = ds("route.me")
    await write(client, urn, {"datasetProperties": {"name": "routed"}})
    response = await client.get(f"/openapi/v3/entity/dataset/{q(urn)}")
    assert response.status_code == 200 and response.json()["urn"] == urn
    assert (await client.get("/openapi/v3/entity/nosuchentity")).status_code == 400


# --- the backend down -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend_name", ["opensearch-down"])
@pytest.mark.parametrize(
    "settings_overrides", [{"search_url": f"http://127.0.0.1:{free_port()}", "search_flavor": "opensearch"}]
)
async def test_sync_index_with_the_backend_down_commits_and_answers_pending(client, db):
    urn = ds("down.one")
    body = await propose(client, mcp("datasetProperties", {"name": "stillwritten"}, urn, sync=True))
    assert body["index"]["status"] == "PENDING" and body["index"]["error"]
    assert body["results"][0]["status"] == "CREATED"
    response = await client.post(
        "/openapi/v3/entity/dataset?async=false",
        headers=SYNC,
        json=[{"urn": urn, "datasetProperties": {"value": {"name": "again"}}}],
    )
    assert response.status_code == 200 and response.headers["X-Metaledger-Index-Update"] == "PENDING"
    assert (
        await db.fetchval(
            "SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'datasetProperties'", urn
        )
        == 2
    )
    assert (await client.get("/openapi/v3/entity/dataset", params={"query": "again"})).status_code == 503


# --- pruning ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend_name", ["none"])
async def test_pruning_keeps_rows_the_indexer_has_not_applied(db):
    from app.changelog import outbox

    for offset in (1, 2, 3):
        await db.execute(
            "INSERT INTO change_log_outbox (topic, message_key, urn, aspect, version, change_type, payload, created_at, feed_offset)"
            " VALUES ('t', 'k', 'urn:li:corpuser:x', 'a', $1, 'UPSERT', '{}', now() - interval '2 days', $1)",
            offset,
        )
    # an indexer registered at offset 1: rows 2 and 3 stay until it has applied them
    await db.execute("INSERT INTO feed_reader_state (reader, last_offset) VALUES ('search-indexer', 1)")
    deleted, after = await outbox.prune(db, 3600, kafka=False, after=0)
    assert (deleted, after) == (1, 1)
    assert [r[0] for r in await db.fetch("SELECT feed_offset FROM change_log_outbox ORDER BY 1")] == [2, 3]
    await db.execute("UPDATE feed_reader_state SET last_offset = 3 WHERE reader = 'search-indexer'")
    deleted, after = await outbox.prune(db, 3600, kafka=False, after=after)
    assert (deleted, after) == (2, 3)


# --- hard delete and re-create: tombstones, order safety -----------------------------------------------------------


async def _versioned_mcls(db, urn: str) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT payload FROM change_log_outbox WHERE urn = $1 AND topic = 'MetadataChangeLog_Versioned_v1' ORDER BY id",
        urn,
    )
    return [orjson.loads(r["payload"]) for r in rows]


async def _index_state(backend, gone: str, neighbour: str) -> dict[str, Any]:
    """What every read says about a (possibly hard-deleted) entity and its lineage neighbour."""
    page = await backend.search("dataset", "*", count=50)
    soft = await backend.search("dataset", "*", count=50, filters={"removed": ["true", "false"]})
    return {
        "hits": sorted(h.urn for h in page.hits),
        "total": page.total,
        "platform_facet": page.facets.get("platform"),
        "with_soft_deleted": sorted(h.urn for h in soft.hits),
        "named": sorted(h.urn for h in (await backend.search("dataset", "tombstoned")).hits),
        "autocomplete": sorted(h.urn for h in await backend.autocomplete("dataset", "tombstoned")),
        "versions": await backend.document_versions(gone),
        "out": sorted(
            (e.relationship, e.destination) for e in (await backend.relationships(gone, direction="OUTGOING"))[0]
        ),
        "in": sorted(
            (e.relationship, e.source) for e in (await backend.relationships(neighbour, direction="INCOMING"))[0]
        ),
        "upstream": sorted((e.destination, hop) for e, hop in await backend.lineage(gone, direction="UPSTREAM")),
        "downstream": sorted((e.source, hop) for e, hop in await backend.lineage(neighbour, direction="DOWNSTREAM")),
    }


async def _replay(indexer, mcls: list[dict[str, Any]]) -> None:
    for mcl in mcls:  # one apply per change log: the worst reordering (each lands in its own batch)
        await indexer.apply_mcls([mcl])


async def test_a_hard_delete_leaves_a_tombstone_that_older_change_logs_cannot_revive(client, db, registry):
    from app.search.service import Indexer

    gone, up, other = ds("tomb_a"), ds("tomb_up"), ds("tomb_other")
    await write(client, up, {"datasetProperties": {"name": "upstream"}})
    await write(client, other, {"datasetProperties": {"name": "other"}})
    await write(
        client,
        gone,
        {
            "datasetProperties": {"name": "tombstoned", "description": "first"},
            "globalTags": {"tags": [{"tag": "urn:li:tag:pii"}]},
            "upstreamLineage": {"upstreams": [{"dataset": up, "type": "TRANSFORMED"}]},
        },
    )
    await write(client, gone, {"datasetProperties": {"name": "tombstoned", "description": "second"}})
    await caught_up(db)
    runtime = client._transport.app.state.search
    backend = runtime.backend
    before = await _index_state(backend, gone, up)
    assert before["named"] == [gone] and before["autocomplete"] == [gone] and before["upstream"] == [(up, 1)]
    assert before["versions"]["datasetProperties"] == 2

    response = await client.post("/entities?action=delete", json={"urn": gone})
    assert response.status_code == 200, response.text
    await caught_up(db)
    in_order = await _index_state(backend, gone, up)
    assert in_order == {
        "hits": sorted([up, other]),
        "total": 2,
        "platform_facet": before["platform_facet"] and {"urn:li:dataPlatform:hive": 2},
        "with_soft_deleted": sorted([up, other]),
        "named": [],
        "autocomplete": [],
        "versions": {},
        "out": [],
        "in": [],
        "upstream": [],
        "downstream": [],
    }
    mcls = await _versioned_mcls(db, gone)
    indexer = Indexer(runtime.settings, registry, backend)
    # replayed in order, backwards, shuffled, one batch: always the in-order state (nothing revived)
    for order in (mcls, mcls[::-1], mcls[1::2] + mcls[0::2], mcls[2:] + mcls[:2]):
        await _replay(indexer, order)
        assert await _index_state(backend, gone, up) == in_order
    await indexer.apply_mcls(mcls[::-1])
    assert await _index_state(backend, gone, up) == in_order

    # re-created: versions continue past the deleted ones, so the new values win and the old logs stay stale
    await write(
        client,
        gone,
        {
            "datasetProperties": {"name": "tombstoned", "description": "reborn"},
            "upstreamLineage": {"upstreams": [{"dataset": other, "type": "TRANSFORMED"}]},
        },
    )
    await caught_up(db)
    reborn = await _index_state(backend, gone, other)
    assert reborn["named"] == [gone] and reborn["autocomplete"] == [gone] and reborn["total"] == 3
    assert reborn["versions"]["datasetProperties"] == 3 and reborn["versions"]["datasetKey"] == 2
    assert "globalTags" not in (await backend.search("dataset", "tombstoned")).hits[0].fields.get("tags", [])
    assert reborn["upstream"] == [(other, 1)] and reborn["out"] == [("DownstreamOf", other)]
    hit = (await search(client, query="tombstoned"))["entities"]
    assert [h["urn"] for h in hit] == [gone]
    everything = await _versioned_mcls(db, gone)
    for order in (mcls, mcls[::-1], everything[::-1], everything[1::2] + everything[0::2]):
        await _replay(indexer, order)
        assert await _index_state(backend, gone, other) == reborn
    props = (await backend.search("dataset", "tombstoned")).hits[0].fields
    assert props.get("description") == "reborn" and not props.get("tags")
    # the old upstream stays gone from both sides
    assert (await _index_state(backend, gone, up))["in"] == [] and (await _index_state(backend, gone, up))[
        "downstream"
    ] == []


async def test_a_tombstone_is_never_a_search_hit_even_with_soft_deleted_included(client, db):
    gone = ds("tomb_soft")
    await write(client, gone, {"datasetProperties": {"name": "tombstoned"}, "status": {"removed": True}})
    await caught_up(db)
    assert await urns_of(client, query="tombstoned", includeSoftDelete="true") == [gone]
    response = await client.post("/entities?action=delete", json={"urn": gone})
    assert response.status_code == 200, response.text
    await caught_up(db)
    assert await urns_of(client, query="tombstoned", includeSoftDelete="true") == []
    assert (await search(client, query="*", includeSoftDelete="true"))["entities"] == []
    response = await client.get("/openapi/v1/search/dataset/autocomplete", params={"query": "tombst"})
    assert response.status_code == 200 and gone not in response.text
