"""The embedded indexing worker: applies committed change logs from the outbox to the search backend, in feed order.

Runs inside `metaledger serve` when `kafka_bootstrap_servers` is unset (the embedded default, whichever backend:
Postgres or a configured Elasticsearch). With Kafka configured, indexing is the Spark job's (it reads the MCL
topics) and this worker does not run. The decision is made from that setting alone (app.background).

Design:
* Position: the changelog's feed cursor (app.changelog.cursor.FeedCursor): every outbox row with
  `feed_offset <= last_offset` has been applied. Feed offsets are given by the relay's sequencer in
  commit order (so the relay must run: it does in `serve` by default, `relay_enabled`); the worker reads
  `feed_offset > last_offset` in batches, in order.
* Each batch: the MCLs of the versioned and timeseries topics (platform events are skipped but counted) →
  `changes_from_mcl` → `backend.apply(changes)` → `last_offset` = the batch's last offset. At least once: a crash
  between apply and the offset update re-applies the batch, which is harmless (apply is idempotent and
  order-safe). Several workers on one database serialise on the state row (`FOR UPDATE` while applying), so
  batches are applied once each in the normal case and never out of order.
* Idle: polls every `search_worker_poll_ms` (a setting, 50 ms by default) — with the relay's 20 ms sequencing
  poll, a write is searchable well within a second.
* A backend failure keeps the position and retries with backoff (the database is the queue); the outbox pruning
  keeps rows past `last_offset` (app.changelog.outbox.prune) once this worker has registered its cursor.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.changelog.cursor import FeedCursor, FeedCursorRepository
from app.search.service import SearchRuntime
from app.settings import Settings
from app.db import close_quietly, connect_dedicated
from app.workers import pause

log = logging.getLogger("metaledger.search.worker")

MAX_BACKOFF_S = 5.0


class IndexWorker:
    def __init__(self, settings: Settings, engine: AsyncEngine, runtime: SearchRuntime) -> None:
        self.settings = settings
        self.engine = engine
        self.runtime = runtime
        self.poll_s = settings.search_worker_poll_ms / 1000
        self.batch = settings.search_worker_batch_size
        self.topics = [settings.topic_mcl_versioned, settings.topic_mcl_timeseries]
        # figures, for tests and logs
        self.applied_rows = 0
        self.applied_changes = 0
        self.failures = 0
        self.last_offset = 0

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            conn: asyncpg.Connection | None = None
            try:
                conn = await connect_dedicated(self.engine, "metaledger-indexer")
                cursor = FeedCursor(conn)
                await cursor.register()
                while not stop.is_set():
                    if not await self.runtime.start():
                        raise RuntimeError(f"search backend unavailable: {self.runtime.last_error}")
                    count = await self.step(cursor)
                    failures = 0
                    if count < self.batch:
                        await pause(stop, self.poll_s)
            except Exception as error:  # noqa: BLE001 - the worker outlives database and search outages
                failures += 1
                self.failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("indexing worker: error; retrying", extra={"attempts": failures, "error": f"{type(error).__name__}: {error}"})
                await pause(stop, min(MAX_BACKOFF_S, 0.1 * 2**failures))
            finally:
                if conn is not None:
                    await close_quietly(conn)

    async def step(self, cursor: FeedCursor) -> int:
        """Apply the next batch; returns the number of outbox rows consumed (0 when caught up)."""
        # The idle poll: no transaction, no lock.
        last = await cursor.position()
        if not await cursor.has_rows_after(last):
            self.last_offset = last
            return 0
        async with cursor.transaction():
            last = await cursor.lock()
            rows = await cursor.read_after(last, self.batch, self.topics)
            if not rows:
                return 0
            mcls: list[dict[str, Any]] = [orjson.loads(r["payload"]) for r in rows if r["payload"] is not None]
            applied = await self.runtime.indexer.apply_mcls(mcls) if mcls else 0
            new_last = rows[-1]["feed_offset"]
            await cursor.advance(new_last)
        self.applied_rows += len(rows)
        self.applied_changes += applied
        self.last_offset = new_last
        return len(rows)


async def wait_until_indexed(
    sessionmaker: async_sessionmaker[AsyncSession], timeout_s: float = 2.0, poll_s: float = 0.02
) -> bool:
    """Read-your-writes for reads that DataHub's clients expect to see their own writes in (the Rest.li timeseries
    action): wait until every change log committed before this call is applied by the embedded worker. Bounded: after
    `timeout_s` the read proceeds (eventually consistent). Only where the embedded worker runs (no Kafka: see
    app.api.deps.ReadYourWrites). True when caught up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with sessionmaker() as session:
        repo = FeedCursorRepository(session)
        target = await repo.latest_change_log_id()
        if target is None:
            return True
        while True:  # each statement on its own (no open transaction): every poll sees the latest commits
            if await repo.applied_through(target):
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(poll_s)
