"""A pure read's pooled connection (app.db.PooledConnection) and what the pool hands out (app.db.create_engine): one
connection taken at the first statement and given back on close; a connection given back inside a transaction is
never handed out again in it, and an idle one is reused."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import PooledConnection, create_engine, session_connection


@pytest_asyncio.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    made = create_engine(database_url, pool_size=1)  # a pool of two: what one test gives back, the next takes
    yield made
    await made.dispose()


def checked_out(engine: AsyncEngine) -> int:
    return engine.sync_engine.pool.checkedout()  # type: ignore[attr-defined]


async def test_a_pooled_connection_is_taken_at_the_first_statement_and_given_back_on_close(engine):
    connection = PooledConnection(engine)
    assert checked_out(engine) == 0 and not connection.in_transaction()
    first = await session_connection(connection)
    assert await first.fetchval("SELECT 1") == 1
    assert checked_out(engine) == 1 and connection.in_transaction()
    assert await session_connection(connection) is first  # the same one for every statement of the answer
    await connection.close()
    assert checked_out(engine) == 0 and not connection.in_transaction()
    await connection.close()  # twice is harmless (a shielded close may follow a failed one)
    assert checked_out(engine) == 0


async def test_a_connection_given_back_inside_a_transaction_is_not_handed_out_again(engine):
    left = PooledConnection(engine)
    conn = await session_connection(left)
    abandoned = await conn.fetchval("SELECT pg_backend_pid()")
    await conn.execute("BEGIN; SELECT txid_current()")  # as a request cancelled between its BEGIN and its end
    await left.close()

    for _ in range(2):  # whichever of the pool's connections comes next
        taken = PooledConnection(engine)
        conn = await session_connection(taken)
        assert not conn.is_in_transaction()
        assert await conn.fetchval("SELECT pg_backend_pid()") != abandoned
        async with conn.transaction():  # a transaction of its own begins
            assert await conn.fetchval("SELECT 1") == 1
        await taken.close()


async def test_an_idle_connection_given_back_is_reused(engine):
    first = PooledConnection(engine)
    pid = await (await session_connection(first)).fetchval("SELECT pg_backend_pid()")
    await first.close()
    again = PooledConnection(engine)
    assert await (await session_connection(again)).fetchval("SELECT pg_backend_pid()") == pid
    await again.close()
