"""The outbox relay. (Interface fixed by the lead; implementation: relay helper.)"""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncEngine

from app.settings import Settings


class OutboxRelay:
    def __init__(self, settings: Settings, engine: AsyncEngine) -> None:
        self.settings = settings
        self.engine = engine

    async def run(self, stop: asyncio.Event) -> None:
        """Assign change-feed offsets in commit order, publish to Kafka when configured, prune; until `stop`."""
        await stop.wait()
