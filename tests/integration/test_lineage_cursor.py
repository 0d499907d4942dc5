"""A lineage search's cursor continues its walk (app.search.across.scroll_lineage): the next page starts where the
previous one stopped — the walk's state kept in the process, or walked again to the cursor's position where it is
not (another worker's cursor) — and the pages together are the whole answer, none twice, none missing. A cursor
edited, expired, or of another search or caller is a 400 naming `$input.scrollId`. Every stage keeps the request's
budget: the walk stops at its share, and a page holds no more results than the share kept back completes.

The slow database is an input: the edge table locked for the hops that must not finish, or a hop's statement made
to take a fixed time; the budgets are far from what must (or cannot) finish within them."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import httpx
import orjson
import pytest

from app import read_deadline
from app.embedded_pg import free_port
from app.search import across
from app.search.postgres import PostgresBackend
from tests.integration.test_read_deadlines import (
    DEADLINE,
    FAN,
    HUB,
    PARTIAL,
    SCROLL,
    START,
    graphql,
    lock_hops_past_the_first,
    urns,
    whole,
    write_graph,
)
from tests.processes import SYSTEM_AUTH, start_service, stop_process, wait_healthy

pytestmark = pytest.mark.asyncio


def count_hops(monkeypatch) -> list[list[str]]:
    """The frontier of every lineage statement from now on."""
    original = PostgresBackend.lineage_hop
    asked: list[list[str]] = []

    async def lineage_hop(self, nodes, *, direction):
        asked.append(list(nodes))
        return await original(self, nodes, direction=direction)

    monkeypatch.setattr(PostgresBackend, "lineage_hop", lineage_hop)
    return asked


async def scroll(client, scroll_id: str | None, count: int, headers: dict[str, str] | None = None) -> dict[str, Any]:
    response = await graphql(client, SCROLL, headers, urn=START, count=count, scrollId=scroll_id)
    assert response.status_code == 200 and "errors" not in response.json(), response.text
    return response.json()["data"]["scrollAcrossLineage"]


async def every_page(client, count: int, forget: bool = False) -> tuple[list[str], int]:
    """The results of every page of the walk from START, in order, and how many pages; `forget`: the walk states
    kept in this process are dropped before each next page (as a page served by another worker finds it)."""
    page = await scroll(client, None, count)
    found, pages = urns(page), 1
    while page["nextScrollId"]:
        if forget:
            across._WALKS.clear()
        page = await scroll(client, page["nextScrollId"], count)
        found += urns(page)
        pages += 1
        assert pages < 100
    assert page["isPartial"] is False and page["total"] == len(found)
    return found, pages


def refused(response) -> dict[str, Any]:
    """The issue of a GraphQL answer's 400 (DataHub's shape: the error's `extensions`)."""
    assert response.status_code == 200, response.text
    (error,) = response.json()["errors"]
    assert error["extensions"]["code"] == 400, error
    return error["extensions"]["issues"][0]


def edited(cursor: str, **changes: Any) -> str:
    value = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    return base64.urlsafe_b64encode(orjson.dumps({**value, **changes})).decode().rstrip("=")


async def test_pages_together_are_the_whole_answer_and_the_walk_is_not_walked_again(client, monkeypatch):
    await write_graph(client)
    asked = count_hops(monkeypatch)
    first = await scroll(client, None, 7)
    walked = len(asked)
    assert walked >= 3 and first["total"] == len(whole()) and first["isPartial"] is False
    found, pages = urns(first), 1
    cursor = first["nextScrollId"]
    while cursor:
        page = await scroll(client, cursor, 7)
        assert page["total"] == len(whole()) and page["isPartial"] is False
        found, cursor, pages = found + urns(page), page["nextScrollId"], pages + 1
    assert found == whole() and pages == -(-len(whole()) // 7)
    assert len(asked) == walked  # the later pages read what the first one's walk found: no statement of the walk


async def test_a_cut_page_s_cursor_continues_the_walk_at_the_hop_it_stopped_at(client, db, monkeypatch):
    await write_graph(client)
    lock_hops_past_the_first(monkeypatch, db)
    first = await scroll(client, None, 10, {DEADLINE: "1500"})
    assert urns(first) == [HUB] and first["isPartial"] is True and first["nextScrollId"]
    monkeypatch.undo()
    asked = count_hops(monkeypatch)
    rest = await scroll(client, first["nextScrollId"], 1_000)
    assert [START] not in asked and asked[0] == [HUB]  # hop 2 asked first: hop 1 is not walked again
    assert urns(first) + urns(rest) == whole() and rest["nextScrollId"] is None and rest["isPartial"] is False


async def test_a_page_in_a_process_without_the_walk_walks_again_to_the_cursor(client, monkeypatch):
    await write_graph(client)
    found, _ = await every_page(client, 9, forget=True)
    assert found == whole()


async def test_an_offset_cursor_given_before_walks_were_kept_still_continues(client):
    await write_graph(client)
    page = await scroll(client, "5", 1_000)
    assert urns(page) == whole()[5:] and page["nextScrollId"] is None


async def test_a_cursor_is_good_for_its_own_search_only(client, app):
    from tests.helpers import bearer

    await write_graph(client)
    cursor = (await scroll(client, None, 3))["nextScrollId"]
    other = await graphql(client, SCROLL.replace("DOWNSTREAM", "UPSTREAM"), urn=START, count=3, scrollId=cursor)
    issue = refused(other)
    assert issue["path"] == "$input.scrollId" and "another search" in issue["message"]
    # the same search by another caller: the walk behind the cursor answered what its caller may see
    headers = await bearer(app, "reader", "urn:li:corpuser:someone-else")
    theirs = await graphql(client, SCROLL, headers, urn=START, count=3, scrollId=cursor)
    assert "another search" in refused(theirs)["message"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [({"n": 0}, "tampered"), ({"w": "someone-elses-walk"}, "tampered"), ({}, None), ("garbage!", "base64")],
)
async def test_an_edited_cursor_is_a_400_naming_it(client, change, reason):
    await write_graph(client)
    cursor = (await scroll(client, None, 3))["nextScrollId"]
    sent = change if isinstance(change, str) else edited(cursor, **change)
    response = await graphql(client, SCROLL, urn=START, count=3, scrollId=sent)
    if reason is None:  # unchanged (decoded and encoded again): the rule must not fire
        assert response.status_code == 200 and urns(response.json()["data"]["scrollAcrossLineage"]) == whole()[3:6]
        return
    issue = refused(response)
    assert issue["path"] == "$input.scrollId" and reason in issue["message"], issue


async def test_an_expired_cursor_is_a_400_and_one_within_its_lifetime_is_not(client, monkeypatch):
    await write_graph(client)
    cursor = (await scroll(client, None, 3))["nextScrollId"]
    assert urns(await scroll(client, cursor, 3)) == whole()[3:6]
    later = time.time() + across.LINEAGE_CURSOR_LIFETIME_S + 5
    monkeypatch.setattr(across.time, "time", lambda: later)
    response = await graphql(client, SCROLL, urn=START, count=3, scrollId=cursor)
    issue = refused(response)
    assert issue["path"] == "$input.scrollId" and "expired" in issue["message"]


async def test_a_page_holds_what_the_kept_back_share_completes(client):
    await write_graph(client, len(FAN))
    most = int(1.0 * read_deadline.FINISH_SHARE / across.RESULT_FINISH_S)  # a 1 s budget's page
    assert 0 < most < len(FAN)
    first = await scroll(client, None, 1)  # without a budget header (10 s): the whole walk, kept for the cursor
    assert first["total"] == len(whole(len(FAN))) and first["isPartial"] is False
    # nothing left to walk: the 1 s budget's page is cut by what its fifth kept back completes, not by the walk
    response = await graphql(
        client, SCROLL, {DEADLINE: "1000"}, urn=START, count=len(FAN) + 10, scrollId=first["nextScrollId"]
    )
    assert response.status_code == 200 and response.headers[PARTIAL] == "true", response.text
    cut = response.json()["data"]["scrollAcrossLineage"]
    assert cut["count"] == most and cut["isPartial"] is True and cut["total"] == len(whole(len(FAN)))
    rest = await scroll(client, cut["nextScrollId"], len(FAN) + 10)  # 10 s: 13,333 a page
    assert urns(first) + urns(cut) + urns(rest) == whole(len(FAN)) and rest["nextScrollId"] is None
    assert rest["isPartial"] is False


async def test_a_small_walk_inside_its_budget_is_whole_and_unflagged(client):
    await write_graph(client)
    response = await graphql(client, SCROLL, {DEADLINE: "60000"}, urn=START, count=1_000)
    assert response.status_code == 200 and PARTIAL not in response.headers, response.text
    page = response.json()["data"]["scrollAcrossLineage"]
    assert urns(page) == whole() and page["isPartial"] is False and page["nextScrollId"] is None


async def test_the_walk_stops_at_its_share_of_the_budget(client, monkeypatch):
    await write_graph(client, 1_200)  # hop 2's frontier: 1 hub; hop 3's: 1,200 fans, three statements
    original = PostgresBackend.lineage_hop
    slow_s = 0.8

    async def lineage_hop(self, nodes, *, direction):
        if list(nodes) != [START]:
            await asyncio.sleep(slow_s)  # every statement after the first takes 0.8 s
        return await original(self, nodes, direction=direction)

    monkeypatch.setattr(PostgresBackend, "lineage_hop", lineage_hop)
    budget_s = 3.0
    started = time.monotonic()
    response = await graphql(client, SCROLL, {DEADLINE: str(int(budget_s * 1000))}, urn=START, count=5_000)
    waited = time.monotonic() - started
    assert response.status_code == 200 and response.headers[PARTIAL] == "true", response.text
    page = response.json()["data"]["scrollAcrossLineage"]
    # hop 2 (0.8 s) and its filtering finished, hop 3's three statements (2.4 s) would pass the 2.4 s share
    assert urns(page) == whole(1_200)[:-1] and page["isPartial"] is True and page["nextScrollId"]
    assert waited < budget_s + 1.5, waited


async def test_a_continued_page_under_a_locked_table_is_never_a_5xx(client, db, monkeypatch):
    await write_graph(client)
    lock_hops_past_the_first(monkeypatch, db)
    first = await scroll(client, None, 10, {DEADLINE: "1500"})
    # the database still cannot answer hop 2: the cursor's page has nothing to show and got no further
    again = await graphql(client, SCROLL, {DEADLINE: "800"}, urn=START, count=10, scrollId=first["nextScrollId"])
    assert again.status_code == 504 and int(again.headers["retry-after"]) >= 1, again.text
    monkeypatch.undo()
    rest = await scroll(client, first["nextScrollId"], 1_000)
    assert urns(first) + urns(rest) == whole()


async def test_pages_served_by_either_of_two_workers_are_the_whole_answer(make_database, migrated_template):
    env = {
        "METALEDGER_DATABASE_URL": make_database(template=migrated_template),
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
    }
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    supervisor = start_service(env, port, workers=2)
    try:
        await wait_healthy(base, 90, supervisor)
        async with httpx.AsyncClient(base_url=base, headers=SYSTEM_AUTH, timeout=60) as http:
            await write_graph(http)
        found: list[str] = []
        cursor: str | None = None
        pages = 0
        while pages == 0 or cursor:
            # a fresh connection a page: the shared port hands it to either worker, with or without the walk
            async with httpx.AsyncClient(base_url=base, headers=SYSTEM_AUTH, timeout=60) as http:
                page = await scroll(http, cursor, 6)
            found, cursor, pages = found + urns(page), page["nextScrollId"], pages + 1
            assert pages < 40
        assert found == whole() and pages == -(-len(whole()) // 6)
    finally:
        stop_process(supervisor)
