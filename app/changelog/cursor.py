"""Feed readers' positions: how far a reader of the change feed has applied it.

A position is a feed offset: every outbox row with `feed_offset <= position` has been applied by the reader. The
changelog owns the positions (their SQL lives here, with the outbox's) so that pruning can honour them: without
Kafka, `outbox.prune` keeps every row past a registered reader's position.

Storage: the table `feed_reader_state` (migration 0009): one row per reader, by name. The readers are the embedded
search indexer (app.search.worker, SEARCH_INDEXER), the change processors' after phase
(app.write.after_processors, CHANGE_PROCESSORS) and the removal of deleted structured properties' values
(app.write.structured_property_deletes, STRUCTURED_PROPERTY_DELETES).
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from app.db import SessionRepository

SEARCH_INDEXER = "search-indexer"
CHANGE_PROCESSORS = "change-processors"
STRUCTURED_PROPERTY_DELETES = "structured-property-deletes"


class UnregisteredReader(RuntimeError):
    """A reader read its position before `register` created it."""

    def __init__(self, reader: str) -> None:
        super().__init__(f"the feed reader {reader!r} has no position: it was not registered")


class FeedCursor:
    """A reader's position in the feed, on the reader's own connection.

    Several processes running the same reader serialise on it: in a transaction, `read_locked` (the position, locked,
    and the rows past it), apply, `advance`, commit."""

    def __init__(self, conn: asyncpg.Connection, reader: str = SEARCH_INDEXER) -> None:
        self.conn = conn
        self.reader = reader

    def transaction(self) -> asyncpg.transaction.Transaction:
        """A transaction on the reader's connection: a `lock` taken in it is held until it ends."""
        return self.conn.transaction()

    async def register(self, start: int = 0) -> None:
        """Create the position (at `start`) if it does not exist; from then on pruning keeps the rows past it."""
        await self.conn.execute(
            "INSERT INTO feed_reader_state (reader, last_offset) VALUES ($1, $2) ON CONFLICT (reader) DO NOTHING",
            self.reader,
            start,
        )

    async def poll(self) -> tuple[int, bool]:
        """The position (without a lock) and whether the feed holds any row past it: the idle poll, one round trip."""
        # ORDER BY ... LIMIT 1 walks the feed_offset index whatever the table's statistics say (an EXISTS was planned
        # as a sequential scan of the outbox while its statistics were stale, at every idle poll)
        record = await self.conn.fetchrow(
            """
            SELECT s.last_offset,
                   (SELECT o.feed_offset FROM change_log_outbox o WHERE o.feed_offset > s.last_offset
                    ORDER BY o.feed_offset LIMIT 1) IS NOT NULL AS more
            FROM feed_reader_state s WHERE s.reader = $1
            """,
            self.reader,
        )
        if record is None:
            raise UnregisteredReader(self.reader)
        return record["last_offset"], record["more"]

    async def feed_end(self) -> int:
        """The offset of the last sequenced row of the feed."""
        return await self.conn.fetchval("SELECT last_offset FROM change_log_feed_state WHERE id = 1")

    async def read_locked(self, limit: int, topics: Sequence[str]) -> tuple[int, list[asyncpg.Record]]:
        """The position, locked (`FOR UPDATE`) until the caller's transaction ends, and the next `limit` rows past it,
        in feed order, in one round trip: records (`feed_offset`, `id`, `topic`, `urn`, `aspect`, `version`,
        `change_type`, `payload`) with the payload (the change log's JSON text) for rows of `topics`, None for the
        others (counted, not read)."""
        records = await self.conn.fetch(
            """
            SELECT s.last_offset AS position, o.*
            FROM (SELECT last_offset FROM feed_reader_state WHERE reader = $1 FOR UPDATE) s
            LEFT JOIN LATERAL (
                SELECT feed_offset, id, topic, urn, aspect, version, change_type,
                       CASE WHEN topic = ANY($3::text[]) THEN payload END AS payload
                FROM change_log_outbox WHERE feed_offset > s.last_offset ORDER BY feed_offset LIMIT $2
            ) o ON true
            """,
            self.reader,
            limit,
            list(topics),
        )
        if not records:
            raise UnregisteredReader(self.reader)
        if records[0]["feed_offset"] is None:  # no row past the position: the lateral join's one empty match
            return records[0]["position"], []
        return records[0]["position"], records

    async def skip_to_end(self) -> None:
        """Move the position to the feed's end without reading a row: a reader with nothing to apply (the after phase
        with no after processor) passes every row sequenced so far in one statement."""
        await self.conn.execute(
            """
            UPDATE feed_reader_state s SET last_offset = f.last_offset, updated_at = now()
            FROM change_log_feed_state f WHERE s.reader = $1 AND f.id = 1 AND f.last_offset > s.last_offset
            """,
            self.reader,
        )

    async def deletes_locked(
        self, limit: int, topic: str, aspects: Sequence[str], urn_prefix: str
    ) -> tuple[int, int, list[asyncpg.Record]]:
        """The position, locked (`FOR UPDATE`) until the caller's transaction ends, the offset of the last of the next
        `limit` rows past it (the position when there is none), and those of them that are DELETEs of `aspects` of an
        entity whose URN starts with `urn_prefix` on `topic`, in feed order: records (`feed_offset`, `urn`, `aspect`,
        `version`). One round trip; the other rows are passed over in the database, not read."""
        records = await self.conn.fetch(
            """
            SELECT s.last_offset AS position, coalesce(w.window_end, s.last_offset) AS window_end,
                   d.feed_offset, d.urn, d.aspect, d.version
            FROM (SELECT last_offset FROM feed_reader_state WHERE reader = $1 FOR UPDATE) s
            CROSS JOIN LATERAL (
                SELECT max(feed_offset) AS window_end FROM (
                    SELECT feed_offset FROM change_log_outbox WHERE feed_offset > s.last_offset
                    ORDER BY feed_offset LIMIT $2) o
            ) w
            LEFT JOIN LATERAL (
                SELECT feed_offset, urn, aspect, version FROM change_log_outbox
                WHERE feed_offset > s.last_offset AND feed_offset <= w.window_end
                  AND topic = $3 AND change_type = 'DELETE' AND aspect = ANY($4::text[]) AND starts_with(urn, $5)
            ) d ON true
            ORDER BY d.feed_offset
            """,
            self.reader,
            limit,
            topic,
            list(aspects),
            urn_prefix,
        )
        if not records:
            raise UnregisteredReader(self.reader)
        first = records[0]
        return first["position"], first["window_end"], [r for r in records if r["feed_offset"] is not None]

    async def advance(self, position: int) -> None:
        """Move the position to `position` (every row up to it is applied)."""
        await self.conn.execute(
            "UPDATE feed_reader_state SET last_offset = $2, updated_at = now() WHERE reader = $1", self.reader, position
        )


class FeedCursorRepository(SessionRepository):
    """Read-your-writes checks against the embedded indexer's position, on a request's session."""

    async def latest_change_log_id(self) -> int | None:
        """The id of the newest change log in the outbox (None when it is empty)."""
        conn = await self._conn()
        return await conn.fetchval("SELECT max(id) FROM change_log_outbox")

    async def applied_through(self, target: int) -> bool:
        """Every outbox row up to id `target` is sequenced and applied by the reader."""
        conn = await self._conn()
        return await conn.fetchval(
            """
            SELECT NOT EXISTS (
                SELECT 1 FROM change_log_outbox
                WHERE id <= $1 AND (feed_offset IS NULL
                      OR feed_offset > coalesce((SELECT last_offset FROM feed_reader_state WHERE reader = $2), 0)))
            """,
            target,
            SEARCH_INDEXER,
        )
