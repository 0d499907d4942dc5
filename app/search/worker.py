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
* Under write load it yields: when it is a full batch behind (a flood of writes) while other sessions of the
  database run statements (`writes_running`: the API's writes; metaledger's background connections, named
  `metaledger-*`, are not counted), a batch is followed by a pause `1 / YIELD_SHARE - 1` times as long as it took (at most `MAX_YIELD_S`, which bounds the delay to search),
  so the worker holds the database and its CPU about `YIELD_SHARE` of the time and the writes get the rest. It
  catches up at full speed once the load ends; alone, or not behind (a write searchable within a second), it never
  waits.
* A backend failure keeps the position and retries with backoff (the database is the queue); the outbox pruning
  keeps rows past `last_offset` (app.changelog.outbox.prune) once this worker has registered its cursor.
* Data never stops it (app.search.failures): a change log whose changes cannot be built, or that the backend refuses
  for its data, is isolated (a refused bulk is split in halves down to single change logs: `Indexer.apply_isolating`),
  recorded in `search_index_failure` in the transaction that advances the cursor past it, and skipped; every other
  change log of the batch is applied, in order. Only transient errors (`is_transient`: the backend or the database
  unreachable, overloaded, restarting) hold the position.
* Runtime models: a change log of an entity type or aspect the registry does not know (written under a runtime model
  set this process's model watcher has not taken up yet: within METALEDGER_MODEL_REFRESH_S of an apply) makes the
  worker take the stored set up before it builds the batch's changes (`ModelFollower.refresh_for`), so it is indexed
  under the set it was written with, not consumed unindexed.
* Retries: at most every `RETRY_CHECK_S`, failures whose retry is due (exponential backoff,
  `search_failure_retry_min_s` .. `_max_s`) are applied again from the change log they keep; indexed ones leave the
  table, the others back off further. A batch that indexes a newer version of an aspect drops its older failures.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.changelog.cursor import FeedCursor, FeedCursorRepository
from app.db import close_quietly, connect_dedicated
from app.ops.metrics import INDEXER_APPLIED, INDEXER_ERRORS, INDEXER_FAILED_ROWS, INDEXER_RETRIED_ROWS
from app.registry.runtime import ModelFollower
from app.search.failures import IndexFailures, describe
from app.search.service import IndexItem, SearchRuntime
from app.settings import Settings
from app.workers import pause

log = logging.getLogger("metaledger.search.worker")

MAX_BACKOFF_S = 5.0
RETRY_CHECK_S = 1.0  # how often the failure table is looked at for due retries (one count when it is empty)
RETRY_BATCH = 100  # failures retried per look
LOGGED_FAILURES = 20  # refused change logs logged per batch (all are recorded)
YIELD_SHARE = 0.25  # under write load: the share of its time the worker spends applying batches
MAX_YIELD_S = 1.0  # the longest pause after a batch under write load (the feed's delay to search stays bounded)


async def writes_running(conn: asyncpg.Connection) -> bool:
    """Whether another session of this database (not one of metaledger's background connections) is running a
    statement: the write load the worker yields to."""
    return await conn.fetchval(
        """
        SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                       WHERE datname = current_database() AND state = 'active' AND backend_type = 'client backend'
                         AND pid <> pg_backend_pid() AND application_name NOT LIKE 'metaledger-%')
        """
    )


class IndexWorker:
    def __init__(self, settings: Settings, engine: AsyncEngine, runtime: SearchRuntime, models: ModelFollower) -> None:
        self.settings = settings
        self.engine = engine
        self.runtime = runtime
        self.poll_s = settings.search_worker_poll_ms / 1000
        self.batch = settings.search_worker_batch_size
        self.topics = [settings.topic_mcl_versioned, settings.topic_mcl_timeseries]
        self.failure_table = IndexFailures(settings.search_failure_retry_min_s, settings.search_failure_retry_max_s)
        self.models = models  # the process's watcher of the runtime model set
        # figures, for tests, logs and app.ops
        self.applied_rows = 0
        self.applied_changes = 0
        self.failures = 0  # errors of the worker (a batch retried whole)
        self.rows_failed = 0  # change logs this worker recorded as failed (first failures and failed retries)
        self.retries_indexed = 0  # recorded failures a retry indexed
        self.failing_rows = 0  # rows in the failure table at the last look (every worker's)
        self.yields = 0  # batches followed by a pause for the write load
        self.last_offset = 0
        self._next_retry_check = 0.0

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            conn: asyncpg.Connection | None = None
            try:
                conn = await connect_dedicated(self.engine, "metaledger-indexer")
                cursor = FeedCursor(conn)
                await cursor.register()
                self._next_retry_check = 0.0
                while not stop.is_set():
                    if not await self.runtime.start():
                        raise RuntimeError(f"search backend unavailable: {self.runtime.last_error}")
                    await self._retry_quietly(conn)
                    started = time.monotonic()
                    count = await self.step(cursor)
                    failures = 0
                    wait = self.poll_s if count < self.batch else 0.0
                    if count == self.batch and await writes_running(conn):
                        took = time.monotonic() - started
                        wait = max(wait, min(MAX_YIELD_S, took * (1 / YIELD_SHARE - 1)))
                        self.yields += 1
                    if wait:
                        await pause(stop, wait)
            except Exception as error:  # noqa: BLE001 - the worker outlives database and search outages
                failures += 1
                self.failures += 1
                INDEXER_ERRORS.inc()
                if failures == 1 or failures % 20 == 0:
                    log.warning(
                        "indexing worker: error; retrying",
                        extra={"attempts": failures, "error": f"{type(error).__name__}: {error}"},
                    )
                await pause(stop, min(MAX_BACKOFF_S, 0.1 * 2**failures))
            finally:
                if conn is not None:
                    await close_quietly(conn)

    async def step(self, cursor: FeedCursor) -> int:
        """Apply the next batch; returns the number of outbox rows consumed (0 when caught up)."""
        # The idle poll: no transaction, no lock.
        last, more = await cursor.poll()
        if not more:
            self.last_offset = last
            return 0
        async with cursor.transaction():
            _, rows = await cursor.read_locked(self.batch, self.topics)
            if not rows:
                return 0
            items, failed = await self._items(rows, "id")
            failed += await self.runtime.indexer.apply_isolating(items)
            if failed:
                await self.failure_table.record(cursor.conn, failed)
                self._log_failed(rows, "id", failed)
            if failed or self.failing_rows:
                failed_ids = {key for key, _ in failed}
                applied = [
                    (r["urn"], r["aspect"], r["version"])
                    for r in rows
                    if r["topic"] == self.topics[0] and r["id"] not in failed_ids
                ]
                await self.failure_table.superseded(cursor.conn, self.topics[0], applied)
            new_last = rows[-1]["feed_offset"]
            await cursor.advance(new_last)
        if failed:
            self.rows_failed += len(failed)
            INDEXER_FAILED_ROWS.inc(len(failed))
            self.failing_rows += len(failed)  # until the next look at the table
        self.applied_rows += len(rows)
        INDEXER_APPLIED.inc(len(rows))
        self.applied_changes += sum(len(item.changes) for item in items)
        self.last_offset = new_last
        return len(rows)

    async def _retry_quietly(self, conn: asyncpg.Connection) -> None:
        """Retries never hold up the feed: an error while retrying is logged and the next look is a while later (a
        broken connection then fails the next step, which reconnects)."""
        try:
            await self.retry_due(conn)
        except Exception as error:  # noqa: BLE001
            self.failures += 1
            INDEXER_ERRORS.inc()
            self._next_retry_check = time.monotonic() + MAX_BACKOFF_S
            log.warning(
                "indexing worker: retrying failures failed; the feed goes on",
                extra={"error": f"{type(error).__name__}: {error}"},
            )

    async def retry_due(self, conn: asyncpg.Connection) -> int:
        """At most every `RETRY_CHECK_S`: look at the failure table and retry the failures that are due (in feed
        order, isolated as in `step`). Returns how many were indexed."""
        now = time.monotonic()
        if now < self._next_retry_check:
            return 0
        self._next_retry_check = now + RETRY_CHECK_S
        self.failing_rows = await IndexFailures.count(conn)
        if not self.failing_rows:
            return 0
        async with conn.transaction():
            due = await self.failure_table.due(conn, RETRY_BATCH)
            if not due:
                return 0
            items, failed = await self._items(due, "outbox_id")
            failed += await self.runtime.indexer.apply_isolating(items)
            failed_ids = {key for key, _ in failed}
            indexed = [r["outbox_id"] for r in due if r["outbox_id"] not in failed_ids]
            await self.failure_table.retried(conn, indexed, failed)
        self.rows_failed += len(failed)
        self.retries_indexed += len(indexed)
        INDEXER_FAILED_ROWS.inc(len(failed))
        INDEXER_RETRIED_ROWS.inc(len(indexed))
        self.failing_rows -= len(indexed)
        if indexed:
            log.info(
                "indexing failures retried: indexed", extra={"indexed": len(indexed), "still_failing": len(failed)}
            )
        if failed:
            self._log_failed(due, "outbox_id", failed, retry=True)
        return len(indexed)

    async def _items(self, rows: Sequence[Any], key: str) -> tuple[list[IndexItem], list[tuple[int, str]]]:
        """Each row's index changes (keyed by its `key` column), and the rows whose changes cannot be built; under
        the stored runtime model set when a row is of an entity type or aspect the registry does not know."""
        await self.models.refresh_for((row["urn"], row["aspect"]) for row in rows if row["payload"] is not None)
        indexer = self.runtime.indexer
        items: list[IndexItem] = []
        failed: list[tuple[int, str]] = []
        for row in rows:
            payload = row["payload"]
            if payload is None:
                continue  # a platform event: not indexed
            try:
                changes = indexer.changes_of(orjson.loads(payload))
            except Exception as error:  # noqa: BLE001 - the change log's own fault: recorded, skipped
                failed.append((row[key], f"index changes could not be built: {describe(error)}"))
                continue
            if changes:
                items.append(IndexItem(row[key], changes))
        return items, failed

    def _log_failed(self, rows: Sequence[Any], key: str, failed: list[tuple[int, str]], *, retry: bool = False) -> None:
        by_key = {row[key]: row for row in rows}
        for row_key, reason in failed[:LOGGED_FAILURES]:
            row = by_key.get(row_key)
            log.warning(
                "change log still refused by the search backend; retried later"
                if retry
                else "change log not indexed (refused); recorded in search_index_failure and skipped",
                extra={
                    "urn": row and row["urn"],
                    "aspect": row and row["aspect"],
                    "version": row and row["version"],
                    "outbox_id": row_key,
                    "error": reason,
                },
            )
        if len(failed) > LOGGED_FAILURES:
            log.warning("more change logs not indexed", extra={"count": len(failed) - LOGGED_FAILURES})


async def wait_until_indexed(
    sessionmaker: async_sessionmaker[AsyncSession], timeout_s: float = 2.0, poll_s: float = 0.02
) -> bool:
    """Read-your-writes for reads that DataHub's clients expect to see their own writes in (the Rest.li timeseries
    action): wait until every change log committed before this call is applied by the embedded worker. Bounded: after
    `timeout_s` the read proceeds (eventually consistent). Only where the embedded worker runs (no Kafka: see
    app.api.deps.WaitForIndex). True when caught up."""
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
