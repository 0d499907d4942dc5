"""A feed reader's position (app.changelog.cursor.FeedCursor) moved without reading the rows it passes: `skip_to_end`
(the after phase with no after processor) and `deletes_locked` (the removal of a deleted structured property's values,
which reads only the DELETEs it acts on), each alone and where it must not move or match."""

from __future__ import annotations

import asyncpg
import pytest

from app.changelog.cursor import CHANGE_PROCESSORS, FeedCursor, UnregisteredReader
from app.write.after_processors import AfterProcessorWorker

VERSIONED = "MetadataChangeLog_Versioned_v1"
PROPERTY = "urn:li:structuredProperty:io.acryl.tier"
DATASET = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"
READER = "a-reader"


async def feed(db: asyncpg.Connection, *rows: tuple[str, str, str, str]) -> None:
    """Sequenced change logs (topic, urn, aspect, change type) at feed offsets 1, 2, ... in order."""
    for offset, (topic, urn, aspect, change_type) in enumerate(rows, start=1):
        await db.execute(
            """INSERT INTO change_log_outbox (topic, message_key, urn, aspect, version, change_type, payload, feed_offset)
               VALUES ($1, $2, $2, $3, 1, $4, '{}', $5)""",
            topic, urn, aspect, change_type, offset,
        )  # fmt: skip
    await db.execute("UPDATE change_log_feed_state SET last_offset = $1 WHERE id = 1", len(rows))


async def position(db: asyncpg.Connection, reader: str = READER) -> int:
    return await db.fetchval("SELECT last_offset FROM feed_reader_state WHERE reader = $1", reader)


def upsert(urn: str = DATASET, aspect: str = "status") -> tuple[str, str, str, str]:
    return (VERSIONED, urn, aspect, "UPSERT")


def delete(
    urn: str = PROPERTY, aspect: str = "propertyDefinition", topic: str = VERSIONED
) -> tuple[str, str, str, str]:
    return (topic, urn, aspect, "DELETE")


async def deletes(cursor: FeedCursor, limit: int = 10) -> tuple[int, int, list[tuple[int, str, str]]]:
    async with cursor.transaction():
        at, end, rows = await cursor.deletes_locked(
            limit, VERSIONED, ("propertyDefinition", "structuredPropertyKey"), "urn:li:structuredProperty:"
        )
    return at, end, [(r["feed_offset"], r["urn"], r["aspect"]) for r in rows]


async def test_skip_to_end_passes_every_sequenced_row(db):
    await feed(db, upsert(), upsert(), upsert())
    cursor = FeedCursor(db, READER)
    await cursor.register(start=1)
    await cursor.skip_to_end()
    assert await position(db) == 3


async def test_skip_to_end_never_moves_a_position_back(db):
    await feed(db, upsert(), upsert())
    cursor = FeedCursor(db, READER)
    await cursor.register(start=5)  # past the feed's end (a reset feed state): kept, not lowered
    await cursor.skip_to_end()
    assert await position(db) == 5


async def test_deletes_locked_returns_only_the_deletes_it_acts_on_and_the_window_end(db):
    await feed(
        db,
        upsert(),  # 1: another change
        delete(aspect="status"),  # 2: a DELETE of another aspect of a property
        delete(urn=DATASET, aspect="propertyDefinition"),  # 3: of an entity that is no property
        delete(topic="PlatformEvent_v1"),  # 4: another topic
        delete(aspect="propertyDefinition"),  # 5
        upsert(urn=PROPERTY, aspect="propertyDefinition"),  # 6: an UPSERT of a definition
        delete(aspect="structuredPropertyKey"),  # 7
    )
    cursor = FeedCursor(db, READER)
    await cursor.register()
    assert await deletes(cursor) == (
        0,
        7,
        [(5, PROPERTY, "propertyDefinition"), (7, PROPERTY, "structuredPropertyKey")],
    )


async def test_deletes_locked_looks_no_further_than_its_limit(db):
    await feed(db, upsert(), upsert(), delete(), upsert())
    cursor = FeedCursor(db, READER)
    await cursor.register()
    assert await deletes(cursor, limit=2) == (0, 2, [])  # the DELETE at 3 is the next window's
    await cursor.advance(2)
    assert await deletes(cursor, limit=2) == (2, 4, [(3, PROPERTY, "propertyDefinition")])


async def test_deletes_locked_past_the_end_is_the_position_itself(db):
    await feed(db, upsert())
    cursor = FeedCursor(db, READER)
    await cursor.register(start=1)
    assert await deletes(cursor) == (1, 1, [])
    with pytest.raises(UnregisteredReader):
        await FeedCursor(db, "never-registered").deletes_locked(10, VERSIONED, ("propertyDefinition",), "urn:li:")


async def test_the_after_phase_without_after_processors_reads_no_row(app, db, monkeypatch):
    await feed(db, upsert(), upsert(), upsert())

    async def read_locked(*args, **kwargs):
        raise AssertionError("the after phase read rows while no after processor runs")

    monkeypatch.setattr(FeedCursor, "read_locked", read_locked)
    state = app.state
    worker = AfterProcessorWorker(state.settings, state.engine, state.sessionmaker, state.write_service)
    await FeedCursor(db, CHANGE_PROCESSORS).register()
    assert await worker.step() == 0  # nothing processed: the poll pauses
    assert await position(db, CHANGE_PROCESSORS) == 3
