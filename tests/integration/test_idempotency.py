"""`Idempotency-Key` on the write routes against the real Postgres (app.idempotency): the same request with the same
key answered once and replayed byte for byte (v1, v3, Rest.li, OpenLineage, rollback), through another worker and
after a restart (real `metaledger serve` processes); another request with the key → 422; the same one in flight →
409; keys scoped to the caller; bad keys → 400; refusals kept, 5xx released, a claim whose process died lapses, an
expired key writes again; a write cut before COMMIT completed is released and its retry writes once. Without the
header every route writes as before."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from urllib.parse import quote

import asyncpg
import httpx
import pytest

from app.embedded_pg import free_port
from tests.helpers import bearer, ds, eventually, mcp
from tests.processes import SYSTEM_AUTH, start_service, stop_process, wait_healthy

KEY = "Idempotency-Key"
REPLAYED = "idempotency-replayed"
PARK_LOCK = 0x1DE4  # the advisory lock a parked COMMIT waits for (`park`)


def properties(marker: str) -> dict:
    return {"description": marker, "customProperties": {}, "tags": []}


def batch(prefix: str, n: int = 100, marker: str = "first") -> list[dict]:
    return [mcp("datasetProperties", properties(marker), urn=ds(f"{prefix}.t{i}")) for i in range(n)]


async def versions(db: asyncpg.Connection, prefix: str) -> list[tuple[str, int]]:
    """Every stored row of datasetProperties of the batch's datasets: (urn, version); history rows are versions > 0."""
    rows = await db.fetch(
        "SELECT urn, version FROM metadata_aspect_v2 WHERE aspect = 'datasetProperties' AND urn LIKE $1 "
        "ORDER BY urn, version",
        f"%,{prefix}.%",
    )
    return [(r["urn"], r["version"]) for r in rows]


async def change_logs(db: asyncpg.Connection, prefix: str) -> int:
    return await db.fetchval(
        "SELECT count(*) FROM change_log_outbox WHERE aspect = 'datasetProperties' AND urn LIKE $1 "
        "AND topic = 'MetadataChangeLog_Versioned_v1'",
        f"%,{prefix}.%",
    )


def assert_replay_of(first: httpx.Response, again: httpx.Response) -> None:
    assert REPLAYED not in first.headers
    assert again.headers.get(REPLAYED) == "true"
    assert again.status_code == first.status_code
    assert again.content == first.content
    assert again.headers["content-type"] == first.headers["content-type"]


# --- each write route ------------------------------------------------------------------------------------------------


async def test_a_v1_batch_sent_twice_with_one_key_writes_once_and_answers_the_same_bytes(client, db):
    proposals = batch("v1")
    first = await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "v1-batch"})
    assert first.status_code == 200, first.text
    assert {r["status"] for r in first.json()["results"]} == {"CREATED"}
    written = await versions(db, "v1")
    assert len(written) == 100 and {v for _, v in written} == {0}
    again = await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "v1-batch"})
    assert_replay_of(first, again)
    assert await versions(db, "v1") == written
    assert await change_logs(db, "v1") == 100


async def test_without_the_header_a_repeated_batch_is_written_again(client, db):
    proposals = batch("plain", 3)
    first = await client.post("/openapi/v1/proposals", json=proposals)
    again = await client.post("/openapi/v1/proposals", json=proposals)
    assert REPLAYED not in first.headers and REPLAYED not in again.headers
    assert {r["status"] for r in again.json()["results"]} == {"UNCHANGED"}  # the write path ran again
    changed = [mcp("datasetProperties", properties("second"), urn=ds(f"plain.t{i}")) for i in range(3)]
    assert (await client.post("/openapi/v1/proposals", json=changed)).status_code == 200
    assert len(await versions(db, "plain")) == 6  # latest and one history row each: nothing held a key


async def test_a_v3_batch_sent_twice_with_one_key_writes_once(client, db):
    body = [{"urn": ds(f"v3.t{i}"), "datasetProperties": {"value": properties("v3")}} for i in range(100)]
    path = "/openapi/v3/entity/dataset?async=false"
    first = await client.post(path, json=body, headers={KEY: "v3-batch"})
    assert first.status_code == 200, first.text
    written = await versions(db, "v3")
    assert len(written) == 100
    again = await client.post(path, json=body, headers={KEY: "v3-batch"})
    assert_replay_of(first, again)
    assert await versions(db, "v3") == written
    patch = [
        {
            "urn": ds("v3.t0"),
            "globalTags": {
                "value": {"patch": [{"op": "add", "path": "/tags/urn:li:tag:a", "value": {"tag": "urn:li:tag:a"}}]}
            },
        }
    ]
    patched = await client.patch(path, json=patch, headers={KEY: "v3-patch"})
    assert patched.status_code == 200, patched.text
    assert_replay_of(patched, await client.patch(path, json=patch, headers={KEY: "v3-patch"}))


async def test_a_restli_batch_sent_twice_with_one_key_writes_once(client, db):
    body = {"proposals": batch("restli", 100), "async": "false"}
    path = "/aspects?action=ingestProposalBatch"
    first = await client.post(path, json=body, headers={KEY: "restli-batch"})
    assert first.status_code == 200, first.text
    written = await versions(db, "restli")
    assert len(written) == 100
    again = await client.post(path, json=body, headers={KEY: "restli-batch"})
    assert_replay_of(first, again)
    assert await versions(db, "restli") == written
    assert await change_logs(db, "restli") == 100


def lineage_event(run_id: str) -> dict:
    return {
        "eventType": "COMPLETE",
        "eventTime": "2024-05-01T10:00:00.000Z",
        "producer": "https://github.com/OpenLineage/OpenLineage/tree/1.30.0/client/python",
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": run_id},
        "job": {"namespace": "analytics", "name": "etl.idempotent"},
        "inputs": [{"namespace": "postgres://db.example:5432", "name": "shop.public.orders"}],
        "outputs": [{"namespace": "postgres://db.example:5432", "name": "shop.public.revenue"}],
    }


async def test_an_openlineage_event_sent_twice_with_one_key_writes_once(client, db):
    event = lineage_event(str(uuid.uuid4()))
    path = "/openapi/openlineage/api/v1/lineage"
    first = await client.post(path, json=event, headers={KEY: "lineage"})
    assert first.status_code == 200, first.text
    rows = await db.fetch("SELECT urn, aspect, version, createdon FROM metadata_aspect_v2 ORDER BY 1, 2, 3")
    outbox = await db.fetchval("SELECT count(*) FROM change_log_outbox")
    again = await client.post(path, json=event, headers={KEY: "lineage"})
    assert_replay_of(first, again)
    assert await db.fetch("SELECT urn, aspect, version, createdon FROM metadata_aspect_v2 ORDER BY 1, 2, 3") == rows
    assert await db.fetchval("SELECT count(*) FROM change_log_outbox") == outbox


async def test_a_rollback_sent_twice_with_one_key_is_run_once(client, db):
    proposals = [mcp("datasetProperties", properties("run"), urn=ds("rb.t0"), systemMetadata={"runId": "run-rb"})]
    assert (await client.post("/openapi/v1/proposals", json=proposals)).status_code == 200
    body = {"runId": "run-rb", "safe": False}
    first = await client.post("/runs?action=rollback", json=body, headers={KEY: "rollback"})
    assert first.status_code == 200, first.text
    assert await versions(db, "rb") == []  # what the run wrote is gone
    after = await db.fetch("SELECT urn, aspect, version FROM metadata_aspect_v2 ORDER BY 1, 2, 3")
    again = await client.post("/runs?action=rollback", json=body, headers={KEY: "rollback"})
    assert_replay_of(first, again)
    assert await db.fetch("SELECT urn, aspect, version FROM metadata_aspect_v2 ORDER BY 1, 2, 3") == after


# --- each rule alone ---------------------------------------------------------------------------------------------


async def test_the_key_with_another_request_is_a_422_naming_the_key_and_writes_nothing(client, db):
    first = await client.post("/openapi/v1/proposals", json=batch("other", 2), headers={KEY: "reused"})
    assert first.status_code == 200
    other_body = await client.post("/openapi/v1/proposals", json=batch("other", 3), headers={KEY: "reused"})
    assert other_body.status_code == 422, other_body.text
    assert "reused" in other_body.json()["message"]
    assert other_body.json()["issues"][0]["path"] == f"${KEY}"
    assert len(await versions(db, "other")) == 2
    other_query = await client.post("/openapi/v1/proposals?async=true", json=batch("other", 2), headers={KEY: "reused"})
    assert other_query.status_code == 422
    other_path = await client.post(
        "/aspects?action=ingestProposalBatch", json={"proposals": batch("other", 2)}, headers={KEY: "reused"}
    )
    assert other_path.status_code == 422


async def test_two_callers_with_one_key_never_see_each_others_replies(app, client, db):
    other = await bearer(app, "writer", "urn:li:corpuser:other")
    first = await client.post("/openapi/v1/proposals", json=batch("actors", 2), headers={KEY: "shared"})
    assert first.status_code == 200
    theirs = await client.post("/openapi/v1/proposals", json=batch("actors", 2), headers={KEY: "shared", **other})
    assert theirs.status_code == 200, theirs.text
    assert REPLAYED not in theirs.headers
    assert {r["status"] for r in theirs.json()["results"]} == {"UNCHANGED"}  # their own write, run
    another_body = await client.post("/openapi/v1/proposals", json=batch("actors", 3), headers={KEY: "shared", **other})
    assert another_body.status_code == 422  # their key now holds their request, not the admin's
    assert await db.fetchval("SELECT count(DISTINCT actor) FROM idempotency_key WHERE key = 'shared'") == 2


@pytest.mark.parametrize("key", ["", "k" * 256, "tab\tkey", "del\x7f"])
async def test_a_key_that_is_not_1_to_255_printable_ascii_is_a_400_naming_the_header(client, db, key):
    response = await client.post("/openapi/v1/proposals", json=batch("badkey", 1), headers={KEY: key})
    assert response.status_code == 400, response.text
    assert response.json()["issues"][0]["path"] == f"${KEY}"
    assert await versions(db, "badkey") == []


async def test_a_key_of_255_printable_characters_is_taken(client):
    key = "".join(chr(32 + i % 95) for i in range(255))
    response = await client.post("/openapi/v1/proposals", json=batch("longkey", 1), headers={KEY: key})
    assert response.status_code == 200, response.text


async def test_a_refusal_is_kept_and_answered_again(client, db):
    urn = ds("refused.t0")
    await client.post("/openapi/v1/proposals", json=[mcp("datasetProperties", properties("x"), urn=urn)])
    create = [mcp("datasetProperties", properties("y"), urn=urn, change_type="CREATE")]
    first = await client.post("/openapi/v1/proposals", json=create, headers={KEY: "refused"})
    assert first.status_code == 409, first.text
    await client.delete(
        f"/openapi/v3/entity/dataset/{quote(urn, safe='')}/datasetProperties"
    )  # the CREATE would succeed now
    again = await client.post("/openapi/v1/proposals", json=create, headers={KEY: "refused"})
    assert_replay_of(first, again)
    latest = "SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'datasetProperties' AND version = 0"
    assert await db.fetchval(latest, urn) == 0  # the replayed refusal wrote nothing


@pytest.mark.parametrize("settings_overrides", [{"idempotency_window_s": 0.5}])
async def test_an_answer_past_the_window_is_forgotten_and_the_request_runs_again(client, db):
    proposals = batch("expired", 2)
    first = await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "expiring"})
    assert first.status_code == 200
    await asyncio.sleep(0.7)
    again = await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "expiring"})
    assert REPLAYED not in again.headers
    assert {r["status"] for r in again.json()["results"]} == {"UNCHANGED"}
    await asyncio.sleep(0.7)
    other = await client.post("/openapi/v1/proposals", json=batch("expired", 3), headers={KEY: "expiring"})
    assert other.status_code == 200  # an expired key takes another request too
    await asyncio.sleep(0.7)
    await client.post("/openapi/v1/proposals", json=batch("purge", 1), headers={KEY: "purging"})
    assert await db.fetchval("SELECT count(*) FROM idempotency_key WHERE key = 'expiring'") == 0  # purged


async def test_a_claim_whose_process_died_before_its_write_committed_lapses_with_its_lease(client, db):
    proposals = batch("lease", 2)
    first = await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "leased"})
    assert first.status_code == 200
    # what a process that died before its write committed leaves: a claim, unanswered, not marked committed
    await db.execute(
        "UPDATE idempotency_key SET done = false, committed = false, status = NULL, headers = NULL, body = NULL, "
        "lease_until = now() + interval '30 seconds' WHERE key = 'leased'"
    )
    held = await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "leased"})
    assert held.status_code == 409, held.text
    assert held.headers["retry-after"] == "1"
    await db.execute("UPDATE idempotency_key SET lease_until = now() - interval '1 second' WHERE key = 'leased'")
    again = await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "leased"})
    assert again.status_code == 200 and REPLAYED not in again.headers
    assert {r["status"] for r in again.json()["results"]} == {"UNCHANGED"}  # no second set of versions
    assert len(await versions(db, "lease")) == 2


async def test_the_write_marks_its_claim_committed_in_its_own_transaction(client, db):
    written = await client.post("/openapi/v1/proposals", json=batch("mark", 2), headers={KEY: "marked"})
    assert written.status_code == 200
    urn = ds("mark.t0")
    create = [mcp("datasetProperties", properties("again"), urn=urn, change_type="CREATE")]
    refused = await client.post("/openapi/v1/proposals", json=create, headers={KEY: "refused-mark"})
    assert refused.status_code == 409
    marks = dict(await db.fetch("SELECT key, committed FROM idempotency_key"))
    assert marks == {"marked": True, "refused-mark": False}


async def test_a_claim_whose_process_died_after_its_write_committed_answers_that_it_was_applied(client, db):
    proposals = batch("died", 2)
    first = await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "died"})
    assert first.status_code == 200
    # what a process that died between COMMIT and storing the reply leaves: a claim marked by the write, unanswered
    await db.execute(
        "UPDATE idempotency_key SET done = false, status = NULL, headers = NULL, body = NULL, "
        "lease_until = now() + interval '30 seconds' WHERE key = 'died'"
    )
    held = await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "died"})
    assert held.status_code == 409 and "still running" in held.json()["message"]  # it may answer yet
    await db.execute("UPDATE idempotency_key SET lease_until = now() - interval '1 second' WHERE key = 'died'")
    for _ in range(2):
        again = await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "died"})
        assert again.status_code == 409, again.text
        assert "was applied (committed) already" in again.json()["message"]
        assert again.headers[REPLAYED] == "true"
    assert len(await versions(db, "died")) == 2
    assert await change_logs(db, "died") == 2


# --- in flight, and cut at COMMIT ------------------------------------------------------------------------------------


@pytest.fixture
async def park(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """Every write's COMMIT waits, in a deferred trigger on the outbox, for an advisory lock the yielded connection
    holds (as tests/integration/test_database_faults.py parks them); `UNPARK` lets them go."""
    conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    await conn.execute(f"""
        CREATE FUNCTION test_park_commit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN PERFORM pg_advisory_xact_lock({PARK_LOCK}); RETURN NULL; END $$;
        CREATE CONSTRAINT TRIGGER test_park_commit AFTER INSERT ON change_log_outbox
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_park_commit();
    """)
    await conn.execute("SELECT pg_advisory_lock($1)", PARK_LOCK)
    try:
        yield conn
    finally:
        await conn.execute("SELECT pg_advisory_unlock_all()")  # the test's database is dropped with its trigger
        await conn.close()


async def parked_commit(db: asyncpg.Connection) -> int:
    return await eventually(
        lambda: db.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'advisory'"
        ),
        timeout=20,
        interval=0.05,
    )


async def test_the_same_request_in_flight_is_a_409_and_never_a_second_write(client, db, park):
    proposals = batch("flight", 5)
    first = asyncio.create_task(client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "flying"}))
    await parked_commit(db)
    duplicate = await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "flying"})
    assert duplicate.status_code == 409, duplicate.text
    assert duplicate.headers["retry-after"] == "1"
    assert "flying" in duplicate.json()["message"]
    await park.execute("SELECT pg_advisory_unlock($1)", PARK_LOCK)
    answered = await first
    assert answered.status_code == 200, answered.text
    assert_replay_of(answered, await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "flying"}))
    assert len(await versions(db, "flight")) == 5
    assert await change_logs(db, "flight") == 5


async def test_a_write_cut_at_commit_before_it_committed_frees_its_key_and_its_retry_writes_once(client, db, park):
    proposals = batch("cut", 3)
    first = asyncio.create_task(client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "cut"}))
    assert await db.fetchval("SELECT pg_terminate_backend($1)", await parked_commit(db))
    cut = await first
    assert cut.status_code == 503, cut.text
    assert "was not committed" in cut.json()["message"]
    assert await db.fetchval("SELECT count(*) FROM idempotency_key WHERE key = 'cut'") == 0  # released
    await park.execute("SELECT pg_advisory_unlock($1)", PARK_LOCK)
    retry = await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "cut"})
    assert retry.status_code == 200 and REPLAYED not in retry.headers
    assert {r["status"] for r in retry.json()["results"]} == {"CREATED"}
    assert_replay_of(retry, await client.post("/openapi/v1/proposals", json=proposals, headers={KEY: "cut"}))
    assert await change_logs(db, "cut") == 3


# --- real processes: another worker, a restart -------------------------------------------------------------------


async def test_the_key_holds_across_workers_and_a_restart(make_database, migrated_template):
    database_url = make_database(template=migrated_template)
    dsn = database_url.replace("postgresql+asyncpg://", "postgresql://")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {"METALEDGER_DATABASE_URL": database_url, "METALEDGER_APPLY_MIGRATIONS_ON_START": "false"}
    proposals = batch("procs")
    headers = {**SYSTEM_AUTH, KEY: "across-processes"}
    answers: list[httpx.Response] = []

    async def send_many(n: int) -> None:
        for _ in range(n):  # fresh connections: the shared port hands them to either worker
            async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                answers.append(await http.post("/openapi/v1/proposals", json=proposals, headers=headers))

    supervisor = start_service(env, port, workers=2)
    try:
        await wait_healthy(base, 90, supervisor)
        await send_many(6)
    finally:
        stop_process(supervisor)
    supervisor = start_service(env, port, workers=1)
    try:
        await wait_healthy(base, 90, supervisor)
        await send_many(1)
    finally:
        stop_process(supervisor)
    first, *again = answers
    assert first.status_code == 200, first.text
    for answer in again:
        assert_replay_of(first, answer)
    db = await asyncpg.connect(dsn)
    try:
        assert len(await versions(db, "procs")) == 100
        assert await change_logs(db, "procs") == 100
    finally:
        await db.close()
