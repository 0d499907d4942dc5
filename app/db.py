"""The database: engine, request-owned sessions, and migrations."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import asyncpg
from sqlalchemy import event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.util.concurrency import greenlet_spawn

from app.db_faults import DatabaseFault, classify
from app.settings import PROJECT_ROOT

if TYPE_CHECKING:
    from alembic.config import Config

# What asyncpg takes as an array parameter in metaledger's processes (see _builtin_containers_as_arrays)
ARRAY_CONTAINERS: tuple[type, ...] = (list, tuple)


def _builtin_containers_as_arrays() -> None:
    """asyncpg tells an array parameter's nested arrays from its elements by asking, of every element, whether it is
    a `collections.abc.Iterable` and `Sized`: two ABC checks, ~300 ns of the ~500 ns a text element costs, and a
    batch write sends ~40 arrays of 100 (a tenth of the API's CPU per aspect written). metaledger passes arrays as
    lists or tuples, which a plain `isinstance` recognises in C (a text element ~130 ns; each further type checked
    costs every element ~20 ns). Any other container given as an array parameter (a set, a dict view) is refused
    with asyncpg's own error ("a sized iterable container expected"), never read as a scalar: the whole test suite
    passes none. Done by `create_engine`, in every process of metaledger's (a benchmark's bare asyncpg client keeps
    asyncpg's own checks). Left alone when asyncpg no longer keeps these names (its array codec changed)."""
    from asyncpg.protocol import protocol

    if all(hasattr(protocol, name) for name in ("IterableABC", "SizedABC", "MappingABC")):
        protocol.IterableABC = protocol.SizedABC = ARRAY_CONTAINERS
        protocol.MappingABC = dict


MIGRATIONS_DIR = PROJECT_ROOT / "migrations"
# A session's `info` key: the event loop's time by which its write transactions must be over (app.ops.backpressure)
WRITE_DEADLINE = "write_deadline"
_STATUS_POLL_S = 0.2  # between two questions to a database that is coming back


def create_engine(
    url: str, pool_size: int = 10, pool_timeout: float = 30.0, connect_timeout: float | None = None
) -> AsyncEngine:
    # READ COMMITTED, as DataHub: row locks (SELECT ... FOR UPDATE) give compare-and-set where it matters.
    # `pool_timeout`: the longest wait for a connection when all are checked out; then sqlalchemy.exc.TimeoutError,
    # which the app answers with 503 and Retry-After (app.main). `connect_timeout`: the longest a new connection may
    # take (asyncpg's default, 60 s, when None); then TimeoutError, a fault of the database (app.db_faults).
    _builtin_containers_as_arrays()
    engine = create_async_engine(
        url,
        # Every connection the pool opened is kept, up to twice `pool_size` (what a burst may open): an overflow
        # connection was closed as it came back and opened again for the next request of the burst — a backend
        # started, TLS asked for, per request past the tenth at once (16 readers: the v3 GET's p99 320 → 47 ms).
        pool_size=2 * pool_size,
        max_overflow=0,
        pool_timeout=pool_timeout,
        isolation_level="READ COMMITTED",
        connect_args={} if connect_timeout is None else {"timeout": connect_timeout},
    )
    event.listen(engine.sync_engine.pool, "checkout", _refuse_unusable_connection)
    return engine


def _refuse_unusable_connection(dbapi_connection, connection_record, connection_proxy) -> None:
    """Instead of `pool_pre_ping` (a round trip on every checkout, a fifth of a single write's statements): a
    connection whose socket the server closed (a restart, a terminated backend) is known to asyncpg without asking;
    the pool then discards it and checks out another. So is one given back inside a transaction begun on the driver
    connection (SQLAlchemy's reset rolls back only its own): a request cancelled between its BEGIN and its end (its
    read budget spent) could not end it, and the next request would run in its snapshot and locks, or fail to begin
    its own (asyncpg: "cannot use Connection.transaction() in a manually started transaction")."""
    conn = dbapi_connection.driver_connection
    if conn.is_closed():
        raise DisconnectionError("the server closed this pooled connection")
    if conn.is_in_transaction():
        raise DisconnectionError("this pooled connection was given back inside a transaction")


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    from alembic.config import Config  # imported where migrations are applied, not by every process (~0.4 s)

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade_database(url: str, revision: str = "head") -> None:
    """Apply pending migrations. Synchronous; safe to call from inside a running event loop (the migration
    environment runs its own loop, so it then runs in a worker thread)."""
    from alembic import command

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        command.upgrade(alembic_config(url), revision)
        return
    with ThreadPoolExecutor(1) as pool:
        pool.submit(command.upgrade, alembic_config(url), revision).result()


async def connect_dedicated(engine: AsyncEngine, application_name: str) -> asyncpg.Connection:
    """A connection of its own (outside the pool) for a long-running background worker: it holds session-level
    advisory locks and must not be handed to request handlers."""
    dsn = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    return await asyncpg.connect(dsn, server_settings={"application_name": application_name})


async def close_quietly(conn: asyncpg.Connection) -> None:
    """Close a dedicated connection; one that is already broken is terminated."""
    try:
        await asyncio.wait_for(conn.close(), timeout=5)
    except Exception:  # noqa: BLE001 - the connection is already broken
        conn.terminate()


def driver_connection(raw: PoolProxiedConnection) -> asyncpg.Connection:
    """The asyncpg connection under a pooled one (from `get_raw_connection()`; SQLAlchemy has None there only once
    the pooled connection is invalidated or closed)."""
    conn = raw.driver_connection
    if conn is None:
        raise DisconnectionError("the pooled connection was invalidated or closed")
    return conn


class PooledConnection:
    """A pure read's stand-in for a session: one connection of the engine's pool, checked out at the first statement
    and given back by `close`, with the `info` and `bind` of a session — without SQLAlchemy's Session around it. The
    repositories run their SQL on the asyncpg connection (`SessionRepository`), so a read never used the Session's
    unit of work, and opening and closing one was most of a read's database CPU: the v3 GET's statement on a
    session's connection 0.97 ms of CPU, on the pooled connection alone 0.37 ms (in-process, same run)."""

    __slots__ = ("bind", "info", "_pooled")

    def __init__(self, engine: AsyncEngine) -> None:
        self.bind = engine
        self.info: dict[str, Any] = {}
        self._pooled: PoolProxiedConnection | None = None

    async def driver(self) -> asyncpg.Connection:
        if self._pooled is None:
            self._pooled = await self.bind.raw_connection()
        return driver_connection(self._pooled)

    def in_transaction(self) -> bool:
        """Whether it holds a connection (what `close` gives back), as a session's answers."""
        return self._pooled is not None

    async def __aenter__(self) -> PooledConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.shield(self.close())  # as SQLAlchemy's connections: a cancelled reader still gives it back

    async def close(self) -> None:
        pooled, self._pooled = self._pooled, None
        if pooled is not None:  # in a greenlet: giving back a connection the server closed awaits its close
            await greenlet_spawn(pooled.close)


# What the repositories take: a session (writes, and what shares their transaction), or a pure read's connection.
SessionOrConnection = AsyncSession | PooledConnection


async def session_connection(session: SessionOrConnection) -> asyncpg.Connection:
    """The asyncpg connection under a session (checked out of the pool for the session's life)."""
    if isinstance(session, PooledConnection):
        return await session.driver()
    connection = await session.connection()
    return driver_connection(await connection.get_raw_connection())


class SessionRepository:
    """Base of the repositories whose bulk SQL runs on the asyncpg connection under the request's session."""

    def __init__(self, session: SessionOrConnection) -> None:
        self._session = session
        self._raw: asyncpg.Connection | None = None

    async def _conn(self) -> asyncpg.Connection:
        if self._raw is None:
            self._raw = await session_connection(self._session)
        return self._raw

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """A READ COMMITTED transaction on the session's connection (a savepoint inside one already open there). It is
        opened on the driver connection itself: SQLAlchemy starts its transaction lazily on its own first statement,
        and these statements bypass it. With the session's write deadline its `SET LOCAL statement_timeout` goes in
        the same message as the BEGIN: one round trip, not two (asyncpg's `Connection.transaction` sends its BEGIN
        alone). A fault of the database during COMMIT raises `CommitInterrupted`: the transaction may have committed."""
        conn = await self._conn()
        savepoint = f"metaledger_{next(_savepoints)}" if conn.is_in_transaction() else None
        begin = f"SAVEPOINT {savepoint}" if savepoint else "BEGIN ISOLATION LEVEL READ COMMITTED"
        deadline = self._session.info.get(WRITE_DEADLINE)
        if deadline is not None:  # a statement past it fails (QueryCanceledError): rolled back, not committed
            left_ms = max(1, int((deadline - asyncio.get_running_loop().time()) * 1000))
            begin += f"; SET LOCAL statement_timeout = {left_ms}"
        try:
            await conn.execute(begin)
            yield
        except BaseException:
            if not conn.is_closed():  # a closed connection took its transaction with it
                await conn.execute(f"ROLLBACK TO SAVEPOINT {savepoint}" if savepoint else "ROLLBACK")
            raise
        try:
            await conn.execute(f"RELEASE SAVEPOINT {savepoint}" if savepoint else "COMMIT")
        except Exception as error:
            if not savepoint and classify(error) is DatabaseFault.UNAVAILABLE:
                raise CommitInterrupted(
                    f"the connection failed during COMMIT ({type(error).__name__}: {error})"
                ) from error
            raise


_savepoints = itertools.count()  # savepoint names, unique in the process (one connection may nest several)


class CommitInterrupted(Exception):
    """The database failed while committing: whether the transaction committed is for `transaction_status` to say."""


async def transaction_status(engine: AsyncEngine, txid: str, wait_s: float) -> str | None:
    """'committed' or 'aborted': what became of transaction `txid` (`pg_current_xact_id()`), asked on a connection of
    its own (the pool's may be dead) until the database answers, for at most `wait_s` seconds; None if it did not. A
    transaction whose backend is still going away is 'in progress' for a moment: asked again."""
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        try:
            conn = await asyncio.wait_for(connect_dedicated(engine, "metaledger-commit-check"), max(left, 0.1))
            try:
                status = await conn.fetchval("SELECT pg_xact_status($1::text::xid8)", txid)
            finally:
                await close_quietly(conn)
            if status in ("committed", "aborted"):
                return status
        except Exception as error:  # noqa: BLE001 - anything but a fault of the database is a bug: raised
            if classify(error) is not DatabaseFault.UNAVAILABLE:
                raise
        if time.monotonic() + _STATUS_POLL_S >= deadline:
            return None
        await asyncio.sleep(_STATUS_POLL_S)
