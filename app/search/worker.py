"""The embedded indexing worker: applies committed change logs from the outbox to the search backend, in feed order.

Runs inside `metaledger serve` when `kafka_bootstrap_servers` is unset (the embedded default, whichever backend:
Postgres or a configured Elasticsearch). With Kafka configured, indexing is the Spark job's (it reads the MCL
topics) and this worker does not run. The decision is made from that setting alone (app.background).

Design:
* Position: `search_index_state.last_offset` (migration 0004): every outbox row with `feed_offset <= last_offset`
  has been applied. Feed offsets are given by the relay's sequencer in commit order (so the relay must run: it
  does in `serve` by default, `relay_enabled`); the worker reads `feed_offset > last_offset` in batches, in order.
* Each batch: the MCLs of the versioned and timeseries topics (platform events are skipped but counted) →
  `changes_from_mcl` → `backend.apply(changes)` → `last_offset` = the batch's last offset. At least once: a crash
  between apply and the offset update re-applies the batch, which is harmless (apply is idempotent and
  order-safe). Several workers on one database serialise on the state row (`FOR UPDATE` while applying), so
  batches are applied once each in the normal case and never out of order.
* Idle: polls every `search_worker_poll_ms` (50 ms; `getattr` default, not a declared setting) — with the relay's
  20 ms sequencing poll, a write is searchable well within a second.
* A backend failure keeps the position and retries with backoff (the database is the queue); the outbox pruning
  keeps rows past `last_offset` (app.kafka.outbox.prune) once this worker has registered its state row.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.search.service import SearchRuntime
from app.settings import Settings
from app.db import SessionRepository, connect_dedicated
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
                await conn.execute("INSERT INTO search_index_state (id, last_offset) VALUES (1, 0) ON CONFLICT (id) DO NOTHING")
                while not stop.is_set():
                    if not await self.runtime.start():
                        raise RuntimeError(f"search backend unavailable: {self.runtime.last_error}")
                    count = await self.step(conn)
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
                    try:
                        await asyncio.wait_for(conn.close(), timeout=5)
                    except Exception:  # noqa: BLE001
                        conn.terminate()

    async def step(self, conn: asyncpg.Connection) -> int:
        """Apply the next batch; returns the number of outbox rows consumed (0 when caught up)."""
        # The idle poll: one round trip, no transaction, no lock.
        last = await conn.fetchval("SELECT last_offset FROM search_index_state WHERE id = 1")
        if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM change_log_outbox WHERE feed_offset > $1)", last):
            self.last_offset = last
            return 0
        async with conn.transaction():
            last = await conn.fetchval("SELECT last_offset FROM search_index_state WHERE id = 1 FOR UPDATE")
            rows = await conn.fetch(
                """
                SELECT feed_offset, CASE WHEN topic = ANY($3::text[]) THEN payload END AS payload
                FROM change_log_outbox WHERE feed_offset > $1 ORDER BY feed_offset LIMIT $2
                """,
                last,
                self.batch,
                self.topics,
            )
            if not rows:
                return 0
            mcls: list[dict[str, Any]] = [orjson.loads(r["payload"]) for r in rows if r["payload"] is not None]
            applied = await self.runtime.indexer.apply_mcls(mcls) if mcls else 0
            new_last = rows[-1]["feed_offset"]
            await conn.execute("UPDATE search_index_state SET last_offset = $1, updated_at = now() WHERE id = 1", new_last)
        self.applied_rows += len(rows)
        self.applied_changes += applied
        self.last_offset = new_last
        return len(rows)


class IndexPositionRepository(SessionRepository):
    """The SQL of read-your-writes waits on the embedded worker's position."""

    async def latest_change_log_id(self) -> int | None:
        conn = await self._conn()
        return await conn.fetchval("SELECT max(id) FROM change_log_outbox")

    async def indexed_through(self, target: int) -> bool:
        """Every outbox row up to id `target` is sequenced and applied by the indexing worker."""
        conn = await self._conn()
        return await conn.fetchval(
            """
            SELECT NOT EXISTS (
                SELECT 1 FROM change_log_outbox
                WHERE id <= $1 AND (feed_offset IS NULL
                      OR feed_offset > coalesce((SELECT last_offset FROM search_index_state WHERE id = 1), 0)))
            """,
            target,
        )


async def wait_until_indexed(app: Any, timeout_s: float = 2.0, poll_s: float = 0.02) -> bool:
    """Read-your-writes for reads that DataHub's clients expect to see their own writes in (the Rest.li timeseries
    action): wait until every change log committed before this call is applied by the embedded worker. Bounded: after
    `timeout_s` the read proceeds (eventually consistent). Without the embedded worker (Kafka configured) it returns
    at once. True when caught up."""
    settings = app.state.settings
    if settings.kafka_bootstrap_servers or getattr(app.state, "search", None) is None:
        return False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with app.state.sessionmaker() as session:
        repo = IndexPositionRepository(session)
        target = await repo.latest_change_log_id()
        if target is None:
            return True
        while True:  # each statement on its own (no open transaction): every poll sees the latest commits
            if await repo.indexed_through(target):
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(poll_s)
