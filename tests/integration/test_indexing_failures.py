"""Indexing that data cannot stop (issue 13): values the index cannot hold are made indexable (NUL stripped, text
capped), a change the backend still refuses is recorded in `search_index_failure`, skipped and retried later, and
the worker never stalls. Run through the HTTP API against both backends (the embedded Postgres backend and the
OpenSearch-API test server), with the embedded indexing worker of the `app` fixture."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import asyncpg
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.search.model import IndexRefused
from tests.helpers import ds, eventually, mcp, propose
from tests.search_server import backend_settings

pytestmark = pytest.mark.asyncio

SEARCHABLE_WITHIN_S = 1.0
# A write behind a 10 MB document waits for it to be indexed (a million distinct words, capped): 0.1-0.3 s on a quiet
# machine, past a second on one whose two cores three test workers share. A stalled worker never indexes it at all.
BEHIND_A_LARGE_DOCUMENT_S = 5.0


@pytest.fixture(params=["postgres", "opensearch"])
def backend_name(request) -> str:
    return request.param


@pytest.fixture
def extra_settings() -> dict[str, Any]:
    return {}


@pytest.fixture
def settings_overrides(backend_name: str, extra_settings: dict[str, Any], request):
    for settings in backend_settings(backend_name, request):
        yield {**settings, **extra_settings}


async def search_urns(client, query: str) -> list[str]:
    response = await client.get("/openapi/v3/entity/dataset", params={"query": query, "count": 50})
    assert response.status_code == 200, response.text
    return [e["urn"] for e in response.json()["entities"]]


async def searchable_within(client, query: str, urn: str, seconds: float = SEARCHABLE_WITHIN_S) -> float:
    """Seconds until `urn` is a hit for `query` (fails past `seconds`)."""
    started = time.monotonic()

    async def found():
        return urn in await search_urns(client, query)

    await eventually(found, timeout=seconds, interval=0.02, what=f"{urn} searchable by {query!r}")
    return time.monotonic() - started


async def trace(client, urn: str, aspect: str) -> dict[str, Any]:
    response = await client.get(f"/openapi/v1/trace/write/{quote(urn, safe='')}", params={"aspect": aspect})
    assert response.status_code == 200, response.text
    return response.json()["aspects"][aspect]["searchStorage"]


async def test_a_nul_in_a_value_is_stored_and_indexing_goes_on(client, db):
    poisoned, after = ds("poison.nul"), ds("poison.after_nul")
    await propose(client, mcp("datasetProperties", {"name": "a\u0000b", "description": "nul\u0000inside"}, poisoned))
    stored = await db.fetchval(
        "SELECT metadata FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'datasetProperties' AND version = 0",
        poisoned,
    )
    assert orjson.loads(stored)["name"] == "a\u0000b"  # the stored aspect is untouched: only the index copy is cleaned

    await propose(client, mcp("datasetProperties", {"name": "afternul", "description": "the next write"}, after))
    await searchable_within(client, "afternul", after)
    # the poisoned value itself is indexed without its NUL
    assert poisoned in await search_urns(client, "ab")
    assert (await trace(client, poisoned, "datasetProperties"))["writeStatus"] == "ACTIVE_STATE"
    assert await db.fetchval("SELECT count(*) FROM search_index_failure") == 0


async def test_ten_megabytes_of_distinct_words_are_stored_and_indexing_goes_on(client, db):
    big, after = ds("poison.big"), ds("poison.after_big")
    description = " ".join(f"w{i:07d}x" for i in range(1_000_100))  # 10 MB, a million distinct words
    assert len(description) >= 10_000_000
    await propose(client, mcp("datasetProperties", {"name": "bigdescription", "description": description}, big))
    length = await db.fetchval(
        "SELECT length(metadata) FROM metadata_aspect_v2 WHERE urn = $1 "
        "AND aspect = 'datasetProperties' AND version = 0",
        big,
    )
    assert length > 10_000_000  # stored whole

    await propose(client, mcp("datasetProperties", {"name": "afterbig", "description": "the next write"}, after))
    await searchable_within(client, "afterbig", after, seconds=BEHIND_A_LARGE_DOCUMENT_S)
    # the big one is searchable by its name and by the words within the indexed part of its description
    assert big in await search_urns(client, "bigdescription")
    assert big in await search_urns(client, "w0000001x")
    assert (await trace(client, big, "datasetProperties"))["writeStatus"] == "ACTIVE_STATE"
    assert await db.fetchval("SELECT count(*) FROM search_index_failure") == 0


# --- change logs the backend refuses: recorded, visible, skipped, retried ------------------------------------------


async def scrape(client) -> dict[str, float]:
    """/metrics as {sample name: value} (the unlabelled series)."""
    response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
        if not s.labels
    }


class RefuseUrn:
    """The started backend's `apply`, refusing every bulk that holds a change of `urn`'s datasetProperties while
    `active`, as the backend does with a document it cannot hold: Postgres with its own error (a data error, not an
    outage), Elasticsearch's backend with `IndexRefused` (a bulk item error)."""

    def __init__(self, backend, backend_name: str, urn: str) -> None:
        self.apply, self.urn, self.active, self.refusals = backend.apply, urn, True, 0
        self.error = (
            (lambda: asyncpg.exceptions.ProgramLimitExceededError("index row size exceeds maximum (test)"))
            if backend_name == "postgres"
            else (lambda: IndexRefused("search bulk refused 1 documents (test)"))
        )

    async def __call__(self, changes):
        if self.active and any(
            getattr(c, "urn", None) == self.urn and c.aspect == "datasetProperties" for c in changes
        ):
            self.refusals += 1
            raise self.error()
        return await self.apply(changes)


@pytest.mark.parametrize("extra_settings", [{"search_failure_retry_min_s": 0.2, "search_failure_retry_max_s": 0.5}])
async def test_a_refused_change_log_is_recorded_visible_skipped_and_retried(app, client, db, backend_name, monkeypatch):
    refused, neighbour, later = ds("refuse.me"), ds("refuse.neighbour"), ds("refuse.later")
    backend = app.state.search.backend
    refuser = RefuseUrn(backend, backend_name, refused)
    monkeypatch.setattr(backend, "apply", refuser)

    # one batch: the refused change log is isolated, its neighbour (same bulk) is indexed
    await propose(
        client,
        mcp("datasetProperties", {"name": "refusedname", "description": "cannot be held"}, refused),
        mcp("datasetProperties", {"name": "neighbourname", "description": "fine"}, neighbour),
    )
    await searchable_within(client, "neighbourname", neighbour)
    await propose(client, mcp("datasetProperties", {"name": "latername", "description": "fine too"}, later))
    await searchable_within(client, "latername", later)
    assert refused not in await search_urns(client, "refusedname")

    failure = await db.fetchrow("SELECT * FROM search_index_failure WHERE urn = $1", refused)
    assert failure is not None and failure["aspect"] == "datasetProperties" and failure["version"] == 1
    assert "(test)" in failure["reason"] and failure["attempts"] >= 1
    assert failure["next_retry_at"] > failure["last_failed_at"] >= failure["first_failed_at"]
    assert orjson.loads(failure["payload"])["entityUrn"] == refused  # the change log itself: retries need no outbox
    assert await db.fetchval("SELECT count(*) FROM search_index_failure") == 1

    status = await trace(client, refused, "datasetProperties")
    assert status["writeStatus"] == "ERROR" and "(test)" in status["writeMessage"], status
    assert "version 1" in status["writeMessage"] and "next retry" in status["writeMessage"]
    assert (await trace(client, neighbour, "datasetProperties"))["writeStatus"] == "ACTIVE_STATE"

    samples = await scrape(client)
    assert samples["metaledger_indexer_failing_rows"] == 1
    assert samples["metaledger_indexer_failures_total"] >= 1
    assert samples["metaledger_indexer_failing_oldest_seconds"] > 0
    ready = await client.get("/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"  # informational: never not ready
    indexing = ready.json()["checks"]["indexing"]
    assert indexing["failingRows"] == 1 and "(test)" in indexing["lastFailure"] and indexing["failedRows"] >= 1

    # the cause goes away: the retry indexes it and the row leaves the table
    refuser.active = False
    await eventually(lambda: _indexed(client, "refusedname", refused), timeout=10, interval=0.05, what="retried")
    await eventually(lambda: _table_empty(db), timeout=5, interval=0.05, what="failure row removed")
    assert (await trace(client, refused, "datasetProperties"))["writeStatus"] == "ACTIVE_STATE"
    samples = await scrape(client)
    assert samples["metaledger_indexer_failing_rows"] == 0 and samples["metaledger_indexer_retried_rows_total"] >= 1
    assert (await client.get("/ready")).json()["checks"]["indexing"]["failingRows"] == 0


async def _indexed(client, query: str, urn: str) -> bool:
    return urn in await search_urns(client, query)


async def _table_empty(db) -> bool:
    return await db.fetchval("SELECT count(*) FROM search_index_failure") == 0


async def test_a_newer_version_supersedes_a_failure(app, client, db, backend_name, monkeypatch):
    urn = ds("refuse.superseded")
    backend = app.state.search.backend
    refuser = RefuseUrn(backend, backend_name, urn)
    monkeypatch.setattr(backend, "apply", refuser)
    await propose(client, mcp("datasetProperties", {"name": "oldname"}, urn))
    await eventually(lambda: _has_failure(db, urn), timeout=5, interval=0.05, what="failure recorded")
    refuser.active = False  # the default retry is 10 s away: the newer version comes first
    await propose(client, mcp("datasetProperties", {"name": "newname"}, urn))
    await searchable_within(client, "newname", urn)
    await eventually(lambda: _table_empty(db), timeout=5, interval=0.05, what="superseded failure removed")
    assert (await trace(client, urn, "datasetProperties")) == {"writeStatus": "ACTIVE_STATE", "version": "2"}


async def _has_failure(db, urn: str) -> bool:
    return bool(await db.fetchval("SELECT count(*) FROM search_index_failure WHERE urn = $1", urn))


@pytest.mark.parametrize("backend_name", ["opensearch"])
async def test_a_document_the_search_server_refuses_is_recorded_and_the_stream_goes_on(client, db):
    """A real refusal by the search server: a date it cannot parse (a valid long for the schema and for Postgres)."""
    bad, good = ds("refuse.date"), ds("refuse.date_neighbour")
    await propose(
        client,
        mcp("datasetProperties", {"name": "baddate", "created": {"time": -(2**63)}}, bad),
        mcp("datasetProperties", {"name": "gooddate", "created": {"time": 1_700_000_000_000}}, good),
    )
    await searchable_within(client, "gooddate", good)
    await eventually(lambda: _has_failure(db, bad), timeout=5, interval=0.05, what="failure recorded")
    reason = await db.fetchval("SELECT reason FROM search_index_failure WHERE urn = $1", bad)
    assert reason.startswith("IndexRefused: search bulk refused 1 documents") and "date" in reason, reason
    status = await trace(client, bad, "datasetProperties")
    assert status["writeStatus"] == "ERROR" and "date" in status["writeMessage"]
    # a corrected value is indexed and takes the failure with it
    await propose(client, mcp("datasetProperties", {"name": "baddate", "created": {"time": 1_700_000_000_000}}, bad))
    await searchable_within(client, "baddate", bad)
    await eventually(lambda: _table_empty(db), timeout=5, interval=0.05, what="superseded failure removed")


async def test_one_refused_change_log_in_a_large_batch_costs_only_itself(app, client, db, backend_name, monkeypatch):
    urns = [ds(f"refuse.bulk_{i:03d}") for i in range(200)]
    backend = app.state.search.backend
    refuser = RefuseUrn(backend, backend_name, urns[117])
    monkeypatch.setattr(backend, "apply", refuser)
    await propose(
        client,
        *[
            mcp("datasetProperties", {"name": f"bulkname{i:03d}", "description": "bulkword"}, u)
            for i, u in enumerate(urns)
        ],
    )

    async def all_but_one():
        response = await client.get("/openapi/v3/entity/dataset", params={"query": "bulkword", "count": 500})
        return len(response.json()["entities"]) == 199

    await eventually(all_but_one, timeout=10, interval=0.05, what="199 of 200 indexed")
    assert await db.fetchval("SELECT array_agg(urn) FROM search_index_failure") == [urns[117]]
    assert refuser.refusals <= 2 * 9 + 1  # split in halves: a few bulks, not one call per change log
