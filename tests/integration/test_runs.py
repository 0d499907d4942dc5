"""Rest.li `/runs` against the real Postgres: list, describe, and rollback aspect by aspect (app.runs)."""

from __future__ import annotations

import orjson

from tests import helpers
from tests.helpers import RESTLI_HEADERS, restli_propose, stored

A = helpers.ds("db.orders")
B = helpers.ds("db.created_by_r1")


def mcp(aspect, value, urn=A, run="r1"):
    return helpers.mcp(aspect, value, urn, encode=True, systemMetadata={"runId": run, "lastObserved": 1700000000000})


async def runs(client, action, **body):
    response = await client.post(f"/runs?action={action}", content=orjson.dumps(body), headers=RESTLI_HEADERS)
    assert response.status_code == 200, response.text
    return response.json()["value"]


async def change_logs(db):
    return [
        (r["urn"], r["aspect"], r["change_type"], orjson.loads(r["payload"]))
        for r in await db.fetch(
            "SELECT urn, aspect, change_type, payload FROM change_log_outbox "
            "WHERE topic LIKE 'MetadataChangeLog_%' ORDER BY id"
        )
    ]


async def seed_and_two_runs(client):
    ok = lambda r: r.status_code == 200 or AssertionError(r.text)  # noqa: E731
    assert ok(
        await restli_propose(
            client,
            mcp("datasetProperties", {"description": "before"}, run="seed"),
            mcp("status", {"removed": False}, run="seed"),
        )
    )
    # r1: updates A's description, creates A's tags, re-observes A's status, creates B
    assert ok(
        await restli_propose(
            client,
            mcp("datasetProperties", {"description": "by r1"}),
            mcp("globalTags", {"tags": [{"tag": "urn:li:tag:r1"}]}),
            mcp("status", {"removed": False}),
            mcp("datasetProperties", {"description": "new"}, urn=B),
            mcp("status", {"removed": False}, urn=B),
        )
    )
    # r2 changes what r1 created on A, later
    assert ok(
        await restli_propose(
            client,
            mcp("globalTags", {"tags": [{"tag": "urn:li:tag:r2"}]}, run="r2"),
            mcp("ownership", {"owners": []}, run="r2"),
        )
    )


async def test_list_describe_and_rollback_aspect_by_aspect(client, db):
    await seed_and_two_runs(client)
    listed = {r["runId"]: r for r in await runs(client, "list", pageOffset=0, pageSize=100, includeSoft=False)}
    # r1's latest rows: A.datasetProperties, A.status (re-observed), B's datasetProperties, status and key
    assert listed["r1"]["rows"] == 5 and listed["r2"]["rows"] == 2 and listed["seed"]["rows"] >= 1
    assert isinstance(listed["r1"]["timestamp"], int)

    described = await runs(client, "describe", runId="r1", start=0, count=100, includeSoft=False, includeAspect=True)
    assert [(r["urn"], r["aspectName"]) for r in described] == sorted(
        [(A, "datasetProperties"), (A, "status"), (B, "datasetKey"), (B, "datasetProperties"), (B, "status")]
    )
    props = next(r for r in described if r["urn"] == A and r["aspectName"] == "datasetProperties")
    assert props["aspect"] == {
        "com.linkedin.dataset.DatasetProperties": {"description": "by r1", "customProperties": {}, "tags": []}
    }
    assert props["runId"] == "r1" and props["keyAspect"] is False
    assert next(r for r in described if r["aspectName"] == "datasetKey")["keyAspect"] is True
    soft = await runs(client, "describe", runId="r1", start=0, count=100, includeSoft=True)
    assert (A, "globalTags") in {(r["urn"], r["aspectName"]) for r in soft}  # superseded by r2, still r1's write
    paged = await runs(client, "describe", runId="r1", start=1, count=2)
    assert [(r["urn"], r["aspectName"]) for r in paged] == [(r["urn"], r["aspectName"]) for r in described[1:3]]

    logs_before = await change_logs(db)
    plan = await runs(client, "rollback", runId="r1", dryRun=True, safe=True)
    assert await change_logs(db) == logs_before  # a dry run writes nothing
    assert plan["aspectsReverted"] == 2 and plan["entitiesDeleted"] == 1
    assert plan["unsafeEntitiesCount"] == 1 and plan["unsafeEntities"] == [{"urn": A}] and plan["aspectsAffected"] == 1
    assert {(r["urn"], r["aspectName"]) for r in plan["aspectRowSummaries"]} == {
        (A, "datasetProperties"),
        (B, "datasetProperties"),
    }

    done = await runs(client, "rollback", runId="r1", dryRun=False, safe=True)
    assert done == plan  # the dry run said exactly what happened
    assert (await stored(db, A, "datasetProperties"))["value"]["description"] == "before"
    assert (await stored(db, A, "globalTags"))["value"]["tags"] == [{"tag": "urn:li:tag:r2"}]  # r2's later change kept
    assert (await stored(db, A, "status"))["value"] == {"removed": False}  # only re-observed by r1
    assert await stored(db, B, "datasetProperties") is None  # created by r1: deleted
    assert (await stored(db, B, "status"))["value"] == {"removed": True}  # B, created by r1: soft-removed
    assert await stored(db, B, "datasetKey") is not None
    new_logs = (await change_logs(db))[len(logs_before) :]
    assert sorted((u, a, c) for u, a, c, _ in new_logs) == [  # one change log per aspect rolled back
        (B, "datasetProperties", "DELETE"),
        (B, "status", "UPSERT"),
        (A, "datasetProperties", "UPSERT"),
    ]
    for _, _, _, payload in new_logs:  # attributed to the caller, under the rollback's own run id
        assert payload["created"]["actor"] == helpers.TEST_ACTOR
        assert payload["systemMetadata"]["runId"] == "__rollback:r1"
    restored = await stored(db, A, "datasetProperties")
    assert restored["createdBy"] == helpers.TEST_ACTOR and restored["systemMetadata"]["version"] == "3"

    again = await runs(client, "rollback", runId="r1", dryRun=False, safe=True)  # idempotent
    assert again["aspectsReverted"] == 0 and again["entitiesDeleted"] == 0 and again["unsafeEntities"] == [{"urn": A}]
    assert len(await change_logs(db)) == len(logs_before) + 3
    assert "r1" not in {r["runId"] for r in await runs(client, "list")}
    assert "r1" in {r["runId"] for r in await runs(client, "list", includeSoft=True)}
    assert "__rollback:r1" in {r["runId"] for r in await runs(client, "list")}

    # safe=false: r2's later change to what r1 created goes too, and B is deleted outright
    nuke = await runs(client, "rollback", runId="r1", dryRun=False, safe=False)
    assert nuke["aspectsReverted"] == 1 and nuke["entitiesDeleted"] == 1
    assert await stored(db, A, "globalTags") is None
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", B) == 0


async def test_reserved_and_unknown_runs(client):
    response = await client.post(
        "/runs?action=rollback", content=orjson.dumps({"runId": "no-run-id-provided"}), headers=RESTLI_HEADERS
    )
    assert response.status_code == 400 and "no-run-id-provided" in response.json()["message"]
    assert (await runs(client, "rollback", runId="never-ran"))["aspectsReverted"] == 0
    assert await runs(client, "describe", runId="never-ran") == []
    response = await client.post("/runs?action=nope", content=b"{}", headers=RESTLI_HEADERS)
    assert response.status_code == 400


async def test_rollback_pages_through_a_large_run(client, db, monkeypatch):
    from app.runs import service

    monkeypatch.setattr(service, "PAGE", 7)  # many pages, entities split across them
    urns = [helpers.ds(f"db.t{i:03d}") for i in range(40)]
    for urn in urns:
        assert (
            await restli_propose(client, mcp("datasetProperties", {"description": "old"}, urn=urn, run="seed"))
        ).status_code == 200
    batch = [mcp("datasetProperties", {"description": "big"}, urn=u, run="big") for u in urns]
    batch += [mcp("status", {"removed": False}, urn=helpers.ds(f"db.new{i:03d}"), run="big") for i in range(20)]
    assert (await restli_propose(client, *batch)).status_code == 200
    done = await runs(client, "rollback", runId="big")
    assert done["aspectsReverted"] == 40 and done["entitiesDeleted"] == 20 and done["entitiesAffected"] == 60
    assert len(done["aspectRowSummaries"]) == 40  # a soft-removed entity's key aspect is not listed (DataHub's)
    assert (
        await db.fetchval(
            "SELECT count(*) FROM metadata_aspect_v2 WHERE version = 0 AND aspect = 'datasetProperties' AND metadata LIKE '%big%'"
        )
        == 0
    )


async def test_an_interrupted_rollback_resumes_where_it_stopped(client, db, monkeypatch):
    """The database lost mid-rollback (after two pages committed): the caller gets a 503, and the same rollback
    again does the rest — each aspect rolled back once, one change log each, nothing reverted twice."""
    from app.errors import ServiceUnavailable
    from app.runs import service

    monkeypatch.setattr(service, "PAGE", 5)
    urns = [helpers.ds(f"db.r{i:02d}") for i in range(20)]
    assert (
        await restli_propose(
            client, *[mcp("datasetProperties", {"description": "old"}, urn=u, run="seed") for u in urns]
        )
    ).status_code == 200
    assert (
        await restli_propose(
            client, *[mcp("datasetProperties", {"description": "bad"}, urn=u, run="bad") for u in urns]
        )
    ).status_code == 200
    pages, page = 0, service.Rollback._page

    async def lost_on_the_third_page(self, keys):
        nonlocal pages
        pages += 1
        if pages == 3:
            raise ServiceUnavailable("the connection to the database was lost; retry", retry_after_s=1)
        await page(self, keys)

    monkeypatch.setattr(service.Rollback, "_page", lost_on_the_third_page)
    response = await client.post(
        "/runs?action=rollback", content=orjson.dumps({"runId": "bad"}), headers=RESTLI_HEADERS
    )
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    bad_left = "SELECT count(*) FROM metadata_aspect_v2 WHERE version = 0 AND metadata LIKE '%bad%'"
    assert await db.fetchval(bad_left) == 10  # two pages of five rolled back, committed

    resumed = await runs(client, "rollback", runId="bad")
    assert resumed["aspectsReverted"] == 10  # the rest; the first ten are not reverted again
    assert await db.fetchval(bad_left) == 0
    logs = [
        (u, a)
        for u, a, _, payload in await change_logs(db)
        if payload["systemMetadata"].get("runId") == "__rollback:bad"
    ]
    assert sorted(logs) == sorted((u, "datasetProperties") for u in urns)  # one change log per aspect
    assert (await runs(client, "rollback", runId="bad"))["aspectsReverted"] == 0  # and again: nothing left
