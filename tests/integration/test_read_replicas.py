"""Read replicas (app.replicas) against a real streaming replica: a throwaway primary of this module's own, a replica
made of it by `pg_basebackup -R`, metaledger on both. Reads are served by the replica; a caller reads its own writes
while the replica's replay is paused (the real `datahub` SDK included, which sends no header); a stopped, lagging or
promoted replica leaves rotation and costs no 5xx."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.db import upgrade_database
from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port, run_coro_sync
from app.main import create_app
from app.replicas import WRITTEN_AT_HEADER, RecentWrites, format_lsn, parse_lsn
from app.settings import Settings
from tests.helpers import ds, eventually, mcp, mint_token
from tests.processes import service_token, start_on_a_free_port, start_service, stop_process, wait_healthy_sync

DATABASE = "replicated"
READS = 50  # reads whose place the statistics tell


@dataclass
class Cluster:
    primary: EmbeddedPostgres
    replica: EmbeddedPostgres
    base: Path

    def url(self, server: EmbeddedPostgres) -> str:
        return server.url(DATABASE)

    def dsn(self, server: EmbeddedPostgres) -> str:
        return server.url(DATABASE, driver="postgresql")


def make_replica(primary: EmbeddedPostgres, root: Path) -> EmbeddedPostgres:
    """A streaming replica of `primary`: its base backup with the standby settings (-R), started on a port of its own."""
    replica = EmbeddedPostgres(root, free_port(), database=None, durable=False)
    replica._prepare_dirs()  # owned by the server's user, as the base backup must be
    backup = replica._pg_run(
        [
            str(replica.bin_dir / "pg_basebackup"),
            *("-D", str(replica.pgdata), "-R", "-X", "stream", "-c", "fast"),
            *("-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres"),
        ]
    )
    assert backup.returncode == 0, backup.stderr
    return start_on_a_free_port(replica)


def stop_now(server: EmbeddedPostgres) -> None:
    """`pg_ctl stop -m immediate`: the server goes away at once, as in a crash."""
    stopped = server._pg_run(
        [str(server.bin_dir / "pg_ctl"), "stop", "-D", str(server.pgdata), "-m", "immediate", "-w"]
    )
    assert stopped.returncode == 0, stopped.stderr


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    base = Path(tempfile.mkdtemp(prefix="metaledger-replicas-"))
    # wal_level=replica and the replication line of pg_hba.conf (trust from 127.0.0.1) are initdb's defaults
    primary = start_on_a_free_port(
        EmbeddedPostgres(
            base / "primary", free_port(), database=None, durable=False, server_options={"max_wal_senders": "5"}
        )
    )
    replica = None
    try:
        ensure_database(primary.admin_dsn, DATABASE)
        upgrade_database(primary.url(DATABASE))
        replica = make_replica(primary, base / "replica")
        yield Cluster(primary, replica, base)
    finally:
        for server in (replica, primary):
            if server is not None:
                server.stop()
        shutil.rmtree(base, ignore_errors=True)


async def fetchval(dsn: str, query: str, *args: Any) -> Any:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(query, *args)
    finally:
        await conn.close()


# The tests that pause replay keep the replica in rotation however slow the machine: what they show is what a
# replica behind the caller's write gives, not when lag takes it out (test_a_lagging_replica_leaves_rotation...).
LAG_UNBOUNDED_S = 3600.0


@pytest.fixture
def replay(cluster: Cluster) -> Iterator[Callable[[bool], Awaitable[None]]]:
    """`await replay(False)` pauses the replica's WAL replay, `replay(True)` resumes it (and the test leaves it on)."""
    dsn = cluster.dsn(cluster.replica)

    async def set_replay(on: bool) -> None:
        await fetchval(dsn, "SELECT pg_wal_replay_resume()" if on else "SELECT pg_wal_replay_pause()")

    yield set_replay
    run_coro_sync(lambda: fetchval(dsn, "SELECT pg_wal_replay_resume()"))


def settings_of(cluster: Cluster, replicas: list[EmbeddedPostgres], **overrides: Any) -> Settings:
    return Settings(
        database_url=cluster.url(cluster.primary),
        read_database_urls=[cluster.url(r) for r in replicas],
        apply_migrations_on_start=False,
        auth_bootstrap_admin_token=False,
        **overrides,
    )


@pytest_asyncio.fixture
async def serve(cluster: Cluster, registry) -> AsyncIterator[Callable[..., Any]]:
    """`async with serve(**settings) as (app, client)`: metaledger on the cluster (its replica unless `replicas=`),
    an admin client."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def run(replicas: list[EmbeddedPostgres] | None = None, **overrides: Any):
        settings = settings_of(cluster, [cluster.replica] if replicas is None else replicas, **overrides)
        application = create_app(settings, registry)
        async with application.router.lifespan_context(application):
            token = await mint_token(application, "admin")
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=application),
                base_url="http://metaledger",
                headers={"Authorization": f"Bearer {token}"},
            ) as http:
                yield application, http

    yield run


def aspect_path(urn: str, aspect: str = "datasetProperties") -> str:
    return f"/openapi/v3/entity/dataset/{quote(urn, safe='')}/{aspect}"


async def write(client: httpx.AsyncClient, urn: str, description: str) -> httpx.Response:
    response = await client.post(
        "/openapi/v1/proposals", json=[mcp("datasetProperties", {"description": description}, urn)]
    )
    assert response.status_code == 200, response.text
    return response


async def description(client: httpx.AsyncClient, urn: str, headers: dict[str, str] | None = None) -> str | None:
    response = await client.get(aspect_path(urn), headers=headers or {})
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    return response.json()["value"]["description"]


async def replica_state(client: httpx.AsyncClient, replica: EmbeddedPostgres) -> dict[str, Any]:
    ready = (await client.get("/ready")).json()
    return ready["checks"]["replicas"]["replicas"][f"127.0.0.1:{replica.port}/{DATABASE}"]


async def in_rotation(client: httpx.AsyncClient, replica: EmbeddedPostgres) -> bool:
    return (await replica_state(client, replica))["inRotation"]


async def aspect_scans(dsn: str) -> int:
    """Scans of the aspect store's table by this server's backends (they are counted where they ran)."""
    return await fetchval(
        dsn,
        "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = 'metadata_aspect_v2'",
    )


async def others_gone(dsn: str) -> bool:
    """No backend but the asking one on the database: every other one has exited, its statistics flushed."""
    return not await fetchval(
        dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", DATABASE
    )


# --- reads go to the replica --------------------------------------------------------------------------------------


async def quiet(*dsns: str) -> None:
    """Wait until every backend but the asking one has left these servers' database (statistics flushed)."""
    for dsn in dsns:
        await eventually(partial(others_gone, dsn), what="the app's backends exit")


async def test_reads_are_served_by_the_replica_and_writes_by_the_primary(serve, cluster: Cluster):
    primary, replica = cluster.dsn(cluster.primary), cluster.dsn(cluster.replica)
    urn = ds("replicas.served")
    async with serve() as (app, client):
        written = await write(client, urn, "on the replica")
        position = parse_lsn(written.headers[WRITTEN_AT_HEADER])
        assert position <= parse_lsn(await fetchval(primary, "SELECT pg_current_wal_lsn()::text"))
        await eventually(
            lambda: fetchval(replica, "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", format_lsn(position)),
            what="the replica replays the write",
        )
    await quiet(primary, replica)
    primary_before, replica_before = await aspect_scans(primary), await aspect_scans(replica)
    async with serve() as (app, client):
        for _ in range(READS):
            assert await description(client, urn) == "on the replica"
    await quiet(primary, replica)  # the app is gone: every backend it had exited and flushed its statistics
    assert await aspect_scans(replica) >= replica_before + READS
    # what a start and the background workers read of the primary meanwhile is a few scans; the reads would be 50
    assert await aspect_scans(primary) - primary_before < READS // 5


async def test_the_same_measure_moves_on_the_primary_without_replicas(serve, cluster: Cluster):
    """The control of the test above: the count it reads does count these reads where they run."""
    primary = cluster.dsn(cluster.primary)
    urn = ds("replicas.control")
    async with serve(replicas=[]) as (app, client):
        written = await write(client, urn, "on the primary")
        assert WRITTEN_AT_HEADER not in written.headers  # no replicas: no write pays the position's round trip
        assert app.state.replicas is None
    await quiet(primary)
    before = await aspect_scans(primary)
    async with serve(replicas=[]) as (app, client):
        for _ in range(READS):
            assert await description(client, urn) == "on the primary"
    await quiet(primary)
    assert await aspect_scans(primary) >= before + READS


# --- read-your-writes -----------------------------------------------------------------------------------------------


async def test_a_caller_reads_its_write_while_replay_is_paused(serve, cluster: Cluster, replay):
    urn = ds("replicas.paused")
    async with serve(replica_max_lag_s=LAG_UNBOUNDED_S, read_your_writes_wait_s=0.3) as (app, client):
        await write(client, urn, "before")
        await eventually(lambda: description(client, urn), what="the first write replayed")
        other = {"Authorization": f"Bearer {await mint_token(app, 'reader', 'urn:li:corpuser:other')}"}
        await replay(False)
        written = await write(client, urn, "after")
        position = written.headers[WRITTEN_AT_HEADER]
        # the writer, without a header (its token wrote within READ_YOUR_WRITES_S): the replica is behind, so the
        # primary answers once the bound is over
        assert await description(client, urn) == "after"
        # another caller without the header reads the replica: what it replayed so far
        assert await description(client, urn, other) == "before"
        # with the header, that caller sees the write too
        assert await description(client, urn, {**other, WRITTEN_AT_HEADER: position}) == "after"
        assert await in_rotation(client, cluster.replica)


async def test_a_read_with_the_header_waits_for_the_replica_to_replay_it(serve, cluster: Cluster, replay):
    urn = ds("replicas.waits")
    async with serve(replica_max_lag_s=LAG_UNBOUNDED_S, read_your_writes_wait_s=30) as (app, client):
        other = {"Authorization": f"Bearer {await mint_token(app, 'reader', 'urn:li:corpuser:waiter')}"}
        await replay(False)
        written = await write(client, urn, "replayed")
        position = {WRITTEN_AT_HEADER: written.headers[WRITTEN_AT_HEADER]}
        read = asyncio.create_task(description(client, urn, {**other, **position}))
        done, _ = await asyncio.wait({read}, timeout=0.3)
        assert not done  # it waits for the replica (a stale read would have answered None at once)
        await replay(True)
        assert await asyncio.wait_for(read, 20) == "replayed"
        assert await in_rotation(client, cluster.replica)


GRAPHQL_READ = """query($urn: String!, $q: String!) {
    dataset(urn: $urn) { properties { description } }
    searchAcrossEntities(input: {types: [DATASET], query: $q, start: 0, count: 10}) { total }
}"""
ADD_TAGS = "mutation($input: BatchAddTagsInput!) { batchAddTags(input: $input) }"


async def graphql(client: httpx.AsyncClient, query: str, headers: dict[str, str], **variables: Any) -> dict[str, Any]:
    response = await client.post("/api/graphql", json={"query": query, "variables": variables}, headers=headers)
    assert response.status_code == 200, response.text
    body = response.json()
    assert "errors" not in body, body
    return body["data"]


async def test_graphql_queries_and_searches_read_the_replica_and_mutations_the_primary(serve, cluster: Cluster, replay):
    urn = ds("replicas.graphql_unique")
    async with serve(replica_max_lag_s=LAG_UNBOUNDED_S, read_your_writes_wait_s=0.2) as (app, client):
        other = {"Authorization": f"Bearer {await mint_token(app, 'writer', 'urn:li:corpuser:curator')}"}
        await replay(False)
        # indexed before the answer (sync): on the primary, the document and the aspect are there
        written = await client.post(
            "/openapi/v1/proposals",
            json=[
                mcp("datasetProperties", {"description": "fresh"}, urn, sync=True),
                mcp("globalTags", {"tags": [{"tag": "urn:li:tag:a"}]}, urn),
                mcp("tagProperties", {"name": "b"}, "urn:li:tag:b", entity="tag"),
            ],
        )
        assert written.status_code == 200, written.text
        stale = await graphql(client, GRAPHQL_READ, other, urn=urn, q="graphql_unique")
        assert stale["dataset"] is None or stale["dataset"]["properties"] is None  # the replica has not replayed it
        assert stale["searchAcrossEntities"]["total"] == 0
        seen = {**other, WRITTEN_AT_HEADER: written.headers[WRITTEN_AT_HEADER]}
        fresh = await graphql(
            client, GRAPHQL_READ, seen, urn=urn, q="graphql_unique"
        )  # from the primary, past the bound
        assert fresh["dataset"]["properties"]["description"] == "fresh"
        assert fresh["searchAcrossEntities"]["total"] == 1
        # a mutation reads what it checks and changes on the primary: the tag created a moment ago exists, the tag
        # written a moment ago is kept
        added = await graphql(
            client, ADD_TAGS, other, input={"tagUrns": ["urn:li:tag:b"], "resources": [{"resourceUrn": urn}]}
        )
        assert added["batchAddTags"] is True
        tags = await fetchval(
            cluster.dsn(cluster.primary),
            "SELECT metadata FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'globalTags' AND version = 0",
            urn,
        )
        assert "urn:li:tag:a" in tags and "urn:li:tag:b" in tags


async def test_a_malformed_position_is_a_400_naming_the_header(serve):
    async with serve() as (app, client):
        response = await client.get(aspect_path(ds("replicas.bad")), headers={WRITTEN_AT_HEADER: "yesterday"})
        assert response.status_code == 400
        assert response.json()["issues"][0]["path"] == f"$.headers.{WRITTEN_AT_HEADER}"


# --- the real SDK ---------------------------------------------------------------------------------------------------

SDK_SCRIPT = """
from datahub.emitter.mcp import MetadataChangeProposalWrapper
from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
from datahub.metadata.schema_classes import DatasetPropertiesClass

graph = DataHubGraph(DatahubClientConfig(server=GMS, token=TOKEN))
graph.emit_mcp(MetadataChangeProposalWrapper(entityUrn=URN, aspect=DatasetPropertiesClass(description="by the sdk")))
print("READ", graph.get_aspect(URN, DatasetPropertiesClass).description)
"""


@pytest.mark.client
def test_the_unmodified_sdk_reads_its_write_while_replay_is_paused(cluster: Cluster, tmp_path: Path):
    from tests.client.conftest import DataHubClient, _client_env, _ensure_client_venv

    primary, replica = cluster.dsn(cluster.primary), cluster.dsn(cluster.replica)
    env = {
        "METALEDGER_DATABASE_URL": cluster.url(cluster.primary),
        "METALEDGER_READ_DATABASE_URLS": cluster.url(cluster.replica),
        "METALEDGER_READ_YOUR_WRITES_WAIT_S": "30",
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
        "METALEDGER_KAFKA_BOOTSTRAP_SERVERS": "",
    }
    port = free_port()
    process = start_service(env, port)
    python = _ensure_client_venv()
    client = DataHubClient(
        python, _client_env(python, tmp_path, f"http://127.0.0.1:{port}", service_token(env)), tmp_path
    )
    urn = ds("replicas.sdk")
    try:
        warm = threading.Thread(target=client.script, args=("pass",))  # the client's imports, while the service starts
        warm.start()
        wait_healthy_sync(f"http://127.0.0.1:{port}", process=process)
        warm.join()
        run_coro_sync(lambda: fetchval(replica, "SELECT pg_wal_replay_pause()"))
        outcome: dict[str, Any] = {}
        sdk = threading.Thread(target=lambda: outcome.update(run=client.script(SDK_SCRIPT, URN=urn)))
        sdk.start()

        async def written() -> bool:
            return bool(
                await fetchval(primary, "SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1 AND version = 0", urn)
            )

        run_coro_sync(lambda: eventually(written, what="the SDK's write committed on the primary", timeout=120))
        # the replica has not replayed it: the SDK's read waits for it (or would read the primary after 30 s)
        assert not run_coro_sync(
            lambda: fetchval(replica, "SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", urn)
        )
        run_coro_sync(lambda: fetchval(replica, "SELECT pg_wal_replay_resume()"))
        sdk.join(120)
        assert "READ by the sdk" in outcome["run"].stdout
    finally:
        run_coro_sync(lambda: fetchval(replica, "SELECT pg_wal_replay_resume()"))
        client.close()
        stop_process(process)


# --- faults ---------------------------------------------------------------------------------------------------------


async def test_a_stopped_replica_costs_no_5xx_and_comes_back(serve, cluster: Cluster):
    urn = ds("replicas.stopped")
    async with serve(read_your_writes_s=0) as (app, client):
        await write(client, urn, "kept")
        await eventually(lambda: description(client, urn), what="replayed")
        assert await in_rotation(client, cluster.replica)
        pool = app.state.replicas
        pool._stop.set()  # the monitor paused: the replica stays in rotation as it last saw it, stopped or not
        await pool._monitor
        stop_now(cluster.replica)
        # reads on the replica that fails under them: each answered again from the primary
        for _ in range(10):
            assert await description(client, urn) == "kept"
        assert pool.retried_on_primary == 10
        assert "metaledger_replica_reads_retried_on_primary_total 10.0" in (await client.get("/metrics")).text
        pool._stop.clear()
        pool._monitor = asyncio.create_task(pool._watch())
        state = await eventually(
            lambda: _out(client, cluster.replica), what="the stopped replica leaves rotation", timeout=10
        )
        assert state["state"] == "unreachable" and state["error"]
        ready = await client.get("/ready")
        assert ready.status_code == 200  # the primary serves: still ready
        assert await description(client, urn) == "kept"
        metrics = (await client.get("/metrics")).text
        assert f'metaledger_replica_in_rotation{{replica="127.0.0.1:{cluster.replica.port}/{DATABASE}"}} 0.0' in metrics
        start_on_a_free_port(cluster.replica)
        await eventually(
            lambda: in_rotation(client, cluster.replica), what="the replica is back in rotation", timeout=15
        )
        assert await description(client, urn) == "kept"


async def _out(client: httpx.AsyncClient, replica: EmbeddedPostgres) -> dict[str, Any] | None:
    state = await replica_state(client, replica)
    return None if state["inRotation"] else state


async def test_a_lagging_replica_leaves_rotation_until_it_catches_up(serve, cluster: Cluster, replay):
    async with serve(replica_max_lag_s=1.0, read_your_writes_s=0) as (app, client):
        await eventually(lambda: in_rotation(client, cluster.replica), what="in rotation")
        await replay(False)
        await write(client, ds("replicas.lag"), "past the replica")
        state = await eventually(lambda: _out(client, cluster.replica), what="the lagging replica leaves rotation")
        assert state["state"] == "lagging" and state["lagBytes"] > 0 and state["lagSeconds"] > 1.0
        assert await description(client, ds("replicas.lag")) == "past the replica"  # from the primary
        metrics = (await client.get("/metrics")).text
        assert f'metaledger_replica_lag_bytes{{replica="127.0.0.1:{cluster.replica.port}/{DATABASE}"}}' in metrics
        await replay(True)
        await eventually(lambda: in_rotation(client, cluster.replica), what="back once it caught up", timeout=10)
        state = await replica_state(client, cluster.replica)
        assert state["lagBytes"] == 0 and state["lagSeconds"] == 0


async def test_an_idle_primary_does_not_make_a_caught_up_replica_lag(serve, cluster: Cluster):
    async with serve(replica_max_lag_s=1.0) as (app, client):
        await eventually(lambda: in_rotation(client, cluster.replica), what="in rotation")
        pool = app.state.replicas
        for _ in range(3):  # three checks of an idle primary, seconds after its last commit
            await pool.check()
        assert await in_rotation(client, cluster.replica)
        assert (await replica_state(client, cluster.replica))["lagSeconds"] == 0


async def test_a_promoted_replica_leaves_rotation(serve, cluster: Cluster):
    promoted = make_replica(cluster.primary, cluster.base / "promoted")
    try:
        async with serve(replicas=[promoted]) as (app, client):
            await eventually(lambda: in_rotation(client, promoted), what="the new replica in rotation")
            await fetchval(promoted.url(DATABASE, driver="postgresql"), "SELECT pg_promote()")
            state = await eventually(lambda: _out(client, promoted), what="the promoted replica leaves rotation")
            assert state["state"] == "promoted"
            await write(client, ds("replicas.promoted"), "on the primary")
            assert await description(client, ds("replicas.promoted")) == "on the primary"
    finally:
        stop_now(promoted)


# --- the parts without a database -----------------------------------------------------------------------------------


def test_positions_read_back_as_written():
    for text in ("0/0", "0/3A1F2B8", "16/B374D848", "FFFFFFFF/FFFFFFFF"):
        assert format_lsn(parse_lsn(text)) == text
    assert parse_lsn("1/0") > parse_lsn("0/FFFFFFFF")
    for bad in ("", "16", "16/", "1/2/3", "-1/0", "G/0", "100000000/0"):
        with pytest.raises(ValueError):
            parse_lsn(bad)


def test_recent_writes_keep_the_latest_position_for_a_while_and_a_bounded_number_of_callers(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("app.replicas.time.monotonic", lambda: now[0])
    recent = RecentWrites(keep_s=5, capacity=3)
    recent.note("a", 20)
    recent.note("a", 10)  # an older position never lowers what the caller saw
    assert recent.position("a") == 20
    assert recent.position("b") is None and recent.position(None) is None
    now[0] += 5.1
    assert recent.position("a") is None  # past READ_YOUR_WRITES_S
    for caller in "wxyz":  # a flood of callers: the oldest goes
        recent.note(caller, 1)
    assert recent.position("w") is None and [recent.position(c) for c in "xyz"] == [1, 1, 1]
    header_only = RecentWrites(keep_s=0)  # READ_YOUR_WRITES_S=0: only the header
    header_only.note("a", 1)
    assert header_only.position("a") is None
