"""`metaledger serve --workers 2`: two API processes on one port and a background process, all against the real test
Postgres. Concurrent writers through the shared port: every acknowledged write committed with exactly one change log,
feed offsets dense and unique (the sequencer runs in the background process only), the writes indexed by the
background process, /metrics summing every process; a background process killed with -9 is replaced and indexing
goes on; SIGTERM to the supervisor stops every process.
"""

from __future__ import annotations

import asyncio
import signal
import time

import asyncpg
import httpx
import psutil

from app.embedded_pg import free_port
from tests.processes import SYSTEM_AUTH, start_service, stop_process, wait_healthy

CLIENTS = 8
WRITES_PER_CLIENT = 40
ENTITIES = 10  # every client writes all of them: each aspect gets writes from both API processes at once


def urn(client: int, i: int) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:hive,workers.c{client}.t{i},PROD)"


def children(pid: int) -> list[psutil.Process]:
    """The supervisor's descendants that are metaledger's (not multiprocessing's resource tracker)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


async def background_pid(dsn: str, supervisor: int) -> int | None:
    """The process of the embedded indexing worker: the child holding a connection named `metaledger-indexer` to this
    test's database (found by its client port); None while there is none. The test server is shared: other services
    of the run (a session-scoped one of tests/client) have indexers of their own on other databases, and a killed
    indexer's connection can outlive it for a moment."""
    conn = await asyncpg.connect(dsn)
    try:
        ports = {
            r["client_port"]
            for r in await conn.fetch(
                "SELECT client_port FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = 'metaledger-indexer'"
            )
        }
    finally:
        await conn.close()
    for child in children(supervisor):
        try:
            if any(c.laddr and c.laddr.port in ports for c in child.net_connections(kind="tcp")):
                return child.pid
        except psutil.NoSuchProcess:  # a child that exited since (the killed background process)
            pass
    return None


async def wait_for(predicate, timeout: float = 90.0, interval: float = 0.2):
    """The predicate's first truthy value, or its last one past `timeout`: conditions are waited on, and the deadline
    is generous (it only matters when the test fails; the machine may be loaded)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval)


async def test_serve_with_two_workers(make_database, migrated_template):
    database_url = make_database(template=migrated_template)
    dsn = database_url.replace("postgresql+asyncpg://", "postgresql://")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        "METALEDGER_DATABASE_URL": database_url,
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
        "METALEDGER_SEARCH_WORKER_POLL_MS": "20",
    }
    # an indexer of another database on the same server, as a full run has (tests/client's session-scoped service)
    other_indexer = await asyncpg.connect(
        make_database().replace("postgresql+asyncpg://", "postgresql://"),
        server_settings={"application_name": "metaledger-indexer"},
    )
    supervisor = start_service(env, port, workers=2)
    try:
        await wait_healthy(base, 90, supervisor)
        # every process is up: 2 API workers, 1 background process (and uvicorn's supervisor thread in this one)
        assert await wait_for(lambda: _count_children(supervisor.pid, 3)), [
            p.cmdline() for p in children(supervisor.pid)
        ]

        async with httpx.AsyncClient(base_url=base, headers=SYSTEM_AUTH, timeout=60) as http:

            async def writer(c: int) -> list[int]:
                statuses = []
                for i in range(WRITES_PER_CLIENT):
                    response = await http.post(
                        f"/openapi/v3/entity/dataset/{urn(0, (c * 3 + i) % ENTITIES)}/datasetProperties",
                        json={"value": {"name": f"t{i}", "description": f"client {c} write {i}"}},
                        params={"createIfNotExists": "false"},
                    )
                    statuses.append(response.status_code)
                return statuses

            results = await asyncio.gather(*(writer(c) for c in range(CLIENTS)))
            assert all(s == 200 for statuses in results for s in statuses), results
            writes = CLIENTS * WRITES_PER_CLIENT

            conn = await asyncpg.connect(dsn)
            try:
                # exactly one versioned change log per acknowledged write, each a version of its own
                rows = await conn.fetch(
                    "SELECT urn, version, feed_offset FROM change_log_outbox WHERE topic = 'MetadataChangeLog_Versioned_v1' "
                    "AND aspect = 'datasetProperties'"
                )
                assert len(rows) == writes
                assert len({(r["urn"], r["version"]) for r in rows}) == writes

                # the background process's sequencer gives every committed change log its offset, densely
                async def sequenced() -> bool:
                    return await conn.fetchval("SELECT count(*) FROM change_log_outbox WHERE feed_offset IS NULL") == 0

                assert await wait_for(sequenced)
                offsets = [
                    r["feed_offset"] for r in await conn.fetch("SELECT feed_offset FROM change_log_outbox ORDER BY 1")
                ]
                assert offsets == list(range(1, len(offsets) + 1))
                # per aspect, the feed has the versions in order (commit order), whichever process wrote them
                by_urn: dict[str, list[int]] = {}
                for r in await conn.fetch(
                    "SELECT urn, version FROM change_log_outbox WHERE topic = 'MetadataChangeLog_Versioned_v1' "
                    "AND aspect = 'datasetProperties' ORDER BY feed_offset"
                ):
                    by_urn.setdefault(r["urn"], []).append(r["version"])
                assert all(versions == sorted(versions) for versions in by_urn.values()), by_urn
                latest = await conn.fetch(
                    "SELECT urn, systemmetadata::jsonb ->> 'version' AS v FROM metadata_aspect_v2 "
                    "WHERE aspect = 'datasetProperties' AND version = 0"
                )
                assert sorted(int(r["v"]) for r in latest) == [writes // ENTITIES] * ENTITIES
            finally:
                await conn.close()

            # indexed by the background process (the API processes run no indexer)
            async def indexed() -> bool:
                found = await http.get("/openapi/v3/entity/dataset", params={"query": "client", "count": 100})
                return found.status_code == 200 and len(found.json()["entities"]) == ENTITIES

            assert await wait_for(indexed), (
                await http.get("/openapi/v3/entity/dataset", params={"query": "client"})
            ).text

            # /metrics sums the processes: every write counted once, whichever process took it and the scrape; the
            # rows applied are counted by the background process (which may still be applying the last ones: every
            # entity found does not mean every version indexed), scraped through an API process
            async def scrape() -> tuple[float, float]:
                lines = (await http.get("/metrics")).text.splitlines()
                counted = sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in lines
                    if line.startswith("metaledger_writes_total{") and 'aspect="datasetProperties"' in line
                )
                applied = sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in lines
                    if line.startswith("metaledger_indexer_applied_rows_total")
                )
                return counted, applied

            async def all_applied() -> bool:
                return (await scrape())[1] >= writes

            assert await wait_for(all_applied), await scrape()
            for _ in range(3):
                counted, applied = await scrape()
                assert counted == writes and applied >= writes, (counted, applied)

            # kill -9 of the background process: the supervisor starts another, which indexes what comes next
            old = await wait_for(lambda: background_pid(dsn, supervisor.pid))
            assert old, "no child process holds this database's indexer connection"
            psutil.Process(old).kill()

            async def replaced() -> int | None:
                pid = await background_pid(dsn, supervisor.pid)
                return pid if pid != old else None

            new = await wait_for(replaced)
            assert new, "the background process was not replaced"
            response = await http.post(
                f"/openapi/v3/entity/dataset/{urn(99, 0)}/datasetProperties",
                json={"value": {"name": "after the restart"}},
            )
            assert response.status_code == 200, response.text

            async def indexed_after() -> bool:
                found = await http.get("/openapi/v3/entity/dataset", params={"query": "restart"})
                return found.status_code == 200 and len(found.json()["entities"]) == 1

            assert await wait_for(indexed_after)
        pids = [p.pid for p in children(supervisor.pid)]
    finally:
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(30)
        finally:
            stop_process(supervisor)
            await other_indexer.close()
    # SIGTERM to the supervisor stops every process it started
    assert await wait_for(lambda: _all_gone(pids)), [p for p in pids if _running(p)]


async def _count_children(pid: int, expected: int) -> bool:
    return len(children(pid)) >= expected


async def _all_gone(pids: list[int]) -> bool:
    return not any(_running(p) for p in pids)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_children_stop_when_the_supervisor_is_killed(make_database, migrated_template):
    """kill -9 of the supervisor leaves no orphan: the API workers and the background process stop on their own
    (they would otherwise keep the port and run a relay nobody supervises)."""
    env = {
        "METALEDGER_DATABASE_URL": make_database(template=migrated_template),
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
    }
    port = free_port()
    supervisor = start_service(env, port, workers=2)
    try:
        await wait_healthy(f"http://127.0.0.1:{port}", 90, supervisor)
        assert await wait_for(lambda: _count_children(supervisor.pid, 3))
        pids = [p.pid for p in children(supervisor.pid)]
        supervisor.kill()
        supervisor.wait(10)
        assert await wait_for(lambda: _all_gone(pids)), [p for p in pids if _running(p)]
    finally:
        stop_process(supervisor)
