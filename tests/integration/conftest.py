"""The app fixtures (`app`, `client`, `db`, `database_url`, `registry`, ...) live in tests/conftest.py: tests/spark uses them too.

Here: `backend`, the embedded (Postgres) search backend on the test's database, started; a module that needs documents
in it overrides it (`async def backend(backend)`: applies them, returns it), one that tests other backends replaces it."""

from collections.abc import AsyncIterator

import pytest_asyncio

from app.db import create_engine
from app.search.postgres import PostgresBackend
from app.settings import Settings


@pytest_asyncio.fixture
async def backend(database_url: str, registry) -> AsyncIterator[PostgresBackend]:
    engine = create_engine(database_url)
    started = PostgresBackend(Settings(database_url=database_url), registry, engine)
    await started.start()
    yield started
    await started.close()
    await engine.dispose()
