"""The runs pages against the app (httpx, real Postgres): runs written through the API with their own run ids
(systemMetadata.runId) listed, a run's aspects, the rollback's preview changing nothing, the rollback done by an
admin's session through the service (its change logs name the person), a reader's and a writer's sessions without the
control and refused a forged POST, CSRF, the read rule on what the pages show, and run ids no run has."""

from __future__ import annotations

import re
from urllib.parse import quote

import httpx
import orjson
import pytest
import pytest_asyncio

from app.ingest.gateway import ORIGIN_KEY
from tests.helpers import ds, mcp, propose, stored
from tests.web.browsing import csrf_of, sign_in

ALICE = "urn:li:corpuser:alice"
BOB = "urn:li:corpuser:bob"
A = ds("runs.orders")
B = ds("runs.created_by_r1")
VIEW = "urn:li:dataHubView:bobs_own"


def written(aspect: str, value, urn: str = A, run: str = "r1", entity: str = "dataset") -> dict:
    return mcp(aspect, value, urn, entity=entity, systemMetadata={"runId": run, "lastObserved": 1700000000000})


@pytest_asyncio.fixture
async def two_runs(client: httpx.AsyncClient) -> None:
    await propose(client, written("datasetProperties", {"description": "before"}, run="seed"))
    # r1 changes A's description and creates B
    await propose(
        client,
        written("datasetProperties", {"description": "by r1"}),
        written("datasetProperties", {"description": "new"}, urn=B),
    )
    await propose(client, written("globalTags", {"tags": [{"tag": "urn:li:tag:r2"}]}, run="r2"))


async def change_log_count(db) -> int:
    return await db.fetchval("SELECT count(*) FROM change_log_outbox")


async def aspect_rows(db) -> list:
    return [
        tuple(r)
        for r in await db.fetch("SELECT urn, aspect, version, metadata FROM metadata_aspect_v2 ORDER BY 1, 2, 3")
    ]


def cells(html: str, css_class: str) -> list[list[str]]:
    found = re.search(rf'<table class="{css_class}">.*?</table>', html, re.S)
    assert found, f"no table {css_class}"
    rows = re.findall(r"<tr>(.*?)</tr>", found.group(0), re.S)[1:]
    return [
        [
            re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", c)).strip()
            for c in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", r, re.S)
        ]
        for r in rows
    ]


async def test_the_runs_are_listed_newest_first_with_their_rows(app, two_runs):
    reader = await sign_in(app, role="reader")
    page = await reader.get("/runs")
    assert page.status_code == 200, page.text
    listed = {row[0]: row for row in cells(page.text, "runs-list")}
    assert list(listed)[:3] == ["r2", "r1", "seed"]
    assert listed["r1"][2] == "3" and listed["r2"][2] == "1"  # the aspects whose latest value is the run's
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", listed["r1"][1])
    assert 'href="/runs/r1"' in page.text


async def test_the_list_is_paged(app, client):
    for i in range(52):
        await propose(client, written("status", {"removed": False}, urn=ds(f"runs.p{i}"), run=f"page-{i:02}"))
    browser = await sign_in(app, role="reader")
    first = await browser.get("/runs")
    assert len(cells(first.text, "runs-list")) == 50 and 'href="/runs?page=2"' in first.text
    second = await browser.get("/runs", params={"page": "2"})
    assert len(cells(second.text, "runs-list")) == 2 and 'href="/runs?page=1"' in second.text
    assert (await browser.get("/runs", params={"page": "x" * 99})).status_code == 200


async def test_a_runs_page_shows_the_aspects_it_wrote(app, two_runs):
    reader = await sign_in(app, role="reader")
    page = await reader.get("/runs/r1")
    assert page.status_code == 200, page.text
    rows = cells(page.text, "run-aspects")
    assert [(r[0].split()[0], r[1]) for r in rows] == [
        ("runs.created_by_r1", "datasetKey key"),
        ("runs.created_by_r1", "datasetProperties"),
        ("runs.orders", "datasetProperties"),
    ]
    assert "&#34;description&#34;: &#34;by r1&#34;" in page.text  # the value, escaped
    assert f'href="/dataset/{quote(A, safe="")}"' in page.text


async def test_the_preview_lists_what_a_rollback_would_change_and_changes_nothing(app, db, two_runs):
    before, logs = await aspect_rows(db), await change_log_count(db)
    admin = await sign_in(app, role="admin")
    page = await admin.get("/runs/r1/rollback")
    assert page.status_code == 200, page.text
    changes = cells(page.text, "rollback-changes")
    assert sorted((r[0].split()[0], r[1], r[2]) for r in changes) == [
        ("runs.created_by_r1", "datasetProperties", "Delete: the run created this aspect"),
        ("runs.created_by_r1", "status", "Mark the entity removed (soft delete)"),
        ("runs.orders", "datasetProperties", "Restore the value it had before the run"),
    ]
    assert "&#34;description&#34;: &#34;before&#34;" in page.text  # the value it would go back to
    assert 'action="/runs/r1/rollback"' in page.text and 'name="csrf_token"' in page.text
    assert await aspect_rows(db) == before and await change_log_count(db) == logs  # nothing written
    hard = await admin.get("/runs/r1/rollback", params={"safe": "false"})
    assert "Delete the entity the run created: every aspect, every version" in hard.text
    assert '<input type="hidden" name="safe" value="false">' in hard.text
    assert await aspect_rows(db) == before


async def test_an_admin_rolls_back_a_run_as_the_person(app, client, db, two_runs):
    admin = await sign_in(app, role="admin", actor=ALICE)
    preview = await admin.get("/runs/r1/rollback")
    done = await admin.post("/runs/r1/rollback", data={"csrf_token": csrf_of(preview.text), "safe": "true"})
    assert done.status_code == 303, done.text
    assert done.headers["location"].startswith("/runs/r1?done=")
    outcome = await admin.get(done.headers["location"])
    assert "Rolled back" in outcome.text and "2 aspects reverted, 1 entity removed." in outcome.text
    assert 'href="/runs/__rollback%3Ar1"' in outcome.text
    # read back through the API
    a = await client.get(f"/openapi/v3/entity/dataset/{quote(A, safe='')}/datasetProperties")
    assert a.status_code == 200 and a.json()["value"]["description"] == "before"
    b = await client.get(f"/openapi/v3/entity/dataset/{quote(B, safe='')}/datasetProperties")
    assert b.status_code == 404
    assert (await stored(db, B, "status"))["value"] == {"removed": True}
    logs = await db.fetch(
        "SELECT payload FROM change_log_outbox WHERE topic LIKE 'MetadataChangeLog_%' AND urn IN ($1, $2) ORDER BY id DESC LIMIT 3",
        A,
        B,
    )
    for row in logs:  # the rollback's change logs: the person, the web view, the rollback's own run
        payload = orjson.loads(row["payload"])
        assert payload["created"]["actor"] == ALICE
        assert payload["systemMetadata"]["runId"] == "__rollback:r1"
        assert payload["systemMetadata"]["properties"][ORIGIN_KEY] == "web"
    assert "r1" not in {row[0] for row in cells((await admin.get("/runs")).text, "runs-list")}
    again = await admin.get("/runs/r1/rollback")  # nothing left: no control
    assert "nothing left to roll back" in again.text and 'method="post" action="/runs/r1/rollback"' not in again.text


async def test_a_forged_outcome_is_not_shown(app, two_runs):
    admin = await sign_in(app, role="admin")
    page = await admin.get("/runs/r1", params={"done": "5.5.0.00000000000000000000000000000000"})
    assert page.status_code == 200 and "Rolled back" not in page.text


@pytest.mark.parametrize("role", ["reader", "writer"])
async def test_no_rollback_control_without_the_admin_role_and_a_forged_post_is_403(app, db, two_runs, role):
    browser = await sign_in(app, role=role)
    preview = await browser.get("/runs/r1/rollback")
    assert preview.status_code == 200 and "Restore the value it had before the run" in preview.text
    assert 'method="post" action="/runs/r1/rollback"' not in preview.text and "needs the admin role" in preview.text
    before = await aspect_rows(db)
    forged = await browser.post("/runs/r1/rollback", data={"csrf_token": csrf_of(preview.text), "safe": "false"})
    assert forged.status_code == 403 and "ADMIN" in forged.text
    assert await aspect_rows(db) == before


async def test_a_rollback_without_the_sessions_csrf_token_is_403(app, db, two_runs):
    admin = await sign_in(app, role="admin")
    other = await sign_in(app, role="admin", actor=BOB)
    before = await aspect_rows(db)
    assert (await admin.post("/runs/r1/rollback", data={"safe": "true"})).status_code == 403
    bobs = csrf_of((await other.get("/runs")).text)
    assert (await admin.post("/runs/r1/rollback", data={"csrf_token": bobs})).status_code == 403
    assert await aspect_rows(db) == before


async def test_what_a_reader_may_not_see_is_left_out(app, client, db):
    view = {
        "name": "bob's",
        "type": "PERSONAL",
        "definition": {"entityTypes": [], "filter": {"or": []}},
        "created": {"time": 1, "actor": BOB},
        "lastModified": {"time": 1, "actor": BOB},
    }
    await propose(
        client,
        written("dataHubViewInfo", view, urn=VIEW, run="views", entity="dataHubView"),
        written("datasetProperties", {"description": "x"}, run="views"),
    )
    alice = await sign_in(app, role="reader")
    page = await alice.get("/runs/views")
    assert VIEW not in page.text and "runs.orders" in page.text
    preview = await alice.get("/runs/views/rollback")
    assert VIEW not in preview.text and "runs.orders" in preview.text
    bob = await sign_in(app, role="reader", actor=BOB)
    assert VIEW in (await bob.get("/runs/views")).text


async def test_run_ids_no_run_has_are_400_or_404_pages(app, client, two_runs):
    await propose(client, written("status", {"removed": False}, run="nightly/2024-01-01"))
    browser = await sign_in(app, role="admin")
    for path, status in (
        ("/runs/" + "x" * 501, 400),
        ("/runs/" + "x" * 501 + "/rollback", 400),
        ("/runs/a%01b", 400),
        ("/runs/a%00b", 400),
        ("/runs/no-run-id-provided", 400),
        ("/runs/nope", 404),
        ("/runs/nope/rollback", 404),
        ("/runs/%3Cscript%3E", 404),
        ("/runs/nightly/2024-01-01", 404),  # a `/` of a run id travels encoded
        ("/runs/r1/rollback/more", 404),
    ):
        answer = await browser.get(path)
        assert answer.status_code == status, (path, answer.status_code, answer.text[:300])
        assert answer.headers["content-type"].startswith("text/html"), path
    assert "&lt;script&gt;" in (await browser.get("/runs/%3Cscript%3E")).text
    preview = await browser.get("/runs/nope/rollback")
    csrf = csrf_of(preview.text)
    assert (await browser.post("/runs/nope/rollback", data={"csrf_token": csrf})).status_code == 404
    assert (await browser.post("/runs/" + "y" * 600 + "/rollback", data={"csrf_token": csrf})).status_code == 400
    encoded = await browser.get("/runs/" + quote("nightly/2024-01-01", safe=""))
    assert encoded.status_code == 200 and "runs.orders" in encoded.text
    listed = await browser.get("/runs")
    assert 'href="/runs/nightly%2F2024-01-01"' in listed.text
