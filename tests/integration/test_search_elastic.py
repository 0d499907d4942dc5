"""What only the Elasticsearch/OpenSearch backend (`app.search.elastic.ElasticBackend`) has, against the
OpenSearch-API test server (osmem, session fixture `search_server`): the client's flavors (OpenSearch: the vendor
media type mapped back to JSON), conditional writes (a replay writes nothing, conflicting writers retry), index
management (aliases over digest-named indices, mapping changes, restore targets, missing indices) and the bulk's item
errors. The `SearchBackend` behaviour both backends share is test_search_contract.py's.
Changes are built with `changes_from_mcl` from realistic change logs. Each test has its own index prefix.
osmem shows documents before a refresh, so nothing here can (or tries to) check refresh timing."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
import pytest_asyncio

from app.search import elastic_mappings
from app.search.documents import changes_from_mcl
from app.search.elastic import ElasticBackend, OpenSearchCompatNode
from app.search.model import IndexedVersion
from tests.helpers import ds


def _settings(url: str, prefix: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        search_url=url, search_flavor="opensearch", search_index_prefix=prefix or f"t{uuid.uuid4().hex[:10]}_"
    )


@pytest_asyncio.fixture
async def backend(search_server, registry):
    b = ElasticBackend(_settings(search_server.url), registry)
    await b.start()
    yield b
    await b.client.indices.delete(index=f"{b.prefix}*", ignore_unavailable=True)
    await b.close()


def mcl(urn: str, aspect: str, value: dict[str, Any], version: int, entity_type: str = "dataset") -> dict[str, Any]:
    """An UPSERT's change log."""
    return {
        "entityType": entity_type,
        "entityUrn": urn,
        "aspectName": aspect,
        "changeType": "UPSERT",
        "systemMetadata": {"version": str(version), "runId": "test", "lastObserved": 1},
        "aspect": {"value": orjson.dumps(value).decode(), "contentType": "application/json"},
    }


def changes(registry, *mcls: dict[str, Any]):
    return [c for m in mcls for c in changes_from_mcl(m, registry)]


def props(name: str, description: str = "", **extra: Any) -> dict[str, Any]:
    return {"name": name, "description": description, "customProperties": {}, "tags": [], **extra}


def upstreams(*urns: str) -> dict[str, Any]:
    return {
        "upstreams": [
            {"auditStamp": {"time": 1, "actor": "urn:li:corpuser:x"}, "dataset": u, "type": "TRANSFORMED"} for u in urns
        ]
    }


async def test_opensearch_node_maps_vendor_media_type(search_server, registry):
    b = ElasticBackend(_settings(search_server.url), registry)
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


async def test_elasticsearch_flavor_sends_vendor_media_type(search_server, registry):
    """Without the OpenSearch node the client's compatibility media type is refused (406): why the flavor exists."""
    from elasticsearch import ApiError

    settings = _settings(search_server.url)
    settings.search_flavor = "elasticsearch"
    b = ElasticBackend(settings, registry)
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
        ElasticBackend(settings, registry)


async def test_a_replay_or_an_older_version_writes_nothing(backend, registry):
    urn = ds("db.versions")
    v1 = mcl(urn, "datasetProperties", props("first name"), 1)
    v2 = mcl(urn, "datasetProperties", props("second name"), 2)
    await backend.apply(changes(registry, v1, v2))
    before = await backend.client.get(index=backend.entity_index("dataset"), id=urn)
    await backend.apply(changes(registry, v1, v2))  # a replay
    await backend.apply(changes(registry, v1))  # older after newer
    after = await backend.client.get(index=backend.entity_index("dataset"), id=urn)
    assert after["_seq_no"] == before["_seq_no"]


async def test_concurrent_writers_conflict_and_retry(backend, registry):
    rounds = 0
    apply_once = backend._apply_once

    async def counting(*args, **kwargs):
        nonlocal rounds
        rounds += 1
        return await apply_once(*args, **kwargs)

    backend._apply_once = counting
    urn = ds("db.race")
    # eight writers, each with its own version of the document and of the lineage edge set of the same source
    batches = [
        changes(
            registry,
            mcl(urn, "datasetProperties", props(f"race {v}"), v),
            mcl(urn, "upstreamLineage", upstreams(ds(f"db.up{v}"), ds(f"db.up{v}b")), v),
        )
        for v in (3, 8, 1, 5, 2, 7, 4, 6)
    ]
    await asyncio.gather(*(backend.apply(b) for b in batches))
    assert rounds > len(batches)  # conditional writes conflicted and were retried
    assert (await backend.document_versions(urn))["datasetProperties"] == 8
    assert (await backend.search("dataset", "race")).hits[0].fields["name"] == "race 8"
    edges, total = await backend.relationships(urn, direction="OUTGOING")
    assert total == 2 and {e.destination for e in edges} == {ds("db.up8"), ds("db.up8b")}


async def test_alias_swap_on_mapping_change(search_server, registry, monkeypatch):
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    first = ElasticBackend(_settings(search_server.url, prefix), registry)
    await first.start()
    urns = [ds(f"db.swap{i}") for i in range(30)]
    await first.apply(
        changes(registry, *(mcl(u, "datasetProperties", props(f"swap {i}"), 1) for i, u in enumerate(urns)))
    )
    alias = first.entity_index("dataset")
    old_indices = set((await first.client.indices.get_alias(name=alias)).body)
    await first.close()

    original = elastic_mappings.index_mapping

    def changed_mapping(registry, entity_type):
        mapping = original(registry, entity_type)
        mapping["properties"]["newField"] = {"type": "keyword"}
        return mapping

    monkeypatch.setattr(elastic_mappings, "index_mapping", changed_mapping)
    second = ElasticBackend(_settings(search_server.url, prefix), registry)
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
        third = ElasticBackend(_settings(search_server.url, prefix), registry)
        await third.start()
        assert set((await third.client.indices.get_alias(name=alias)).body) == new_indices
        await third.close()
    finally:
        await second.client.indices.delete(index=f"{prefix}*", ignore_unavailable=True)
        await second.close()


async def test_an_alias_on_a_restored_index_of_the_same_mapping_is_current(search_server, registry):
    """A restore job builds `<alias>_<digest>_r<timestamp>` and swaps the alias onto it: same mapping, no reindex;
    another digest with a suffix is still a mapping change."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    first = ElasticBackend(_settings(search_server.url, prefix), registry)
    try:
        await first.start()
        alias = first.entity_index("dataset")
        [built] = list((await first.client.indices.get_alias(name=alias)).body)
        urn = ds("db.restored")
        await first.apply(changes(registry, mcl(urn, "datasetProperties", props("restored"), 1)))
        restored = f"{built}_r1767225600000"
        mapping, index_settings = first.entity_index_body("dataset")
        await first.client.indices.create(
            index=restored, mappings=mapping, **({"settings": index_settings} if index_settings else {})
        )
        await first.client.reindex(
            source={"index": built}, dest={"index": restored}, refresh=True, wait_for_completion=True
        )
        await first.client.indices.update_aliases(
            actions=[{"remove": {"index": built, "alias": alias}}, {"add": {"index": restored, "alias": alias}}]
        )
        await first.client.indices.delete(index=built)

        second = ElasticBackend(_settings(search_server.url, prefix), registry)
        try:
            assert await second.ensure_index(alias, mapping, index_settings) == restored
            assert list((await second.client.indices.get_alias(name=alias)).body) == [restored]
            assert not await second.client.indices.exists(index=built)  # nothing was created or reindexed
            assert (await second.search("dataset", "restored")).total == 1
            # a suffixed index of another mapping is not current: reindexed into the digest's index
            other = {**mapping, "properties": {**mapping["properties"], "newField": {"type": "keyword"}}}
            third = ElasticBackend(_settings(search_server.url, prefix), registry)
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


async def test_starters_racing_on_empty_indices_all_succeed(search_server, registry):
    """Several processes (service workers, Spark tasks) start at once on a fresh cluster: each creates or finds
    the same indices; an alias that appears between one starter's two looks is not taken for a legacy index."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    starters = [ElasticBackend(_settings(search_server.url, prefix), registry) for _ in range(4)]
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


async def test_rebuild_target_is_built_aside_then_swapped_in(search_server, registry):
    """The index lifecycle of restore-indices: fresh indices built while the aliases serve the old ones (one entity
    type: the other types' edges are copied), filled by a backend writing into them, swapped in; or dropped."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    live = ElasticBackend(_settings(search_server.url, prefix), registry)
    try:
        await live.start()
        urn, user = ds("db.rebuilt"), "urn:li:corpuser:rebuilt"
        owners = {"owners": [{"owner": user, "type": "DATAOWNER"}], "lastModified": {"time": 1, "actor": user}}
        await live.apply(
            changes(
                registry,
                mcl(urn, "datasetProperties", props("rebuilt"), 1),
                mcl(urn, "ownership", owners, 1),
                mcl(user, "corpUserInfo", {"active": True, "displayName": "before"}, 1, entity_type="corpuser"),
            )
        )
        aliases = [live.entity_index("corpuser"), live.graph_index, live.edge_set_index]
        before = {a: set((await live.client.indices.get_alias(name=a)).body) for a in aliases}
        dataset_before = set((await live.client.indices.get_alias(name=live.entity_index("dataset"))).body)

        target = await live.create_rebuild_target(["corpuser"])
        assert sorted(target.indices) == sorted(aliases)
        assert all(target.indices[a].startswith(f"{a}_") and "_r" in target.indices[a].removeprefix(a) for a in aliases)
        into = live.writing_into(target)
        try:
            await into.apply(
                changes(
                    registry,
                    mcl(user, "corpUserInfo", {"active": True, "displayName": "after"}, 2, entity_type="corpuser"),
                )
            )
        finally:
            await into.close()
        assert (await live.search("corpuser", "before")).total == 1  # the aliases still serve the old indices

        old = await live.swap_in(target)
        assert sorted(old) == sorted(i for a in aliases for i in before[a])
        for alias in aliases:
            assert list((await live.client.indices.get_alias(name=alias)).body) == [target.indices[alias]]
            assert not any([await live.client.indices.exists(index=i) for i in before[alias]])
        assert set((await live.client.indices.get_alias(name=live.entity_index("dataset"))).body) == dataset_before
        assert (await live.search("corpuser", "after")).total == 1 and (
            await live.search("corpuser", "before")
        ).total == 0
        edges, _ = await live.relationships(urn, direction="OUTGOING", types=["OwnedBy"])
        assert [e.destination for e in edges] == [user]  # another entity type's edges, copied into the fresh index

        assert set(await live.indexed_versions(["dataset"])) >= {
            IndexedVersion(urn, "datasetProperties", "document", 1, True),
            IndexedVersion(urn, "ownership", "edges", 1, True),
        }
        assert IndexedVersion(user, "corpUserInfo", "document", 2, True) in await live.indexed_versions(["corpuser"])

        dropped = await live.create_rebuild_target()
        assert set(dropped.indices) >= set(aliases) | {live.entity_index("dataset")}
        await live.drop_rebuild_target(dropped)
        assert not any([await live.client.indices.exists(index=i) for i in dropped.indices.values()])
        assert list((await live.client.indices.get_alias(name=live.graph_index)).body) == [
            target.indices[live.graph_index]
        ]
    finally:
        await live.client.indices.delete(index=f"{prefix}*", ignore_unavailable=True)
        await live.close()


async def test_create_missing_indices_leaves_existing_ones_alone(search_server, registry, monkeypatch):
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    backend = ElasticBackend(_settings(search_server.url, prefix), registry)  # not started
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
        again = ElasticBackend(_settings(search_server.url, prefix), registry)
        try:
            await again.create_missing_indices(["dataset", "corpuser"])  # the dataset index exists: not migrated
            assert list((await again.client.indices.get_alias(name=again.entity_index("dataset"))).body) == current
            assert await again.client.indices.exists_alias(name=again.entity_index("corpuser"))
        finally:
            await again.close()
    finally:
        await backend.client.indices.delete(index=f"{prefix}*", ignore_unavailable=True)
        await backend.close()


async def test_a_document_the_server_refuses_raises_index_refused_and_the_others_are_written(
    backend, registry, monkeypatch
):
    """Bulk item errors: refused for the data (400: a date the server cannot parse) → `IndexRefused` naming the item,
    after every other document of the bulk is written; rejected for capacity (429) → `IndexUnavailable` (transient)."""
    from app.search.failures import is_transient
    from app.search.model import IndexRefused, IndexUnavailable

    bad, good = ds("db.bad_date"), ds("db.good_date")
    with pytest.raises(IndexRefused) as refused:
        await backend.apply(
            changes(
                registry,
                mcl(bad, "datasetProperties", props("bad", "x", created={"time": -(2**63)}), 1),
                mcl(good, "datasetProperties", props("good", "y", created={"time": 1_700_000_000_000}), 1),
            )
        )
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
        await backend.apply(changes(registry, mcl(ds("db.busy"), "datasetProperties", props("busy", "z"), 1)))
    assert is_transient(busy.value)
