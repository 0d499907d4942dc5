"""The embedded search backend (`app.search.postgres.PostgresBackend`) against the real Postgres: relevance, filters
and facets, scrolling 10k documents, soft delete, idempotent and out-of-order application, deletes, the graph,
lineage and timeseries. Records are built directly (the model's dataclasses), as `changes_from_mcl` produces them."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

import pytest_asyncio

from app.db import create_engine
from app.search.model import (
    AspectEdges,
    AspectFields,
    Criterion,
    Edge,
    EntityRemoval,
    IndexedVersion,
    TimeseriesPoint,
    TimeseriesQuery,
)
from app.search.postgres import PostgresBackend
from app.settings import Settings
from tests.helpers import ds


def key(urn: str, version: int = 1) -> AspectFields:
    platform = urn.split("dataPlatform:")[1].split(",")[0]
    env = urn.rsplit(",", 1)[1].rstrip(")")
    return AspectFields(
        "dataset", urn, "datasetKey", version, {"platform": f"urn:li:dataPlatform:{platform}", "origin": env}
    )


def props(urn: str, name: str, description: str = "", version: int = 1) -> AspectFields:
    return AspectFields("dataset", urn, "datasetProperties", version, {"name": name, "description": description})


def tags(urn: str, *names: str, version: int = 1) -> AspectFields:
    return AspectFields("dataset", urn, "globalTags", version, {"tags": [f"urn:li:tag:{n}" for n in names]})


def status(urn: str, removed: bool, version: int = 1) -> AspectFields:
    return AspectFields("dataset", urn, "status", version, {"removed": removed})


def lineage(urn: str, *upstreams: str, version: int = 1) -> AspectEdges:
    return AspectEdges(
        urn,
        "upstreamLineage",
        version,
        tuple(
            Edge(urn, up, "DownstreamOf", "dataset", "dataset", created_on=1000 + version, is_lineage=True,
                 properties={"type": "TRANSFORMED"})  # fmt: skip
            for up in upstreams
        ),
    )


def owners(urn: str, *users: str, version: int = 1) -> AspectEdges:
    return AspectEdges(
        urn, "ownership", version, tuple(Edge(urn, f"urn:li:corpuser:{u}", "OwnedBy", "dataset", "corpuser") for u in users)
    )


@pytest_asyncio.fixture
async def backend(database_url, registry):
    engine = create_engine(database_url)
    backend = PostgresBackend(Settings(database_url=database_url), registry, engine)
    await backend.start()
    yield backend
    await backend.close()
    await engine.dispose()


async def urns_of(backend, query: str, **kwargs) -> list[str]:
    page = await backend.search("dataset", query, count=100, **kwargs)
    return [h.urn for h in page.hits]


# --- relevance ---------------------------------------------------------------------------------------------------


async def test_exact_name_beats_description_match(backend):
    orders, sales, other = ds("db.orders"), ds("db.sales"), ds("db.customers")
    await backend.apply([
        key(orders), props(orders, "orders", "one row per order"),
        key(sales), props(sales, "sales", "daily totals of orders and refunds, orders orders"),
        key(other), props(other, "customers", "people"),
    ])  # fmt: skip
    hits = (await backend.search("dataset", "orders")).hits
    assert [h.urn for h in hits] == [orders, sales]
    assert hits[0].score > hits[1].score
    assert hits[0].fields["name"] == "orders"
    # a name match beats a description match without the exact bonus too (weights A vs C)
    assert await urns_of(backend, "order") == [orders, sales]
    # prefix matching, case-insensitive; words of the urn are searchable
    assert await urns_of(backend, "CUST") == [other]
    assert await urns_of(backend, "db.customers") == [other]
    assert set(await urns_of(backend, "*")) == {orders, sales, other}
    assert set(await urns_of(backend, "")) == {orders, sales, other}
    assert await urns_of(backend, "nothing-like-this") == []
    # websearch syntax: phrases and negation
    assert await urns_of(backend, '"daily totals"') == [sales]
    assert await urns_of(backend, "orders -refunds") == [orders]
    # exact urn first (the other one has every word of it too)
    assert (await urns_of(backend, orders))[0] == orders
    # other entity types are not mixed in
    assert (await backend.search("chart", "orders")).total == 0


async def test_a_text_query_is_answered_by_indexes(backend, monkeypatch):
    # Each statement of a text search (the page and its count) can be a BitmapOr of the two GIN indexes, one per arm
    # of the match (the tsvector, the exact names). An arm no index answers (`x = ANY(exact_names)` was one) leaves
    # Postgres nothing but reading every document of the type. On a table this small the planner would read it all
    # anyway: table scans are priced out, and the (entity_type, urn) index, the other way to read every document of
    # a type, is dropped from this test's database.
    orders = ds("db.orders")
    others = [ds(f"db.t{i}") for i in range(200)]
    await backend.apply([key(orders), props(orders, "orders", "one row per order")]
                        + [c for u in others for c in (key(u), props(u, u.split(",")[1], "a table"))])
    async with backend._connection(readonly=False) as conn:
        await conn.execute("DROP INDEX ix_search_document_type_urn")
        await conn.execute("ANALYZE search_document")
    plans: list[str] = []
    plain = backend._connection

    class Explaining:
        def __init__(self, conn):
            self._conn = conn

        async def _explain(self, sql, args):
            await self._conn.execute("SET LOCAL enable_seqscan = off")
            plans.append("\n".join(r[0] for r in await self._conn.fetch(f"EXPLAIN {sql}", *args)))

        async def fetch(self, sql, *args):
            await self._explain(sql, args)
            return await self._conn.fetch(sql, *args)

        async def fetchval(self, sql, *args):
            await self._explain(sql, args)
            return await self._conn.fetchval(sql, *args)

    @asynccontextmanager
    async def explaining(*, readonly: bool = True):
        async with plain(readonly=readonly) as conn:
            yield Explaining(conn)

    monkeypatch.setattr(backend, "_connection", explaining)
    for query in ("orders", "db.orders", '"one row"', orders):
        plans.clear()
        page = await backend.search("dataset", query, facets=False)
        assert [h.urn for h in page.hits] == [orders] and page.total == 1
        assert len(plans) == 2  # the page and the count
        for plan in plans:
            assert "Seq Scan" not in plan, plan
            assert "ix_search_document_vector" in plan and "ix_search_document_exact_names" in plan, plan


async def test_reads_are_planned_for_their_parameters(backend):
    # asyncpg prepares every statement; a generic plan (chosen after five executions) ignores how many documents a
    # filter value matches, so the backend's reads always get a plan for their own parameters
    async with backend._connection() as conn:
        assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
        assert await conn.fetchval("SHOW jit") == "off"
    async with backend._connection(readonly=False) as conn:
        assert await conn.fetchval("SHOW plan_cache_mode") == "auto"


async def test_autocomplete(backend):
    a, b, c = ds("db.orders"), ds("db.orders_archive"), ds("db.reorders")
    await backend.apply([key(a), props(a, "orders"), key(b), props(b, "orders_archive"), key(c), props(c, "reorders")])
    hits = await backend.autocomplete("dataset", "ord")
    assert [h.urn for h in hits][:2] == [a, b]  # shortest name first
    assert c not in [h.urn for h in hits]
    assert [h.urn for h in await backend.autocomplete("dataset", "ord", limit=1)] == [a]
    assert await backend.autocomplete("dataset", "zzz") == []


# --- filters, facets, scrolling ------------------------------------------------------------------------------------


async def test_filters_and_facets(backend):
    a, b, c, d = ds("a"), ds("b", "kafka"), ds("c", env="DEV"), ds("d", "kafka", "DEV")
    await backend.apply([
        key(a), props(a, "alpha"), tags(a, "pii", "gold"),
        key(b), props(b, "beta"), tags(b, "pii"),
        key(c), props(c, "gamma"),
        key(d), props(d, "delta"), tags(d, "gold"),
    ])  # fmt: skip
    assert set(await urns_of(backend, "*", filters={"platform": ["urn:li:dataPlatform:kafka"]})) == {b, d}
    assert set(await urns_of(backend, "*", filters={"origin": ["DEV"]})) == {c, d}
    # list-valued fields: any of the values; several filters: all of them
    assert set(await urns_of(backend, "*", filters={"tags": ["urn:li:tag:pii"]})) == {a, b}
    assert set(await urns_of(backend, "*", filters={"tags": ["urn:li:tag:pii", "urn:li:tag:gold"]})) == {a, b, d}
    assert await urns_of(backend, "*", filters={"tags": ["urn:li:tag:gold"], "origin": ["DEV"]}) == [d]
    assert await urns_of(backend, "delta", filters={"origin": ["PROD"]}) == []
    assert await urns_of(backend, "*", filters={"urn": [a]}) == [a]

    page = await backend.search("dataset", "*")
    assert page.total == 4
    assert page.facets["platform"] == {"urn:li:dataPlatform:hive": 2, "urn:li:dataPlatform:kafka": 2}
    assert page.facets["origin"] == {"PROD": 2, "DEV": 2}
    assert page.facets["tags"] == {"urn:li:tag:pii": 2, "urn:li:tag:gold": 2}
    # facets count the matching documents only
    page = await backend.search("dataset", "*", filters={"origin": ["DEV"]})
    assert page.facets["tags"] == {"urn:li:tag:gold": 1}
    assert page.facets["platform"] == {"urn:li:dataPlatform:hive": 1, "urn:li:dataPlatform:kafka": 1}


async def test_any_of_groups_negation_and_removed(backend):
    """`any_of` (GraphQL's orFilters): OR of AND groups, negated criteria, `removed` named in a group."""
    a, b, c, d = ds("a"), ds("b", "kafka"), ds("c", env="DEV"), ds("d", "kafka", "DEV")
    await backend.apply([key(a), tags(a, "pii"), key(b), key(c), key(d), tags(d, "pii"), status(d, True)])
    kafka, dev = Criterion("platform", ("urn:li:dataPlatform:kafka",)), Criterion("origin", ("DEV",))
    assert set(await urns_of(backend, "*", any_of=[[kafka], [dev]])) == {b, c}  # d is soft-deleted
    assert await urns_of(backend, "*", any_of=[[kafka, dev]]) == []
    assert set(await urns_of(backend, "*", any_of=[[Criterion("tags", ("urn:li:tag:pii",), negated=True)]])) == {b, c}
    not_removed = Criterion("removed", ("true",), negated=True)
    assert set(await urns_of(backend, "*", any_of=[[kafka, not_removed]])) == {b}
    assert set(await urns_of(backend, "*", any_of=[[kafka, Criterion("removed", ("true",))]])) == {d}
    assert await urns_of(backend, "*", any_of=[]) == []  # no group: nothing matches
    assert set(await urns_of(backend, "*", any_of=[[]])) == {a, b, c}  # an empty group: everything
    page = await backend.search("dataset", "*", any_of=[[kafka]], facets=False)
    assert page.total == 1 and page.facets == {}


async def test_scroll_through_10k_documents(backend):
    n = 10_500
    urns = [ds(f"db.table_{i:05d}") for i in range(n)]
    started = time.perf_counter()
    changes = []
    for i, urn in enumerate(urns):
        changes += [key(urn), props(urn, f"table_{i:05d}", "bulk loaded " + ("even" if i % 2 == 0 else "odd"))]
    for start in range(0, len(changes), 5000):
        await backend.apply(changes[start : start + 5000])
    load_s = time.perf_counter() - started
    assert load_s < 30, load_s

    seen: list[str] = []
    scroll = None
    pages = 0
    while True:
        page = await backend.search("dataset", "*", count=1000, scroll_id=scroll)
        assert page.total == n
        seen += [h.urn for h in page.hits]
        pages += 1
        scroll = page.scroll_id
        if scroll is None:
            break
    assert pages == 11
    assert len(seen) == n and set(seen) == set(urns)
    assert seen == sorted(seen)  # score ties: urn order

    # scrolling a ranked query: every match once, scores never increase
    seen, scores, scroll = [], [], None
    while True:
        page = await backend.search("dataset", "even", count=700, scroll_id=scroll)
        seen += [h.urn for h in page.hits]
        scores += [h.score for h in page.hits]
        if (scroll := page.scroll_id) is None:
            break
    assert len(seen) == len(set(seen)) == (n + 1) // 2
    assert scores == sorted(scores, reverse=True)

    # sorted by a field, descending
    page = await backend.search("dataset", "*", count=3, sort=[("name", "DESCENDING")])
    assert [h.fields["name"] for h in page.hits] == ["table_10499", "table_10498", "table_10497"]
    page = await backend.search("dataset", "*", count=3, sort=[("name", "DESCENDING")], scroll_id=page.scroll_id)
    assert [h.fields["name"] for h in page.hits] == ["table_10496", "table_10495", "table_10494"]
    print(f"\nloaded {n} documents ({2 * n} aspects) in {load_s:.2f}s")


# --- soft delete, replay, order ------------------------------------------------------------------------------------


async def test_soft_delete_hides_and_restores(backend):
    a, b = ds("a"), ds("b")
    await backend.apply([key(a), props(a, "orders"), key(b), props(b, "orders_b"), status(a, True)])
    assert await urns_of(backend, "orders") == [b]
    assert (await backend.search("dataset", "*")).total == 1
    assert await backend.autocomplete("dataset", "orders") and [h.urn for h in await backend.autocomplete("dataset", "orders")] == [b]
    # explicitly asked for
    assert await urns_of(backend, "*", filters={"removed": ["true"]}) == [a]
    await backend.apply([status(a, False, version=2)])
    assert set(await urns_of(backend, "orders")) == {a, b}


async def test_idempotent_replay(backend, database_url):
    a, b = ds("a"), ds("b")
    batch = [key(a), props(a, "alpha", "first"), tags(a, "pii"), lineage(a, b), owners(a, "jdoe"),
             TimeseriesPoint("datasetProfile", "p1", a, "dataset", 1000, {"rowCount": 5}, {"rowCount": 5})]  # fmt: skip
    await backend.apply(batch)
    first = await backend.search("dataset", "alpha")
    # the same batch twice more, and the same change twice inside one batch
    await backend.apply(batch)
    await backend.apply(batch + batch)
    again = await backend.search("dataset", "alpha")
    assert [(h.urn, h.fields, h.score) for h in again.hits] == [(h.urn, h.fields, h.score) for h in first.hits]
    assert len((await backend.relationships(a, direction="OUTGOING"))[0]) == 2
    assert len(await backend.timeseries(TimeseriesQuery(a, "datasetProfile"))) == 1
    assert await backend.document_versions(a) == {"datasetKey": 1, "datasetProperties": 1, "globalTags": 1}


async def test_out_of_order_never_regresses(backend):
    a, up1, up2 = ds("a"), ds("up1"), ds("up2")
    await backend.apply([key(a), props(a, "newname", version=3), lineage(a, up2, version=3)])
    # older versions arrive later: in their own batch, and in the same batch after the newer one
    await backend.apply([props(a, "oldname", version=2), lineage(a, up1, version=2)])
    await backend.apply([props(a, "newer", version=4), props(a, "older", version=1)])
    assert await urns_of(backend, "newer") == [a]
    assert await urns_of(backend, "oldname") == [] and await urns_of(backend, "older") == []
    edges, total = await backend.relationships(a, direction="OUTGOING")
    assert total == 1 and edges[0].destination == up2
    assert (await backend.document_versions(a))["datasetProperties"] == 4
    # a newer edge set replaces the whole set
    await backend.apply([lineage(a, up1, version=5)])
    assert [e.destination for e in (await backend.relationships(a, direction="OUTGOING"))[0]] == [up1]
    assert (await backend.relationships(up2, direction="INCOMING"))[1] == 0


async def test_aspect_delete(backend):
    a = ds("a")
    await backend.apply([key(a), props(a, "alpha", "described"), tags(a, "pii", version=2)])
    await backend.apply([AspectFields("dataset", a, "globalTags", 3, {}, deleted=True)])
    assert await urns_of(backend, "*", filters={"tags": ["urn:li:tag:pii"]}) == []
    hit = (await backend.search("dataset", "alpha")).hits[0]
    assert "tags" not in hit.fields and hit.fields["name"] == "alpha"
    assert (await backend.document_versions(a))["globalTags"] == 3  # the marker stays
    # an older upsert after the delete does not bring the fields back; a newer one does
    await backend.apply([tags(a, "pii", version=2)])
    assert await urns_of(backend, "*", filters={"tags": ["urn:li:tag:pii"]}) == []
    await backend.apply([tags(a, "gold", version=4)])
    assert await urns_of(backend, "*", filters={"tags": ["urn:li:tag:gold"]}) == [a]
    # deleting every aspect removes the document
    await backend.apply([
        AspectFields("dataset", a, aspect, 9, {}, deleted=True) for aspect in ("datasetKey", "datasetProperties", "globalTags")
    ])  # fmt: skip
    assert (await backend.search("dataset", "*")).total == 0


async def test_entity_removal_removes_document_and_edges_both_ways(backend):
    a, b, c = ds("a"), ds("b"), ds("c")
    await backend.apply([
        key(a), props(a, "alpha"), key(b), props(b, "beta"), key(c), props(c, "gamma"),
        lineage(a, b), lineage(b, c), owners(b, "jdoe"),
    ])  # fmt: skip
    await backend.apply([EntityRemoval("dataset", b, 1)])
    assert set(await urns_of(backend, "*")) == {a, c}
    assert await backend.document_versions(b) == {}
    assert await backend.relationships(b, direction="OUTGOING") == ([], 0)
    assert await backend.relationships(b, direction="INCOMING") == ([], 0)
    assert await backend.relationships(a, direction="OUTGOING") == ([], 0)
    assert await backend.relationships(c, direction="INCOMING") == ([], 0)
    # in one batch: changes before the removal are removed with it, changes after it recreate the entity (the write
    # path continues versions across a delete: the re-created aspects are newer than the removed ones; this used to
    # re-create at version 1, which a tombstone now rightly ignores)
    await backend.apply([props(c, "gamma2", version=2), EntityRemoval("dataset", c, 1), key(c, 2), props(c, "again", version=3)])
    assert await urns_of(backend, "again") == [c]
    assert await urns_of(backend, "gamma2") == []
    assert await backend.document_versions(c) == {"datasetKey": 2, "datasetProperties": 3}


# --- graph ---------------------------------------------------------------------------------------------------------


async def test_relationships_both_directions(backend):
    a, b, c = ds("a"), ds("b"), ds("c")
    await backend.apply([lineage(a, b, c), owners(a, "jdoe", "alice"), lineage(c, b)])
    edges, total = await backend.relationships(a, direction="OUTGOING")
    assert total == 4
    assert [(e.relationship, e.destination) for e in edges] == [
        ("DownstreamOf", b), ("DownstreamOf", c), ("OwnedBy", "urn:li:corpuser:alice"), ("OwnedBy", "urn:li:corpuser:jdoe"),
    ]  # fmt: skip
    first = edges[0]
    assert first.source == a and first.is_lineage and first.properties == {"type": "TRANSFORMED"} and first.created_on == 1001
    assert first.source_type == "dataset" and first.destination_type == "dataset"
    edges, total = await backend.relationships(a, direction="OUTGOING", types=["OwnedBy"], start=1, count=1)
    assert total == 2 and [e.destination for e in edges] == ["urn:li:corpuser:jdoe"]
    edges, total = await backend.relationships(b, direction="INCOMING")
    assert total == 2 and {e.source for e in edges} == {a, c}
    edges, total = await backend.relationships("urn:li:corpuser:jdoe", direction="INCOMING", types=["OwnedBy"])
    assert total == 1 and edges[0].source == a
    assert await backend.relationships(b, direction="INCOMING", types=["OwnedBy"]) == ([], 0)


async def test_lineage_three_hops(backend):
    # raw -> stage -> clean -> mart -> report   (each DownstreamOf its upstream), plus a side branch and a cycle
    raw, stage, clean, mart, report, side = (ds(n) for n in ("raw", "stage", "clean", "mart", "report", "side"))
    await backend.apply([
        lineage(stage, raw), lineage(clean, stage, side), lineage(mart, clean), lineage(report, mart),
        lineage(raw, report),  # a cycle
        owners(mart, "jdoe"),  # not lineage
    ])  # fmt: skip
    up = await backend.lineage(report, direction="UPSTREAM", max_hops=3)
    assert [(e.source, e.destination, hop) for e, hop in up] == [
        (report, mart, 1), (mart, clean, 2), (clean, side, 3), (clean, stage, 3),
    ]  # fmt: skip
    assert len(await backend.lineage(report, direction="UPSTREAM", max_hops=1)) == 1
    down = await backend.lineage(raw, direction="DOWNSTREAM", max_hops=3)
    assert [(e.source, hop) for e, hop in down] == [(stage, 1), (clean, 2), (mart, 3)]
    # the cycle ends: every edge once, at its first hop
    full = await backend.lineage(report, direction="UPSTREAM", max_hops=10)
    assert len(full) == 6 and len({(e.source, e.destination) for e, _ in full}) == 6
    # a job's Produces edge points downstream: followed the other way round
    job = "urn:li:dataJob:(urn:li:dataFlow:(airflow,dag,PROD),task)"
    await backend.apply([
        AspectEdges(job, "dataJobInputOutput", 1, (
            Edge(job, report, "Consumes", "dataJob", "dataset", is_lineage=True),
            Edge(job, ds("out"), "Produces", "dataJob", "dataset", is_lineage=True),
        ))
    ])  # fmt: skip
    assert [(e.source, e.destination, hop) for e, hop in await backend.lineage(ds("out"), direction="UPSTREAM", max_hops=2)] == [
        (job, ds("out"), 1), (job, report, 2),
    ]  # fmt: skip
    down = await backend.lineage(report, direction="DOWNSTREAM", max_hops=2)
    assert sorted((e.source, e.destination, hop) for e, hop in down) == sorted([
        (job, report, 1), (raw, report, 1), (job, ds("out"), 2), (stage, raw, 2),
    ])  # fmt: skip


async def test_lineage_data_process_instance_edges_walk_downstream(backend):
    # a run consumes `raw` and produces `out`: DataProcessInstanceConsumes points upstream (run -> its input),
    # DataProcessInstanceProduces downstream (run -> its output), so `out` is downstream of the run, of `raw` in turn
    run = "urn:li:dataProcessInstance:run1"
    raw, out = ds("raw"), ds("out")
    await backend.apply([
        AspectEdges(run, "dataProcessInstanceInput", 1, (
            Edge(run, raw, "DataProcessInstanceConsumes", "dataProcessInstance", "dataset", is_lineage=True),)),
        AspectEdges(run, "dataProcessInstanceOutput", 1, (
            Edge(run, out, "DataProcessInstanceProduces", "dataProcessInstance", "dataset", is_lineage=True),)),
    ])  # fmt: skip
    up = await backend.lineage(out, direction="UPSTREAM", max_hops=3)
    assert [(e.source, e.destination, e.relationship, hop) for e, hop in up] == [
        (run, out, "DataProcessInstanceProduces", 1), (run, raw, "DataProcessInstanceConsumes", 2),
    ]  # fmt: skip
    down = await backend.lineage(raw, direction="DOWNSTREAM", max_hops=3)
    assert [(e.source, e.destination, e.relationship, hop) for e, hop in down] == [
        (run, raw, "DataProcessInstanceConsumes", 1), (run, out, "DataProcessInstanceProduces", 2),
    ]  # fmt: skip
    # nothing is downstream of the output, nothing upstream of the input
    assert await backend.lineage(out, direction="DOWNSTREAM", max_hops=3) == []
    assert await backend.lineage(raw, direction="UPSTREAM", max_hops=3) == []


# --- timeseries ----------------------------------------------------------------------------------------------------


def profile(urn: str, ts: int, rows: int, partition: str = "FULL_TABLE_SNAPSHOT") -> TimeseriesPoint:
    value = {"timestampMillis": ts, "rowCount": rows, "partitionSpec": {"partition": partition}}
    return TimeseriesPoint(
        "datasetProfile", f"{urn}|{ts}|{partition}", urn, "dataset", ts,
        {"timestampMillis": ts, "rowCount": rows, "partition": partition}, value, {"runId": f"run-{rows}"},
    )  # fmt: skip


async def test_timeseries_range_and_overwrite(backend):
    a, b = ds("a"), ds("b")
    await backend.apply([profile(a, t * 1000, t) for t in range(1, 11)] + [profile(b, 5000, 99), profile(a, 5000, 7, "p1")])
    points = await backend.timeseries(TimeseriesQuery(a, "datasetProfile", start_ms=3000, end_ms=6000))
    assert [(p.timestamp_ms, p.fields["rowCount"]) for p in points] == [(6000, 6), (5000, 5), (5000, 7), (4000, 4), (3000, 3)]
    assert points[0].value["partitionSpec"] == {"partition": "FULL_TABLE_SNAPSHOT"}
    assert points[0].system_metadata == {"runId": "run-6"}
    # newest first, limit
    assert [p.timestamp_ms for p in await backend.timeseries(TimeseriesQuery(a, "datasetProfile", limit=2))] == [10_000, 9000]
    # field filters
    only = await backend.timeseries(TimeseriesQuery(a, "datasetProfile", equals={"partition": "p1"}))
    assert [(p.timestamp_ms, p.fields["rowCount"]) for p in only] == [(5000, 7)]
    # re-sending a point overwrites it
    await backend.apply([profile(a, 5000, 500)])
    points = await backend.timeseries(TimeseriesQuery(a, "datasetProfile", start_ms=5000, end_ms=5000))
    assert sorted(p.fields["rowCount"] for p in points) == [7, 500]
    assert len(await backend.timeseries(TimeseriesQuery(a, "datasetProfile"))) == 11
    # another aspect with the same document id is a different point
    same_id = profile(a, 5000, 1)
    await backend.apply([TimeseriesPoint("datasetUsageStatistics", same_id.doc_id, a, "dataset", 5000, {}, {"x": 1})])
    assert len(await backend.timeseries(TimeseriesQuery(a, "datasetUsageStatistics"))) == 1
    assert len(await backend.timeseries(TimeseriesQuery(a, "datasetProfile"))) == 11


# --- concurrency ---------------------------------------------------------------------------------------------------


async def test_concurrent_batches_on_one_entity_lose_nothing(backend):
    a = ds("a")
    await backend.apply([key(a)])
    aspects = [AspectFields("dataset", a, f"aspect{i}", 1, {f"field{i}": f"value{i}"}) for i in range(20)]
    await asyncio.gather(*(backend.apply([x]) for x in aspects))
    hit = (await backend.search("dataset", "*")).hits[0]
    assert all(hit.fields[f"field{i}"] == f"value{i}" for i in range(20))
    assert await urns_of(backend, "value17") == [a]


# --- index lifecycle (restore-indices --clean, reconcile) ----------------------------------------------------------


async def test_indexed_versions_and_clear_by_entity_type(backend):
    a, b, user = ds("a"), ds("b"), "urn:li:corpuser:u1"
    await backend.apply([key(a), props(a, "alpha", version=2), owners(a, "u1"), key(b),
                         AspectFields("dataset", b, "status", 3, {}, deleted=True),
                         AspectFields("corpuser", user, "corpUserInfo", 4, {"displayName": "User One"})])
    assert sorted(await backend.indexed_versions(["dataset"])) == sorted([
        IndexedVersion(a, "datasetKey", "document", 1, True), IndexedVersion(a, "datasetProperties", "document", 2, True),
        IndexedVersion(b, "datasetKey", "document", 1, True), IndexedVersion(b, "status", "document", 3, False),
        IndexedVersion(a, "ownership", "edges", 1, True),
    ])

    cleared = await backend.clear(["dataset"])
    assert cleared == {"search_document": 2, "search_aspect_fields": 4, "search_edge": 1, "search_edge_version": 1}
    assert await backend.indexed_versions(["dataset"]) == []
    assert (await backend.search("dataset", "*")).total == 0
    assert await backend.indexed_versions(["corpuser"]) == [IndexedVersion(user, "corpUserInfo", "document", 4, True)]
    assert [h.urn for h in (await backend.search("corpuser", "User")).hits] == [user]

    assert await backend.clear() == {"search_document": 1, "search_aspect_fields": 1, "search_edge": 0,
                                     "search_edge_version": 0}
    assert await backend.indexed_versions(["corpuser", "dataset"]) == []


async def test_an_entity_with_many_large_aspects_stays_within_the_tsvector_limit(backend, database_url):
    """Every aspect's contribution is bounded (app.search.documents), but an entity has many aspects: the tsvector is
    built from at most `search_max_document_chars` of their text, the heavier weights first, so it never reaches
    Postgres's 1 MB limit ("string is too long for tsvector")."""
    import asyncpg

    urn = ds("tsv.many")
    words = lambda prefix: " ".join(f"{prefix}{i:06d}" for i in range(10_000))  # noqa: E731 - 100k chars of distinct words
    changes = [props(urn, "manyaspects", words("desc"))]
    changes += [AspectFields("dataset", urn, f"extraAspect{n}", 1, {f"notes{n}": words(f"x{n}q")}) for n in range(15)]
    await backend.apply(changes)
    assert await urns_of(backend, "manyaspects") == [urn]  # the name (weight A) is kept whole
    assert await urns_of(backend, "desc000001") == [urn]
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        size = await conn.fetchval("SELECT pg_column_size(search_vector) FROM search_document WHERE urn = $1", urn)
    finally:
        await conn.close()
    assert size < 1_048_575
