"""Topic creation at start-up. (Interface fixed by the lead; implementation: relay helper.)"""

from __future__ import annotations

from app.settings import Settings


async def ensure_topics(settings: Settings) -> None:
    """Create every metaledger topic that is missing, with its configs (retention, max message size)."""
    raise NotImplementedError
