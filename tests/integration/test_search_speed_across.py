"""A search across entity types on the embedded backend counts every type at once: its totals, and its totals with
the facets, are one statement when the conditions do not depend on the type (app.search.postgres.CountBatch), with
the same answers as one search per type; a type the read rule scopes (app.auth.reads) is counted apart, as the
caller may see it."""

from __future__ import annotations

import pytest_asyncio

from app.auth.model import Principal, Role
from app.auth.reads import ReadScopedBackend
from app.search import postgres
from app.search.across import TypeSearch, facets_across, scroll_across
from app.search.model import AspectFields
from tests.helpers import ds

TYPES = ["dataset", "chart", "corpuser", "tag", "dashboard", "dataFlow", "dataJob", "glossaryTerm", "domain"]
READER = Principal("urn:li:corpuser:reader", Role.READER)


def view(name: str, kind: str, creator: str) -> AspectFields:
    info = {"name": f"orders {name}", "type": kind, "createdBy": creator}
    return AspectFields("dataHubView", f"urn:li:dataHubView:{name}", "dataHubViewInfo", 1, info)


@pytest_asyncio.fixture
async def backend(backend):
    changes = []
    for i in range(6):
        platform = ("hive", "kafka")[i % 2]
        urn = ds(f"db.orders{i}", platform)
        key = {"platform": f"urn:li:dataPlatform:{platform}", "origin": "PROD"}
        properties = {"name": f"orders{i}", "tags": ["urn:li:tag:t"]}
        changes += [
            AspectFields("dataset", urn, "datasetKey", 1, key),
            AspectFields("dataset", urn, "datasetProperties", 1, properties),
        ]
    chart = {"title": "orders", "tags": ["urn:li:tag:t"]}
    changes += [
        AspectFields("chart", "urn:li:chart:(looker,orders)", "chartInfo", 1, chart),
        AspectFields("tag", "urn:li:tag:orders", "tagProperties", 1, {"name": "orders"}),
        view("mine", "PERSONAL", READER.actor),
        view("theirs", "PERSONAL", "urn:li:corpuser:other"),
        view("everyone", "GLOBAL", "urn:li:corpuser:other"),
    ]
    await backend.apply(changes)
    return backend


class OneTypeAtATime:
    """The backend without its batches: one search per type."""

    def __init__(self, backend):
        self.backend = backend

    async def search(self, entity_type, query, **kw):
        return await self.backend.search(entity_type, query, **kw)


@pytest_asyncio.fixture
def statements(monkeypatch):
    """The counting statements run (their conditions)."""
    run: list[str] = []
    count = postgres._count

    async def counting(conn, where, params, fields):
        run.append(where)
        return await count(conn, where, params, fields)

    monkeypatch.setattr(postgres, "_count", counting)
    return run


async def test_the_types_are_counted_in_one_statement(backend, statements):
    searches = [TypeSearch(t) for t in TYPES]
    for query in ("orders", "*", "/q platform:kafka"):
        statements.clear()
        found = await facets_across(backend, searches, query)
        assert len(statements) == 1
        assert found == await facets_across(OneTypeAtATime(backend), searches, query)
    assert found.totals["dataset"] == 3 and found.values["platform"] == {"urn:li:dataPlatform:kafka": 3}
    statements.clear()
    page = await scroll_across(backend, searches, "orders", count=4)
    assert page.total == 8 and len(statements) == 1  # the totals; the first type's page does not count it again
    assert [h.entity_type for h in page.hits] == ["dataset"] * 4


async def test_a_type_the_read_rule_scopes_is_counted_as_the_caller_sees_it(backend, statements):
    searches = [TypeSearch(t) for t in [*TYPES, "dataHubView"]]
    scoped = ReadScopedBackend(backend, READER)
    found = await facets_across(scoped, searches, "orders")
    assert found.totals["dataHubView"] == 2 and found.totals["dataset"] == 6  # not the other one's personal view
    assert len(statements) == 2  # the scoped type apart
    assert found == await facets_across(OneTypeAtATime(scoped), searches, "orders")
    assert (await facets_across(backend, searches, "orders")).totals["dataHubView"] == 3  # unscoped: every view
