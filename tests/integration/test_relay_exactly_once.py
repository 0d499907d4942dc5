"""No duplicate on the broker after a restart of the database or of the relay (real Postgres, real Tansu broker).

The fault lands between the broker's acknowledgement and the delivered mark: a trigger on the mark either ends the
marking connection (`pg_terminate_backend`) or parks it on an advisory lock the test holds, while the test restarts
the database (`pg_ctl stop -m fast` / `start`) or kills the relay process with SIGKILL and starts another. Every
outbox row must then be on the topic exactly once, in per-URN order, and the relay that resumed must have found rows
on the broker (so the fault did land between produce and mark).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import asyncpg
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from app.db import upgrade_database
from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port
from app.kafka.relay import FEED_OFFSET_HEADER, LANE_HEADER
from app.settings import Settings
from tests.helpers import run_relay, unique_topics, wait_delivered
from tests.processes import service_env

URNS = 40
VERSIONS = 5
BATCH = 20  # rows a relay publishes at a time: the fault leaves at least one batch produced and unmarked
FAULT_LOCK = 0x4D4C7E57  # the advisory lock a parked mark waits for

FAULTS = """
CREATE SEQUENCE fault_once;
CREATE FUNCTION fault_at_mark() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('fault_once') = 1 THEN  -- the first row of the first mark only (a sequence is not rolled back)
        IF TG_ARGV[0] = 'terminate' THEN
            PERFORM pg_terminate_backend(pg_backend_pid());
            PERFORM pg_sleep(10);  -- the termination lands here
        ELSE
            PERFORM pg_advisory_lock(%d);
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER fault_at_mark BEFORE UPDATE ON change_log_outbox FOR EACH ROW
    WHEN (OLD.delivered_at IS NULL AND NEW.delivered_at IS NOT NULL) EXECUTE FUNCTION fault_at_mark('%s');
"""


def plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def fill_outbox(db: asyncpg.Connection, topic: str) -> None:
    """URNS × VERSIONS change logs, the versions of each URN in order, URNs interleaved (so in many lanes)."""
    rows = [
        (f"urn:li:dataset:(urn:li:dataPlatform:hive,exactly.once{u},PROD)", v)
        for v in range(1, VERSIONS + 1)
        for u in range(URNS)
    ]
    await db.execute(
        """
        INSERT INTO change_log_outbox (topic, message_key, urn, aspect, version, change_type, payload)
        SELECT $1, urn, urn, 'status', version, 'UPSERT', json_build_object('urn', urn, 'version', version)::text
        FROM unnest($2::text[], $3::bigint[]) AS r(urn, version)
        """,
        topic, [u for u, _ in rows], [v for _, v in rows],
    )  # fmt: skip


async def install_fault(db: asyncpg.Connection, kind: str) -> None:
    await db.execute(FAULTS % (FAULT_LOCK, kind))


async def wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def parked_marks(db: asyncpg.Connection) -> list[int]:
    """The backends waiting for FAULT_LOCK: marks parked after their rows were produced."""
    return [
        r[0]
        for r in await db.fetch(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = $1::bigint::oid",
            FAULT_LOCK & 0xFFFFFFFF,
        )
    ]


async def topic_records(bootstrap: str, topic: str) -> list[tuple[str, int, int, int]]:
    """Every record of the topic's one partition up to its high watermark: (key, version, feed offset, lane)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=10
    )
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        records = []
        while consumer.highwater(partition) is None or await consumer.position(partition) < consumer.highwater(
            partition
        ):
            for r in (await consumer.getmany(partition, timeout_ms=100)).get(partition, ()):
                headers = dict(r.headers)
                records.append(
                    (
                        r.key.decode(),
                        orjson.loads(r.value)["version"],
                        int(headers[FEED_OFFSET_HEADER]),
                        int(headers[LANE_HEADER]),
                    )
                )
        return records
    finally:
        await consumer.stop()


async def assert_exactly_once(db: asyncpg.Connection, bootstrap: str, topic: str) -> None:
    """Each outbox row once on the topic, with its own feed offset and lane, each URN's versions in order."""
    total = await wait_delivered(db, timeout=60)
    assert total == URNS * VERSIONS
    rows = {
        r["feed_offset"]: (r["message_key"], r["version"], r["lane"])
        for r in await db.fetch("SELECT feed_offset, message_key, version, lane FROM change_log_outbox")
    }
    records = await topic_records(bootstrap, topic)
    offsets = [offset for _, _, offset, _ in records]
    assert len(offsets) == len(set(offsets)), f"{len(offsets) - len(set(offsets))} records on the topic twice"
    assert {offset: (key, version, lane) for key, version, offset, lane in records} == rows  # nothing lost
    versions: dict[str, list[int]] = defaultdict(list)
    for key, version, _, _ in records:
        versions[key].append(version)
    assert all(seen == list(range(1, VERSIONS + 1)) for seen in versions.values()), versions


def relay_settings(database_url: str, bootstrap: str, topics: dict[str, str]) -> Settings:
    return Settings(
        database_url=database_url,
        kafka_bootstrap_servers=bootstrap,
        kafka_value_format="json",
        relay_batch_size=BATCH,
        **topics,
    )


@pytest.fixture
def topics() -> dict[str, str]:
    return unique_topics()


async def test_a_connection_lost_at_the_mark_publishes_nothing_twice(database_url, db, kafka_broker, topics):
    topic = topics["topic_mcl_versioned"]
    await install_fault(db, "terminate")
    await fill_outbox(db, topic)
    relay, finish = await run_relay(relay_settings(database_url, kafka_broker.bootstrap_servers, topics))
    try:
        await assert_exactly_once(db, kafka_broker.bootstrap_servers, topic)
        assert await db.fetchval("SELECT last_value FROM fault_once") > 1  # the fault fired, and marks went on
        assert relay.publisher.found_published >= BATCH  # the first batch was on the broker, unmarked
    finally:
        await finish()


@pytest.fixture
def own_postgres():
    """A Postgres server of this test's own, to restart (the run's shared server stays up)."""
    base = Path(tempfile.mkdtemp(prefix="metaledger-test-restart-"))
    server = EmbeddedPostgres(base, free_port(), database=None, durable=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


async def test_a_database_restart_between_produce_and_mark_publishes_nothing_twice(own_postgres, kafka_broker, topics):
    ensure_database(own_postgres.admin_dsn, "restarted")
    database_url = own_postgres.url("restarted")
    await asyncio.to_thread(upgrade_database, database_url)
    topic = topics["topic_mcl_versioned"]
    db = await asyncpg.connect(plain(database_url))
    await install_fault(db, "park")
    await db.fetchval("SELECT pg_advisory_lock($1::bigint)", FAULT_LOCK)
    await fill_outbox(db, topic)
    relay, finish = await run_relay(relay_settings(database_url, kafka_broker.bootstrap_servers, topics))
    try:
        await wait_for(lambda: parked_marks(db), "a mark parked after its batch was produced")
        await asyncio.to_thread(own_postgres.stop)  # pg_ctl stop -m fast: every session is terminated
        await asyncio.to_thread(own_postgres.start)
        db = await asyncpg.connect(plain(database_url))
        await assert_exactly_once(db, kafka_broker.bootstrap_servers, topic)
        assert relay.publisher.found_published >= BATCH
    finally:
        await finish()
        await db.close()


async def test_a_relay_killed_between_produce_and_mark_is_taken_over_without_duplicates(
    database_url, db, kafka_broker, topics
):
    topic = topics["topic_mcl_versioned"]
    await install_fault(db, "park")
    await db.fetchval("SELECT pg_advisory_lock($1::bigint)", FAULT_LOCK)
    await fill_outbox(db, topic)
    env = {
        "METALEDGER_DATABASE_URL": database_url,
        "METALEDGER_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers,
        "METALEDGER_KAFKA_VALUE_FORMAT": "json",
        "METALEDGER_RELAY_BATCH_SIZE": str(BATCH),
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
        **{f"METALEDGER_{name.upper()}": value for name, value in topics.items()},
    }
    doomed = subprocess.Popen(
        [str(Path(sys.executable).with_name("metaledger")), "relay"],
        env=service_env(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_for(lambda: parked_marks(db), "the first relay's mark parked after its batch was produced", 60)
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(10)
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(10)
    # The server would notice the dead client only once the parked statement ends: end it now, as if it had.
    await db.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", await parked_marks(db))
    await db.fetchval("SELECT pg_advisory_unlock($1::bigint)", FAULT_LOCK)
    assert await db.fetchval("SELECT count(*) FROM change_log_outbox WHERE delivered_at IS NOT NULL") == 0
    relay, finish = await run_relay(relay_settings(database_url, kafka_broker.bootstrap_servers, topics))
    try:
        await assert_exactly_once(db, kafka_broker.bootstrap_servers, topic)
        assert relay.publisher.found_published >= BATCH
    finally:
        await finish()
