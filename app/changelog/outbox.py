"""The outbox (table `change_log_outbox`, migrations 0001 and 0002) and all of its SQL: the change logs the write
path inserts (as one CTE of its single write statement: `INSERT_CTE`, `insert_params`), the sequencer, the
publisher's reads and marks, pruning, and the deletes of the Rest.li timeseries store (`OutboxRepository`). The
change feed's reads are in app.changelog.feed, the feed readers' positions in app.changelog.cursor.

Locks (advisory locks are per database, so several metaledger databases on one server do not interfere):

- sequencer: `pg_try_advisory_xact_lock(SEQUENCER_LOCK)`, held for one sequencing transaction; a relay that does not
  get it skips its turn (another relay is sequencing).
- lanes: `pg_try_advisory_lock(LANE_LOCK_CLASS, lane)`, session-level, on the publisher's own connection; only the
  holder publishes the lane's rows. Closing the connection (or a crash) releases them.
- membership: `pg_try_advisory_lock(MEMBER_LOCK_CLASS, pg_backend_pid())` on the same connection; the number of
  these locks in the database is the number of live publishers, from which each computes its fair share of lanes.
- pruning: `pg_try_advisory_xact_lock(PRUNE_LOCK)`, so two relays do not delete the same rows at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from app.audit.model import AuditedChange
from app.db import SessionRepository

LANES = 16  # the `lane` column is hashtext(urn) & 15 (migration 0002)

# Advisory lock keys: (class, id) pairs with a class no other part of metaledger uses ("ML" + n).
SEQUENCER_LOCK = 0x4D4C0001
PRUNE_LOCK = 0x4D4C0002
LANE_LOCK_CLASS = 0x4D4C0003
MEMBER_LOCK_CLASS = 0x4D4C0004


# --- the write path's inserts ----------------------------------------------------------------------------------


@dataclass(slots=True)
class OutboxRow:
    """One change log, as the write path stores it (in the transaction of the change it describes)."""

    topic: str
    message_key: str
    urn: str
    aspect: str
    version: int
    change_type: str
    payload: str
    audited: AuditedChange | None = None  # a change's own change log: what its audit entry records (app.audit)


INSERT_PARAMS = 7  # parameters of `insert_cte`


def insert_cte(first_param: int) -> str:
    """The body of a CTE (`WITH outboxed AS (<this>)`) that inserts change logs, for a caller's single write
    statement; its `INSERT_PARAMS` array parameters are numbered from `$first_param`, in the order of
    `insert_params`."""
    p = [f"${first_param + i}" for i in range(INSERT_PARAMS)]
    return f"""
                INSERT INTO change_log_outbox (topic, message_key, urn, aspect, version, change_type, payload)
                SELECT * FROM unnest({p[0]}::text[], {p[1]}::text[], {p[2]}::text[], {p[3]}::text[], {p[4]}::bigint[], {p[5]}::text[], {p[6]}::text[])
            """


def insert_params(rows: Sequence[OutboxRow]) -> tuple[list, ...]:
    """The parameter arrays of `insert_cte`, in order."""
    return (
        [r.topic for r in rows],
        [r.message_key for r in rows],
        [r.urn for r in rows],
        [r.aspect for r in rows],
        [r.version for r in rows],
        [r.change_type for r in rows],
        [r.payload for r in rows],
    )


# --- the sequencer ---------------------------------------------------------------------------------------------


async def sequence(conn: asyncpg.Connection, limit: int, horizon: int = 0) -> tuple[int, int]:
    """Give feed offsets to up to `limit` committed rows, in id order, continuing after the last offset given.

    Only rows whose transaction id is below the snapshot's xmin are taken: their transactions have finished, and any
    transaction still running has a txid at or above xmin, so it can only add rows that get later offsets. For one
    URN, the write path's row locks serialise writers, so id order is commit order.

    `horizon`: a transaction id below which every committed row already has an offset (0: not known), as returned
    by the previous call on the same database. A call that takes every row it may (fewer than `limit`) returns the
    xmin of the snapshot it read them with: no row without an offset is left below it, and no transaction running or
    still to come can add one there. While the database's xmin has not moved past the horizon, no row can be due and
    the call reads nothing but the xmin. A pass walks the unsequenced rows from the horizon on (the partial index
    `ix_change_log_outbox_unsequenced_txid`): under a flood that index holds thousands of entries of rows already
    sequenced that cannot be vacuumed yet, all of them below it.
    The horizon is also kept in `change_log_feed_state.sequenced_below` by the passes that sequence rows, for a
    sequencer that starts and for the sampler (app.ops.sampler). A stored horizon above the database's xmin is not this
    database's (a logical copy of another one: its transaction ids restarted lower) and is not used.
    Returns (rows sequenced, the horizon for the next call); 0 rows also when another relay holds the lock."""
    # The poll: one round trip, no transaction, no scan. (The xmin never decreases: transactions only end, and new
    # ones get ids above every running one.)
    if await conn.fetchval("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint") <= horizon:
        return 0, horizon
    async with conn.transaction():
        if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1::bigint)", SEQUENCER_LOCK):
            return 0, horizon  # another relay is sequencing: nothing learnt
        xmin, below, row_ids = await conn.fetchrow(
            """
            SELECT x::text::bigint, b::text::bigint, ARRAY(
                SELECT id FROM change_log_outbox WHERE feed_offset IS NULL AND txid >= b AND txid < x ORDER BY id LIMIT $1)
            FROM pg_snapshot_xmin(pg_current_snapshot()) AS x,
                 LATERAL (SELECT greatest($2::text::xid8, CASE WHEN s.sequenced_below <= x THEN s.sequenced_below
                                                            ELSE '0'::xid8 END) AS b
                          FROM change_log_feed_state s WHERE s.id = 1) AS h
            """,
            limit,
            str(horizon),
        )
        if not row_ids:
            return 0, xmin
        # with `limit` rows taken, more may be due below this xmin: the horizon stays until a pass takes them all
        horizon = xmin if len(row_ids) < limit else below
        # One statement: the last offset given (locked), the rows' offsets after it in id order, the new last offset.
        await conn.execute(
            """
            WITH given AS (
                SELECT last_offset FROM change_log_feed_state WHERE id = 1 FOR UPDATE
            ), offsets AS (
                UPDATE change_log_outbox o SET feed_offset = given.last_offset + s.n
                FROM given, unnest($1::bigint[]) WITH ORDINALITY AS s(id, n) WHERE o.id = s.id
            )
            UPDATE change_log_feed_state f SET last_offset = given.last_offset + cardinality($1::bigint[]),
                                               sequenced_below = $2::text::xid8
            FROM given WHERE f.id = 1
            """,
            row_ids,
            str(horizon),
        )
        return len(row_ids), horizon


# --- the publisher ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class PendingRow:
    id: int
    feed_offset: int
    topic: str
    key: str
    payload: bytes
    aspect: str
    lane: int


@dataclass(slots=True)
class LaneFront:
    """A lane's first sequenced, undelivered row: its feed offset and when it was written."""

    feed_offset: int
    created_at: datetime


async def join_publishers(conn: asyncpg.Connection) -> None:
    await conn.fetchval("SELECT pg_try_advisory_lock($1::int, pg_backend_pid())", MEMBER_LOCK_CLASS)


async def count_publishers(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(
        """
        SELECT count(*) FROM pg_locks
        WHERE locktype = 'advisory' AND granted AND classid = $1::bigint::oid AND objsubid = 2
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
        """,
        MEMBER_LOCK_CLASS,
    )


async def try_lock_lane(conn: asyncpg.Connection, lane: int) -> bool:
    return await conn.fetchval("SELECT pg_try_advisory_lock($1::int, $2::int)", LANE_LOCK_CLASS, lane)


async def unlock_lane(conn: asyncpg.Connection, lane: int) -> None:
    await conn.fetchval("SELECT pg_advisory_unlock($1::int, $2::int)", LANE_LOCK_CLASS, lane)


async def pending(conn: asyncpg.Connection, lanes: Sequence[int], limit: int, after: int = 0) -> list[PendingRow]:
    """The oldest sequenced, undelivered rows of the given lanes after offset `after`, in feed order."""
    records = await conn.fetch(
        """
        SELECT id, feed_offset, topic, message_key, convert_to(payload, 'UTF8'), aspect, lane FROM change_log_outbox
        WHERE delivered_at IS NULL AND feed_offset > $3 AND publish_error IS NULL AND lane = ANY($1::smallint[])
        ORDER BY feed_offset LIMIT $2
        """,
        list(lanes),
        limit,
        after,
    )
    return [PendingRow(*r) for r in records]


async def lane_fronts(conn: asyncpg.Connection, lanes: Sequence[int]) -> tuple[dict[int, LaneFront], int]:
    """The first sequenced, undelivered row of each given lane that has one, and the last feed offset given so far
    (no relay can have published a row after it)."""
    records = await conn.fetch(
        """
        SELECT l.lane, o.feed_offset, o.created_at, (SELECT last_offset FROM change_log_feed_state WHERE id = 1)
        FROM unnest($1::smallint[]) AS l(lane)
        LEFT JOIN LATERAL (
            SELECT feed_offset, created_at FROM change_log_outbox
            WHERE delivered_at IS NULL AND feed_offset IS NOT NULL AND publish_error IS NULL AND lane = l.lane
            ORDER BY feed_offset LIMIT 1
        ) o ON true
        """,
        list(lanes),
    )
    fronts = {r[0]: LaneFront(r[1], r[2]) for r in records if r[1] is not None}
    return fronts, records[0][3] if records else 0


async def mark_delivered(conn: asyncpg.Connection, ids: Sequence[int]) -> None:
    await conn.execute("UPDATE change_log_outbox SET delivered_at = now() WHERE id = ANY($1::bigint[])", list(ids))


async def mark_failed(conn: asyncpg.Connection, row_id: int, error: str) -> None:
    await conn.execute("UPDATE change_log_outbox SET publish_error = $2 WHERE id = $1", row_id, error)


# --- pruning ---------------------------------------------------------------------------------------------------


async def prune(
    conn: asyncpg.Connection, retention_s: float, *, kafka: bool, after: int, chunk: int = 5000, max_rows: int = 100_000
) -> tuple[int, int]:
    """Delete the oldest sequenced rows created more than `retention_s` seconds ago: with Kafka, delivered ones only, walking the feed
    in offset order and stopping at the first row too young or not yet delivered (rows Kafka refused, marked with a
    publish error, are stepped over and kept). Without Kafka the feed is the only reader: every sequenced row older
    than the cutoff goes. Either way rows past a registered feed reader's position (app.changelog.cursor: rows it has
    not applied yet) are kept; with Kafka the search indexer's is not counted (Spark indexes from Kafka). `after` is where the previous call stopped (an offset below which only kept rows remain).
    Returns (rows deleted, new `after`)."""
    deleted = 0
    while deleted < max_rows:
        async with conn.transaction():
            if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1::bigint)", PRUNE_LOCK):
                return deleted, after
            records = await conn.fetch(
                """
                SELECT feed_offset, created_at < now() - make_interval(secs => $2) AS old,
                       delivered_at IS NOT NULL AS delivered,
                       publish_error IS NOT NULL AS refused
                FROM change_log_outbox WHERE feed_offset > $1
                  AND feed_offset <= COALESCE((SELECT min(last_offset) FROM feed_reader_state
                                               WHERE NOT $4 OR reader <> 'search-indexer'), feed_offset)
                ORDER BY feed_offset LIMIT $3
                """,
                after,
                retention_s,
                chunk,
                kafka,
            )
            doomed: list[int] = []
            stopped = False
            for offset, old, delivered, refused in records:
                if not old or (kafka and not delivered and not refused):
                    stopped = True
                    break
                if not kafka or delivered:
                    doomed.append(offset)
                after = offset
            if doomed:
                await conn.execute("DELETE FROM change_log_outbox WHERE feed_offset = ANY($1::bigint[])", doomed)
                deleted += len(doomed)
        if stopped or len(records) < chunk:
            break
    return deleted, after


# --- the Rest.li timeseries store ------------------------------------------------------------------------------


class OutboxRepository(SessionRepository):
    """Outbox statements that run on the request's session (and so join its transaction)."""

    async def delete_timeseries(
        self, topic: str, urn: str, aspects: Sequence[str], start: int | None, end: int | None
    ) -> int:
        """Delete the points of an entity's timeseries aspects in [start, end] (either bound optional). Rows not yet
        published to Kafka are deleted too: a deleted point is never published."""
        if not aspects:
            return 0
        conn = await self._conn()
        status = await conn.execute(
            """
            DELETE FROM change_log_outbox
            WHERE topic = $1 AND urn = $2 AND aspect = ANY($3::text[])
              AND ($4::bigint IS NULL OR version >= $4) AND ($5::bigint IS NULL OR version <= $5)
            """,
            topic, urn, list(aspects), start, end,
        )  # fmt: skip
        return int(status.rsplit(" ", 1)[1])
