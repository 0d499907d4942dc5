"""The `SearchBackend` contract (app.search.model) on both backends: the embedded Postgres backend and the
Elasticsearch/OpenSearch backend on the OpenSearch-API test server, each made by `make_backend` from the settings a
service on it has (tests.search_server.backend_settings). The same records and the same expectations for both:
documents and text queries, filters and facets, sorting and paging, soft and hard deletes, version order, the graph
and lineage, timeseries, what the index holds. Records are the model's dataclasses, shaped as `changes_from_mcl`
builds them. What one backend alone can show is in its own module (test_search_postgres.py, test_search_elastic.py).

A behaviour one backend lacks (or its test server cannot show) is tested here all the same, as a strict expected
failure on that backend (`except_on`, with the reason): the gap shows in every run, and the mark must go when it is
closed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import pytest_asyncio

from app.db import create_engine
from app.search.model import (
    AspectEdges,
    AspectFields,
    Criterion,
    Edge,
    EdgeQuery,
    EntityRemoval,
    IndexedVersion,
    TimeseriesPoint,
    TimeseriesQuery,
)
from app.search.service import make_backend
from app.settings import Settings
from tests.helpers import ds
from tests.integration.search_indices import clear, opensearch_overrides  # noqa: F401 - the module's indices

BACKENDS = ("postgres", "opensearch")
JOB = "urn:li:dataJob:(urn:li:dataFlow:(airflow,dag,PROD),task)"
RUN = "urn:li:dataProcessInstance:run1"


@pytest.fixture(params=BACKENDS)
def backend_name(request) -> str:
    return request.param


def except_on(lacking: str, reason: str):
    """Both backends, the test a strict expected failure on `lacking` (a behaviour it does not have)."""
    return pytest.mark.parametrize(
        "backend_name",
        [
            pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=reason)) if name == lacking else name
            for name in BACKENDS
        ],
    )


@pytest_asyncio.fixture
async def backend(backend_name, request, database_url, registry):
    # OpenSearch: the module's indices (tests.integration.search_indices), cleared after each test
    overrides = request.getfixturevalue("opensearch_overrides") if backend_name == "opensearch" else {}
    engine = create_engine(database_url)
    started = make_backend(Settings(database_url=database_url, **overrides), registry, engine)
    await started.start()
    yield started
    if overrides:
        await clear(started)
    await started.close()
    await engine.dispose()


# --- the records -------------------------------------------------------------------------------------------------


def key(urn: str, version: int = 1) -> AspectFields:
    platform = urn.split("dataPlatform:")[1].split(",")[0]
    name, env = urn.rstrip(")").rsplit(",", 2)[1:]
    return AspectFields(
        "dataset",
        urn,
        "datasetKey",
        version,
        {"id": name, "origin": env, "platform": f"urn:li:dataPlatform:{platform}", "urn": urn},
    )


def props(urn: str, name: str, description: str = "", version: int = 1) -> AspectFields:
    return AspectFields(
        "dataset",
        urn,
        "datasetProperties",
        version,
        {"name": name, "description": description, "hasDescription": bool(description)},
    )


def tags(urn: str, *names: str, version: int = 1) -> list[AspectFields | AspectEdges]:
    """globalTags: its document fields and its edges."""
    tag_urns = [f"urn:li:tag:{n}" for n in names]
    return [
        AspectFields("dataset", urn, "globalTags", version, {"tags": tag_urns, "hasTags": bool(tag_urns)}),
        AspectEdges(urn, "globalTags", version, tuple(Edge(urn, t, "TaggedWith", "dataset", "tag") for t in tag_urns)),
    ]


def untagged(urn: str, version: int) -> list[AspectFields | AspectEdges]:
    """globalTags deleted: its fields and its edges go."""
    return [
        AspectFields("dataset", urn, "globalTags", version, {}, deleted=True),
        AspectEdges(urn, "globalTags", version, ()),
    ]


def status(urn: str, removed: bool, version: int = 1) -> AspectFields:
    return AspectFields("dataset", urn, "status", version, {"removed": removed})


def lineage(urn: str, *upstreams: str, version: int = 1) -> AspectEdges:
    return AspectEdges(
        urn,
        "upstreamLineage",
        version,
        tuple(
            Edge(
                urn,
                up,
                "DownstreamOf",
                "dataset",
                "dataset",
                created_on=1000 + version,
                is_lineage=True,
                properties={"type": "TRANSFORMED"},
            )
            for up in upstreams
        ),
    )


def owners(urn: str, *users: str, version: int = 1) -> AspectEdges:
    return AspectEdges(
        urn,
        "ownership",
        version,
        tuple(Edge(urn, f"urn:li:corpuser:{u}", "OwnedBy", "dataset", "corpuser") for u in users),
    )


def job_io(inputs: list[str], outputs: list[str], version: int = 1) -> AspectEdges:
    """A job consumes its inputs (the edge points upstream) and produces its outputs (it points downstream)."""
    return AspectEdges(
        JOB,
        "dataJobInputOutput",
        version,
        tuple(
            [Edge(JOB, i, "Consumes", "dataJob", "dataset", is_lineage=True) for i in inputs]
            + [Edge(JOB, o, "Produces", "dataJob", "dataset", is_lineage=True) for o in outputs]
        ),
    )


def profile(urn: str, ts: int, rows: int, partition: str = "FULL_TABLE_SNAPSHOT") -> TimeseriesPoint:
    value = {"timestampMillis": ts, "rowCount": rows, "partitionSpec": {"partition": partition}}
    return TimeseriesPoint(
        "datasetProfile",
        f"{urn}|{ts}|{partition}",
        urn,
        "dataset",
        ts,
        {
            "urn": urn,
            "timestampMillis": ts,
            "partitionSpec": {"partition": partition},
            "partition": partition,
            "rowCount": rows,
        },
        value,
        {"runId": f"run-{rows}"},
    )


def documents(*urns_and_names: tuple[str, str]) -> list[AspectFields]:
    return [c for urn, name in urns_and_names for c in (key(urn), props(urn, name))]


async def urns_of(backend, query: str, **kwargs: Any) -> list[str]:
    page = await backend.search("dataset", query, count=100, **kwargs)
    return [h.urn for h in page.hits]


def walked(steps: list[tuple[Edge, int]]) -> list[tuple[int, str, str, str]]:
    """A lineage walk as (hop, source, relationship, destination), in hop order; the order within a hop is not part of
    the contract."""
    assert [hop for _, hop in steps] == sorted(hop for _, hop in steps)
    return sorted((hop, e.source, e.relationship, e.destination) for e, hop in steps)


# --- documents and text queries ----------------------------------------------------------------------------------


async def test_an_exact_name_beats_a_description_match(backend):
    orders, sales, other = ds("db.orders"), ds("db.sales"), ds("db.customers")
    await backend.apply(
        [
            *documents((orders, "orders"), (other, "customers")),
            key(sales),
            props(sales, "sales", "daily totals of orders and refunds, orders orders"),
        ]
    )
    hits = (await backend.search("dataset", "orders")).hits
    assert [h.urn for h in hits] == [orders, sales]
    assert hits[0].score > hits[1].score
    assert hits[0].fields["name"] == "orders" and hits[0].fields["platform"] == "urn:li:dataPlatform:hive"
    assert await urns_of(backend, "ORDERS") == [orders, sales]  # case-insensitive
    assert await urns_of(backend, "customers") == [other]
    assert set(await urns_of(backend, "*")) == set(await urns_of(backend, "")) == {orders, sales, other}
    assert await urns_of(backend, "nothing-like-this") == []
    assert (await urns_of(backend, orders))[0] == orders  # the exact urn first
    assert (await backend.search("chart", "orders")).total == 0  # other entity types are not mixed in


@except_on("opensearch", "a query word matches only whole words of the text fields (no prefix matching)")
async def test_a_query_word_matches_words_it_starts(backend):
    orders, customers = ds("db.orders"), ds("db.customers")
    await backend.apply(documents((orders, "orders"), (customers, "customers")))
    assert await urns_of(backend, "order") == [orders]
    assert await urns_of(backend, "CUST") == [customers]


@except_on("opensearch", "an underscore joins words (the standard tokenizer's word characters)")
async def test_words_of_a_name_are_split_at_underscores(backend):
    lines, archive = ds("db.order_lines"), ds("db.orders_archive")
    await backend.apply(documents((lines, "order_lines"), (archive, "orders_archive")))
    assert await urns_of(backend, "lines") == [lines]
    assert await urns_of(backend, "archive") == [archive]


@except_on("opensearch", "no query syntax: quotes and a leading `-` are read as plain words")
async def test_phrases_and_negated_words(backend):
    orders, sales = ds("db.orders"), ds("db.sales")
    await backend.apply(
        [
            key(orders),
            props(orders, "orders", "one row per order"),
            key(sales),
            props(sales, "sales", "daily totals of orders and refunds"),
        ]
    )
    assert await urns_of(backend, '"daily totals"') == [sales]
    assert await urns_of(backend, '"totals daily"') == []
    assert await urns_of(backend, "orders -refunds") == [orders]


async def test_autocomplete(backend):
    a, b, c = ds("db.orders"), ds("db.orders_archive"), ds("db.reorders")
    await backend.apply(documents((a, "orders"), (b, "orders_archive"), (c, "reorders")))
    hits = await backend.autocomplete("dataset", "ord")
    assert [h.urn for h in hits] == [a, b]  # the shortest name first; "reorders" has no word starting so
    assert [h.urn for h in await backend.autocomplete("dataset", "ORD", limit=1)] == [a]
    assert await backend.autocomplete("dataset", "zzz") == []
    assert await backend.autocomplete("dataset", "  ") == []


# --- filters, conditions, facets ---------------------------------------------------------------------------------


async def test_filters_and_facets(backend):
    a, b, c, d = ds("a"), ds("b", "kafka"), ds("c", env="DEV"), ds("d", "kafka", "DEV")
    await backend.apply(
        [
            *documents((a, "alpha"), (b, "beta"), (c, "gamma"), (d, "delta")),
            *tags(a, "pii", "gold"),
            *tags(b, "pii"),
            *tags(d, "gold"),
        ]
    )
    assert set(await urns_of(backend, "*", filters={"platform": ["urn:li:dataPlatform:kafka"]})) == {b, d}
    assert set(await urns_of(backend, "*", filters={"origin": ["DEV"]})) == {c, d}
    # a list-valued field: any of its values; any of a filter's values; every filter
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
    assert (await backend.search("dataset", "*", facets=False)).facets == {}


async def test_any_of_groups_negation_and_removed(backend):
    """`any_of` (GraphQL's orFilters): OR of AND groups, negated criteria, `removed` named in a group. The conditions
    beyond EQUAL are test_search_filters.py's."""
    a, b, c, d = ds("a"), ds("b", "kafka"), ds("c", env="DEV"), ds("d", "kafka", "DEV")
    await backend.apply([key(a), *tags(a, "pii"), key(b), key(c), key(d), *tags(d, "pii"), status(d, True)])
    kafka, dev = Criterion("platform", ("urn:li:dataPlatform:kafka",)), Criterion("origin", ("DEV",))
    assert set(await urns_of(backend, "*", any_of=[[kafka], [dev]])) == {b, c}  # d is soft-deleted
    assert await urns_of(backend, "*", any_of=[[kafka, dev]]) == []
    assert set(await urns_of(backend, "*", any_of=[[Criterion("tags", ("urn:li:tag:pii",), negated=True)]])) == {b, c}
    hive = Criterion("platform", ("urn:li:dataPlatform:hive",), negated=True)
    assert await urns_of(backend, "*", any_of=[[hive]]) == [b]
    assert await urns_of(backend, "*", any_of=[[kafka, Criterion("removed", ("true",), negated=True)]]) == [b]
    assert await urns_of(backend, "*", any_of=[[kafka, Criterion("removed", ("true",))]]) == [d]
    assert await urns_of(backend, "*", any_of=[]) == []  # no group: nothing matches
    assert set(await urns_of(backend, "*", any_of=[[]])) == {a, b, c}  # an empty group: everything
    assert await urns_of(backend, "*", filters={"origin": ["DEV"]}, any_of=[[kafka], [dev]]) == [c]  # both hold
    page = await backend.search("dataset", "*", any_of=[[kafka]], facets=False)
    assert page.total == 1 and page.facets == {}


# --- sorting and paging ------------------------------------------------------------------------------------------

PAGED = 10_050  # past 10,000: Elasticsearch's window for from/size paging (a cursor is not bound by it)


@pytest_asyncio.fixture
async def paged(backend) -> list[str]:
    """PAGED documents: every even one's description says "even"."""
    urns = [ds(f"db.table_{i:05d}") for i in range(PAGED)]
    changes = [
        c
        for i, urn in enumerate(urns)
        for c in (key(urn), props(urn, f"table_{i:05d}", "bulk loaded " + ("even" if i % 2 == 0 else "odd")))
    ]
    for start in range(0, len(changes), 5000):
        await backend.apply(changes[start : start + 5000])
    return urns


async def scrolled(backend, query: str, count: int, **kwargs: Any) -> list[Any]:
    """Every page of a search, through its cursors; each page checked against the total (a cursor that does not
    move on would page forever)."""
    pages, scroll = [], None
    while True:
        page = await backend.search("dataset", query, count=count, scroll_id=scroll, facets=False, **kwargs)
        pages.append(page)
        assert page.total == pages[0].total and len(page.hits) <= count
        assert len(pages) <= -(-page.total // count), f"more than {page.total} hits in pages of {count}"
        if (scroll := page.scroll_id) is None:
            return pages


async def test_cursors_page_through_every_document_once(backend, paged):
    pages = await scrolled(backend, "*", 1000)
    seen = [h.urn for page in pages for h in page.hits]
    assert len(pages) == 11 and pages[0].total == PAGED
    assert seen == sorted(paged)  # each once; equal scores: in urn order
    # sorted by a field, both ways, across pages
    first = await backend.search("dataset", "*", count=3, sort=[("name", "DESCENDING")])
    assert [h.fields["name"] for h in first.hits] == ["table_10049", "table_10048", "table_10047"]
    second = await backend.search("dataset", "*", count=3, sort=[("name", "DESCENDING")], scroll_id=first.scroll_id)
    assert [h.fields["name"] for h in second.hits] == ["table_10046", "table_10045", "table_10044"]
    names = [
        h.fields["name"] for page in await scrolled(backend, "*", 4000, sort=[("name", "ASCENDING")]) for h in page.hits
    ]
    assert names == sorted(f"table_{i:05d}" for i in range(PAGED))
    # count 0: the total alone
    page = await backend.search("dataset", "even", count=0)
    assert page.hits == [] and page.total == PAGED // 2 and page.scroll_id is None


@except_on(
    "opensearch",
    "osmem, the test server, scores in float64 but prints float32: a score in a cursor never "
    "equals the stored one (real engines score in float32)",
)
async def test_cursors_page_through_a_ranked_query(backend):
    urns = [ds(f"db.ranked_{i:04d}") for i in range(1500)]
    await backend.apply(
        [
            c
            for i, urn in enumerate(urns)  # five levels of relevance, 300 documents each
            for c in (key(urn), props(urn, f"ranked_{i:04d}", " ".join(["even"] * (i % 5 + 1) + ["odd"] * 5)))
        ]
    )
    hits = [h for page in await scrolled(backend, "even", 70) for h in page.hits]
    assert sorted(h.urn for h in hits) == urns  # each once
    assert [(-h.score, h.urn) for h in hits] == sorted((-h.score, h.urn) for h in hits)  # by score, then urn
    assert len({h.score for h in hits}) == 5


# --- soft delete, replay, version order --------------------------------------------------------------------------


async def test_soft_delete_hides_and_restores(backend):
    a, b = ds("a"), ds("b")
    await backend.apply([*documents((a, "orders"), (b, "orders b")), status(a, True)])
    assert await urns_of(backend, "orders") == [b]
    assert (await backend.search("dataset", "*")).total == 1
    assert [h.urn for h in await backend.autocomplete("dataset", "orders")] == [b]
    assert await urns_of(backend, "*", filters={"removed": ["true"]}) == [a]  # asked for explicitly
    await backend.apply([status(a, False, version=2)])
    assert set(await urns_of(backend, "orders")) == {a, b}


async def test_replaying_changes_changes_nothing(backend):
    a, b = ds("a"), ds("b")
    batch = [key(a), props(a, "alpha", "first"), *tags(a, "pii"), lineage(a, b), owners(a, "jdoe"), profile(a, 1000, 5)]
    await backend.apply(batch)
    first = await backend.search("dataset", "alpha")
    # the same batch twice more, and the same change twice inside one batch
    await backend.apply(batch)
    await backend.apply(batch + batch)
    again = await backend.search("dataset", "alpha")
    assert [(h.urn, h.fields, h.score) for h in again.hits] == [(h.urn, h.fields, h.score) for h in first.hits]
    assert (await backend.relationships(a, direction="OUTGOING"))[1] == 3
    assert len(await backend.timeseries(TimeseriesQuery(a, "datasetProfile"))) == 1
    assert await backend.document_versions(a) == {"datasetKey": 1, "datasetProperties": 1, "globalTags": 1}


async def test_an_older_version_never_overwrites_a_newer_one(backend):
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
    assert await backend.relationships(up2, direction="INCOMING") == ([], 0)


async def test_concurrent_batches_on_one_entity_lose_nothing(backend):
    a = ds("a")
    await backend.apply([key(a)])
    # different aspects at once: every one stays
    aspects = [AspectFields("dataset", a, f"aspect{i}", 1, {f"field{i}": f"value{i}"}) for i in range(20)]
    await asyncio.gather(*(backend.apply([x]) for x in aspects))
    hit = (await backend.search("dataset", "*")).hits[0]
    assert all(hit.fields[f"field{i}"] == f"value{i}" for i in range(20))
    # versions of one aspect and of one edge set at once, in any order: the newest wins
    batches = [
        [props(a, f"race {v}", version=v), lineage(a, ds(f"up{v}"), ds(f"up{v}b"), version=v)]
        for v in (3, 8, 1, 5, 2, 7, 4, 6)
    ]
    await asyncio.gather(*(backend.apply(batch) for batch in batches))
    assert (await backend.document_versions(a))["datasetProperties"] == 8
    assert (await backend.search("dataset", "race")).hits[0].fields["name"] == "race 8"
    edges, total = await backend.relationships(a, direction="OUTGOING")
    assert total == 2 and {e.destination for e in edges} == {ds("up8"), ds("up8b")}


# --- deletes -----------------------------------------------------------------------------------------------------


async def test_an_aspect_delete_removes_its_fields_and_edges(backend):
    a = ds("a")
    await backend.apply([key(a), props(a, "alpha", "described"), *tags(a, "pii", version=2)])
    assert (await backend.relationships(a, direction="OUTGOING"))[1] == 1
    await backend.apply(untagged(a, 3))
    assert await urns_of(backend, "*", filters={"tags": ["urn:li:tag:pii"]}) == []
    hit = (await backend.search("dataset", "alpha")).hits[0]
    assert "tags" not in hit.fields and hit.fields["name"] == "alpha"
    assert await backend.relationships(a, direction="OUTGOING") == ([], 0)
    assert (await backend.document_versions(a))["globalTags"] == 3  # the marker stays
    # an older upsert after the delete does not bring the fields back; a newer one does
    await backend.apply(tags(a, "pii", version=2))
    assert await urns_of(backend, "*", filters={"tags": ["urn:li:tag:pii"]}) == []
    assert await backend.relationships(a, direction="OUTGOING") == ([], 0)
    await backend.apply(tags(a, "gold", version=4))
    assert await urns_of(backend, "*", filters={"tags": ["urn:li:tag:gold"]}) == [a]
    # deleting every aspect removes the document
    await backend.apply(
        [
            AspectFields("dataset", a, aspect, 9, {}, deleted=True)
            for aspect in ("datasetKey", "datasetProperties", "globalTags")
        ]
    )
    assert (await backend.search("dataset", "*")).total == 0
    assert await backend.document_versions(a) == {}


async def test_an_entity_removal_removes_its_document_and_edges_both_ways(backend):
    a, b, c = ds("a"), ds("b"), ds("c")
    await backend.apply(
        [*documents((a, "alpha"), (b, "beta"), (c, "gamma")), lineage(a, b), lineage(b, c), owners(b, "jdoe")]
    )
    await backend.apply([EntityRemoval("dataset", b, 1, "datasetKey")])
    assert set(await urns_of(backend, "*")) == {a, c}
    assert await urns_of(backend, "beta") == [] and await backend.autocomplete("dataset", "beta") == []
    assert (await backend.search("dataset", "*")).facets["origin"] == {"PROD": 2}  # a tombstone is not counted
    assert await backend.document_versions(b) == {}
    assert await backend.relationships(b, direction="OUTGOING") == ([], 0)
    assert await backend.relationships(b, direction="INCOMING") == ([], 0)
    assert await backend.relationships(a, direction="OUTGOING") == ([], 0)
    assert await backend.relationships(c, direction="INCOMING") == ([], 0)
    assert await backend.relationships("urn:li:corpuser:jdoe", direction="INCOMING") == ([], 0)
    # an older change does not revive it
    await backend.apply([props(b, "beta again", version=1)])
    assert await urns_of(backend, "beta") == []
    # in one batch: changes before the removal go with it, changes after it re-create the entity (newer versions:
    # the write path continues versions across a delete)
    await backend.apply(
        [
            props(c, "gamma2", version=2),
            EntityRemoval("dataset", c, 1, "datasetKey"),
            key(c, 2),
            props(c, "again", version=3),
        ]
    )
    assert await urns_of(backend, "again") == [c]
    assert await urns_of(backend, "gamma2") == []
    assert await backend.document_versions(c) == {"datasetKey": 2, "datasetProperties": 3}


async def test_an_entity_removal_older_than_its_key_does_nothing(backend):
    a = ds("a")
    await backend.apply([key(a, 5), props(a, "alpha", version=5), owners(a, "jdoe")])
    await backend.apply([EntityRemoval("dataset", a, 4, "datasetKey")])  # the entity was re-created since
    assert await urns_of(backend, "alpha") == [a]
    assert (await backend.relationships(a, direction="OUTGOING"))[1] == 1


# --- the graph ---------------------------------------------------------------------------------------------------


async def test_relationships_both_directions(backend):
    a, b, c = ds("a"), ds("b"), ds("c")
    await backend.apply([lineage(a, b, c), owners(a, "jdoe", "alice"), lineage(c, b)])
    edges, total = await backend.relationships(a, direction="OUTGOING")
    assert total == 4
    assert [(e.relationship, e.destination) for e in edges] == [  # by relationship, then the other end
        ("DownstreamOf", b),
        ("DownstreamOf", c),
        ("OwnedBy", "urn:li:corpuser:alice"),
        ("OwnedBy", "urn:li:corpuser:jdoe"),
    ]
    assert edges[0] == Edge(
        a, b, "DownstreamOf", "dataset", "dataset", created_on=1001, is_lineage=True, properties={"type": "TRANSFORMED"}
    )  # every field of the edge kept
    edges, total = await backend.relationships(a, direction="OUTGOING", types=["OwnedBy"], start=1, count=1)
    assert total == 2 and [e.destination for e in edges] == ["urn:li:corpuser:jdoe"]
    edges, total = await backend.relationships(b, direction="INCOMING")
    assert total == 2 and [e.source for e in edges] == [a, c]
    edges, total = await backend.relationships("urn:li:corpuser:jdoe", direction="INCOMING", types=["OwnedBy"])
    assert total == 1 and edges[0].source == a
    assert await backend.relationships(b, direction="INCOMING", types=["OwnedBy"]) == ([], 0)
    assert await backend.relationships(b, direction="OUTGOING") == ([], 0)


async def test_scroll_edges_pages_in_key_order(backend):
    a, b, c = ds("a"), ds("b"), ds("c")
    await backend.apply([lineage(a, b, c), owners(a, "jdoe"), lineage(c, b), owners(c, "alice"), job_io([a], [b])])
    everything: list[Edge] = []
    after = None
    while True:
        page = await backend.scroll_edges(EdgeQuery(), after=after, count=2)
        everything += page.edges
        if (after := page.after) is None:
            break
        assert len(page.edges) == 2
    # (source, aspect, relationship, destination) order
    assert [(e.source, e.relationship, e.destination) for e in everything] == [
        (JOB, "Consumes", a),
        (JOB, "Produces", b),  # "urn:li:dataJob:..." < "urn:li:dataset:..."
        (a, "OwnedBy", "urn:li:corpuser:jdoe"),
        (a, "DownstreamOf", b),
        (a, "DownstreamOf", c),
        (c, "OwnedBy", "urn:li:corpuser:alice"),
        (c, "DownstreamOf", b),
    ]

    async def found(query: EdgeQuery) -> set[tuple[str, str, str]]:
        return {(e.source, e.relationship, e.destination) for e in (await backend.scroll_edges(query)).edges}

    assert await found(EdgeQuery(relationship_types=("OwnedBy",))) == {
        (a, "OwnedBy", "urn:li:corpuser:jdoe"),
        (c, "OwnedBy", "urn:li:corpuser:alice"),
    }
    assert await found(EdgeQuery(source_types=("dataJob",))) == {(JOB, "Consumes", a), (JOB, "Produces", b)}
    assert await found(EdgeQuery(destination_types=("corpuser",), source_urns=(c,))) == {
        (c, "OwnedBy", "urn:li:corpuser:alice")
    }
    assert await found(EdgeQuery(destination_urns=(b,))) == {
        (a, "DownstreamOf", b),
        (c, "DownstreamOf", b),
        (JOB, "Produces", b),
    }
    assert await found(EdgeQuery(either_urns=(c,), lineage_only=True)) == {
        (a, "DownstreamOf", c),
        (c, "DownstreamOf", b),
    }
    assert await found(EdgeQuery(relationship_types=("Nothing",))) == set()


async def test_lineage_walks_hops_and_ends_cycles(backend):
    # raw <- stage <- clean <- mart <- report (each DownstreamOf its upstream), a side branch, and a cycle
    raw, stage, clean, mart, report, side = (ds(n) for n in ("raw", "stage", "clean", "mart", "report", "side"))
    await backend.apply(
        [
            lineage(stage, raw),
            lineage(clean, stage, side),
            lineage(mart, clean),
            lineage(report, mart),
            lineage(raw, report),  # the cycle
            owners(mart, "jdoe"),  # not lineage
        ]
    )
    up = "DownstreamOf"
    assert walked(await backend.lineage(report, direction="UPSTREAM", max_hops=3)) == [
        (1, report, up, mart),
        (2, mart, up, clean),
        (3, clean, up, side),
        (3, clean, up, stage),
    ]
    assert walked(await backend.lineage(report, direction="UPSTREAM", max_hops=1)) == [(1, report, up, mart)]
    assert walked(await backend.lineage(raw, direction="DOWNSTREAM", max_hops=3)) == [
        (1, stage, up, raw),
        (2, clean, up, stage),
        (3, mart, up, clean),
    ]
    # the cycle ends: every edge once, at its first hop
    assert walked(await backend.lineage(report, direction="UPSTREAM", max_hops=10)) == [
        (1, report, up, mart),
        (2, mart, up, clean),
        (3, clean, up, side),
        (3, clean, up, stage),
        (4, stage, up, raw),
        (5, raw, up, report),
    ]
    assert walked(await backend.lineage(side, direction="UPSTREAM", max_hops=3)) == []


async def test_lineage_follows_produces_the_other_way_round(backend):
    # the job consumes `report` and produces `out`: Consumes points upstream (job -> its input), Produces downstream
    # (job -> its output), so `out` is downstream of the job, and of `report` in turn
    raw, report, out = ds("raw"), ds("report"), ds("out")
    await backend.apply([lineage(report, raw), job_io([report], [out])])
    assert walked(await backend.lineage(out, direction="UPSTREAM", max_hops=3)) == [
        (1, JOB, "Produces", out),
        (2, JOB, "Consumes", report),
        (3, report, "DownstreamOf", raw),
    ]
    assert walked(await backend.lineage(raw, direction="DOWNSTREAM", max_hops=3)) == [
        (1, report, "DownstreamOf", raw),
        (2, JOB, "Consumes", report),
        (3, JOB, "Produces", out),
    ]
    assert await backend.lineage(out, direction="DOWNSTREAM", max_hops=3) == []
    assert walked(await backend.lineage(JOB, direction="UPSTREAM", max_hops=1)) == [(1, JOB, "Consumes", report)]
    assert walked(await backend.lineage(JOB, direction="DOWNSTREAM", max_hops=1)) == [(1, JOB, "Produces", out)]
    # a cycle through the job: `report` is downstream of `out` too
    await backend.apply([lineage(report, raw, out, version=2)])
    assert walked(await backend.lineage(out, direction="UPSTREAM", max_hops=10)) == [
        (1, JOB, "Produces", out),
        (2, JOB, "Consumes", report),
        (3, report, "DownstreamOf", out),
        (3, report, "DownstreamOf", raw),
    ]


async def test_lineage_data_process_instance_edges_walk_downstream(backend):
    # a run consumes `raw` and produces `out`: DataProcessInstanceConsumes points upstream (run -> its input),
    # DataProcessInstanceProduces downstream (run -> its output)
    raw, out = ds("raw"), ds("out")
    await backend.apply(
        [
            AspectEdges(
                RUN,
                "dataProcessInstanceInput",
                1,
                (Edge(RUN, raw, "DataProcessInstanceConsumes", "dataProcessInstance", "dataset", is_lineage=True),),
            ),
            AspectEdges(
                RUN,
                "dataProcessInstanceOutput",
                1,
                (Edge(RUN, out, "DataProcessInstanceProduces", "dataProcessInstance", "dataset", is_lineage=True),),
            ),
        ]
    )
    assert walked(await backend.lineage(out, direction="UPSTREAM", max_hops=3)) == [
        (1, RUN, "DataProcessInstanceProduces", out),
        (2, RUN, "DataProcessInstanceConsumes", raw),
    ]
    assert walked(await backend.lineage(raw, direction="DOWNSTREAM", max_hops=3)) == [
        (1, RUN, "DataProcessInstanceConsumes", raw),
        (2, RUN, "DataProcessInstanceProduces", out),
    ]
    assert await backend.lineage(out, direction="DOWNSTREAM", max_hops=3) == []
    assert await backend.lineage(raw, direction="UPSTREAM", max_hops=3) == []


# --- timeseries --------------------------------------------------------------------------------------------------


async def test_timeseries_range_limit_filters_and_overwrite(backend):
    a, b = ds("a"), ds("b")
    await backend.apply(
        [profile(a, t * 1000, t) for t in range(1, 11)] + [profile(b, 5000, 99), profile(a, 5000, 7, "p1")]
    )

    async def points(**kwargs: Any) -> list[tuple[int, int]]:
        found = await backend.timeseries(TimeseriesQuery(a, "datasetProfile", **kwargs))
        return [(p.timestamp_ms, p.value["rowCount"]) for p in found]

    # newest first (points of one timestamp in no given order), within the inclusive range
    assert sorted(await points(start_ms=3000, end_ms=6000), reverse=True) == [
        (6000, 6),
        (5000, 7),
        (5000, 5),
        (4000, 4),
        (3000, 3),
    ]
    assert [ts for ts, _ in await points(start_ms=3000, end_ms=6000)] == [6000, 5000, 5000, 4000, 3000]
    [newest] = await backend.timeseries(TimeseriesQuery(a, "datasetProfile", limit=1))
    assert (newest.doc_id, newest.urn, newest.entity_type, newest.timestamp_ms) == (
        f"{a}|10000|FULL_TABLE_SNAPSHOT",
        a,
        "dataset",
        10_000,
    )
    assert newest.value == {
        "timestampMillis": 10_000,
        "rowCount": 10,
        "partitionSpec": {"partition": "FULL_TABLE_SNAPSHOT"},
    }
    assert newest.fields["partition"] == "FULL_TABLE_SNAPSHOT" and newest.system_metadata == {"runId": "run-10"}
    assert await points(limit=2) == [(10_000, 10), (9000, 9)]
    assert await points(equals={"partition": "p1"}) == [(5000, 7)]
    # re-sending a point overwrites it
    await backend.apply([profile(a, 5000, 500)])
    assert sorted(await points(start_ms=5000, end_ms=5000)) == [(5000, 7), (5000, 500)]
    assert len(await points()) == 11
    # another aspect with the same document id is another point
    resent = profile(a, 5000, 1)
    await backend.apply(
        [
            TimeseriesPoint(
                "datasetUsageStatistics",
                resent.doc_id,
                a,
                "dataset",
                5000,
                {"urn": a, "timestampMillis": 5000},
                {"x": 1},
            )
        ]
    )
    assert len(await backend.timeseries(TimeseriesQuery(a, "datasetUsageStatistics"))) == 1
    assert len(await points()) == 11
    assert await backend.timeseries(TimeseriesQuery(ds("none"), "datasetProfile")) == []
    assert await backend.timeseries(TimeseriesQuery(a, "datasetSomethingElse")) == []


async def test_delete_timeseries_within_a_range(backend):
    a, b = ds("a"), ds("b")
    await backend.apply([profile(a, t * 1000, t) for t in range(1, 6)] + [profile(b, 3000, 3)])
    await backend.apply(
        [
            TimeseriesPoint(
                "datasetUsageStatistics", "u1", a, "dataset", 3000, {"urn": a, "timestampMillis": 3000}, {"x": 1}
            )
        ]
    )
    assert await backend.delete_timeseries(a, ["datasetProfile"], start_ms=2000, end_ms=4000) == 3
    assert [p.timestamp_ms for p in await backend.timeseries(TimeseriesQuery(a, "datasetProfile"))] == [5000, 1000]
    assert len(await backend.timeseries(TimeseriesQuery(b, "datasetProfile"))) == 1  # another entity's: kept
    assert len(await backend.timeseries(TimeseriesQuery(a, "datasetUsageStatistics"))) == 1  # another aspect's
    assert await backend.delete_timeseries(a, ["datasetProfile", "datasetUsageStatistics", "datasetSomethingElse"]) == 3
    assert await backend.timeseries(TimeseriesQuery(a, "datasetProfile")) == []
    assert await backend.delete_timeseries(a, ["datasetProfile"]) == 0


# --- what the index holds ----------------------------------------------------------------------------------------


async def test_indexed_versions(backend):
    a, b, c, user = ds("a"), ds("b"), ds("c"), "urn:li:corpuser:u1"
    await backend.apply(
        [
            key(a),
            props(a, "alpha", version=2),
            owners(a, "u1"),
            key(b),
            AspectFields("dataset", b, "status", 3, {}, deleted=True),
            key(c),
            AspectFields("corpuser", user, "corpUserInfo", 4, {"displayName": "User One"}),
        ]
    )
    await backend.apply([EntityRemoval("dataset", c, 1, "datasetKey")])
    listed = await backend.indexed_versions(["dataset"])
    assert set(listed) - {
        IndexedVersion(c, "datasetKey", "document", 1, False)
    } == {  # a tombstone: not live, or not at all
        IndexedVersion(a, "datasetKey", "document", 1, True),
        IndexedVersion(a, "datasetProperties", "document", 2, True),
        IndexedVersion(b, "datasetKey", "document", 1, True),
        IndexedVersion(b, "status", "document", 3, False),
        IndexedVersion(a, "ownership", "edges", 1, True),
    }
    assert await backend.indexed_versions(["corpuser"]) == [IndexedVersion(user, "corpUserInfo", "document", 4, True)]
    assert await backend.document_versions(a) == {"datasetKey": 1, "datasetProperties": 2}
    assert await backend.document_versions(user) == {"corpUserInfo": 4}
    assert await backend.document_versions(ds("never")) == {}
