"""The audit log's reads (a page of entries, the chain's verification) and its upkeep (sealing, retention).

Reads seal first: every entry committed before the read is in the chain when it is listed or verified, also where
no sealer runs (`AuditSealer` keeps the chain sealed within a second and purges past the retention).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from app.audit import repository
from app.audit.model import entry_hash, entry_json
from app.audit.repository import EntryQuery
from app.db import SessionRepository, close_quietly, connect_dedicated
from app.settings import Settings
from app.workers import pause

log = logging.getLogger("metaledger.audit")

SEAL_BATCH = 1000
VERIFY_PAGE = 2000
PURGE_EVERY_S = 60.0
MAX_BACKOFF_S = 5.0


async def seal_all(conn: asyncpg.Connection) -> int:
    """Seal every entry committed so far; how many."""
    sealed = 0
    while (count := await repository.seal(conn, SEAL_BATCH)) == SEAL_BATCH:
        sealed += count
    return sealed + count


@dataclass(slots=True)
class Page:
    entries: list[dict[str, Any]]
    next: str | None  # the cursor of the next page (None: this is the last one for now)


async def page(conn: asyncpg.Connection, query: EntryQuery) -> Page:
    """Entries in chain order after the cursor's position, filtered; sealed first."""
    await seal_all(conn)
    rows = await repository.entries(conn, replace(query, count=query.count + 1))
    more = len(rows) > query.count
    rows = rows[: query.count]
    return Page([entry_json(r) for r in rows], str(rows[-1]["seq"]) if more else None)


async def verify(conn: asyncpg.Connection) -> dict[str, Any]:
    """Walk the chain from its anchor, recomputing each entry's hash from the one before: the first entry that does
    not match (edited in place), or where positions are missing (deleted), or that the chain holds."""
    await seal_all(conn)
    state = await repository.chain_state(conn)
    previous, expected, checked = state.anchor_hash, state.anchor_seq + 1, 0
    last: asyncpg.Record | None = None
    while rows := await repository.sealed_between(conn, expected - 1, state.last_seq, VERIFY_PAGE):
        for row in rows:
            if row["seq"] != expected:
                return _broken(
                    checked,
                    row,
                    f"positions {expected}..{row['seq'] - 1} are missing before this entry: entries were deleted",
                )
            recomputed = entry_hash(previous, row)
            if recomputed != row["hash"]:
                return _broken(checked, row, "the entry does not match its hash: it was changed after it was sealed")
            previous, expected, checked, last = recomputed, expected + 1, checked + 1, row
    if expected - 1 != state.last_seq:
        where = f"after entry {last['id']}" if last is not None else "after the anchor"
        return {
            "holds": False,
            "checked": checked,
            "entry": _named(last),
            "reason": f"positions {expected}..{state.last_seq}, the chain's last, are missing {where}: "
            "entries were deleted",
        }
    if previous != state.last_hash:
        return _broken(checked, last, "the chain's head does not match its last entry")
    return {
        "holds": True,
        "checked": checked,
        "anchor": {"position": state.anchor_seq, "hash": state.anchor_hash},
        "head": {"position": state.last_seq, "hash": state.last_hash},
    }


def _named(row: asyncpg.Record | None) -> dict[str, Any] | None:
    return None if row is None else {"id": row["id"], "position": row["seq"]}


def _broken(checked: int, row: asyncpg.Record | None, reason: str) -> dict[str, Any]:
    return {"holds": False, "checked": checked, "entry": _named(row), "reason": reason}


async def purge(conn: asyncpg.Connection, retention_days: float) -> int:
    """Entries older than the retention deleted (sealed first, so that none is left out of the chain); 0 when
    `retention_days` is 0 (kept forever)."""
    if retention_days <= 0:
        return 0
    await seal_all(conn)
    return await repository.purge(conn, retention_days * 86400)


class AuditLog(SessionRepository):
    """The audit log as the API reads it, on the request's session."""

    async def page(self, query: EntryQuery) -> Page:
        return await page(await self._conn(), query)

    async def verify(self) -> dict[str, Any]:
        return await verify(await self._conn())


class AuditSealer:
    """A background worker (app.background): seals the chain every `poll` seconds and purges past
    AUDIT_RETENTION_DAYS every minute; several may run (one seals at a time, the others after it)."""

    def __init__(self, settings: Settings, engine: AsyncEngine, poll: float = 1.0) -> None:
        self.settings = settings
        self.engine = engine
        self.poll = poll
        self.sealed = 0  # figures, for tests and logs
        self.purged = 0

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        next_purge = time.monotonic()
        while not stop.is_set():
            conn: asyncpg.Connection | None = None
            try:
                conn = await connect_dedicated(self.engine, "metaledger-audit-sealer")
                while not stop.is_set():
                    self.sealed += await seal_all(conn)
                    if time.monotonic() >= next_purge:
                        self.purged += await purge(conn, self.settings.audit_retention_days)
                        next_purge = time.monotonic() + PURGE_EVERY_S
                    failures = 0
                    await pause(stop, self.poll)
            except Exception as error:  # noqa: BLE001 - the sealer outlives database restarts
                failures += 1
                log.warning(
                    "audit sealer: database error; retrying", extra={"error": f"{type(error).__name__}: {error}"}
                )
                await pause(stop, min(MAX_BACKOFF_S, 0.2 * 2**failures))
            finally:
                if conn is not None:
                    await close_quietly(conn)
