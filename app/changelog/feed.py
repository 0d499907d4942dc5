"""The change feed: the outbox's change logs in commit order, for readers without Kafka (served over HTTP by
app.api.change_feed: metaledger's page API and DataHub's Events API long poll).

Offsets are assigned by the relay's sequencer (`app.changelog.outbox.sequence`) once a change log's transaction and
every transaction that could precede it have finished, so the feed only grows at its end: a reader that keeps the
`next_offset` of each page and asks again from it sees every change log exactly once, in commit order per URN (and
in one total order for all URNs). Rows leave the feed when the relay prunes them (`outbox_retention_hours`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import driver_connection
from app.settings import Settings


@dataclass(slots=True)
class FeedEvent:
    """One change log of the feed."""

    offset: int  # position in the feed (commit order)
    topic: str  # the Kafka topic it is (or would be) published to
    key: str  # the Kafka message key
    urn: str
    aspect: str
    version: int  # the aspect version (timeseries aspects: the timestamp in milliseconds)
    change_type: str
    created_at_ms: int  # when the change was written, epoch milliseconds
    payload: str  # the change log's JSON text, exactly as published to Kafka


async def read_feed(conn: asyncpg.Connection, after: int, limit: int, topics: Sequence[str]) -> list[asyncpg.Record]:
    """Sequenced rows after `after`, in feed (commit) order, of the given topics."""
    return await conn.fetch(
        """
        SELECT feed_offset, topic, message_key, urn, aspect, version, change_type, created_at, payload
        FROM change_log_outbox
        WHERE feed_offset > $1 AND topic = ANY($3::text[])
        ORDER BY feed_offset LIMIT $2
        """,
        after,
        limit,
        list(topics),
    )


def feed_topics(settings: Settings) -> tuple[list[str], list[str]]:
    """The change feed's (default topics, every topic that may be asked for): the change logs, and the
    platform events on request."""
    default = list(dict.fromkeys([settings.topic_mcl_versioned, settings.topic_mcl_timeseries]))
    allowed = list(dict.fromkeys([*default, settings.topic_platform_event]))
    return default, allowed


async def read_page(engine: AsyncEngine, after: int, limit: int, topics: Sequence[str]) -> tuple[list[FeedEvent], int]:
    """Up to `limit` change logs of `topics` after offset `after`, in feed order, and the offset to continue from
    (the last one returned, or `after` when there is none). Only change logs whose place in the order is final are
    returned."""
    async with engine.connect() as connection:
        raw = driver_connection(await connection.get_raw_connection())
        records = await read_feed(raw, after, limit, topics)
    events = [
        FeedEvent(
            r["feed_offset"], r["topic"], r["message_key"], r["urn"], r["aspect"], r["version"], r["change_type"],
            int(r["created_at"].timestamp() * 1000), r["payload"],
        )
        for r in records
    ]  # fmt: skip
    return events, events[-1].offset if events else after


async def last_offset(engine: AsyncEngine) -> int:
    """The last offset the sequencer gave: a reader starting from it sees only what comes next."""
    async with engine.connect() as connection:
        raw = driver_connection(await connection.get_raw_connection())
        return await raw.fetchval("SELECT last_offset FROM change_log_feed_state WHERE id = 1")


async def offset_before(engine: AsyncEngine, since: datetime) -> int:
    """The offset to continue from to read every change log written since `since` (still in the feed)."""
    async with engine.connect() as connection:
        raw = driver_connection(await connection.get_raw_connection())
        first = await raw.fetchval(
            "SELECT min(feed_offset) FROM change_log_outbox WHERE feed_offset IS NOT NULL AND created_at >= $1",
            since.replace(tzinfo=None),
        )
        if first is not None:
            return first - 1
        return await raw.fetchval("SELECT last_offset FROM change_log_feed_state WHERE id = 1")


async def poll(
    engine: AsyncEngine, after: int, limit: int, topics: Sequence[str], timeout_s: float, interval_s: float = 0.1
) -> tuple[list[FeedEvent], int]:
    """`read_page`, waiting up to `timeout_s` for a first change log when there is none yet (a long poll)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        events, next_offset = await read_page(engine, after, limit, topics)
        if events or asyncio.get_running_loop().time() >= deadline:
            return events, next_offset
        await asyncio.sleep(interval_s)
