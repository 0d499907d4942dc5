"""The database: engine, request-owned sessions, and migrations."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from alembic import command
from alembic.config import Config
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from app.settings import PROJECT_ROOT

MIGRATIONS_DIR = PROJECT_ROOT / "migrations"


def create_engine(url: str, pool_size: int = 10) -> AsyncEngine:
    # READ COMMITTED, as DataHub: row locks (SELECT ... FOR UPDATE) give compare-and-set where it matters.
    return create_async_engine(
        url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True, isolation_level="READ COMMITTED"
    )


def create_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade_database(url: str, revision: str = "head") -> None:
    """Apply pending migrations. Synchronous; safe to call from inside a running event loop (the migration
    environment runs its own loop, so it then runs in a worker thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        command.upgrade(alembic_config(url), revision)
        return
    with ThreadPoolExecutor(1) as pool:
        pool.submit(command.upgrade, alembic_config(url), revision).result()


async def session_scope(maker: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    async with maker() as session:
        yield session

