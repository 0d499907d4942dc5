"""Pieces every background worker (the outbox relay, the indexing worker, the consumers) and every child process of
`serve --workers N` shares."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable


async def pause(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds`, or less if the worker is told to stop meanwhile; True when it was told to stop."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True


SUPERVISOR_PID_ENV = "METALEDGER_SUPERVISOR_PID"  # set by `serve --workers N` (app.supervisor) for its children


async def follow_supervisor(on_gone: Callable[[], None], interval_s: float = 1.0) -> None:
    """In a child process of `serve --workers N`: once the supervisor is gone (killed with -9, so that nothing stopped
    its children and they were re-parented), call `on_gone`, so that no orphan keeps the port or the relay. Returns at
    once outside a supervisor."""
    expected = os.environ.get(SUPERVISOR_PID_ENV)
    if not expected:
        return
    while os.getppid() == int(expected):
        await asyncio.sleep(interval_s)
    logging.getLogger("metaledger").error("the supervisor is gone: this process stops", extra={"supervisor": expected})
    on_gone()
