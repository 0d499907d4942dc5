"""Asynchronous ingestion consumers. (Interface fixed by the lead; implementation: async helper.)"""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.settings import Settings
from app.write.service import WriteService


class McpConsumer:
    """MetadataChangeProposal_v1 → the write pipeline in batches; failures → FailedMetadataChangeProposal_v1."""

    def __init__(self, settings: Settings, sessionmaker: async_sessionmaker[AsyncSession], writer: WriteService) -> None:
        self.settings, self.sessionmaker, self.writer = settings, sessionmaker, writer

    async def run(self, stop: asyncio.Event) -> None:
        raise NotImplementedError


class MceConsumer(McpConsumer):
    """MetadataChangeEvent_v4 → unbundled MCPs → the write pipeline; failures → FailedMetadataChangeEvent_v4."""
