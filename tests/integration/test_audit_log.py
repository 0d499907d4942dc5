"""The audit log against the real Postgres (app.audit, app.api.audit): every aspect write with its actor, token,
surface, versions, run and trace; token create/revoke, rollback, processor pipeline changes; exact filters and cursor
pages; an actor reads its own; the hash chain's verification naming an edited or deleted entry; retention keeping the
chain's anchor."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from app.audit import repository as audit_repository
from app.audit import service as audit_service
from app.audit.model import Entry
from tests.helpers import ANY_TRACE_ID, bearer, ds, mcp, restli_propose

ALICE = "urn:li:corpuser:alice"
BOB = "urn:li:corpuser:bob"
CAROL = "urn:li:corpuser:carol"
ADMIN = "urn:li:corpuser:datahub"  # the `client` fixture's actor

UPDATE_DESCRIPTION = """
    mutation updateDescription($input: DescriptionUpdateInput!) { updateDescription(input: $input) }
"""
LINEAGE = "/openapi/openlineage/api/v1/lineage"
PRODUCER = "https://github.com/OpenLineage/OpenLineage/tree/1.30.0/client/python"


def properties(name: str, description: str = "") -> dict[str, Any]:
    return {"name": name, "description": description, "customProperties": {}, "tags": []}


def lineage_event(run_id: str) -> dict[str, Any]:
    return {
        "eventType": "START",
        "eventTime": "2024-05-01T10:00:00.000Z",
        "producer": PRODUCER,
        "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
        "run": {"runId": run_id},
        "job": {"namespace": "audit", "name": "etl.audited"},
        "inputs": [{"namespace": "postgres://db.example:5432", "name": "shop.public.orders"}],
        "outputs": [],
    }


class Caller:
    """An HTTP client of the app with a token of its own, and that token's id."""

    def __init__(self, http: httpx.AsyncClient, token_id: str) -> None:
        self.http = http
        self.token_id = token_id


@pytest_asyncio.fixture
async def callers(app) -> AsyncIterator[dict[str, Caller]]:
    made: dict[str, Caller] = {}
    clients = []
    for actor, role in ((ALICE, "writer"), (BOB, "writer"), (CAROL, "writer")):
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://metaledger", headers=await bearer(app, role, actor)
        )
        clients.append(http)
        me = await http.get("/openapi/v1/auth/me")
        assert me.status_code == 200, me.text
        made[actor] = Caller(http, me.json()["tokenId"])
    yield made
    for http in clients:
        await http.aclose()


async def audit(http: httpx.AsyncClient, expect: int = 200, **params: Any) -> Any:
    response = await http.get("/openapi/v1/audit", params={k: v for k, v in params.items() if v is not None})
    assert response.status_code == expect, response.text
    return response.json()


async def every_entry(http: httpx.AsyncClient, count: int = 1000, **params: Any) -> list[dict[str, Any]]:
    """Every entry matching, page by page."""
    found, cursor = [], None
    while True:
        page = await audit(http, count=count, cursor=cursor, **params)
        found += page["entries"]
        cursor = page["next"]
        if cursor is None:
            return found


async def verify(http: httpx.AsyncClient) -> dict[str, Any]:
    response = await http.get("/openapi/v1/audit/verify")
    assert response.status_code == 200, response.text
    return response.json()


def fields(entry: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: entry[name] for name in names}


WRITE_FIELDS = ("action", "actor", "tokenId", "surface", "urn", "aspect", "changeType", "versionBefore", "versionAfter")


# --- what is recorded --------------------------------------------------------------------------------------------


async def test_writes_by_three_tokens_across_v3_restli_graphql_and_openlineage_are_recorded(client, callers):
    alice, bob, carol = callers[ALICE], callers[BOB], callers[CAROL]
    v3, restli = ds("audit.v3"), ds("audit.restli")
    for description in ("first", "second"):
        body = [{"urn": v3, "datasetProperties": {"value": properties("v3", description)}}]
        response = await alice.http.post("/openapi/v3/entity/dataset?async=false", json=body)
        assert response.status_code == 200, response.text
    proposal = mcp("datasetProperties", properties("restli"), urn=restli, encode=True, systemMetadata={"runId": "r-1"})
    response = await restli_propose(bob.http, proposal)
    assert response.status_code == 200, response.text
    variables = {"input": {"description": "curated", "resourceUrn": restli}}
    body = {"query": UPDATE_DESCRIPTION, "variables": variables, "operationName": "updateDescription"}
    response = await bob.http.post("/api/graphql", json=body)
    assert response.json() == {"data": {"updateDescription": True}}, response.text
    response = await carol.http.post(LINEAGE, json=lineage_event(str(uuid.uuid4())))
    assert response.status_code == 200, response.text

    by_alice = [e for e in await every_entry(client, actor=ALICE) if e["aspect"] == "datasetProperties"]
    assert [fields(e, *WRITE_FIELDS) for e in by_alice] == [
        {
            "action": "aspect.write",
            "actor": ALICE,
            "tokenId": alice.token_id,
            "surface": "v3",
            "urn": v3,
            "aspect": "datasetProperties",
            "changeType": "UPSERT",
            "versionBefore": before,
            "versionAfter": after,
        }
        for before, after in ((None, 1), (1, 2))
    ]
    assert all(e["traceId"] == ANY_TRACE_ID for e in by_alice)
    assert by_alice[0]["position"] < by_alice[1]["position"]

    by_bob = await every_entry(client, actor=BOB, urn=restli)
    written = {(e["aspect"], e["surface"]): e for e in by_bob}
    assert fields(written["datasetProperties", "restli"], "tokenId", "runId", "versionAfter") == {
        "tokenId": bob.token_id,
        "runId": "r-1",
        "versionAfter": 1,
    }
    assert fields(written["editableDatasetProperties", "graphql"], "tokenId", "changeType", "versionAfter") == {
        "tokenId": bob.token_id,
        "changeType": "UPSERT",
        "versionAfter": 1,
    }

    by_carol = await every_entry(client, actor=CAROL)
    assert by_carol, "the OpenLineage event's writes are recorded"
    assert {(e["surface"], e["tokenId"], e["action"]) for e in by_carol} == {
        ("openlineage", carol.token_id, "aspect.write")
    }


async def test_an_unchanged_write_is_not_an_entry_and_a_delete_has_no_version_after(client, db):
    urn = ds("audit.unchanged")
    write = mcp("datasetProperties", properties("same"), urn=urn)
    for _ in range(2):
        assert (await client.post("/openapi/v1/proposals", json=[write])).status_code == 200
    entries = await every_entry(client, urn=urn, action="aspect.write")
    assert [(e["aspect"], e["versionAfter"]) for e in entries if e["aspect"] == "datasetProperties"] == [
        ("datasetProperties", 1)
    ]
    deleted = mcp("datasetProperties", None, urn=urn, change_type="DELETE")
    assert (await client.post("/openapi/v1/proposals", json=[deleted])).status_code == 200
    last = (await every_entry(client, urn=urn))[-1]
    assert fields(last, "changeType", "versionBefore", "versionAfter", "surface") == {
        "changeType": "DELETE",
        "versionBefore": 1,
        "versionAfter": None,
        "surface": "v1",
    }


async def test_token_create_and_revoke_are_recorded(client):
    response = await client.post("/openapi/v1/auth/tokens", json={"actor": ALICE, "role": "reader"})
    assert response.status_code == 201, response.text
    token_id = response.json()["id"]
    admin_token = (await client.get("/openapi/v1/auth/me")).json()["tokenId"]
    assert (await client.delete(f"/openapi/v1/auth/tokens/{token_id}")).status_code == 200

    created = await every_entry(client, action="token.create", urn=ALICE)
    assert [fields(e, "actor", "tokenId", "surface", "detail") for e in created] == [
        {"actor": ADMIN, "tokenId": admin_token, "surface": "v1", "detail": {"token": token_id, "role": "reader"}}
    ]
    revoked = await every_entry(client, action="token.revoke")
    assert [fields(e, "actor", "detail") for e in revoked] == [{"actor": ADMIN, "detail": {"token": token_id}}]
    # revoking an unknown token records nothing
    assert (await client.delete("/openapi/v1/auth/tokens/nope")).status_code == 404
    assert len(await every_entry(client, action="token.revoke")) == 1


async def test_a_rollback_is_recorded_and_its_dry_run_is_not(client):
    proposal = mcp("datasetProperties", properties("rb"), urn=ds("audit.rb"), systemMetadata={"runId": "run-audit"})
    assert (await client.post("/openapi/v1/proposals", json=[proposal])).status_code == 200
    dry = await client.post("/runs?action=rollback", json={"runId": "run-audit", "dryRun": True, "safe": False})
    assert dry.status_code == 200, dry.text
    assert await every_entry(client, action="run.rollback") == []
    done = await client.post("/runs?action=rollback", json={"runId": "run-audit", "safe": False})
    assert done.status_code == 200, done.text
    (entry,) = await every_entry(client, action="run.rollback")
    assert fields(entry, "actor", "runId", "surface") == {"actor": ADMIN, "runId": "run-audit", "surface": "restli"}
    assert entry["detail"]["entitiesDeleted"] == 1


async def test_a_processor_pipeline_change_is_its_own_action(client):
    response = await client.put("/openapi/v1/change-processors", json={"steps": []})
    assert response.status_code == 200, response.text
    (entry,) = await every_entry(client, action="processor.change")
    assert fields(entry, "actor", "surface", "changeType") == {"actor": ADMIN, "surface": "v1", "changeType": "UPSERT"}
    assert await every_entry(client, action="model.apply") == []


# --- filters, pages, who reads ------------------------------------------------------------------------------------


async def test_each_filter_is_exact(client, callers):
    alice = callers[ALICE]
    short, longer = ds("audit.f"), ds("audit.f2")
    assert (
        await alice.http.post("/openapi/v1/proposals", json=[mcp("status", {"removed": False}, urn=short)])
    ).status_code == 200
    await asyncio.sleep(0.05)
    middle = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    assert (
        await client.post("/openapi/v1/proposals", json=[mcp("status", {"removed": False}, urn=longer)])
    ).status_code == 200

    assert {e["urn"] for e in await every_entry(client, urn=short)} == {short}
    assert {e["actor"] for e in await every_entry(client, actor=ALICE)} == {ALICE}
    assert await every_entry(client, actor="urn:li:corpuser:alic") == []
    assert {e["action"] for e in await every_entry(client, action="aspect.write")} == {"aspect.write"}
    assert await every_entry(client, action="aspect") == []
    writes = {"action": "aspect.write"}
    assert {e["urn"] for e in await every_entry(client, since=middle, **writes)} == {longer}
    assert {e["urn"] for e in await every_entry(client, until=middle, **writes)} == {short}
    assert {e["urn"] for e in await every_entry(client, **writes)} == {short, longer}


async def test_pages_follow_the_cursor_in_chain_order(client):
    for i in range(7):
        proposal = mcp("status", {"removed": False}, urn=ds(f"audit.page{i}"))
        assert (await client.post("/openapi/v1/proposals", json=[proposal])).status_code == 200
    everything = await every_entry(client, action="aspect.write")
    pages, cursor = [], None
    while True:
        page = await audit(client, action="aspect.write", count=3, cursor=cursor)
        pages.append(page["entries"])
        cursor = page["next"]
        if cursor is None:
            break
    assert [len(p) for p in pages[:-1]] == [3] * (len(pages) - 1) and 1 <= len(pages[-1]) <= 3
    assert [e["id"] for p in pages for e in p] == [e["id"] for e in everything]
    positions = [e["position"] for e in everything]
    assert positions == sorted(positions)
    await audit(client, expect=400, cursor="not-a-cursor")


async def test_a_caller_not_an_admin_reads_its_own_entries_only(app, client, callers):
    alice = callers[ALICE]
    assert (
        await alice.http.post("/openapi/v1/proposals", json=[mcp("status", {"removed": False}, urn=ds("audit.own"))])
    ).status_code == 200
    assert (
        await client.post("/openapi/v1/proposals", json=[mcp("status", {"removed": False}, urn=ds("audit.admin"))])
    ).status_code == 200
    own = await every_entry(alice.http)
    assert own and {e["actor"] for e in own} == {ALICE}
    assert await every_entry(alice.http, actor=ALICE) == own
    refused = await audit(alice.http, expect=403, actor=ADMIN)
    assert "own" in refused["message"]
    assert (await alice.http.get("/openapi/v1/audit/verify")).status_code == 403
    # an admin reads anyone's
    assert {e["actor"] for e in await every_entry(client)} >= {ALICE, ADMIN}
    reader = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://metaledger", headers=await bearer(app, "reader", BOB)
    )
    async with reader:
        assert await every_entry(reader) == []


async def test_reading_the_log_needs_a_token(anonymous):
    assert (await anonymous.get("/openapi/v1/audit")).status_code == 401
    assert (await anonymous.get("/openapi/v1/audit/verify")).status_code == 401


# --- the chain ---------------------------------------------------------------------------------------------------


async def write_some(client, n: int, prefix: str) -> None:
    proposals = [mcp("status", {"removed": False}, urn=ds(f"audit.{prefix}{i}")) for i in range(n)]
    assert (await client.post("/openapi/v1/proposals", json=proposals)).status_code == 200


async def test_verify_holds_and_names_the_entry_edited_in_sql(client, db):
    await write_some(client, 5, "edit")
    held = await verify(client)
    total = await db.fetchval("SELECT count(*) FROM audit_log")
    assert held["holds"] is True and held["checked"] == total
    victim = await db.fetchrow(
        "SELECT id, seq FROM audit_log WHERE urn = $1 AND action = 'aspect.write'", ds("audit.edit2")
    )
    assert (await verify(client))["holds"] is True  # verifying again changes nothing

    await db.execute("UPDATE audit_log SET actor = 'urn:li:corpuser:mallory' WHERE id = $1", victim["id"])
    broken = await verify(client)
    assert broken["holds"] is False
    assert broken["entry"] == {"id": victim["id"], "position": victim["seq"]}
    assert broken["checked"] == victim["seq"] - 1
    assert "hash" in broken["reason"]


async def test_an_edited_hash_is_named(client, db):
    await write_some(client, 3, "hash")
    assert (await verify(client))["holds"] is True
    first = await db.fetchrow("SELECT id, seq FROM audit_log ORDER BY seq LIMIT 1")
    await db.execute("UPDATE audit_log SET hash = repeat('0', 64) WHERE id = $1", first["id"])
    broken = await verify(client)
    assert broken["holds"] is False and broken["entry"]["id"] == first["id"]


async def test_verify_names_where_the_chain_breaks_after_a_delete(client, db):
    await write_some(client, 5, "delete")
    assert (await verify(client))["holds"] is True
    rows = await db.fetch("SELECT id, seq FROM audit_log ORDER BY seq")
    gone, after = rows[2], rows[3]
    await db.execute("DELETE FROM audit_log WHERE id = $1", gone["id"])
    broken = await verify(client)
    assert broken["holds"] is False
    assert broken["entry"] == {"id": after["id"], "position": after["seq"]}
    assert f"positions {gone['seq']}..{gone['seq']}" in broken["reason"]


async def test_verify_names_deleted_last_entries(client, db):
    await write_some(client, 4, "tail")
    assert (await verify(client))["holds"] is True
    rows = await db.fetch("SELECT id, seq FROM audit_log ORDER BY seq")
    await db.execute("DELETE FROM audit_log WHERE seq >= $1", rows[-2]["seq"])
    broken = await verify(client)
    assert broken["holds"] is False
    assert broken["entry"] == {"id": rows[-3]["id"], "position": rows[-3]["seq"]}
    assert "last" in broken["reason"]


async def test_an_entry_is_chained_when_its_transaction_commits_whatever_its_id(client, db):
    """Concurrent writers commit out of id order: an entry gets its position once its transaction has committed,
    after every entry sealed before, and the chain holds."""
    await write_some(client, 1, "open")
    async with db.transaction():
        await audit_repository.record(db, Entry("web.sign_in", "urn:li:corpuser:slow", surface="web"))
        slow_id = await db.fetchval("SELECT max(id) FROM audit_log")
        await write_some(client, 1, "later")
        listed = await every_entry(client)
        assert slow_id not in {e["id"] for e in listed}  # not committed: not in the chain
        later = next(e for e in listed if e["urn"] == ds("audit.later0") and e["aspect"] == "status")
        assert later["id"] > slow_id
    slow = next(e for e in await every_entry(client) if e["id"] == slow_id)
    assert slow["position"] > later["position"]
    assert (await verify(client))["holds"] is True


# --- retention ---------------------------------------------------------------------------------------------------


async def test_a_purge_deletes_the_oldest_and_verify_still_holds(client, db):
    await write_some(client, 6, "purge")
    assert (await verify(client))["holds"] is True
    rows = await db.fetch("SELECT id, seq, hash FROM audit_log ORDER BY seq")
    old = rows[:3]
    # made old as a purge finds them (their hashes no longer match: the purge removes them with the evidence)
    await db.execute("UPDATE audit_log SET at = at - interval '10 days' WHERE seq <= $1", old[-1]["seq"])
    assert await audit_service.purge(db, 0) == 0  # 0: kept forever
    assert await audit_service.purge(db, 30) == 0  # none is past 30 days
    assert await audit_service.purge(db, 1) == 3
    assert await db.fetchval("SELECT min(seq) FROM audit_log") == old[-1]["seq"] + 1
    anchor = await db.fetchrow("SELECT anchor_seq, anchor_hash FROM audit_chain")
    assert tuple(anchor) == (old[-1]["seq"], old[-1]["hash"])
    held = await verify(client)
    assert held["holds"] is True and held["checked"] == len(rows) - 3
    # an entry written after the purge chains on
    await write_some(client, 1, "after-purge")
    assert (await verify(client))["holds"] is True


async def test_a_purge_stops_at_the_first_young_entry(client, db):
    await write_some(client, 4, "young")
    assert (await verify(client))["holds"] is True
    rows = await db.fetch("SELECT seq FROM audit_log ORDER BY seq")
    await db.execute(
        "UPDATE audit_log SET at = at - interval '10 days' WHERE seq = ANY($1::bigint[])",
        [rows[0]["seq"], rows[2]["seq"]],
    )
    assert await audit_service.purge(db, 1) == 1
    assert await db.fetchval("SELECT anchor_seq FROM audit_chain") == rows[0]["seq"]


@pytest.mark.parametrize("path", ["/openapi/v1/audit", "/openapi/v1/audit/verify"])
async def test_the_routes_answer_the_admin(client, path):
    assert (await client.get(path)).status_code == 200
