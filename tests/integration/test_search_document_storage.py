"""How search_document is stored (migration 0025): the columns every search filters on stay in the row, and the GIN
indexes' pending lists stay short however often the embedded indexer rewrites documents."""

from __future__ import annotations

import asyncio
import random

from alembic import command

from app.db import alembic_config, upgrade_database
from app.search.model import AspectFields
from app.search.postgres import PostgresBackend
from tests.helpers import ds

WORDS = [f"word{i}" for i in range(3000)]


def wide(names: range, revision: int) -> list[AspectFields]:
    """Documents of ~3 kB, a 50-field schema's worth of text: past the 2 kB at which Postgres moves values out."""
    rng = random.Random(revision)
    return [
        AspectFields(
            "dataset",
            ds(f"t{i}"),
            "datasetProperties",
            revision,
            {"name": f"t{i}", "description": " ".join(rng.choices(WORDS, k=300)) + f" revision{revision}"},
        )
        for i in names
    ]


async def scans_read_the_table_alone(backend: PostgresBackend) -> None:
    """A scan testing each filter column reads the table's pages and nothing else (a value in the TOAST table costs a
    lookup and a fetch: 3 pages a row more)."""
    async with backend._connection() as conn:
        await conn.execute("SET LOCAL enable_indexscan = off; SET LOCAL enable_bitmapscan = off")
        pages = await conn.fetchval("SELECT pg_relation_size('search_document') / current_setting('block_size')::int")
        for condition in ("exact_names @> ARRAY['t7']", "'platform' = ANY(facet_values)"):
            explained = await conn.fetchval(  # JSON decoded by the engine's codec (app.db)
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT count(*) FROM search_document WHERE {condition}"
            )
            plan = explained[0]["Plan"]
            read = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
            assert read <= pages + 2, (condition, read, pages)


async def test_a_scan_of_the_filter_columns_reads_the_table_alone(backend: PostgresBackend):
    await backend.apply(wide(range(200), 1))
    await scans_read_the_table_alone(backend)


async def test_the_upgrade_moves_the_documents_written_before_it_into_their_rows(backend, database_url):
    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0024")
    await backend.apply(wide(range(200), 1))
    await asyncio.to_thread(upgrade_database, database_url)
    await scans_read_the_table_alone(backend)
    assert (await backend.search("dataset", "t123")).total == 1  # t123 alone: no t1230


async def test_the_pending_lists_stay_short_under_rewrites(backend: PostgresBackend):
    async with backend._connection(readonly=False) as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    for revision in range(1, 5):  # ~12 MB of new index entries in all, the default limit three times over
        await backend.apply(wide(range(300), revision))
    async with backend._connection() as conn:
        pending = {
            index: await conn.fetchval("SELECT pending_pages FROM pgstatginindex($1)", index)
            for index in ("ix_search_document_vector", "ix_search_document_fields", "ix_search_document_exact_names")
        }
    assert max(pending.values()) <= 512 // 8 + 1, pending  # 512 kB of 8 kB pages (the default, 4 MB: 512)
    assert pending["ix_search_document_vector"] > 0  # the writes went through the list: fastupdate is on
