"""Pieces every background worker (the outbox relay, the indexing worker, the consumers) shares."""

from __future__ import annotations

import asyncio


async def pause(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds`, or less if the worker is told to stop meanwhile; True when it was told to stop."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True
