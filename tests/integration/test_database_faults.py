"""Real database faults against a real `metaledger serve` process, on a Postgres of this module's own (restarting the
session's shared one would break the other tests):

- `pg_ctl restart -m fast`, then a stop / a few seconds / start, under several concurrent writers and a reader: no
  500, no connection closed without an answer, every failure a 503 with Retry-After, and every acknowledged write
  stored with exactly one change log;
- a connection lost during COMMIT, parked there on purpose: after the server committed (a COMMIT waiting for a
  synchronous standby that does not exist is committed locally), before it did (a deferred trigger waiting for an
  advisory lock the test holds), and with the database gone for longer than the service waits: each answer tells
  the truth, and retrying the same write creates no second version and no second change log.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.db import upgrade_database
from app.embedded_pg import EmbeddedPostgres, free_port
from app.write.service import COMMIT_CHECK_S
from tests.helpers import ds, eventually, mcp
from tests.processes import SYSTEM_AUTH, start_service, stop_process, wait_healthy

WRITERS = 6
MCL = "MetadataChangeLog_Versioned_v1"
READ_URN = ds("faults.read")
PARK_LOCK = 0x7E57  # the advisory lock the deferred trigger waits for


@pytest.fixture(scope="module")
def own_pg() -> Iterator[EmbeddedPostgres]:
    base = Path(tempfile.mkdtemp(prefix="metaledger-faults-pg-"))
    pg = EmbeddedPostgres(base, free_port(), database="faults", durable=False)
    try:
        pg.start()
        upgrade_database(pg.url())
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(base, ignore_errors=True)


def pg_ctl(pg: EmbeddedPostgres, *args: str) -> None:
    # -l: a server started by pg_ctl keeps its output open, on which pg_ctl's caller would wait for ever
    done = pg._pg_run(
        [str(pg.bin_dir / "pg_ctl"), *args, "-D", str(pg.pgdata), "-l", str(pg.log_file), "-w", "-t", "60"]
    )
    assert done.returncode == 0, done.stdout + done.stderr


def start_again(pg: EmbeddedPostgres) -> None:
    pg.start()  # with the options it was first started with


@pytest_asyncio.fixture(scope="module")
async def service(own_pg: EmbeddedPostgres, tmp_path_factory) -> AsyncIterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("faults") / "serve.log"
    env = {"METALEDGER_DATABASE_URL": own_pg.url(), "METALEDGER_APPLY_MIGRATIONS_ON_START": "false"}
    process = start_service(env, port, workers=1, log=log)
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(base, process=process)
        yield base
    finally:
        stop_process(process)


@pytest_asyncio.fixture
async def db(own_pg: EmbeddedPostgres) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(own_pg.url(driver="postgresql"))
    try:
        yield conn
    finally:
        await conn.close()


def properties(marker: str) -> dict:
    return {"description": marker, "customProperties": {}, "tags": []}


async def change_logs(db: asyncpg.Connection, urn: str) -> list[int]:
    return [
        r["version"]
        for r in await db.fetch(
            "SELECT version FROM change_log_outbox WHERE urn = $1 AND aspect = 'datasetProperties' AND topic = $2",
            urn,
            MCL,
        )
    ]


async def test_restart_and_outage_under_load_answer_503_and_lose_nothing(own_pg, service):
    outcomes: Counter[str] = Counter()
    acknowledged: dict[str, str] = {}  # urn -> the value it was acknowledged with
    missing_retry_after: list[int] = []
    stop = asyncio.Event()

    def record(kind: str, response: httpx.Response) -> None:
        outcomes[f"{kind} {response.status_code}"] += 1
        if response.status_code == 503 and "retry-after" not in response.headers:
            missing_retry_after.append(response.status_code)

    async def writer(client: int) -> None:
        async with httpx.AsyncClient(base_url=service, headers=SYSTEM_AUTH, timeout=30) as http:
            n = 0
            while not stop.is_set():
                n += 1
                urn, marker = ds(f"faults.c{client}.n{n}"), f"c{client}-{n}"
                try:
                    response = await http.post(
                        "/openapi/v1/proposals", json=[mcp("datasetProperties", properties(marker), urn=urn)]
                    )
                except httpx.TransportError as error:
                    outcomes[f"write closed:{type(error).__name__}"] += 1
                    continue
                record("write", response)
                if response.status_code == 200:
                    acknowledged[urn] = marker
                elif response.status_code == 503:
                    await asyncio.sleep(0.05)  # the client's back-off after a 503 (its pace, not a wait for anything)

    async def reader() -> None:
        async with httpx.AsyncClient(base_url=service, headers=SYSTEM_AUTH, timeout=30) as http:
            while not stop.is_set():
                try:
                    response = await http.get(f"/openapi/v3/entity/dataset/{quote(READ_URN, safe='')}")
                except httpx.TransportError as error:
                    outcomes[f"read closed:{type(error).__name__}"] += 1
                    continue
                record("read", response)
                await asyncio.sleep(0.02)  # the reader's pace

    async def writes_pass(more: int) -> None:
        target = len(acknowledged) + more
        await eventually(lambda: asyncio.sleep(0, len(acknowledged) >= target), timeout=30, interval=0.05)

    assert (await post(service, READ_URN, "read")).status_code == 200
    load = [asyncio.create_task(writer(c)) for c in range(WRITERS)] + [asyncio.create_task(reader())]
    try:
        await writes_pass(30)
        await asyncio.to_thread(pg_ctl, own_pg, "restart", "-m", "fast")
        await writes_pass(30)
        answered = outcomes["write 503"]
        await asyncio.to_thread(pg_ctl, own_pg, "stop", "-m", "fast")
        outage_started = time.monotonic()
        await eventually(
            lambda: asyncio.sleep(0, outcomes["write 503"] >= answered + 20), timeout=30
        )  # answered, not hung
        # the outage itself, ~3 s: its length is the behaviour (writes keep being answered 503 through it)
        await asyncio.sleep(max(0.0, 3 - (time.monotonic() - outage_started)))
        await asyncio.to_thread(start_again, own_pg)
        await writes_pass(30)
    finally:
        stop.set()
        await asyncio.gather(*load)

    db = await asyncpg.connect(own_pg.url(driver="postgresql"))  # the fixture's connection died with the restart
    try:
        stored = {
            r["urn"]: r["description"]
            for r in await db.fetch(
                "SELECT urn, metadata::jsonb ->> 'description' AS description FROM metadata_aspect_v2"
                " WHERE aspect = 'datasetProperties' AND version = 0 AND urn LIKE '%faults.c%'"
            )
        }
        logs = Counter(
            r["urn"]
            for r in await db.fetch(
                "SELECT urn FROM change_log_outbox WHERE aspect = 'datasetProperties' AND topic = $1 AND urn LIKE '%faults.c%'",
                MCL,
            )
        )
    finally:
        await db.close()
    lost = [u for u, marker in acknowledged.items() if stored.get(u) != marker or logs[u] == 0]
    duplicated = [u for u, count in logs.items() if count > 1]
    print(
        f"\noutcomes {dict(outcomes)}; acknowledged {len(acknowledged)}; lost {len(lost)}; duplicated {len(duplicated)}"
    )
    assert set(outcomes) <= {"write 200", "write 503", "read 200", "read 503"}, outcomes  # no 500, none closed
    assert outcomes["write 503"] > 0 and not missing_retry_after
    assert not lost and not duplicated


async def admin(pg: EmbeddedPostgres, sql: str, *args) -> None:
    """`sql` on a connection of its own (the database may have been restarted since the test's connection was made)."""
    conn = await asyncpg.connect(pg.url(driver="postgresql"))
    try:
        await conn.execute(sql, *args)
    finally:
        await conn.close()


@pytest_asyncio.fixture
async def park(own_pg: EmbeddedPostgres, db: asyncpg.Connection) -> AsyncIterator[None]:
    """Every write's COMMIT waits, in a deferred trigger on the outbox, for an advisory lock `db` holds (the write is
    then not committed: `parked_commit` finds its backend, `db.execute(UNPARK)` lets it go). Only writes insert into
    the outbox: the service's background workers never wait there."""
    await db.execute(f"""
        CREATE FUNCTION test_park_commit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_advisory_xact_lock({PARK_LOCK}); RETURN NULL; END $$;
        CREATE CONSTRAINT TRIGGER test_park_commit AFTER INSERT ON change_log_outbox
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_park_commit();
    """)
    await db.execute("SELECT pg_advisory_lock($1)", PARK_LOCK)
    try:
        yield
    finally:
        if not db.is_closed():
            await db.execute(UNPARK)
        await admin(own_pg, "DROP TRIGGER test_park_commit ON change_log_outbox; DROP FUNCTION test_park_commit()")


UNPARK = f"SELECT pg_advisory_unlock({PARK_LOCK})"


async def parked_commit(db: asyncpg.Connection) -> int:
    """The backend of the write whose COMMIT `park` holds."""
    return await eventually(
        lambda: db.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'advisory'"
        ),
        timeout=20,
        interval=0.05,
    )


@pytest_asyncio.fixture
async def synchronous_standby_missing(own_pg: EmbeddedPostgres) -> AsyncIterator[None]:
    """Every COMMIT that wrote waits for a synchronous standby that does not exist: it is committed (durable) and
    unanswered. Cleared again: the waiting COMMITs then complete."""
    await admin(own_pg, "ALTER SYSTEM SET synchronous_standby_names = 'metaledger_test_nobody'")
    await admin(own_pg, "SELECT pg_reload_conf()")
    try:
        yield
    finally:
        await admin(own_pg, "ALTER SYSTEM RESET synchronous_standby_names")
        await admin(own_pg, "SELECT pg_reload_conf()")


async def committed_unanswered(db: asyncpg.Connection) -> int:
    """The backend of the write `park` holds, let go to commit, once its COMMIT waits for the missing standby."""
    pid = await parked_commit(db)
    await db.execute(UNPARK)
    await eventually(
        lambda: db.fetchval("SELECT wait_event = 'SyncRep' FROM pg_stat_activity WHERE pid = $1", pid),
        timeout=20,
        interval=0.05,
    )
    return pid


async def post(service: str, urn: str, marker: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=service, headers=SYSTEM_AUTH, timeout=30) as http:
        return await http.post("/openapi/v1/proposals", json=[mcp("datasetProperties", properties(marker), urn=urn)])


async def test_a_commit_lost_after_the_server_committed_answers_the_result(
    service, db, park, synchronous_standby_missing
):
    urn = ds("faults.committed")
    write = asyncio.create_task(post(service, urn, "landed"))
    pid = await committed_unanswered(db)
    assert await db.fetchval("SELECT pg_terminate_backend($1)", pid)
    response = await write
    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["status"] == "CREATED"
    assert await change_logs(db, urn) == [1]


async def test_a_commit_lost_before_the_server_committed_answers_503_not_committed(service, db, park):
    urn = ds("faults.aborted")
    write = asyncio.create_task(post(service, urn, "never"))
    assert await db.fetchval("SELECT pg_terminate_backend($1)", await parked_commit(db))
    response = await write
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    assert "was not committed" in response.json()["message"]
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", urn) == 0
    assert await change_logs(db, urn) == []
    await db.execute(UNPARK)
    again = await post(service, urn, "never")  # the retry the answer asks for
    assert again.status_code == 200, again.text
    assert await change_logs(db, urn) == [1]


async def test_a_commit_whose_outcome_stays_unknown_says_so_and_its_retry_is_applied_once(
    own_pg,
    service,
    db,
    park,
    synchronous_standby_missing,
):
    urn = ds("faults.unknown")
    write = asyncio.create_task(post(service, urn, "maybe"))
    await committed_unanswered(db)
    started = time.monotonic()
    await asyncio.to_thread(pg_ctl, own_pg, "stop", "-m", "fast")  # terminates the waiting COMMIT; stays down
    response = await write
    waited = time.monotonic() - started
    await asyncio.to_thread(start_again, own_pg)
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "1"
    assert "may or may not be stored" in response.json()["message"]
    assert COMMIT_CHECK_S - 1 <= waited < COMMIT_CHECK_S + 10
    await admin(own_pg, "ALTER SYSTEM RESET synchronous_standby_names")
    await admin(own_pg, "SELECT pg_reload_conf()")
    conn = await asyncpg.connect(own_pg.url(driver="postgresql"))
    try:
        assert await change_logs(conn, urn) == [1]  # it had landed (committed before the stop)
        again = await post(service, urn, "maybe")  # the retry the answer allows
        assert again.status_code == 200, again.text
        assert again.json()["results"][0] == again.json()["results"][0] | {"status": "UNCHANGED", "version": "1"}
        assert await change_logs(conn, urn) == [1]
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'datasetProperties'", urn
            )
            == 1
        )
    finally:
        await conn.close()
