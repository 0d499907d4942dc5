"""The embedded search backend has `search_document` analyzed as it writes documents (app.search.postgres
ANALYZE_CHECK_DOCUMENTS): a table Postgres never analyzed gets statistics without waiting for autovacuum (a text
search planned without them read every document of its types), and one that changed little is left alone."""

from __future__ import annotations

from app.search import postgres
from app.search.model import AspectFields
from app.search.postgres import PostgresBackend
from tests.helpers import ds


def datasets(names: range) -> list[AspectFields]:
    return [AspectFields("dataset", ds(f"t{i}"), "datasetProperties", 1, {"name": f"t{i}"}) for i in names]


async def analyzed_rows(backend: PostgresBackend) -> float:
    """The rows Postgres last counted in search_document (-1: never analyzed)."""
    if backend._analyzing is not None:
        await backend._analyzing
    async with backend._connection() as conn:
        return await conn.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'search_document'::regclass")


async def test_documents_written_get_their_statistics(backend, monkeypatch):
    monkeypatch.setattr(postgres, "ANALYZE_CHECK_DOCUMENTS", 10)
    assert await analyzed_rows(backend) < 0
    await backend.apply(datasets(range(5)))
    assert await analyzed_rows(backend) < 0  # not yet looked at: 5 documents
    await backend.apply(datasets(range(5, 12)))
    assert await analyzed_rows(backend) == 12
    monkeypatch.setattr(postgres, "ANALYZE_CHANGED_FRACTION", 10.0)
    await backend.apply(datasets(range(12, 24)))
    assert await analyzed_rows(backend) == 12  # changed by less than the fraction: not again


async def test_changed_documents_wait_for_the_interval_since_the_last_analysis(backend, monkeypatch):
    monkeypatch.setattr(postgres, "ANALYZE_CHECK_DOCUMENTS", 10)
    await backend.apply(datasets(range(12)))
    assert await analyzed_rows(backend) == 12  # never analyzed: at once
    monkeypatch.setattr(postgres, "ANALYZE_CHANGED_FRACTION", -1.0)  # whatever changed, the table is stale
    await backend.apply(datasets(range(12, 30)))
    assert await analyzed_rows(backend) == 12  # within the interval: not again
    monkeypatch.setattr(postgres, "ANALYZE_MIN_INTERVAL_S", 0.0)
    await backend.apply(datasets(range(30, 42)))
    assert await analyzed_rows(backend) == 42
