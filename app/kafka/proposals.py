"""Producing proposals for asynchronous ingestion. (Interface fixed by the lead; implementation: async helper.)"""

from __future__ import annotations

from typing import Any

from app.settings import Settings


class ProposalProducer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def send(self, proposals: list[dict[str, Any]]) -> None:
        """Produce MCPs (DataHub JSON form) to the MCP topic, keyed by entity URN; returns when acknowledged."""
        raise NotImplementedError
