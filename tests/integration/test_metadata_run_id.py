"""`metadata_run_id(systemmetadata)` (migrations 0011, 0022, 0023): the run a row was written by, which the run index,
the ingestion-run trigger and rollback read. Each case alone, including where it must answer NULL."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from alembic import command

from app.db import alembic_config, upgrade_database


@pytest.mark.parametrize(
    ("system_metadata", "run"),
    [
        ('{"runId": "file-2026-11-29", "lastObserved": 1}', "file-2026-11-29"),
        ('{"lastObserved": 1, "properties": {"a": "b"}, "runId": "r"}', "r"),
        ('{"lastObserved": 1, "version": "3"}', None),  # no run: answered without parsing
        ('{"lastObserved": 1, "lastRunId": "r"}', None),  # another key that ends in RunId
        ('{"runId": "no-run-id-provided"}', None),  # DataHub's placeholder
        ('{"runId": null}', None),
        ('{"note": "runId", "lastObserved": 1}', None),  # the word as a value: parsed, no run
        ('{"note": "\\"runId\\""}', None),
        ('{"runId": "r", "note": "\\u0000"}', None),  # text jsonb cannot hold
        (None, None),
    ],
)
async def test_run_of_system_metadata(db, system_metadata, run):
    assert await db.fetchval("SELECT metadata_run_id($1::text)", system_metadata) == run


async def test_a_key_spelled_with_escapes_is_not_a_run(db):
    assert await db.fetchval("SELECT metadata_run_id($1::text)", '{"\\u0072unId": "r"}') is None


async def test_the_run_index_answers_as_the_function(db):
    """The run index is an expression index on the function: a row written after the change is found by its run."""
    await db.execute(
        "INSERT INTO metadata_aspect_v2 (urn, aspect, version, metadata, systemmetadata, createdon, createdby) "
        "VALUES ($1, 'status', 0, '{}', $2, now(), 'urn:li:corpuser:t'), ($3, 'status', 0, '{}', $4, now(), 'urn:li:corpuser:t')",
        "urn:li:corpuser:run-index-a",
        '{"runId": "run-index-test"}',
        "urn:li:corpuser:run-index-b",
        '{"lastObserved": 1}',
    )
    await db.execute("SET enable_seqscan = off")
    try:
        found = await db.fetch(
            "SELECT urn FROM metadata_aspect_v2 WHERE metadata_run_id(systemmetadata) = 'run-index-test'"
        )
    finally:
        await db.execute("RESET enable_seqscan")
    assert [r["urn"] for r in found] == ["urn:li:corpuser:run-index-a"]


async def test_the_upgrade_rebuilds_the_run_index_a_row_with_an_escaped_key_was_in(db, database_url):
    """Written under 0022's definition, such a row was in the run index by its run; after 0023 the function answers
    NULL for it, and so does the index (rebuilt): a query the index answers and one it cannot agree."""
    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0022")
    await db.execute(
        "INSERT INTO metadata_aspect_v2 (urn, aspect, version, metadata, systemmetadata, createdon, createdby) "
        "VALUES ($1, 'status', 0, '{}', $2, now(), 'urn:li:corpuser:t')",
        "urn:li:corpuser:escaped",
        '{"\\u0072unId": "escaped-run"}',
    )
    assert await db.fetchval("SELECT metadata_run_id(systemmetadata) FROM metadata_aspect_v2") == "escaped-run"
    await asyncio.to_thread(upgrade_database, database_url)
    # A connection of its own: a backend keeps an index's expressions as it first read them (with the function's
    # body of then inlined), and would not use the run index at all.
    fresh = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await fresh.execute("SET enable_seqscan = off")
        query = "SELECT count(*) FROM metadata_aspect_v2 WHERE metadata_run_id(systemmetadata) = 'escaped-run'"
        plan = "\n".join(r[0] for r in await fresh.fetch("EXPLAIN " + query))
        assert "ix_metadata_aspect_v2_run" in plan
        assert await fresh.fetchval(query) == 0
        assert await fresh.fetchval("SELECT metadata_run_id(systemmetadata) FROM metadata_aspect_v2") is None
    finally:
        await fresh.close()
