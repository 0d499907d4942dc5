"""The sequencer: change-feed offsets in commit order, and pruning of the outbox.

It gives consecutive `feed_offset`s to committed outbox rows in id order (`outbox.sequence`: one sequencer at a time,
by a transaction-level advisory lock, so several may run; its poll reads only the database's xmin until a
transaction has ended since the last pass), then every few seconds prunes rows past
`outbox_retention_hours` (`outbox.prune`: delivered rows with Kafka; every sequenced row without it, except those
the embedded indexer has not applied yet). It runs inside the outbox relay (app.kafka.relay), with or without Kafka:
the change feed and the embedded indexer read rows by their offsets.
"""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from app.changelog import outbox
from app.db import close_quietly, connect_dedicated
from app.settings import Settings
from app.workers import pause

log = logging.getLogger("metaledger.sequencer")

MAX_BACKOFF_S = 5.0  # database reconnects
SEQUENCE_BATCHES = 4  # offsets for up to this many publishing batches per transaction


class Sequencer:
    def __init__(self, settings: Settings, engine: AsyncEngine, wake: asyncio.Event | None = None) -> None:
        self.settings = settings
        self.engine = engine
        self.wake = wake  # set when rows got offsets (the publisher has work)
        # figures, for tests, benchmarks and logs
        self.sequenced = 0  # rows given a feed offset by this sequencer
        self.pruned = 0
        self.prune_passes = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Sequence and prune until `stop`; database outages are retried with backoff."""
        poll = self.settings.relay_poll_interval_ms / 1000
        batch = max(1, self.settings.relay_batch_size) * SEQUENCE_BATCHES
        retention_s = self.settings.outbox_retention_hours * 3600
        prune_every = min(60.0, max(1.0, retention_s / 4))
        prune_after = 0  # offsets at or below this are pruned or kept for good (see outbox.prune)
        next_prune = time.monotonic() + min(prune_every, 5.0)
        failures = 0
        while not stop.is_set():
            conn: asyncpg.Connection | None = None
            try:
                conn = await connect_dedicated(self.engine, "metaledger-sequencer")
                # learnt again on every connection: after a reconnect the database may be another one (a restored
                # copy) whose transaction ids are below the old horizon
                horizon = 0
                while not stop.is_set():
                    count, horizon = await outbox.sequence(conn, batch, horizon)
                    failures = 0
                    if count:
                        self.sequenced += count
                        if self.wake is not None:
                            self.wake.set()
                    if time.monotonic() >= next_prune:
                        deleted, prune_after = await outbox.prune(
                            conn, retention_s, kafka=bool(self.settings.kafka_bootstrap_servers), after=prune_after
                        )
                        self.prune_passes += 1
                        if deleted:
                            self.pruned += deleted
                            log.info("outbox pruned", extra={"rows": deleted})
                        next_prune = time.monotonic() + prune_every
                    if count < batch:
                        await pause(stop, poll)
            except Exception as error:  # noqa: BLE001 - the relay outlives database restarts
                failures += 1
                log.warning("sequencer: database error; retrying", extra={"error": f"{type(error).__name__}: {error}"})
                await pause(stop, min(MAX_BACKOFF_S, 0.2 * 2**failures))
            finally:
                if conn is not None:
                    await close_quietly(conn)
