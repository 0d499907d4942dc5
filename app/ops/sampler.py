"""The outbox sampler: the change-log backlog, relay lag and indexing lag, measured with one cheap statement on a
connection of its own (outside the request pool, so an exhausted pool does not blind it).

It samples every `ops_sample_interval_s` (the figure the write backpressure reads, app.ops.backpressure) and again
when `/metrics` is scraped. The statement is a handful of index lookups:

- **unsequenced** rows (committed, no feed offset yet: the sequencer's lag): counted on the partial index
  `ix_change_log_outbox_unsequenced_txid` from the sequencer's stored horizon on (the entries below it are of rows
  already sequenced, not yet vacuumed) up to `COUNT_CAP` rows; past the cap, about the id difference (max id - the id
  of the oldest transaction's first unsequenced row + 1: ids of rolled-back transactions are gaps, and ids are not
  quite in transaction order).
- with Kafka, **undelivered** rows (sequenced, not yet published, not refused: the relay's lag): counted on the partial
  index `ix_change_log_outbox_undelivered` up to the cap; past it, the offset difference (the last feed offset - the
  oldest undelivered offset + 1: offsets are consecutive; an upper bound when lanes are published unevenly).
- without Kafka, rows past the **embedded indexer's cursor** (its lag): the last feed offset - the cursor, exact
  (offsets are consecutive, and pruning keeps every row past the cursor).

The backlog is unsequenced + undelivered (Kafka) or unsequenced + the indexer's lag (without Kafka; the indexer is
then the outbox's only consumer), and its age is that of its oldest row.

Indexing failures (app.search.failures): the change logs in `search_index_failure` (counted up to the cap), the age
of the oldest first failure and the latest reason; the table is small (it holds only refused change logs).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import close_quietly, connect_dedicated
from app.settings import Settings
from app.workers import pause

log = logging.getLogger("metaledger.ops")

COUNT_CAP = 100_000  # rows counted exactly; past this, offset/id differences
T = TypeVar("T")

# The sequencer's stored horizon (app.changelog.outbox `sequence`), unless it is another database's.
_HORIZON = """(SELECT CASE WHEN sequenced_below <= pg_snapshot_xmin(pg_current_snapshot()) THEN sequenced_below
                    ELSE '0'::xid8 END AS below FROM change_log_feed_state WHERE id = 1)"""

_COMMON = """
    SELECT
        extract(epoch FROM now())::float8 AS now,
        (SELECT last_offset FROM change_log_feed_state WHERE id = 1) AS feed_end,
        (SELECT last_offset FROM feed_reader_state WHERE reader = 'search-indexer') AS cursor,
        (SELECT max(id) FROM change_log_outbox) AS last_id,
        (SELECT count(*) FROM (SELECT 1 FROM change_log_outbox WHERE feed_offset IS NULL AND txid >= h.below LIMIT $1) c)
            AS unsequenced,
        (SELECT count(*) FROM (SELECT 1 FROM search_index_failure LIMIT $1) f) AS failing_rows,
        (SELECT extract(epoch FROM min(first_failed_at))::float8 FROM search_index_failure) AS failing_since,
        (SELECT reason FROM search_index_failure ORDER BY last_failed_at DESC LIMIT 1) AS last_failure,
        u.id AS first_unsequenced_id, extract(epoch FROM u.created_at)::float8 AS unsequenced_since,
"""
_KAFKA = (
    _COMMON
    + """
        (SELECT count(*) FROM (SELECT 1 FROM change_log_outbox
                               WHERE delivered_at IS NULL AND feed_offset IS NOT NULL AND publish_error IS NULL
                               LIMIT $1) c) AS undelivered,
        d.feed_offset AS first_undelivered, extract(epoch FROM d.created_at)::float8 AS undelivered_since,
        NULL::float8 AS unindexed_since
    FROM """
    + _HORIZON
    + """ h
    LEFT JOIN LATERAL (SELECT id, created_at FROM change_log_outbox WHERE feed_offset IS NULL AND txid >= h.below
                       ORDER BY txid LIMIT 1) u ON true
    LEFT JOIN LATERAL (SELECT feed_offset, created_at FROM change_log_outbox
                       WHERE delivered_at IS NULL AND feed_offset IS NOT NULL AND publish_error IS NULL
                       ORDER BY feed_offset LIMIT 1) d ON true
"""
)
_EMBEDDED = (
    _COMMON
    + """
        NULL::bigint AS undelivered, NULL::bigint AS first_undelivered, NULL::float8 AS undelivered_since,
        extract(epoch FROM i.created_at)::float8 AS unindexed_since
    FROM """
    + _HORIZON
    + """ h
    LEFT JOIN LATERAL (SELECT id, created_at FROM change_log_outbox WHERE feed_offset IS NULL AND txid >= h.below
                       ORDER BY txid LIMIT 1) u ON true
    LEFT JOIN LATERAL (SELECT created_at FROM change_log_outbox
                       WHERE feed_offset > (SELECT last_offset FROM feed_reader_state WHERE reader = 'search-indexer')
                       ORDER BY feed_offset LIMIT 1) i ON true
"""
)


@dataclass(frozen=True, slots=True)
class OutboxSample:
    taken_at: float  # time.monotonic() of the sample
    feed_end: int  # the last feed offset given
    unsequenced: int
    relay_lag: int | None  # with Kafka: sequenced rows not yet published
    relay_lag_s: float | None
    indexer_position: int | None  # without Kafka: the embedded indexer's cursor (None: not registered)
    indexer_lag: int | None
    indexer_lag_s: float | None
    backlog: int
    oldest_age_s: float  # 0 when the backlog is empty
    failing_rows: int = 0  # change logs in search_index_failure (refused by the search backend, retried later)
    failing_age_s: float | None = None  # since the oldest of them first failed
    last_failure: str | None = None  # the reason of the latest failure

    @property
    def age_s(self) -> float:
        return time.monotonic() - self.taken_at


def _age(now: float, *since: float | None) -> float | None:
    known = [s for s in since if s is not None]
    return max(0.0, now - min(known)) if known else None


class OutboxSampler:
    """The figures, and the ops connection (also used by the readiness checks: `run`)."""

    def __init__(self, settings: Settings, engine: AsyncEngine) -> None:
        self.settings = settings
        self.engine = engine
        self.kafka = bool(settings.kafka_bootstrap_servers)
        self.interval_s = settings.ops_sample_interval_s
        self.timeout_s = settings.ready_timeout_s
        self.latest: OutboxSample | None = None
        self.errors = 0
        self.last_error: str | None = None
        self._conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()

    def backlog(self) -> int | None:
        """The last sampled backlog (None before the first sample); what the write backpressure reads."""
        latest = self.latest
        return latest.backlog if latest is not None else None

    async def run_on_connection(self, work: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """`work` on the ops connection (opened or reopened as needed), within `ready_timeout_s`; on any error the
        connection is dropped (the next call reconnects)."""
        async with self._lock:
            try:
                async with asyncio.timeout(self.timeout_s):
                    if self._conn is None or self._conn.is_closed():
                        self._conn = await connect_dedicated(self.engine, "metaledger-ops")
                    return await work(self._conn)
            except BaseException:
                conn, self._conn = self._conn, None
                if conn is not None:
                    conn.terminate()
                raise

    async def sample(self) -> OutboxSample:
        row = await self.run_on_connection(lambda conn: conn.fetchrow(_KAFKA if self.kafka else _EMBEDDED, COUNT_CAP))
        assert row is not None
        now = row["now"]
        feed_end = row["feed_end"] or 0
        unsequenced = row["unsequenced"]
        if unsequenced >= COUNT_CAP and row["first_unsequenced_id"] is not None and row["last_id"] is not None:
            unsequenced = max(unsequenced, row["last_id"] - row["first_unsequenced_id"] + 1)
        relay_lag = relay_lag_s = indexer_lag = indexer_lag_s = None
        cursor = row["cursor"]
        if self.kafka:
            relay_lag = row["undelivered"]
            if relay_lag >= COUNT_CAP and row["first_undelivered"] is not None:
                relay_lag = max(relay_lag, feed_end - row["first_undelivered"] + 1)
            relay_lag_s = _age(now, row["undelivered_since"]) or 0.0
            backlog = unsequenced + relay_lag
            oldest = _age(now, row["unsequenced_since"], row["undelivered_since"])
        else:
            if cursor is not None:
                indexer_lag = max(0, feed_end - cursor)
                indexer_lag_s = _age(now, row["unindexed_since"]) or 0.0
            backlog = unsequenced + (indexer_lag or 0)
            oldest = _age(now, row["unsequenced_since"], row["unindexed_since"] if cursor is not None else None)
        sample = OutboxSample(
            taken_at=time.monotonic(),
            feed_end=feed_end,
            unsequenced=unsequenced,
            relay_lag=relay_lag,
            relay_lag_s=relay_lag_s,
            indexer_position=cursor,
            indexer_lag=indexer_lag,
            indexer_lag_s=indexer_lag_s,
            backlog=backlog,
            oldest_age_s=oldest or 0.0,
            failing_rows=row["failing_rows"],
            failing_age_s=_age(now, row["failing_since"]),
            last_failure=row["last_failure"],
        )
        self.latest = sample
        return sample

    async def refresh(self) -> OutboxSample | None:
        """A fresh sample, or the last one (possibly None) when the database cannot answer now."""
        try:
            return await self.sample()
        except Exception as error:  # noqa: BLE001 - a scrape reports what it has
            self._failed(error)
            return self.latest

    def _failed(self, error: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(error).__name__}: {error}"
        if self.errors == 1 or self.errors % 30 == 0:
            log.warning(
                "outbox sampler: the database cannot answer", extra={"error": self.last_error, "failures": self.errors}
            )

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sample()
            except Exception as error:  # noqa: BLE001 - sampling outlives database outages
                self._failed(error)
            await pause(stop, self.interval_s)

    async def close(self) -> None:
        async with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            await close_quietly(conn)
