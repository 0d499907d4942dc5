"""The sequencer's statement (`app.changelog.outbox.sequence`) and its horizon, call by call: rows of transactions
still open are left for later and then taken, a pass stopped by its limit keeps the horizon, and a poll while no
transaction has ended reads no table.

The snapshot xmin the sequencer reads is the whole server's: a transaction that another worker's test holds open in
its own database of the shared test server holds it back, and these tests' rows would not be due when they say. So
this module runs on a Postgres server of its own, a database per test copied from one migrated there."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from app.changelog import outbox
from app.db import upgrade_database
from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port
from tests.helpers import dataset
from tests.processes import start_on_a_free_port

INSERT_ROW = """
INSERT INTO change_log_outbox (topic, message_key, urn, aspect, version, change_type, payload)
VALUES ('t', $1, $1, 'status', $2, 'UPSERT', '{}')
RETURNING txid::text::bigint
"""


TEMPLATE = "sequenced_template"


@pytest.fixture(scope="module")
def own_server() -> Iterator[EmbeddedPostgres]:
    base = Path(tempfile.mkdtemp(prefix="metaledger-sequencer-"))
    server = None
    try:
        server = start_on_a_free_port(EmbeddedPostgres(base, free_port(), database=None, durable=False))
        ensure_database(server.admin_dsn, TEMPLATE)
        upgrade_database(server.url(TEMPLATE))
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def database_url(own_server: EmbeddedPostgres) -> str:
    """A migrated database of this test alone on the module's server (the server goes at the module's end)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    ensure_database(own_server.admin_dsn, name, TEMPLATE)
    return own_server.url(name)


@pytest_asyncio.fixture
async def connect(database_url: str) -> AsyncIterator:
    opened: list[asyncpg.Connection] = []

    async def open_one() -> asyncpg.Connection:
        opened.append(await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://")))
        return opened[-1]

    yield open_one
    for conn in opened:
        await conn.close()


async def offsets(db: asyncpg.Connection) -> list[tuple[str, int | None]]:
    return [
        (r["urn"], r["feed_offset"])
        for r in await db.fetch("SELECT urn, feed_offset FROM change_log_outbox ORDER BY id")
    ]


async def test_rows_of_a_transaction_open_at_a_pass_are_taken_once_it_ends(db, connect):
    sequencer, slow = await connect(), await connect()
    async with slow.transaction():
        slow_txid = await slow.fetchval(INSERT_ROW, dataset("slow"), 1)  # id 1, open
        await db.fetchval(INSERT_ROW, dataset("fast"), 1)  # id 2, committed, txid above the open one
        count, horizon = await outbox.sequence(sequencer, 10)
        assert count == 0 and 0 < horizon <= slow_txid
        assert await outbox.sequence(sequencer, 10, horizon) == (0, horizon)
    count, after = await outbox.sequence(sequencer, 10, horizon)
    assert count == 2 and after > slow_txid
    assert await offsets(db) == [(dataset("slow"), 1), (dataset("fast"), 2)]


async def test_a_pass_stopped_by_its_limit_keeps_the_horizon(db, connect):
    sequencer = await connect()
    for version in (1, 2, 3):
        await db.fetchval(INSERT_ROW, dataset("limited"), version)
    assert await outbox.sequence(sequencer, 2, 1) == (2, 1)
    count, horizon = await outbox.sequence(sequencer, 2, 1)
    assert count == 1 and horizon > 1
    assert [offset for _, offset in await offsets(db)] == [1, 2, 3]


async def test_a_poll_while_no_transaction_ended_reads_no_table(db, connect):
    sequencer, locker = await connect(), await connect()
    await db.fetchval(INSERT_ROW, dataset("idle"), 1)
    count, horizon = await outbox.sequence(sequencer, 10)
    while count:  # the sequencer's own commit ends a transaction: the next pass finds nothing and moves the horizon
        count, horizon = await outbox.sequence(sequencer, 10, horizon)
    await sequencer.execute("SET lock_timeout = '200ms'")
    async with locker.transaction():  # no transaction id: the xmin stays where it is
        await locker.execute("LOCK TABLE change_log_outbox IN ACCESS EXCLUSIVE MODE")
        try:
            polled = await outbox.sequence(sequencer, 10, horizon)
        except asyncpg.LockNotAvailableError:
            polled = None
        ended_meanwhile = await db.fetchval("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint") > horizon
    # (another database of the same server may end a transaction meanwhile: the pass is then due, and waits)
    assert polled == (0, horizon) or ended_meanwhile
    await db.fetchval(INSERT_ROW, dataset("idle"), 2)
    count, _ = await outbox.sequence(sequencer, 10, horizon)
    assert count == 1 and [offset for _, offset in await offsets(db)] == [1, 2]


async def stored_horizon(db: asyncpg.Connection) -> int:
    return await db.fetchval("SELECT sequenced_below::text::bigint FROM change_log_feed_state WHERE id = 1")


async def test_a_sequencer_that_starts_walks_from_the_stored_horizon(db, connect):
    await db.fetchval(INSERT_ROW, dataset("before"), 1)
    count, horizon = await outbox.sequence(await connect(), 10)
    assert count == 1 and await stored_horizon(db) == horizon > 0
    # an entry below the stored horizon without an offset cannot be a committed row still due (every row there has
    # its offset): a new sequencer (horizon 0) does not walk there. Planted with an explicit txid to show it.
    await db.execute(
        """INSERT INTO change_log_outbox (topic, message_key, urn, aspect, version, change_type, payload, txid)
                        VALUES ('t', 'k', 'planted', 'status', 1, 'UPSERT', '{}', ($1::bigint - 1)::text::xid8)""",
        horizon,
    )
    await db.fetchval(INSERT_ROW, dataset("after"), 1)
    count, _ = await outbox.sequence(await connect(), 10)
    assert count == 1
    assert await offsets(db) == [(dataset("before"), 1), ("planted", None), (dataset("after"), 2)]


async def test_a_stored_horizon_above_the_xmin_is_another_databases_and_is_not_used(db, connect):
    # a logical copy of a database whose transaction ids ran ahead of this one's: its stored horizon would hide rows
    await db.execute("UPDATE change_log_feed_state SET sequenced_below = '4000000000'::xid8 WHERE id = 1")
    await db.fetchval(INSERT_ROW, dataset("copied"), 1)
    count, horizon = await outbox.sequence(await connect(), 10)
    assert count == 1 and horizon < 4_000_000_000
    assert await stored_horizon(db) == horizon
