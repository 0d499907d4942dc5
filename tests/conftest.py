"""Shared fixtures: one real PostgreSQL server per test run, and a fresh empty database per test.

Fixtures (see the end of this file for the place where app/client fixtures go):

* ``pg_server`` (session)          -> :class:`PgServer`; a throwaway cluster (temp dir, no fsync, free port)
  started once per run through :class:`app.embedded_pg.EmbeddedPostgres`, or the server named by
  ``METALEDGER_TEST_DATABASE_URL`` when that is set (any database in it; we only use it to connect).
* ``pg_admin_dsn`` (session)       -> ``"postgresql://postgres@127.0.0.1:PORT/postgres"`` (plain DSN).
* ``make_database`` (session)      -> ``make_database(name=None, template=None) -> str``: CREATE DATABASE
  and return its ``postgresql+asyncpg://`` URL.  Works from sync and async code.
* ``fresh_database_url`` (function) -> URL of a new empty database named after the test.
* ``drop_database`` (session)      -> ``drop_database(url)``: drop a database made by ``make_database``.
* ``database_url`` (function)      -> URL of a migrated database of the test's own (``reused_database``).

``fresh_database_url`` drops its database after the test: a run makes many of them (8 MB each), and removing the
cluster's directory at the end of the run took 20-40 s when they were kept. ``database_url`` (the app's database) is
one copy of the migrated template per worker, put back as the template has it after each test (``ReusedDatabase``):
a copy per test was 0.3-0.5 s of every test's set-up.

``make test`` runs the tests on two pytest-xdist workers (``-n 2 --dist loadfile --no-loadscope-reorder``: xdist's
default puts the modules with the most tests first): each worker has its own Postgres,
broker and search server (the session fixtures), a module never spans workers, nor do the modules of a
``SHARED_GROUPS`` prefix (they share costly session fixtures), and the modules that take minutes are collected first
(``LONG_MODULES``) so that the other worker runs the short ones around them.

No Postgres binaries is an error, never a skip: the message says ``apt-get install -y postgresql``.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.db import upgrade_database
from app.embedded_pg import (
    EmbeddedPostgres,
    ensure_database,
    free_port,
    quote_ident,
    run_coro_sync,
)
from app.main import create_app
from app.registry import load_registry
from app.settings import Settings
from tests.processes import start_on_a_free_port

TEST_DATABASE_URL_ENV = "METALEDGER_TEST_DATABASE_URL"
# The tests count the change logs of a fresh database: the server id's write at start-up (app.telemetry) is off for the
# apps and processes they start, unless one asks for it (tests/integration/test_telemetry.py, the real CLI's tests).
os.environ.setdefault("METALEDGER_TELEMETRY_CLIENT_ID", "false")

# The modules that take minutes, longest first. `make test` gives each xdist worker whole modules in collection order:
# collected first, they start at once and the other worker runs the thousand short tests around them; collected in
# their place, the run ended with one worker alone on them for about eight minutes.
LONG_MODULES = (
    "tests/spark/test_cluster.py",
    "tests/integration/test_fuzz.py",
    "tests/spark/test_stream.py",
    "tests/client/test_runs_cli.py",
    "tests/spark/test_reconcile.py",
    "tests/client/test_datahub_client.py",
    "tests/client/test_datahub_graphql.py",
    "tests/client/test_openlineage_dbt.py",  # its virtualenv: about 100 s the first time
    "tests/web/test_browser.py",  # a real Chromium: collected in its place (last), one worker ran it alone at the end
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {module: i for i, module in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(LONG_MODULES)))  # stable: others keep order


# Modules (by path prefix) that --dist loadfile gives one worker as one unit: their session fixtures are built once per
# run, not once per worker. The Spark modules share the local SparkSession (a JVM: ~30 s of CPU) and the `ingested`
# data set (~25 s); the unit starts with the cluster test (first in LONG_MODULES) and the other worker runs the rest
# meanwhile. (Not `--dist loadgroup` with xdist_group marks: xdist 3.8 writes the group into `item._nodeid`, which
# pytest 9 no longer reads, so every marked test was still scheduled on its own.)
SHARED_GROUPS = {"tests/spark/": "tests/spark"}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFixturesScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return next((group for prefix, group in SHARED_GROUPS.items() if module.startswith(prefix)), module)

    return SharedFixturesScheduling(config, log)


@dataclass
class PgServer:
    """Where the test PostgreSQL server is.  ``url(db)`` gives SQLAlchemy URLs into it."""

    scheme_netloc: str  # "postgresql://user[:password]@host:port"
    external: bool = False
    created: list[str] = field(default_factory=list)  # databases made by make_database

    @property
    def admin_dsn(self) -> str:
        return f"{self.scheme_netloc}/postgres"

    def url(self, database: str, driver: str = "postgresql+asyncpg") -> str:
        return self.scheme_netloc.replace("postgresql://", f"{driver}://", 1) + f"/{database}"

    @classmethod
    def from_url(cls, url: str, external: bool = True) -> PgServer:
        parts = urlsplit(url)
        if not parts.scheme.startswith("postgres"):
            raise ValueError(f"{TEST_DATABASE_URL_ENV} must be a postgresql:// URL, got {url!r}")
        return cls(urlunsplit(("postgresql", parts.netloc, "", "", "")), external=external)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    env_url = os.environ.get(TEST_DATABASE_URL_ENV)
    if env_url:
        server = PgServer.from_url(env_url)
        yield server
        _drop_databases(server)
        return
    base = Path(tempfile.mkdtemp(prefix="metaledger-test-pg-"))
    pg: EmbeddedPostgres | None = None
    try:
        pg = start_on_a_free_port(EmbeddedPostgres(base, free_port(), database=None, durable=False))
        yield PgServer.from_url(pg.admin_dsn, external=False)
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_admin_dsn(pg_server: PgServer) -> str:
    return pg_server.admin_dsn


@pytest.fixture(scope="session")
def make_database(pg_server: PgServer) -> Callable[..., str]:
    """``make_database(name=None, template=None) -> url``: a new database (random name if None)."""

    def make(name: str | None = None, template: str | None = None) -> str:
        name = name or f"t_{uuid.uuid4().hex[:12]}"
        if not ensure_database(pg_server.admin_dsn, name, template):
            raise RuntimeError(f"database {name!r} already exists on the test server")
        pg_server.created.append(name)
        return pg_server.url(name)

    return make


@pytest.fixture(scope="session")
def drop_database(pg_server: PgServer) -> Callable[[str], None]:
    """``drop_database(url)``: drop it, ending whatever connections the test left to it (best effort: the cluster is
    thrown away at the end of the run anyway)."""

    def drop(url: str) -> None:
        name = url.rsplit("/", 1)[1]

        async def run() -> None:
            conn = await asyncpg.connect(pg_server.admin_dsn)
            try:
                await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
            finally:
                await conn.close()

        try:
            run_coro_sync(run)
        except (OSError, asyncpg.PostgresError):
            return
        if name in pg_server.created:
            pg_server.created.remove(name)

    return drop


@pytest.fixture
def fresh_database_url(
    request: pytest.FixtureRequest, make_database: Callable[..., str], drop_database: Callable[[str], None]
) -> Iterator[str]:
    """URL (``postgresql+asyncpg://``) of a new, empty database for this test."""
    stem = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")[:40]
    url = make_database(f"t_{stem}_{uuid.uuid4().hex[:8]}")
    yield url
    drop_database(url)


def _drop_databases(server: PgServer) -> None:
    """On a server we do not own, remove what the run created (a throwaway cluster is just deleted)."""
    if not server.created:
        return

    async def drop() -> None:
        conn = await asyncpg.connect(server.admin_dsn)
        try:
            for name in server.created:
                await conn.execute(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")
        finally:
            await conn.close()

    run_coro_sync(drop)


# ==================================================================================================
# App / client fixtures: a metaledger app on a fresh, migrated database of the real test Postgres, and a
# client for it (tests/integration and tests/spark; one migrated template per run).
# ==================================================================================================


@pytest.fixture(scope="session")
def registry():
    return load_registry(Settings().registry_path)


@pytest.fixture(scope="session")
def migrated_template(make_database: Callable[..., str]) -> str:
    """A database migrated once; every test copies it (CREATE DATABASE ... TEMPLATE) instead of migrating."""
    # per xdist worker: two workers may share a server named by METALEDGER_TEST_DATABASE_URL
    name = f"metaledger_template_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    upgrade_database(make_database(name))
    return name


# The catalogs a test's DDL writes in its database (CREATE, ALTER, DROP, GRANT, COMMENT, ALTER DATABASE ... SET: any
# of them inserts, updates or deletes rows of one): all but the statistics ANALYZE writes (the reset clears them) and
# the large objects' data (their metadata is here). A session's temporary schema stays when the session ends.
_CATALOGS = r"""
    SELECT c.relname, CASE c.relname
        WHEN 'pg_namespace' THEN $$nspname NOT LIKE 'pg\_temp\_%' AND nspname NOT LIKE 'pg\_toast\_temp\_%'$$
        WHEN 'pg_db_role_setting' THEN 'setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())'
        WHEN 'pg_shdepend' THEN 'dbid = (SELECT oid FROM pg_database WHERE datname = current_database())'
        ELSE 'true' END
    FROM pg_class c
    WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'r'
      AND (NOT c.relisshared OR c.relname IN ('pg_db_role_setting', 'pg_shdepend'))
      AND c.relname NOT IN ('pg_statistic', 'pg_statistic_ext_data', 'pg_largeobject')
    ORDER BY 1
"""


def _catalog_changes(catalogs: list[tuple[str, str]]) -> str:
    """A statement of each catalog's rows (count) and those written after transaction $1 (age: wraparound-safe)."""
    return " UNION ALL ".join(
        f"SELECT '{name}', count(*), count(*) FILTER (WHERE age(xmin) < age($1::text::xid)) FROM pg_catalog.{name}"
        f" WHERE {where}"
        for name, where in catalogs
    )


@dataclass
class TemplateState:
    """What a copy of the migrated template holds before a test writes: its catalogs' rows (to see DDL by), the rows the
    migrations seed, its sequences and its tables' size estimates (which the planner, and the search backend's
    statistics check in app.search.postgres, read)."""

    catalog_rows: dict[str, int]  # catalog → its rows
    catalog_changes: str  # _catalog_changes: a catalog's rows, and those written after a transaction
    written_by: int  # the transaction after which a copy's catalogs are as the template's (a reset's, else this)
    tables: list[str]  # quoted qualified names, every user table
    always_truncated: list[str]  # those with pages in the template: seeded (or rows deleted since)
    seeds: dict[tuple[str, str], bytes]  # (schema, table) → its rows (COPY ... binary)
    sequences: list[tuple[str, int, bool]]  # (quoted name, last_value, is_called)
    class_stats: list[tuple[int, int, float, int]]  # (oid, relpages, reltuples, relallvisible)

    @classmethod
    async def read(cls, conn: asyncpg.Connection) -> TemplateState:
        user_tables = """
            SELECT format('%I.%I', n.nspname, c.relname) AS name, n.nspname, c.relname, c.relkind::text AS kind
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
              AND c.relkind IN ('r', 'p', 'S', 'm')
        """
        relations = await conn.fetch(user_tables)
        tables = [r["name"] for r in relations if r["kind"] in ("r", "p")]
        if any(r["kind"] == "m" for r in relations):
            raise RuntimeError("the migrated template has a materialized view: ReusedDatabase cannot empty it")
        if await conn.fetchval("SELECT count(*) FROM pg_statistic WHERE starelid >= 16384"):
            raise RuntimeError("the migrated template has column statistics: ReusedDatabase would remove them")
        seeds: dict[tuple[str, str], bytes] = {}
        for r in relations:
            if r["kind"] in ("r", "p") and await conn.fetchval(f"SELECT EXISTS (SELECT FROM {r['name']})"):
                out = io.BytesIO()
                await conn.copy_from_table(r["relname"], schema_name=r["nspname"], output=out, format="binary")
                seeds[(r["nspname"], r["relname"])] = out.getvalue()
        sequences = [
            (r["name"], *(await conn.fetchrow(f"SELECT last_value, is_called FROM {r['name']}")))
            for r in relations
            if r["kind"] == "S"
        ]
        class_stats = [
            tuple(r)
            for r in await conn.fetch(
                "SELECT oid::int, relpages, reltuples, relallvisible FROM pg_class WHERE oid >= 16384"
            )
        ]
        always_truncated = await conn.fetchval(
            "SELECT coalesce(array_agg(t), '{}') FROM unnest($1::text[]) AS t WHERE pg_relation_size(t::regclass) > 0",
            tables,
        )
        catalog_changes = _catalog_changes([(r[0], r[1]) for r in await conn.fetch(_CATALOGS)])
        written_by = await conn.fetchval(_CURRENT_XID)
        catalog_rows = {r[0]: r[1] for r in await conn.fetch(catalog_changes, str(written_by))}
        return cls(
            catalog_rows, catalog_changes, written_by, tables, list(always_truncated), seeds, sequences, class_stats
        )


_CURRENT_XID = "SELECT pg_current_xact_id()::text::bigint % 4294967296"  # an xid's 32 bits, as xmin has them


class SchemaChanged(Exception):
    """The test changed its database's schema: a reset of its rows would not give the template back."""


class ReusedDatabase:
    """One copy of the migrated template per worker, put back as the template has it after each test, under a new
    name (so that a URL never names two tests' data).

    A copy (CREATE DATABASE ... TEMPLATE) and its drop took 0.15-1.5 s a test (a loaded machine), a reset takes
    0.06-0.25 s: the tables written emptied and the migrations' seed rows written again, the sequences, size estimates
    (pg_class) and statistics (pg_statistic, the cumulative statistics of pg_stat_user_tables) as the template has
    them. The connections the test left are ended first, as DROP DATABASE ... WITH (FORCE) did. A test that changed
    the schema (any object made, altered or dropped: a catalog row written after the last reset, or a catalog with
    another number of rows: _CATALOGS), or a reset that fails, gets the database dropped and the next test a new copy.
    The reset runs between tests, never during one (a CREATE DATABASE in flight holds the cluster's xmin, which the
    outbox sequencer waits behind: 59fdfc7)."""

    def __init__(self, server: PgServer, make: Callable[..., str], drop: Callable[[str], None], template: str) -> None:
        self._server, self._make, self._drop, self._template = server, make, drop, template
        self._state: TemplateState | None = None
        self._url: str | None = None
        self._reset_by = 0  # the transaction of the last reset, or the template's after a new copy

    def take(self) -> str:
        if self._state is None:
            self._state = run_coro_sync(self._read_template)
        if self._url is None:
            self._url = self._make(template=self._template)
            self._reset_by = self._state.written_by
        return self._url

    def give_back(self) -> None:
        url, self._url = self._url, None
        if url is None:
            return
        renamed: list[str] = []
        try:
            run_coro_sync(lambda: self._rename_and_reset(url, renamed))
        except (SchemaChanged, OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            self._drop(renamed[0] if renamed else url)
            return
        self._url = renamed[0]

    async def _read_template(self) -> TemplateState:
        conn = await asyncpg.connect(_plain_dsn(self._server.url(self._template)))
        try:
            return await TemplateState.read(conn)
        finally:
            await conn.close()

    async def _rename_and_reset(self, url: str, renamed: list[str]) -> None:
        assert self._state is not None
        state = self._state
        old, new = url.rsplit("/", 1)[1], f"t_{uuid.uuid4().hex[:12]}"
        admin = await asyncpg.connect(self._server.admin_dsn)
        try:
            await _end_connections(admin, old)
            await admin.execute(f"ALTER DATABASE {quote_ident(old)} RENAME TO {quote_ident(new)}")
        finally:
            await admin.close()
        self._server.created[self._server.created.index(old)] = new
        url = self._server.url(new)
        renamed.append(url)
        conn = await asyncpg.connect(_plain_dsn(url))
        try:
            catalogs = await conn.fetch(state.catalog_changes, str(self._reset_by))
            if any(written or state.catalog_rows[name] != rows for name, rows, written in catalogs):
                raise SchemaChanged(url)
            # Only the tables written since (an empty table of the template has no pages: a row written, even rolled
            # back, gives it one) and those the migrations seed, with the tables whose foreign keys reference them
            # (CASCADE): a table truncated is 2-3 ms of files and catalog rows.
            written = await conn.fetchval(
                "SELECT array_agg(t) FROM unnest($1::text[]) AS t WHERE pg_relation_size(t::regclass) > 0",
                [t for t in state.tables if t not in state.always_truncated],
            )
            async with conn.transaction():
                await conn.execute(f"TRUNCATE {', '.join([*state.always_truncated, *(written or ())])} CASCADE")
                for (schema, table), rows in state.seeds.items():
                    await conn.copy_to_table(table, schema_name=schema, source=io.BytesIO(rows), format="binary")
                for name, last_value, is_called in state.sequences:
                    await conn.execute("SELECT setval($1::regclass, $2, $3)", name, last_value, is_called)
                await conn.execute(
                    "UPDATE pg_class c SET relpages = s.relpages, reltuples = s.reltuples,"
                    " relallvisible = s.relallvisible"
                    " FROM unnest($1::oid[], $2::int[], $3::real[], $4::int[]) AS s(oid, relpages, reltuples,"
                    " relallvisible) WHERE c.oid = s.oid"
                    " AND (c.relpages, c.reltuples, c.relallvisible) IS DISTINCT FROM (s.relpages, s.reltuples,"
                    " s.relallvisible)",
                    *map(list, zip(*state.class_stats)),
                )
                await conn.execute("DELETE FROM pg_statistic WHERE starelid >= 16384")
                await conn.execute("DELETE FROM pg_statistic_ext_data")
                # the emptied tables' counts reach the cumulative statistics before they are reset
                await conn.execute("SELECT pg_stat_force_next_flush()")
                reset_by = await conn.fetchval(_CURRENT_XID)
            await conn.execute("SELECT pg_stat_reset()")
            self._reset_by = reset_by
        finally:
            await conn.close()


def _plain_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def _end_connections(admin: asyncpg.Connection, name: str) -> None:
    """End the connections to database ``name`` and wait until they are gone (their statistics flushed)."""
    alive = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1"
    for _ in range(500):
        if not await admin.fetchval(alive, name):
            return
        await asyncio.sleep(0.01)
    raise asyncpg.ObjectInUseError(f"connections to {name} did not end")


@pytest.fixture(scope="session")
def reused_database(
    pg_server: PgServer, make_database: Callable[..., str], drop_database: Callable[[str], None], migrated_template: str
) -> ReusedDatabase:
    return ReusedDatabase(pg_server, make_database, drop_database, migrated_template)


@pytest.fixture
def database_url(reused_database: ReusedDatabase) -> Iterator[str]:
    """A migrated database of this test alone: the worker's reused copy of the template, reset (ReusedDatabase)."""
    yield reused_database.take()
    reused_database.give_back()


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    return {}


@pytest_asyncio.fixture
async def app(database_url: str, registry, settings_overrides: dict[str, Any]):
    # Authentication is on, as in production; `client` carries an admin token (no first-start token is printed).
    settings = Settings(
        database_url=database_url,
        apply_migrations_on_start=False,
        **{"auth_bootstrap_admin_token": False, **settings_overrides},
    )
    application = create_app(settings, registry)
    async with application.router.lifespan_context(application):
        yield application


@pytest_asyncio.fixture
async def admin_token(app) -> str:
    from tests.helpers import mint_token

    return await mint_token(app, "admin")


@pytest_asyncio.fixture
async def client(app, admin_token: str) -> AsyncIterator[httpx.AsyncClient]:
    """An admin (urn:li:corpuser:datahub) talking to `app`."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://metaledger",
        headers={"Authorization": f"Bearer {admin_token}"},
    ) as http:
        yield http


@pytest_asyncio.fixture
async def anonymous(app) -> AsyncIterator[httpx.AsyncClient]:
    """A client of `app` without credentials."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://metaledger") as http:
        yield http


@pytest_asyncio.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection to the test database, to check what was really stored."""
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    yield conn
    await conn.close()


@pytest.fixture(scope="session")
def kafka_broker():
    """A real Kafka-protocol broker (Tansu) on a free loopback port, for the whole run."""
    from tests.kafka_broker import start_broker

    broker = start_broker()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def search_server():
    """An OpenSearch-API search server (osmem) on a free loopback port, for the whole run."""
    from tests.search_server import start_search_server

    server = start_search_server()
    yield server
    server.stop()
