"""The embedded search backend's result cache: a repeated search is answered from it while the search index is at
the version it was read at (`search_index_version`, migration 0021), and never once a write of the documents has
committed (in this process or in another one); a caller's scoped search is never answered with another caller's
rows."""

from __future__ import annotations

import asyncio

import pytest_asyncio
from alembic import command

from app.auth.model import Principal, Role
from app.auth.reads import ReadScopedBackend
from app.db import alembic_config, create_engine, upgrade_database
from app.search import postgres
from app.search.model import AspectFields
from app.search.postgres import PostgresBackend
from app.settings import Settings
from tests.helpers import ds

READER = Principal("urn:li:corpuser:reader", Role.READER)


def dataset(name: str) -> list[AspectFields]:
    urn = ds(name)
    return [
        AspectFields("dataset", urn, "datasetKey", 1, {"platform": "urn:li:dataPlatform:hive", "origin": "PROD"}),
        AspectFields("dataset", urn, "datasetProperties", 1, {"name": name, "description": "orders"}),
    ]


def view(name: str, kind: str) -> AspectFields:
    info = {"name": f"orders {name}", "type": kind, "createdBy": "urn:li:corpuser:other"}
    return AspectFields("dataHubView", f"urn:li:dataHubView:{name}", "dataHubViewInfo", 1, info)


async def new_backend(database_url, registry) -> PostgresBackend:
    backend = PostgresBackend(Settings(database_url=database_url), registry, create_engine(database_url))
    await backend.start()
    return backend


@pytest_asyncio.fixture
async def backends(database_url, registry):
    """Two backends on one database, as two processes have."""
    made = [await new_backend(database_url, registry) for _ in range(2)]
    await made[0].apply([*dataset("a"), *dataset("b")])
    yield made
    for backend in made:
        await backend._engine.dispose()


async def urns(backend, query: str = "orders") -> list[str]:
    page = await backend.search("dataset", query, count=10)
    assert page.total == len(page.hits)
    assert page.facets["platform"] == ({"urn:li:dataPlatform:hive": page.total} if page.total else {})
    return sorted(h.urn for h in page.hits)


async def test_a_repeated_search_is_answered_until_a_write_commits(backends):
    backend, other = backends
    assert await urns(backend) == [ds("a"), ds("b")]
    # a change the index's writes never make (no version moved): the cached answer stands
    async with backend._connection(readonly=False) as conn:
        await conn.execute("UPDATE search_document SET removed = true WHERE urn = $1", ds("a"))
    assert await urns(backend) == [ds("a"), ds("b")]
    # a write, here or in another process: every search reads again
    await other.apply(dataset("c"))
    assert await urns(backend) == [ds("b"), ds("c")]
    await backend.apply(dataset("d"))
    assert await urns(other) == [ds("b"), ds("c"), ds("d")]
    await other.clear(["dataset"])
    assert await urns(backend) == []


async def test_a_search_the_cache_answers_begins_no_transaction(backends, monkeypatch):
    backend, _ = backends
    began: list[str] = []
    reading = PostgresBackend._reading

    def counting(self, raw, **kwargs):  # a read transaction, with its settings and the request's budget
        began.append("BEGIN")
        return reading(self, raw, **kwargs)

    monkeypatch.setattr(PostgresBackend, "_reading", counting)
    assert await urns(backend) == [ds("a"), ds("b")]
    assert began == ["BEGIN"]  # the page, then its total and facets, in one read transaction
    assert await urns(backend) == [ds("a"), ds("b")]
    assert began == ["BEGIN"]  # the version read alone: no BEGIN, no settings, no COMMIT
    assert await urns(backend, "nothing") == []
    assert began == ["BEGIN", "BEGIN"]  # a statement not held: a transaction with its settings again


async def test_a_scoped_search_is_never_answered_with_another_callers_rows(backends):
    backend, _ = backends
    await backend.apply([view("theirs", "PERSONAL"), view("everyone", "GLOBAL")])
    scoped = ReadScopedBackend(backend, READER)
    for _ in range(2):
        assert (await backend.search("dataHubView", "orders")).total == 2
        assert (await scoped.search("dataHubView", "orders")).total == 1


async def test_the_migration_keeps_the_documents_searchable(backends, database_url):
    backend, _ = backends
    config = alembic_config(database_url)
    await asyncio.to_thread(command.downgrade, config, "0018")
    await asyncio.to_thread(upgrade_database, database_url)
    async with backend._connection() as conn:
        storage = await conn.fetchval(
            "SELECT attstorage::text FROM pg_attribute WHERE attrelid = 'search_document'::regclass "
            "AND attname = 'search_vector'"
        )
    assert storage == "m"  # MAIN: in the row, compressed
    await backend.apply(dataset("c"))
    assert await urns(backend) == [ds("a"), ds("b"), ds("c")]


def test_the_cache_holds_a_bounded_number_of_rows_of_the_newest_version(monkeypatch):
    monkeypatch.setattr(postgres, "RESULT_CACHE_ROWS", 10)
    monkeypatch.setattr(postgres, "RESULT_CACHE_STATEMENT_ROWS", 4)
    cache = postgres._ResultCache()
    cache.put(("a", ""), 1, [1, 2, 3])
    cache.put(("too many", ""), 1, [1, 2, 3, 4, 5])
    assert cache.get(("a", ""), 1) == [1, 2, 3] and cache.get(("too many", ""), 1) is None
    assert cache.get(("a", ""), 0) is None  # only at the version it was read at
    cache.put(("b", ""), 1, [1, 2, 3])
    cache.get(("a", ""), 1)  # used: b is the least recently used
    cache.put(("c", ""), 1, [])
    cache.put(("d", ""), 1, [1])  # 4 + 4 + 1 + 2 rows (and one each): b goes
    assert cache.get(("b", ""), 1) is None and cache.get(("a", ""), 1) == [1, 2, 3] and cache.get(("c", ""), 1) == []
    assert cache.get(("a", ""), 2) is None and cache.get(("d", ""), 1) is None  # a newer version: nothing older
    cache.put(("e", ""), 1, [1])
    assert cache.get(("e", ""), 1) is None  # read before the newer version: not kept


async def test_a_statement_being_read_is_read_once():
    cache = postgres._ResultCache()
    calls: list[str] = []

    def fetch(name: str, fails: bool = False):
        async def read():
            calls.append(name)
            await asyncio.sleep(0.05)
            if fails:
                raise RuntimeError("statement timeout")
            return [name]

        return read

    first = await asyncio.gather(*(cache.read(("s", ""), 1, fetch(f"r{i}")) for i in range(3)))
    assert first == [["r0"]] * 3 and calls == ["r0"]
    # a read that fails fails alone: the searches that waited for it read for themselves (once, again)
    calls.clear()
    answers = await asyncio.gather(
        cache.read(("t", ""), 1, fetch("fails", fails=True)),
        cache.read(("t", ""), 1, fetch("w1")),
        cache.read(("t", ""), 1, fetch("w2")),
        return_exceptions=True,
    )
    assert isinstance(answers[0], RuntimeError) and answers[1:] == [["w1"], ["w1"]] and calls == ["fails", "w1"]
    # another version is another read
    assert await cache.read(("s", ""), 2, fetch("v2")) == ["v2"]
