"""App fixtures: a metaledger app on a fresh, migrated database of the real test Postgres, and a client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.db import upgrade_database
from app.main import create_app
from app.registry import load_registry
from app.settings import Settings


@pytest.fixture(scope="session")
def registry():
    return load_registry(Settings().registry_path)


@pytest.fixture(scope="session")
def migrated_template(make_database: Callable[..., str]) -> str:
    """A database migrated once; every test copies it (CREATE DATABASE ... TEMPLATE) instead of migrating."""
    url = make_database("metaledger_template")
    upgrade_database(url)
    return "metaledger_template"


@pytest.fixture
def database_url(make_database: Callable[..., str], migrated_template: str) -> str:
    return make_database(template=migrated_template)


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    return {}


@pytest_asyncio.fixture
async def app(database_url: str, registry, settings_overrides: dict[str, Any]):
    settings = Settings(database_url=database_url, apply_migrations_on_start=False, **settings_overrides)
    application = create_app(settings, registry)
    async with application.router.lifespan_context(application):
        yield application


@pytest_asyncio.fixture
async def client(app) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://metaledger") as http:
        yield http


@pytest_asyncio.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A plain connection to the test database, to check what was really stored."""
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    yield conn
    await conn.close()
