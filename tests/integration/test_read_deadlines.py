"""Reads keep their deadline (app.read_deadline): a read's budget is METALEDGER_READ_TIMEOUT_S, which a caller's
`X-Metaledger-Deadline-Ms` may shorten, never lengthen (a bad value: 400 naming the header). A lineage walk cut by it
answers the hops it finished, flagged (GraphQL: DataHub's `isPartial`, and a scroll cursor that continues it; REST:
`X-Metaledger-Partial: true`); a budget that found nothing is a 504 with Retry-After. A walk cut by the 20-hop cap of
a lineage search says so too.

The slow database is an input, not a race: the edge table is locked (ACCESS EXCLUSIVE) for the hops that must not
finish, so a cut never depends on how fast the machine is; the budgets are either far above the real time of what
must finish or far below what cannot."""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.search.model import URN_FIELD
from app.search.postgres import PostgresBackend
from tests.helpers import ds, mcp, propose

pytestmark = pytest.mark.asyncio

DEADLINE = "X-Metaledger-Deadline-Ms"
PARTIAL = "x-metaledger-partial"
START, HUB, LAST = ds("rd.start"), ds("rd.hub"), ds("rd.last")
FAN = [ds(f"rd.fan_{i:04d}") for i in range(2_000)]
SMALL_FAN = 100  # the tests whose walk is the same at any size write less


def whole(fan: int = SMALL_FAN) -> list[str]:
    """Downstream of START, by degree then urn: HUB (hop 1), the fan (hop 2), LAST (hop 3)."""
    return [HUB, *sorted(FAN[:fan]), LAST]


SCROLL = """
query($urn: String!, $scrollId: String, $count: Int) {
  scrollAcrossLineage(input: {urn: $urn, direction: DOWNSTREAM, query: "*", scrollId: $scrollId, count: $count}) {
    nextScrollId count total isPartial searchResults { degree entity { urn } }
  }
}"""
SEARCH = """
query($urn: String!, $count: Int) {
  searchAcrossLineage(input: {urn: $urn, direction: DOWNSTREAM, query: "*", start: 0, count: $count}) {
    total isPartial searchResults { degree entity { urn } }
  }
}"""


def upstream(of: str, *upstreams: str) -> dict[str, Any]:
    value = {"upstreams": [{"dataset": u, "type": "TRANSFORMED"} for u in upstreams]}
    return mcp("upstreamLineage", value, urn=of, sync=True)


async def write_graph(client, fan: int = SMALL_FAN) -> None:
    await propose(
        client,
        mcp("datasetProperties", {"name": "start"}, urn=START, sync=True),
        upstream(HUB, START),
        *(upstream(u, HUB) for u in FAN[:fan]),
        upstream(LAST, FAN[0]),
        batch_size=500,
    )


def lock_hops_past_the_first(monkeypatch, db) -> list[int]:
    """Every lineage hop but the first (its frontier: START) finds the edge table locked for as long as it runs:
    it is cancelled at its budget. Returns the sizes of the frontiers the locked hops were asked about."""
    original = PostgresBackend.lineage_hop
    locked: list[int] = []

    async def lineage_hop(self, nodes, *, direction):
        if list(nodes) == [START]:
            return await original(self, nodes, direction=direction)
        locked.append(len(nodes))
        async with db.transaction():
            await db.execute("LOCK TABLE search_edge IN ACCESS EXCLUSIVE MODE")
            return await original(self, nodes, direction=direction)

    monkeypatch.setattr(PostgresBackend, "lineage_hop", lineage_hop)
    return locked


async def graphql(client, query: str, headers: dict[str, str] | None = None, **variables: Any):
    return await client.post("/api/graphql", json={"query": query, "variables": variables}, headers=headers or {})


def urns(result: dict[str, Any]) -> list[str]:
    return [r["entity"]["urn"] for r in result["searchResults"]]


async def test_without_a_deadline_the_whole_walk_answers_unflagged(client):
    await write_graph(client)
    response = await graphql(client, SEARCH, urn=START, count=3)
    assert response.status_code == 200 and PARTIAL not in response.headers, response.text
    result = response.json()["data"]["searchAcrossLineage"]
    assert result["total"] == len(whole()) and result["isPartial"] is False
    assert urns(result) == whole()[:3]
    rest = await client.get(f"/openapi/v1/lineage/{START}", params={"direction": "DOWNSTREAM", "maxHops": 5})
    assert rest.status_code == 200 and PARTIAL not in rest.headers, rest.text
    assert [e["urn"] for e in rest.json()["entities"]] == whole()


async def test_a_deadline_far_above_the_walk_changes_nothing(client):
    await write_graph(client)
    response = await graphql(client, SEARCH, {DEADLINE: "60000"}, urn=START, count=3)
    assert response.status_code == 200 and PARTIAL not in response.headers, response.text
    result = response.json()["data"]["searchAcrossLineage"]
    assert result["total"] == len(whole()) and result["isPartial"] is False


async def test_a_cut_scroll_answers_the_hops_it_finished_and_its_cursor_continues(client, db, monkeypatch):
    await write_graph(client, len(FAN))
    locked = lock_hops_past_the_first(monkeypatch, db)
    started = time.monotonic()
    response = await graphql(client, SCROLL, {DEADLINE: "1500"}, urn=START, count=10)
    waited = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert response.headers[PARTIAL] == "true"
    first = response.json()["data"]["scrollAcrossLineage"]
    # hop 1 finished, hop 2 (the 1 hub's edges) was cancelled at the walking share of the budget
    assert urns(first) == [HUB] and first["total"] == 1 and first["isPartial"] is True
    assert locked == [1] and waited < 5, (locked, waited)
    assert first["nextScrollId"]
    monkeypatch.undo()  # the database is fast again: the cursor continues where the cut answer ended
    again = await graphql(client, SCROLL, urn=START, count=10, scrollId=first["nextScrollId"])
    assert again.status_code == 200 and PARTIAL not in again.headers, again.text
    second = again.json()["data"]["scrollAcrossLineage"]
    assert second["isPartial"] is False and second["total"] == len(whole(len(FAN)))
    assert urns(first) + urns(second) == whole(len(FAN))[:11]


async def test_a_cut_rest_walk_answers_the_hops_it_finished_with_the_partial_header(client, db, monkeypatch):
    await write_graph(client)
    lock_hops_past_the_first(monkeypatch, db)
    response = await client.get(
        f"/openapi/v1/lineage/{START}", params={"direction": "DOWNSTREAM", "maxHops": 3}, headers={DEADLINE: "1500"}
    )
    assert response.status_code == 200, response.text
    assert response.headers[PARTIAL] == "true"
    assert [(e["urn"], e["hop"]) for e in response.json()["entities"]] == [(HUB, 1)]


async def test_a_one_hop_walk_within_the_budget_is_whole_though_deeper_hops_would_not_be(client, db, monkeypatch):
    await write_graph(client)
    locked = lock_hops_past_the_first(monkeypatch, db)
    response = await client.get(
        f"/openapi/v1/lineage/{START}", params={"direction": "DOWNSTREAM", "maxHops": 1}, headers={DEADLINE: "1500"}
    )
    assert response.status_code == 200 and PARTIAL not in response.headers, response.text
    assert [e["urn"] for e in response.json()["entities"]] == [HUB] and locked == []


async def test_a_lineage_search_whose_document_checks_the_budget_cuts_answers_the_degrees_it_finished(
    client, db, monkeypatch
):
    await write_graph(client)
    original = PostgresBackend.search

    async def search(self, entity_type, query, **options):
        if FAN[0] not in (options.get("filters") or {}).get(URN_FIELD, ()):
            return await original(self, entity_type, query, **options)
        async with db.transaction():  # the walk finished: the documents of its second hop cannot be read
            await db.execute("LOCK TABLE search_document IN ACCESS EXCLUSIVE MODE")
            return await original(self, entity_type, query, **options)

    monkeypatch.setattr(PostgresBackend, "search", search)
    response = await graphql(client, SEARCH, {DEADLINE: "1500"}, urn=START, count=5)
    assert response.status_code == 200 and response.headers[PARTIAL] == "true", response.text
    result = response.json()["data"]["searchAcrossLineage"]
    assert urns(result) == [HUB] and result["total"] == 1 and result["isPartial"] is True


@pytest.mark.parametrize("surface", ["rest", "graphql"])
async def test_a_budget_that_finds_nothing_is_a_504_with_retry_after(client, db, surface):
    await write_graph(client)
    async with db.transaction():
        await db.execute("LOCK TABLE search_edge IN ACCESS EXCLUSIVE MODE")  # not even the first hop finishes
        started = time.monotonic()
        if surface == "rest":
            params = {"direction": "DOWNSTREAM"}
            response = await client.get(f"/openapi/v1/lineage/{START}", params=params, headers={DEADLINE: "300"})
        else:
            response = await graphql(client, SEARCH, {DEADLINE: "300"}, urn=START, count=3)
        waited = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert int(response.headers["retry-after"]) >= 1 and waited < 5, waited
    again = await client.get(f"/openapi/v1/lineage/{START}", params={"direction": "DOWNSTREAM", "maxHops": 1})
    assert again.status_code == 200 and [e["urn"] for e in again.json()["entities"]] == [HUB]


async def test_a_budget_of_one_millisecond_is_a_504(client):
    await write_graph(client)
    response = await graphql(client, SEARCH, {DEADLINE: "1"}, urn=START, count=3)
    assert response.status_code == 504 and int(response.headers["retry-after"]) >= 1, response.text


@pytest.mark.parametrize("settings_overrides", [{"read_timeout_s": 0.3}])
async def test_the_header_never_lengthens_the_read_timeout(client, db):
    await write_graph(client)
    async with db.transaction():
        await db.execute("LOCK TABLE search_edge IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        response = await client.get(
            f"/openapi/v1/lineage/{START}", params={"direction": "DOWNSTREAM"}, headers={DEADLINE: "600000"}
        )
        waited = time.monotonic() - started
    assert response.status_code == 504 and waited < 5, (response.text, waited)


async def test_a_search_statement_runs_under_what_is_left_of_the_budget(client, db):
    await propose(client, mcp("datasetProperties", {"name": "start"}, urn=START, sync=True))
    async with db.transaction():
        await db.execute("LOCK TABLE search_document IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        # METALEDGER_READ_TIMEOUT_S is 10 s: the header's 300 ms is what cancels the statement
        response = await client.get("/openapi/v3/entity/dataset", params={"count": 3}, headers={DEADLINE: "300"})
        waited = time.monotonic() - started
    assert response.status_code == 503 and int(response.headers["retry-after"]) >= 1, response.text
    assert waited < 5, waited


@pytest.mark.parametrize("value", ["soon", "0", "-5", "1.5", "", "99999999999"])
async def test_a_bad_deadline_is_a_400_naming_the_header(client, value):
    for response in (
        await client.get(f"/openapi/v1/lineage/{START}", headers={DEADLINE: value}),
        await graphql(client, SEARCH, {DEADLINE: value}, urn=START, count=3),
    ):
        assert response.status_code == 400, response.text
        assert response.json()["issues"][0]["path"] == f"$.headers.{DEADLINE}"


async def test_a_lineage_search_cut_by_the_hop_cap_says_so(client):
    chain = [ds(f"rd.chain_{i:02d}") for i in range(23)]  # chain[0] <- chain[1] <- ... : 22 hops downstream
    await propose(client, mcp("datasetProperties", {"name": "c0"}, urn=chain[0], sync=True))
    await propose(client, *(upstream(chain[i], chain[i - 1]) for i in range(1, 23)))
    capped = (await graphql(client, SEARCH, urn=chain[0], count=30)).json()["data"]["searchAcrossLineage"]
    assert capped["isPartial"] is True and capped["total"] == 20
    assert urns(capped) == chain[1:21]
    within = (await graphql(client, SEARCH, urn=chain[2], count=30)).json()["data"]["searchAcrossLineage"]
    assert within["isPartial"] is False and within["total"] == 20  # exactly 20 hops: nothing beyond the cap
