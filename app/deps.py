"""FastAPI dependencies: the request-owned session and the shared services built at start-up."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncSession

from app.registry import EntityRegistry
from app.settings import Settings
from app.write.proposal import DEFAULT_ACTOR, AuditStamp
from app.write.service import WriteService


# All dependencies are `async def`: FastAPI runs plain `def` dependencies in its thread pool, a costly hop per call.


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessionmaker() as session:
        yield session


async def get_write_service(request: Request) -> WriteService:
    return request.app.state.write_service


async def get_registry(request: Request) -> EntityRegistry:
    return request.app.state.registry


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


async def request_audit_stamp(request: Request) -> AuditStamp:
    # Authentication arrives later; until then every request acts as DataHub's default actor.
    return AuditStamp.now(DEFAULT_ACTOR)
