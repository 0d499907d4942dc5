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

``database_url`` and ``fresh_database_url`` drop their database after the test: a run makes over a thousand of them
(8 MB each), and removing the cluster's directory at the end of the run took 20-40 s when they were kept.

``make test`` runs the tests on two pytest-xdist workers (``-n 2 --dist loadfile --no-loadscope-reorder``: xdist's
default puts the modules with the most tests first): each worker has its own Postgres,
broker and search server (the session fixtures), a module never spans workers, nor do the modules of a
``SHARED_GROUPS`` prefix (they share costly session fixtures), and the modules that take minutes are collected first
(``LONG_MODULES``) so that the other worker runs the short ones around them.

No Postgres binaries is an error, never a skip: the message says ``apt-get install -y postgresql``.
"""

from __future__ import annotations

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
    EmbeddedPostgresError,
    ensure_database,
    free_port,
    quote_ident,
    run_coro_sync,
)
from app.main import create_app
from app.registry import load_registry
from app.settings import Settings

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


def _start_throwaway(base: Path) -> EmbeddedPostgres:
    # The port is free when we pick it but another process may grab it first: retry a few times.
    last: Exception | None = None
    for _ in range(5):
        pg = EmbeddedPostgres(base, free_port(), database=None, durable=False)
        try:
            pg.start()
            return pg
        except EmbeddedPostgresError as exc:
            if "Address already in use" not in str(exc):
                raise
            last = exc
    raise last  # type: ignore[misc]


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
        pg = _start_throwaway(base)
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


@pytest.fixture
def database_url(
    make_database: Callable[..., str], migrated_template: str, drop_database: Callable[[str], None]
) -> Iterator[str]:
    url = make_database(template=migrated_template)
    yield url
    drop_database(url)


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
