"""The embedded indexer yields to the write load (app.search.worker: `writes_running`, `YIELD_SHARE`): a full batch
applied while another session runs a statement is followed by a pause; alone, or not behind, the worker never
waits."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from app.changelog import outbox
from app.search.worker import IndexWorker, writes_running
from tests.helpers import dataset, mcp, propose

BATCH = 4


@pytest.fixture
def settings_overrides():
    # the test runs the worker and sequences the feed itself; a full batch is BATCH change logs
    return {"background_in_process": False, "search_worker_batch_size": BATCH}


async def running_a_statement(dsn: str, application_name: str = "") -> tuple[asyncpg.Connection, asyncio.Task]:
    """Another session, busy for 10 s (its statement cancelled when the connection is closed)."""
    conn = await asyncpg.connect(dsn, server_settings={"application_name": application_name})
    busy = asyncio.create_task(conn.execute("SELECT pg_sleep(10)"))
    await asyncio.sleep(0.2)
    return conn, busy


async def stop_running(conn: asyncpg.Connection, busy: asyncio.Task) -> None:
    conn.terminate()
    await asyncio.gather(busy, return_exceptions=True)


async def test_only_another_session_running_a_statement_is_write_load(db, database_url):
    dsn = database_url.replace("postgresql+asyncpg://", "postgresql://")
    assert not await writes_running(db)  # idle sessions and this one do not count
    background, busy = await running_a_statement(dsn, "metaledger-sequencer")
    try:
        assert not await writes_running(db)
    finally:
        await stop_running(background, busy)
    api, busy = await running_a_statement(dsn)
    try:
        assert await writes_running(db)
    finally:
        await stop_running(api, busy)


async def test_the_indexer_pauses_after_a_full_batch_only_under_write_load(app, client, db, database_url):
    worker = IndexWorker(app.state.settings, app.state.engine, app.state.search)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    names = [f"paced{i}" for i in range(BATCH)]

    async def write_and_index(count: int, description: str) -> None:
        """New descriptions of `count` datasets (one change log each, and at most one platform event)."""
        applied = worker.applied_rows
        await propose(client, *(mcp("datasetProperties", {"name": name, "description": description}, dataset(name))
                                for name in names[:count]))
        await outbox.sequence(db, 100)
        deadline = time.monotonic() + 10
        while worker.applied_rows < applied + count:
            assert time.monotonic() < deadline, "not indexed"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)  # past the batch's pause, if any

    try:
        await write_and_index(BATCH, "created")
        await write_and_index(BATCH, "alone")
        assert worker.yields == 0
        writer, busy = await running_a_statement(database_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            await write_and_index(1, "not behind")  # fewer rows than a batch
            assert worker.yields == 0
            await write_and_index(BATCH, "a batch behind")
            assert worker.yields >= 1
        finally:
            await stop_running(writer, busy)
    finally:
        stop.set()
        await running
