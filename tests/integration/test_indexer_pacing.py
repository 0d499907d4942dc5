"""The embedded indexer yields to the write load (app.search.worker: `writes_running`, `YIELD_SHARE`): a full batch
applied while another session runs a statement is followed by a pause; alone, or not behind, the worker never
waits."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from app.changelog import outbox
from app.modelset.watcher import ModelWatcher
from app.search.worker import IndexWorker, writes_running
from tests.helpers import dataset, eventually, mcp, propose

BATCH = 4


@pytest.fixture
def settings_overrides():
    # the test runs the worker and sequences the feed itself; a full batch is BATCH change logs
    return {"background_in_process": False, "search_worker_batch_size": BATCH}


async def running_a_statement(dsn: str, application_name: str = "") -> tuple[asyncpg.Connection, asyncio.Task]:
    """Another session, busy for 10 s (its statement cancelled when the connection is closed), once Postgres shows
    its statement running."""
    conn = await asyncpg.connect(dsn, server_settings={"application_name": application_name})
    pid = conn.get_server_pid()
    busy = asyncio.create_task(conn.execute("SELECT pg_sleep(10)"))
    watcher = await asyncpg.connect(dsn)
    try:

        async def running() -> bool:
            return await watcher.fetchval(
                "SELECT state = 'active' AND query = 'SELECT pg_sleep(10)' FROM pg_stat_activity WHERE pid = $1", pid
            )

        await eventually(running, timeout=10, interval=0.02, what="the other session's statement running")
    finally:
        await watcher.close()
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
    models = ModelWatcher(app.state.settings, app.state.sessionmaker, app.state.registry)
    worker = IndexWorker(app.state.settings, app.state.engine, app.state.search, models)
    began, results = [0], []  # steps begun; what each step returned, in order (one worker: steps are sequential)
    step = worker.step

    async def counted_step(cursor):
        began[0] += 1
        count = None
        try:
            count = await step(cursor)
            return count
        finally:
            results.append(count)

    worker.step = counted_step
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    names = [f"paced{i}" for i in range(BATCH)]

    async def write_and_index(count: int, description: str) -> int:
        """New descriptions of `count` datasets (one change log each, and at most one platform event); returns the
        rows the worker applied, once it has caught up: a step begun after they were sequenced found nothing left,
        so the pause after the last batch, if any, is over."""
        applied = worker.applied_rows
        await propose(
            client,
            *(
                mcp("datasetProperties", {"name": name, "description": description}, dataset(name))
                for name in names[:count]
            ),
        )
        before = await db.fetchval("SELECT last_offset FROM change_log_feed_state")
        await outbox.sequence(db, 100)
        rows = await db.fetchval("SELECT last_offset FROM change_log_feed_state") - before
        after = began[0]

        async def caught_up() -> bool:
            return 0 in results[after:]

        await eventually(caught_up, timeout=10, interval=0.02, what=f"the worker catching up with {rows} rows")
        assert worker.applied_rows - applied == rows >= count
        return rows

    try:
        await write_and_index(BATCH, "created")
        await write_and_index(BATCH, "alone")
        assert worker.yields == 0
        writer, busy = await running_a_statement(database_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            assert await write_and_index(1, "not behind") < BATCH  # fewer rows than a batch
            assert worker.yields == 0
            rows = await write_and_index(BATCH, "a batch behind")
            assert worker.yields == rows // BATCH >= 1  # each full batch, and only those
        finally:
            await stop_running(writer, busy)
    finally:
        stop.set()
        await running
