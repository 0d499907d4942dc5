"""FastAPI dependencies, declared once as `Annotated` aliases: the request-owned session and the process's shared
services (built by app.main at start-up and kept on `app.state`, which only this module reads)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.errors import ServiceUnavailable
from app.ingest.gateway import IngestGateway
from app.registry import EntityRegistry
from app.schema_registry import SchemaRegistryClient
from app.search.model import SearchBackend
from app.search.service import SearchRuntime, SearchUnavailable
from app.search.worker import wait_until_indexed
from app.settings import Settings
from app.write.proposal import DEFAULT_ACTOR, AuditStamp

# All dependencies are `async def`: FastAPI runs plain `def` dependencies in its thread pool, a costly hop per call.


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessionmaker() as session:
        yield session


async def get_gateway(request: Request) -> IngestGateway:
    return request.app.state.gateway


async def get_registry(request: Request) -> EntityRegistry:
    return request.app.state.registry


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_engine(request: Request) -> AsyncEngine:
    return request.app.state.engine


async def get_schema_registry(request: Request) -> SchemaRegistryClient | None:
    return getattr(request.app.state, "schema_registry", None)


async def get_search_runtime(request: Request) -> SearchRuntime | None:
    return getattr(request.app.state, "search", None)


async def get_backend(request: Request) -> SearchBackend:
    """The started search backend; 503 when there is none or it cannot be reached now."""
    runtime: SearchRuntime | None = getattr(request.app.state, "search", None)
    if runtime is None:
        raise ServiceUnavailable("no search backend in this process")
    try:
        return await runtime.ready_backend()
    except SearchUnavailable as error:
        raise ServiceUnavailable(f"the search backend is unavailable: {error}") from None


async def _already_current() -> bool:
    return False


async def get_read_your_writes(request: Request) -> Callable[[], Awaitable[bool]]:
    """Wait (bounded) until the embedded indexer has applied every change log committed so far; a no-op where there
    is no embedded indexer (Kafka configured: the Spark job indexes) or no search backend."""
    state = request.app.state
    if state.settings.kafka_bootstrap_servers or getattr(state, "search", None) is None:
        return _already_current
    return partial(wait_until_indexed, state.sessionmaker)


async def request_audit_stamp(request: Request) -> AuditStamp:
    # Authentication arrives later; until then every request acts as DataHub's default actor.
    return AuditStamp.now(DEFAULT_ACTOR)


Session = Annotated[AsyncSession, Depends(get_session)]
Gateway = Annotated[IngestGateway, Depends(get_gateway)]
Registry = Annotated[EntityRegistry, Depends(get_registry)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Engine = Annotated[AsyncEngine, Depends(get_engine)]
Search = Annotated[SearchRuntime | None, Depends(get_search_runtime)]
SchemaRegistry = Annotated[SchemaRegistryClient | None, Depends(get_schema_registry)]
Backend = Annotated[SearchBackend, Depends(get_backend)]
Audit = Annotated[AuditStamp, Depends(request_audit_stamp)]
ReadYourWrites = Annotated[Callable[[], Awaitable[bool]], Depends(get_read_your_writes)]
