"""The Elasticsearch/OpenSearch backend (`app.search.elastic.ElasticBackend`) against the OpenSearch-API test server
(osmem, session fixture `search_server`), in OpenSearch flavor (the client's vendor media type mapped back to JSON).
Changes are built with `changes_from_mcl` from realistic change logs. Each test has its own index prefix.
osmem shows documents before a refresh, so nothing here can (or tries to) check refresh timing."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
import pytest_asyncio

from app.registry import load_registry
from app.search import documents, elastic_mappings
from app.search.documents import changes_from_mcl
from app.search.elastic import ElasticBackend, OpenSearchCompatNode
from app.search.model import AspectFields, Criterion, EntityRemoval, IndexedVersion, TimeseriesQuery
from tests.helpers import ds

REGISTRY_PATH = Path("/work/main/entity_registry.yml")


@pytest.fixture(scope="module")
def es_registry():
    return load_registry(REGISTRY_PATH)


def _settings(url: str, prefix: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(search_url=url, search_flavor="opensearch",
                           search_index_prefix=prefix or f"t{uuid.uuid4().hex[:10]}_")


@pytest_asyncio.fixture
async def backend(search_server, es_registry):
    b = ElasticBackend(_settings(search_server.url), es_registry)
    await b.start()
    yield b
    await b.client.indices.delete(index=f"{b.prefix}*", ignore_unavailable=True)
    await b.close()


def mcl(urn: str, aspect: str, value: dict[str, Any] | None, version: int, change: str = "UPSERT",
        entity_type: str = "dataset") -> dict[str, Any]:
    out: dict[str, Any] = {
        "entityType": entity_type, "entityUrn": urn, "aspectName": aspect, "changeType": change,
        "systemMetadata": {"version": str(version), "runId": "test", "lastObserved": 1},
    }
    if value is not None:
        out["aspect"] = {"value": orjson.dumps(value).decode(), "contentType": "application/json"}
    if change == "DELETE":
        out["previousSystemMetadata"] = {"version": str(version)}
    return out


def changes(registry, *mcls: dict[str, Any]):
    return [c for m in mcls for c in changes_from_mcl(m, registry)]


def props(name: str, description: str = "", **extra: Any) -> dict[str, Any]:
    return {"name": name, "description": description, "customProperties": {}, "tags": [], **extra}


def upstreams(*urns: str) -> dict[str, Any]:
    return {"upstreams": [{"auditStamp": {"time": 1, "actor": "urn:li:corpuser:x"}, "dataset": u, "type": "TRANSFORMED"}
                          for u in urns]}


async def test_opensearch_node_maps_vendor_media_type(search_server, es_registry):
    b = ElasticBackend(_settings(search_server.url), es_registry)
    try:
        assert b.client.transport.node_pool.node_class is OpenSearchCompatNode
        info = await b.client.info()
        assert info["version"]["distribution"] == "opensearch"
        await b.client.indices.create(index=f"{b.prefix}probe", mappings={"properties": {"a": {"type": "keyword"}}})
        await b.client.index(index=f"{b.prefix}probe", id="1", document={"a": "x"}, refresh="wait_for")
        found = await b.client.search(index=f"{b.prefix}probe", query={"term": {"a": "x"}})  # 406 without the node
        assert found["hits"]["total"]["value"] == 1
        await b.client.indices.delete(index=f"{b.prefix}probe")
    finally:
        await b.close()


async def test_elasticsearch_flavor_sends_vendor_media_type(search_server, es_registry):
    """Without the OpenSearch node the client's compatibility media type is refused (406): why the flavor exists."""
    from elasticsearch import ApiError

    settings = _settings(search_server.url)
    settings.search_flavor = "elasticsearch"
    b = ElasticBackend(settings, es_registry)
    try:
        assert b.client.transport.node_pool.node_class is not OpenSearchCompatNode
        await b.client.info()  # no body: osmem lets the vendor Accept through
        with pytest.raises(ApiError) as refused:  # a body in the vendor Content-Type: refused
            await b.client.search(index=f"{b.prefix}none", query={"match_all": {}})
        assert refused.value.meta.status == 406
    finally:
        await b.close()
    settings.search_flavor = "solr"
    with pytest.raises(ValueError):
        ElasticBackend(settings, es_registry)


async def test_exact_name_beats_description(backend, es_registry):
    target, noisy, other = ds("db.orders"), ds("db.customers"), ds("db.order_lines")
    await backend.apply(changes(
        es_registry,
        mcl(noisy, "datasetProperties", props("customers", "every orders of every customer, orders orders"), 1),
        mcl(target, "datasetProperties", props("orders", "the fact table"), 1),
        mcl(other, "datasetProperties", props("order_lines", "lines"), 1),
    ))
    page = await backend.search("dataset", "orders")
    urns = [h.urn for h in page.hits]
    assert urns[0] == target and noisy in urns
    assert page.hits[0].score > page.hits[1].score
    case = await backend.search("dataset", "ORDERS")
    assert case.hits[0].urn == target
    everything = await backend.search("dataset", "*")
    assert everything.total == 3
    auto = await backend.autocomplete("dataset", "ord")
    assert {h.urn for h in auto} >= {target, other} and noisy not in {h.urn for h in auto}


async def test_filters_and_facets(backend, es_registry):
    mcls = []
    for i in range(6):
        urn = ds(f"db.t{i}", platform="hive" if i < 4 else "kafka")
        mcls.append(mcl(urn, "datasetKey", {"platform": f"urn:li:dataPlatform:{'hive' if i < 4 else 'kafka'}",
                                             "name": f"db.t{i}", "origin": "PROD"}, 1))
        mcls.append(mcl(urn, "datasetProperties", props(f"table {i}", "sales data"), 1))
    await backend.apply(changes(es_registry, *mcls))
    filters = documents.filter_fields(es_registry, "dataset")
    assert "platform" in filters
    page = await backend.search("dataset", "sales", filters={"platform": ["urn:li:dataPlatform:kafka"]})
    assert page.total == 2 and all("kafka" in h.urn for h in page.hits)
    page = await backend.search("dataset", "*")
    assert page.facets["platform"] == {"urn:li:dataPlatform:hive": 4, "urn:li:dataPlatform:kafka": 2}


async def test_any_of_groups_negation_and_removed(backend, es_registry):
    """`any_of` (GraphQL's orFilters): OR of AND groups, negated criteria, `removed` named in a group."""
    rows = [("a", "hive", "PROD"), ("b", "kafka", "PROD"), ("c", "hive", "DEV"), ("d", "kafka", "DEV")]
    mcls = []
    for name, platform, env in rows:
        urn = ds(name, platform=platform, env=env)
        mcls.append(mcl(urn, "datasetKey", {"platform": f"urn:li:dataPlatform:{platform}", "name": name, "origin": env}, 1))
    mcls.append(mcl(ds("d", platform="kafka", env="DEV"), "status", {"removed": True}, 1))
    await backend.apply(changes(es_registry, *mcls))
    a, b, c, d = (ds(n, platform=p, env=e) for n, p, e in rows)

    async def urns(**kwargs: Any) -> set[str]:
        return {h.urn for h in (await backend.search("dataset", "*", count=100, **kwargs)).hits}

    kafka, dev = Criterion("platform", ("urn:li:dataPlatform:kafka",)), Criterion("origin", ("DEV",))
    assert await urns(any_of=[[kafka], [dev]]) == {b, c}  # d is soft-deleted
    assert await urns(any_of=[[kafka, dev]]) == set()
    assert await urns(any_of=[[Criterion("platform", ("urn:li:dataPlatform:hive",), negated=True)]]) == {b}
    assert await urns(any_of=[[kafka, Criterion("removed", ("true",), negated=True)]]) == {b}
    assert await urns(any_of=[[kafka, Criterion("removed", ("true",))]]) == {d}
    assert await urns(any_of=[]) == set()
    assert await urns(any_of=[[]]) == {a, b, c}
    page = await backend.search("dataset", "*", any_of=[[kafka]], facets=False)
    assert page.total == 1 and page.facets == {}


async def test_pagination_through_10k_documents(search_server, es_registry):
    b = ElasticBackend(_settings(search_server.url), es_registry, refresh=False)  # a bulk load: no read-your-writes
    await b.start()
    try:
        n = 10_050
        started = time.perf_counter()
        batch = [AspectFields("dataset", ds(f"db.bulk_{i:05d}"), "datasetProperties", 1,
                              {"name": f"bulk {i}", "description": "bulk loaded"}) for i in range(n)]
        await b.apply(batch)
        await b.client.indices.refresh(index=b.entity_index("dataset"))
        load_s = time.perf_counter() - started
        seen: list[str] = []
        scroll = None
        pages = 0
        # match-all ("*"): every score is 1.0. A scored query cannot be paged on osmem: it scores in float64 but
        # prints float32, so a `_score` in search_after never equals the stored one (real engines score in float32).
        while pages < 20:
            page = await b.search("dataset", "*", count=1000, scroll_id=scroll)
            assert page.total == n
            seen.extend(h.urn for h in page.hits)
            pages += 1
            scroll = page.scroll_id
            if scroll is None:
                break
        assert len(seen) == n and len(set(seen)) == n and pages == 11
        assert seen == sorted(seen)  # ties broken by urn
        by_name = await b.search("dataset", "*", count=5000, sort=[("name", "DESCENDING")])
        second = await b.search("dataset", "*", count=5000, sort=[("name", "DESCENDING")], scroll_id=by_name.scroll_id)
        names = [h.fields["name"] for h in by_name.hits + second.hits]
        assert names == sorted(names, reverse=True) and len(set(names)) == 10_000
        print(f"bulk-loaded {n} documents in {load_s:.2f}s")
    finally:
        await b.client.indices.delete(index=f"{b.prefix}*", ignore_unavailable=True)
        await b.close()


async def test_soft_delete_hidden(backend, es_registry):
    a, b = ds("db.alive"), ds("db.gone")
    await backend.apply(changes(es_registry, mcl(a, "datasetProperties", props("thing alive"), 1),
                                mcl(b, "datasetProperties", props("thing gone"), 1)))
    await backend.apply(changes(es_registry, mcl(b, "status", {"removed": True}, 1)))
    page = await backend.search("dataset", "thing")
    assert [h.urn for h in page.hits] == [a]
    shown = await backend.search("dataset", "thing", filters={"removed": ["true"]})
    assert [h.urn for h in shown.hits] == [b]
    await backend.apply(changes(es_registry, mcl(b, "status", {"removed": False}, 2)))
    assert (await backend.search("dataset", "thing")).total == 2


async def test_idempotent_replay_and_out_of_order(backend, es_registry):
    urn = ds("db.versions")
    v1 = mcl(urn, "datasetProperties", props("first name"), 1)
    v2 = mcl(urn, "datasetProperties", props("second name"), 2)
    await backend.apply(changes(es_registry, v1, v2))
    before = await backend.client.get(index=backend.entity_index("dataset"), id=urn)
    await backend.apply(changes(es_registry, v1, v2))  # replay: no write at all
    after = await backend.client.get(index=backend.entity_index("dataset"), id=urn)
    assert after["_seq_no"] == before["_seq_no"]
    await backend.apply(changes(es_registry, v1))  # older after newer: no regression
    assert (await backend.search("dataset", "second")).hits[0].urn == urn
    assert (await backend.search("dataset", "first")).total == 0
    assert (await backend.document_versions(urn))["datasetProperties"] == 2


async def test_concurrent_writers_conflict_and_retry(backend, es_registry):
    import asyncio

    rounds = 0
    apply_once = backend._apply_once

    async def counting(*args, **kwargs):
        nonlocal rounds
        rounds += 1
        return await apply_once(*args, **kwargs)

    backend._apply_once = counting
    urn = ds("db.race")
    # eight writers, each with its own version of the document and of the lineage edge set of the same source
    batches = [changes(es_registry, mcl(urn, "datasetProperties", props(f"race {v}"), v),
                       mcl(urn, "upstreamLineage", upstreams(ds(f"db.up{v}"), ds(f"db.up{v}b")), v))
               for v in (3, 8, 1, 5, 2, 7, 4, 6)]
    await asyncio.gather(*(backend.apply(b) for b in batches))
    assert rounds > len(batches)  # conditional writes conflicted and were retried
    assert (await backend.document_versions(urn))["datasetProperties"] == 8
    assert (await backend.search("dataset", "race")).hits[0].fields["name"] == "race 8"
    edges, total = await backend.relationships(urn, direction="OUTGOING")
    assert total == 2 and {e.destination for e in edges} == {ds("db.up8"), ds("db.up8b")}


async def test_aspect_delete(backend, es_registry):
    urn = ds("db.tagged")
    await backend.apply(changes(
        es_registry, mcl(urn, "datasetProperties", props("tagged table"), 1),
        mcl(urn, "globalTags", {"tags": [{"tag": "urn:li:tag:pii"}]}, 1),
    ))
    assert (await backend.relationships(urn, direction="OUTGOING"))[1] == 1
    hit = (await backend.search("dataset", "tagged")).hits[0]
    assert "urn:li:tag:pii" in str(hit.fields.get("tags"))
    await backend.apply(changes(es_registry, mcl(urn, "globalTags", None, 1, change="DELETE")))
    hit = (await backend.search("dataset", "tagged")).hits[0]
    assert not hit.fields.get("tags")
    assert (await backend.relationships(urn, direction="OUTGOING"))[1] == 0
    # a late upsert older than the delete does not resurrect the tags
    await backend.apply(changes(es_registry, mcl(urn, "globalTags", {"tags": [{"tag": "urn:li:tag:pii"}]}, 0)))
    assert not (await backend.search("dataset", "tagged")).hits[0].fields.get("tags")


async def test_relationships_both_directions_and_entity_removal(backend, es_registry):
    a, b, c = ds("db.a"), ds("db.b"), ds("db.c")
    await backend.apply(changes(
        es_registry,
        mcl(b, "upstreamLineage", upstreams(a), 1),
        mcl(c, "upstreamLineage", upstreams(b), 1),
        mcl(b, "datasetProperties", props("bee"), 1),
    ))
    out, total = await backend.relationships(b, direction="OUTGOING", types=["DownstreamOf"])
    assert total == 1 and out[0].destination == a and out[0].is_lineage
    inc, total = await backend.relationships(b, direction="INCOMING")
    assert total == 1 and inc[0].source == c
    # the edge set of an aspect is replaced by a newer version, never by an older one
    await backend.apply(changes(es_registry, mcl(b, "upstreamLineage", upstreams(c), 2)))
    await backend.apply(changes(es_registry, mcl(b, "upstreamLineage", upstreams(a), 1)))
    out, _ = await backend.relationships(b, direction="OUTGOING")
    assert [e.destination for e in out] == [c]
    # hard delete of b: its document and every edge from or to it
    await backend.apply([EntityRemoval("dataset", b, 3)])
    assert (await backend.relationships(b, direction="OUTGOING"))[1] == 0
    assert (await backend.relationships(b, direction="INCOMING"))[1] == 0
    assert (await backend.relationships(c, direction="OUTGOING"))[1] == 0
    assert (await backend.search("dataset", "bee")).total == 0
    assert await backend.document_versions(b) == {}
    key_delete = changes(es_registry, mcl(c, "datasetKey", None, 1, change="DELETE"))
    assert isinstance(key_delete[0], EntityRemoval)


async def test_lineage_three_hops(backend, es_registry):
    n = [ds(f"db.l{i}") for i in range(5)]  # l4 <- l3 <- l2 <- l1 <- l0 (l0 downstream of l1, ...)
    await backend.apply(changes(es_registry, *(mcl(n[i], "upstreamLineage", upstreams(n[i + 1]), 1) for i in range(4)),
                                mcl(n[1], "upstreamLineage", upstreams(n[2], n[3]), 2)))  # l1 -> l2 and l3
    up = await backend.lineage(n[0], direction="UPSTREAM", max_hops=3)
    hops = {(e.source, e.destination): h for e, h in up}
    assert hops == {(n[0], n[1]): 1, (n[1], n[2]): 2, (n[1], n[3]): 2, (n[2], n[3]): 3, (n[3], n[4]): 3}
    down = await backend.lineage(n[4], direction="DOWNSTREAM", max_hops=3)
    assert {(e.source, e.destination, h) for e, h in down} == {
        (n[3], n[4], 1), (n[2], n[3], 2), (n[1], n[3], 2), (n[1], n[2], 3), (n[0], n[1], 3)}
    one = await backend.lineage(n[0], direction="UPSTREAM", max_hops=1)
    assert [(e.destination, h) for e, h in one] == [(n[1], 1)]


async def test_lineage_data_process_instance_edges_walk_downstream(backend, es_registry):
    # a run consumes `raw` and produces `out` (the edges of its input and output aspects): DataProcessInstanceConsumes
    # points upstream, DataProcessInstanceProduces downstream; `inputs`/`outputs` give edges that are not lineage
    run = "urn:li:dataProcessInstance:run1"
    raw, out = ds("db.raw"), ds("db.out")
    await backend.apply(changes(
        es_registry,
        mcl(run, "dataProcessInstanceInput", {"inputs": [raw], "inputEdges": [{"destinationUrn": raw}]}, 1,
            entity_type="dataProcessInstance"),
        mcl(run, "dataProcessInstanceOutput", {"outputs": [out], "outputEdges": [{"destinationUrn": out}]}, 1,
            entity_type="dataProcessInstance"),
    ))
    up = await backend.lineage(out, direction="UPSTREAM", max_hops=3)
    assert [(e.source, e.destination, e.relationship, h) for e, h in up] == [
        (run, out, "DataProcessInstanceProduces", 1), (run, raw, "DataProcessInstanceConsumes", 2)]
    down = await backend.lineage(raw, direction="DOWNSTREAM", max_hops=3)
    assert [(e.source, e.destination, e.relationship, h) for e, h in down] == [
        (run, raw, "DataProcessInstanceConsumes", 1), (run, out, "DataProcessInstanceProduces", 2)]
    # nothing is downstream of the output, nothing upstream of the input
    assert await backend.lineage(out, direction="DOWNSTREAM", max_hops=3) == []
    assert await backend.lineage(raw, direction="UPSTREAM", max_hops=3) == []


async def test_timeseries_range_and_overwrite(backend, es_registry):
    urn = ds("db.profiled")

    def profile(ts: int, rows: int) -> dict[str, Any]:
        return mcl(urn, "datasetProfile", {"timestampMillis": ts, "rowCount": rows, "columnCount": 3,
                                           "eventGranularity": {"unit": "DAY", "multiple": 1}}, 0)

    await backend.apply(changes(es_registry, *(profile(1_000 * d, d * 10) for d in range(1, 6))))
    points = await backend.timeseries(TimeseriesQuery(urn=urn, aspect="datasetProfile", start_ms=2_000, end_ms=4_000))
    assert [p.timestamp_ms for p in points] == [4_000, 3_000, 2_000]
    assert points[0].value["rowCount"] == 40
    resent = profile(3_000, 999)
    resent["systemMetadata"]["runId"] = "resend"
    await backend.apply(changes(es_registry, resent))  # the same point re-sent: overwritten
    points = await backend.timeseries(TimeseriesQuery(urn=urn, aspect="datasetProfile"))
    assert len(points) == 5 and [p.value["rowCount"] for p in points if p.timestamp_ms == 3_000] == [999]
    limited = await backend.timeseries(TimeseriesQuery(urn=urn, aspect="datasetProfile", limit=2, equals={"runId": "resend"}))
    assert [p.timestamp_ms for p in limited] == [3_000]
    assert len(await backend.timeseries(TimeseriesQuery(urn=urn, aspect="datasetProfile", limit=2))) == 2
    assert await backend.timeseries(TimeseriesQuery(urn=ds("db.none"), aspect="datasetUsageStatistics")) == []


async def test_alias_swap_on_mapping_change(search_server, es_registry, monkeypatch):
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    first = ElasticBackend(_settings(search_server.url, prefix), es_registry)
    await first.start()
    urns = [ds(f"db.swap{i}") for i in range(30)]
    await first.apply(changes(es_registry, *(mcl(u, "datasetProperties", props(f"swap {i}"), 1) for i, u in enumerate(urns))))
    alias = first.entity_index("dataset")
    old_indices = set((await first.client.indices.get_alias(name=alias)).body)
    await first.close()

    original = elastic_mappings.index_mapping

    def changed_mapping(registry, entity_type):
        mapping = original(registry, entity_type)
        mapping["properties"]["newField"] = {"type": "keyword"}
        return mapping

    monkeypatch.setattr(elastic_mappings, "index_mapping", changed_mapping)
    second = ElasticBackend(_settings(search_server.url, prefix), es_registry)
    try:
        await second.start()
        new_indices = set((await second.client.indices.get_alias(name=alias)).body)
        assert len(new_indices) == 1 and new_indices.isdisjoint(old_indices)
        assert not await second.client.indices.exists(index=next(iter(old_indices)))
        mapping = (await second.client.indices.get_mapping(index=alias)).body
        assert "newField" in next(iter(mapping.values()))["mappings"]["properties"]
        page = await second.search("dataset", "swap", count=100)
        assert page.total == 30 and {h.urn for h in page.hits} == set(urns)
        assert (await second.document_versions(urns[0])) == {"datasetProperties": 1}
        # unchanged mappings: a restart does nothing
        third = ElasticBackend(_settings(search_server.url, prefix), es_registry)
        await third.start()
        assert set((await third.client.indices.get_alias(name=alias)).body) == new_indices
        await third.close()
    finally:
        await second.client.indices.delete(index=f"{prefix}*", ignore_unavailable=True)
        await second.close()



async def test_an_alias_on_a_restored_index_of_the_same_mapping_is_current(search_server, es_registry):
    """A restore job builds `<alias>_<digest>_r<timestamp>` and swaps the alias onto it: same mapping, no reindex;
    another digest with a suffix is still a mapping change."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    first = ElasticBackend(_settings(search_server.url, prefix), es_registry)
    try:
        await first.start()
        alias = first.entity_index("dataset")
        [built] = list((await first.client.indices.get_alias(name=alias)).body)
        urn = ds("db.restored")
        await first.apply(changes(es_registry, mcl(urn, "datasetProperties", props("restored"), 1)))
        restored = f"{built}_r1767225600000"
        mapping, index_settings = first.entity_index_body("dataset")
        await first.client.indices.create(index=restored, mappings=mapping, **({"settings": index_settings} if index_settings else {}))
        await first.client.reindex(source={"index": built}, dest={"index": restored}, refresh=True, wait_for_completion=True)
        await first.client.indices.update_aliases(actions=[{"remove": {"index": built, "alias": alias}},
                                                           {"add": {"index": restored, "alias": alias}}])
        await first.client.indices.delete(index=built)

        second = ElasticBackend(_settings(search_server.url, prefix), es_registry)
        try:
            assert await second.ensure_index(alias, mapping, index_settings) == restored
            assert list((await second.client.indices.get_alias(name=alias)).body) == [restored]
            assert not await second.client.indices.exists(index=built)  # nothing was created or reindexed
            assert (await second.search("dataset", "restored")).total == 1
            # a suffixed index of another mapping is not current: reindexed into the digest's index
            other = {**mapping, "properties": {**mapping["properties"], "newField": {"type": "keyword"}}}
            third = ElasticBackend(_settings(search_server.url, prefix), es_registry)
            try:
                target = await third.ensure_index(alias, other, index_settings)
                assert target != restored and not target.startswith(f"{built}_")
                assert list((await third.client.indices.get_alias(name=alias)).body) == [target]
                assert (await third.search("dataset", "restored")).total == 1
            finally:
                await third.close()
        finally:
            await second.close()
    finally:
        await first.client.indices.delete(index=f"{prefix}*", ignore_unavailable=True)
        await first.close()


async def test_starters_racing_on_empty_indices_all_succeed(search_server, es_registry):
    """Several processes (service workers, Spark tasks) start at once on a fresh cluster: each creates or finds
    the same indices; an alias that appears between one starter's two looks is not taken for a legacy index."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    starters = [ElasticBackend(_settings(search_server.url, prefix), es_registry) for _ in range(4)]
    try:
        for _ in range(3):
            await asyncio.gather(*(b.start() for b in starters))
            for b in starters:
                b._ready.clear()  # the next round checks the cluster again, as a fresh process would
        alias = starters[0].entity_index("dataset")
        indices = list((await starters[0].client.indices.get_alias(name=alias)).body)
        assert len(indices) == 1 and indices[0].startswith(f"{alias}_")
    finally:
        await starters[0].client.indices.delete(index=f"{prefix}*", ignore_unavailable=True)
        for b in starters:
            await b.close()


async def test_rebuild_target_is_built_aside_then_swapped_in(search_server, es_registry):
    """The index lifecycle of restore-indices: fresh indices built while the aliases serve the old ones (one entity
    type: the other types' edges are copied), filled by a backend writing into them, swapped in; or dropped."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    live = ElasticBackend(_settings(search_server.url, prefix), es_registry)
    try:
        await live.start()
        urn, user = ds("db.rebuilt"), "urn:li:corpuser:rebuilt"
        owners = {"owners": [{"owner": user, "type": "DATAOWNER"}], "lastModified": {"time": 1, "actor": user}}
        await live.apply(changes(es_registry, mcl(urn, "datasetProperties", props("rebuilt"), 1),
                                 mcl(urn, "ownership", owners, 1),
                                 mcl(user, "corpUserInfo", {"active": True, "displayName": "before"}, 1,
                                     entity_type="corpuser")))
        aliases = [live.entity_index("corpuser"), live.graph_index, live.edge_set_index]
        before = {a: set((await live.client.indices.get_alias(name=a)).body) for a in aliases}
        dataset_before = set((await live.client.indices.get_alias(name=live.entity_index("dataset"))).body)

        target = await live.create_rebuild_target(["corpuser"])
        assert sorted(target.indices) == sorted(aliases)
        assert all(target.indices[a].startswith(f"{a}_") and "_r" in target.indices[a].removeprefix(a) for a in aliases)
        into = live.writing_into(target)
        try:
            await into.apply(changes(es_registry, mcl(user, "corpUserInfo", {"active": True, "displayName": "after"},
                                                      2, entity_type="corpuser")))
        finally:
            await into.close()
        assert (await live.search("corpuser", "before")).total == 1  # the aliases still serve the old indices

        old = await live.swap_in(target)
        assert sorted(old) == sorted(i for a in aliases for i in before[a])
        for alias in aliases:
            assert list((await live.client.indices.get_alias(name=alias)).body) == [target.indices[alias]]
            assert not any([await live.client.indices.exists(index=i) for i in before[alias]])
        assert set((await live.client.indices.get_alias(name=live.entity_index("dataset"))).body) == dataset_before
        assert (await live.search("corpuser", "after")).total == 1 and (await live.search("corpuser", "before")).total == 0
        edges, _ = await live.relationships(urn, direction="OUTGOING", types=["OwnedBy"])
        assert [e.destination for e in edges] == [user]  # another entity type's edges, copied into the fresh index

        assert set(await live.indexed_versions(["dataset"])) >= {
            IndexedVersion(urn, "datasetProperties", "document", 1, True), IndexedVersion(urn, "ownership", "edges", 1, True),
        }
        assert IndexedVersion(user, "corpUserInfo", "document", 2, True) in await live.indexed_versions(["corpuser"])

        dropped = await live.create_rebuild_target()
        assert set(dropped.indices) >= set(aliases) | {live.entity_index("dataset")}
        await live.drop_rebuild_target(dropped)
        assert not any([await live.client.indices.exists(index=i) for i in dropped.indices.values()])
        assert list((await live.client.indices.get_alias(name=live.graph_index)).body) == [target.indices[live.graph_index]]
    finally:
        await live.client.indices.delete(index=f"{prefix}*", ignore_unavailable=True)
        await live.close()


async def test_create_missing_indices_leaves_existing_ones_alone(search_server, es_registry, monkeypatch):
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    backend = ElasticBackend(_settings(search_server.url, prefix), es_registry)  # not started
    try:
        await backend.create_missing_indices(["dataset"])
        for alias in (backend.graph_index, backend.edge_set_index, backend.entity_index("dataset")):
            assert await backend.client.indices.exists_alias(name=alias)
        assert not await backend.client.indices.exists(index=backend.entity_index("corpuser"))
        current = list((await backend.client.indices.get_alias(name=backend.entity_index("dataset"))).body)

        original = elastic_mappings.index_mapping

        def changed_mapping(registry, entity_type):
            mapping = original(registry, entity_type)
            mapping["properties"]["newField"] = {"type": "keyword"}
            return mapping

        monkeypatch.setattr(elastic_mappings, "index_mapping", changed_mapping)
        again = ElasticBackend(_settings(search_server.url, prefix), es_registry)
        try:
            await again.create_missing_indices(["dataset", "corpuser"])  # the dataset index exists: not migrated
            assert list((await again.client.indices.get_alias(name=again.entity_index("dataset"))).body) == current
            assert await again.client.indices.exists_alias(name=again.entity_index("corpuser"))
        finally:
            await again.close()
    finally:
        await backend.client.indices.delete(index=f"{prefix}*", ignore_unavailable=True)
        await backend.close()


async def test_a_document_the_server_refuses_raises_index_refused_and_the_others_are_written(backend, es_registry,
                                                                                               monkeypatch):
    """Bulk item errors: refused for the data (400: a date the server cannot parse) → `IndexRefused` naming the item,
    after every other document of the bulk is written; rejected for capacity (429) → `IndexUnavailable` (transient)."""
    from app.search.failures import is_transient
    from app.search.model import IndexRefused, IndexUnavailable

    bad, good = ds("db.bad_date"), ds("db.good_date")
    with pytest.raises(IndexRefused) as refused:
        await backend.apply(changes(
            es_registry,
            mcl(bad, "datasetProperties", props("bad", "x", created={"time": -(2**63)}), 1),
            mcl(good, "datasetProperties", props("good", "y", created={"time": 1_700_000_000_000}), 1),
        ))
    assert len(refused.value.items) == 1 and "date" in refused.value.items[0] and not is_transient(refused.value)
    assert [h.urn for h in (await backend.search("dataset", "good")).hits] == [good]
    assert await backend.document_versions(bad) == {}

    real_bulk = backend.client.bulk

    async def busy_bulk(**kwargs):
        response = await real_bulk(**kwargs)
        first = next(iter(response["items"][0].values()))
        first.update(status=429, error={"type": "es_rejected_execution_exception", "reason": "queue full"})
        return {**response, "errors": True}

    monkeypatch.setattr(backend.client, "bulk", busy_bulk)
    with pytest.raises(IndexUnavailable) as busy:
        await backend.apply(changes(es_registry, mcl(ds("db.busy"), "datasetProperties", props("busy", "z"), 1)))
    assert is_transient(busy.value)
