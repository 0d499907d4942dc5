"""Write tracing, DataHub's protocol (app.api.trace_write): every response's `traceparent`, the trace id kept in each
write's system metadata (`telemetryTraceId`), and `POST /openapi/v1/trace/write/{traceId}` per aspect — synchronous
writes, replaced ones, timeseries, and asynchronous ones on the real broker (PENDING, then ACTIVE_STATE, or ERROR
with the MCP consumer's reason)."""

from __future__ import annotations

import re
from contextvars import ContextVar
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import event

from app.ingest import write_trace
from app.ingest.trace import trace_time_ms
from app.main import create_app
from app.settings import Settings
from tests.helpers import bearer, create_topics, eventually, fast_groups, kafka_overrides, mcp, stored, unique_topics

URN = "urn:li:dataset:(urn:li:dataPlatform:hive,db.traced,PROD)"
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-[0-9a-f]{16}-01")


def trace_id_of(response: httpx.Response) -> str:
    match = TRACEPARENT.fullmatch(response.headers["traceparent"])
    assert match, response.headers.get("traceparent")
    return match.group(1)


async def trace(client: httpx.AsyncClient, trace_id: str, wanted: dict[str, list[str]], **params: Any) -> dict:
    response = await client.post(
        f"/openapi/v1/trace/write/{trace_id}", params={"onlyIncludeErrors": "false", **params}, json=wanted
    )
    assert response.status_code == 200, response.text
    return response.json()


def statuses(answer: dict, urn: str, aspect: str) -> tuple[str, str, bool]:
    status = answer[urn][aspect]
    return status["primaryStorage"]["writeStatus"], status["searchStorage"]["writeStatus"], status["success"]


async def test_every_write_answers_a_traceparent_and_keeps_its_trace_id(client, db):
    theirs = "4bf92f3577b34da6a3ce929d0e0e4736"
    v3 = await client.post(
        "/openapi/v3/entity/dataset?async=false",
        headers={"traceparent": f"00-{theirs}-00f067aa0ba902b7-01"},
        json=[{"urn": URN, "status": {"value": {"removed": False}}}],
    )
    assert v3.status_code == 200, v3.text
    assert trace_id_of(v3) == theirs  # the caller's trace continues
    assert (await stored(db, URN, "status"))["systemMetadata"]["properties"]["telemetryTraceId"] == theirs

    restli = await client.post(
        "/aspects?action=ingestProposal",
        json={
            "proposal": mcp(
                "datasetProperties",
                {"description": "x"},
                URN,
                encode=True,
                systemMetadata={"runId": "r1", "properties": {"clientId": "acryl-datahub"}},
            )
        },
    )
    assert restli.status_code == 200, restli.text
    ours = trace_id_of(restli)
    assert ours != theirs and trace_time_ms(ours) is not None  # DataHub's form: its time comes first
    properties = (await stored(db, URN, "datasetProperties"))["systemMetadata"]["properties"]
    assert properties == {"clientId": "acryl-datahub", "telemetryTraceId": ours}  # the caller's properties kept

    batch = await client.post(
        "/aspects?action=ingestProposalBatch",
        json={"proposals": [mcp("subTypes", {"typeNames": ["Table"]}, URN, encode=True)]},
    )
    v1 = await client.post("/openapi/v1/proposals", json=[mcp("globalTags", {"tags": []}, URN)])
    assert batch.status_code == 200 and v1.status_code == 200
    assert (await stored(db, URN, "subTypes"))["systemMetadata"]["properties"]["telemetryTraceId"] == trace_id_of(batch)
    assert (await stored(db, URN, "globalTags"))["systemMetadata"]["properties"]["telemetryTraceId"] == trace_id_of(v1)
    assert trace_id_of(batch) != trace_id_of(v1)


async def test_a_synchronous_write_is_active_then_searchable_then_historic(client):
    first = await client.post(
        "/openapi/v3/entity/dataset?async=false",
        json=[{"urn": URN, "datasetProperties": {"value": {"description": "first"}}}],
    )
    assert first.status_code == 200, first.text
    first_id = trace_id_of(first)
    wanted = {URN: ["datasetProperties"]}

    answer = await trace(client, first_id, wanted)
    assert statuses(answer, URN, "datasetProperties")[0] == "ACTIVE_STATE"

    async def searchable():
        return statuses(await trace(client, first_id, wanted), URN, "datasetProperties")[1] == "ACTIVE_STATE"

    await eventually(searchable, what="the embedded indexer's ACTIVE_STATE")
    # Only errors by default (DataHub's onlyIncludeErrors=true): a write that landed answers nothing.
    quiet = await client.post(f"/openapi/v1/trace/write/{first_id}", json=wanted)
    assert quiet.status_code == 200 and quiet.json() == {}

    second = await client.post(
        "/openapi/v3/entity/dataset?async=false",
        json=[{"urn": URN, "datasetProperties": {"value": {"description": "second"}}}],
    )
    assert statuses(await trace(client, first_id, wanted), URN, "datasetProperties") == (
        "HISTORIC_STATE",
        "HISTORIC_STATE",
        True,
    )
    assert statuses(await trace(client, trace_id_of(second), wanted), URN, "datasetProperties")[0] == "ACTIVE_STATE"
    # The whole traceparent is accepted in the path too (DataHub's extractTraceId).
    assert (await trace(client, second.headers["traceparent"], wanted))[URN]["datasetProperties"]["success"] is True

    # A trace that never wrote this aspect (and older than its write): UNKNOWN, not an error.
    stranger = await trace(client, "0" * 31 + "1", {URN: ["datasetProperties", "status"]})
    assert statuses(stranger, URN, "status") == ("UNKNOWN", "UNKNOWN", True)
    # Timeseries points are not traced (DataHub's answer).
    profile = await trace(client, first_id, {URN: ["datasetProfile"]})
    assert statuses(profile, URN, "datasetProfile") == ("NO_OP", "TRACE_NOT_IMPLEMENTED", True)


async def test_a_trace_request_naming_what_does_not_exist_is_a_400(client):
    unknown_aspect = await client.post(f"/openapi/v1/trace/write/{'a' * 32}", json={URN: ["notAnAspect"]})
    assert unknown_aspect.status_code == 400 and "notAnAspect" in unknown_aspect.text
    bad_urn = await client.post(f"/openapi/v1/trace/write/{'a' * 32}", json={"urn:li:nope:x": ["status"]})
    assert bad_urn.status_code == 400
    bad_id = await client.post("/openapi/v1/trace/write/not-a-trace", json={URN: ["status"]})
    assert bad_id.status_code == 400 and "$traceId" in bad_id.text


OTHER = "urn:li:dataset:(urn:li:dataPlatform:hive,db.traced_too,PROD)"
THIRD = "urn:li:dataset:(urn:li:dataPlatform:hive,db.traced_three,PROD)"
TRACE_LIMIT = 6
_COUNTED: ContextVar[bool] = ContextVar("counted_checkouts", default=False)


class Checkouts:
    """The pooled connections checked out for the requests sent inside the block (the ASGI transport runs them in this
    context; the app's background workers do not see it): how many, and the most held at once."""

    def __init__(self, app) -> None:
        self.pool = app.state.engine.sync_engine.pool
        self.taken, self.most, self._held = 0, 0, set()

    def _checkout(self, dbapi_connection, record, proxy) -> None:
        if _COUNTED.get():
            self.taken += 1
            self._held.add(id(record))
            self.most = max(self.most, len(self._held))

    def _checkin(self, dbapi_connection, record) -> None:
        self._held.discard(id(record))

    def __enter__(self) -> Checkouts:
        event.listen(self.pool, "checkout", self._checkout)
        event.listen(self.pool, "checkin", self._checkin)
        self._token = _COUNTED.set(True)
        return self

    def __exit__(self, *exc) -> None:
        _COUNTED.reset(self._token)
        event.remove(self.pool, "checkout", self._checkout)
        event.remove(self.pool, "checkin", self._checkin)


# auth_cache_seconds: the caller's token is verified once, by the first request, and not again in the test
@pytest.mark.parametrize("settings_overrides", [{"max_batch_items": TRACE_LIMIT, "auth_cache_seconds": 3600}])
async def test_a_trace_of_more_aspects_than_the_batch_limit_is_a_413_before_any_lookup(client, app):
    write = await client.post(
        "/openapi/v3/entity/dataset?async=false", json=[{"urn": URN, "status": {"value": {"removed": False}}}]
    )
    assert write.status_code == 200, write.text
    trace_id = trace_id_of(write)
    # 7 (urn, aspect) pairs, a URN asked with none counting as one: one past the limit, refused as it was sent (the
    # unknown aspect name is not even looked at), without a connection taken
    seven = {URN: ["status", "datasetProperties", "subTypes", "notAnAspect"], OTHER: ["status", "ownership"], THIRD: []}
    with Checkouts(app) as checkouts:
        refused = await client.post(
            f"/openapi/v1/trace/write/{trace_id}", params={"onlyIncludeErrors": "false"}, json=seven
        )
    assert refused.status_code == 413, refused.text
    message = refused.json()["message"]
    assert "has 7 aspects to trace; the limit is 6 (METALEDGER_MAX_BATCH_ITEMS)" in message, message
    assert refused.json()["issues"] == [
        {
            "message": "too many aspects to trace",
            "path": "$",
            "expected": "at most 6 aspects to trace",
            "found": "7 aspects to trace",
        }
    ]
    assert checkouts.taken == 0

    # at the limit: answered, every pair
    six = {URN: ["status", "datasetProperties", "subTypes", "globalTags"], OTHER: ["status"], THIRD: []}
    answer = await trace(client, trace_id, six)
    assert statuses(answer, URN, "status")[0] == "ACTIVE_STATE"
    assert {statuses(answer, URN, a) for a in ("datasetProperties", "subTypes", "globalTags")} == {
        ("UNKNOWN", "UNKNOWN", True)
    }
    assert statuses(answer, OTHER, "status") == ("UNKNOWN", "UNKNOWN", True) and THIRD not in answer


async def test_a_trace_is_looked_up_in_rounds_giving_the_connection_back_after_each(client, app, monkeypatch):
    """Every state a trace can find in the database, over rounds of 2 pairs: the request holds one connection at a
    time, for a round, never for the whole trace."""
    monkeypatch.setattr(write_trace, "TRACE_ROUND_PAIRS", 2)
    backend = app.state.search.backend
    apply = backend.apply

    async def refusing(changes):  # the search backend cannot hold OTHER's datasetProperties (as a too large value)
        if any(getattr(c, "urn", None) == OTHER and c.aspect == "datasetProperties" for c in changes):
            raise asyncpg.exceptions.ProgramLimitExceededError("index row size exceeds maximum (test)")
        return await apply(changes)

    monkeypatch.setattr(backend, "apply", refusing)
    first = await client.post(
        "/openapi/v3/entity/dataset?async=false",
        json=[
            {
                "urn": URN,
                "status": {"value": {"removed": False}},
                "datasetProperties": {"value": {"description": "first"}},
            },
            {
                "urn": OTHER,
                "status": {"value": {"removed": False}},
                "datasetProperties": {"value": {"description": "x"}},
            },
        ],
    )
    assert first.status_code == 200, first.text
    first_id = trace_id_of(first)
    second = await client.post(
        "/openapi/v3/entity/dataset?async=false",
        json=[{"urn": URN, "datasetProperties": {"value": {"description": "second"}}}],
    )
    assert second.status_code == 200, second.text
    wanted = {
        URN: ["status", "datasetProperties", "datasetProfile"],
        OTHER: ["datasetProperties", "status", "subTypes"],
    }

    async def settled():
        answer = await trace(client, first_id, wanted)
        return (
            statuses(answer, URN, "status")[1] == statuses(answer, OTHER, "status")[1] == "ACTIVE_STATE"
            and statuses(answer, OTHER, "datasetProperties")[1] == "ERROR"
        )

    await eventually(settled, what="indexed, and OTHER's datasetProperties refused by the index")
    with Checkouts(app) as checkouts:
        answer = await trace(client, first_id, wanted)
    assert statuses(answer, URN, "status") == ("ACTIVE_STATE", "ACTIVE_STATE", True)
    assert statuses(answer, URN, "datasetProperties") == ("HISTORIC_STATE", "HISTORIC_STATE", True)
    assert statuses(answer, URN, "datasetProfile") == ("NO_OP", "TRACE_NOT_IMPLEMENTED", True)
    assert statuses(answer, OTHER, "datasetProperties") == ("ACTIVE_STATE", "ERROR", False)
    assert "(test)" in answer[OTHER]["datasetProperties"]["searchStorage"]["writeMessage"]
    assert statuses(answer, OTHER, "status") == ("ACTIVE_STATE", "ACTIVE_STATE", True)
    assert statuses(answer, OTHER, "subTypes") == ("UNKNOWN", "UNKNOWN", True)
    # 5 pairs to look up: 3 rounds, then the index failures; a connection each, given back before the next
    assert checkouts.taken >= 4 and checkouts.most == 1, (checkouts.taken, checkouts.most)


async def test_async_writes_are_pending_on_the_topic_then_active_or_refused(
    kafka_broker, database_url, registry, db, monkeypatch
):
    bootstrap = kafka_broker.bootstrap_servers
    topics = unique_topics("topic_mcp", "topic_fmcp", "topic_mce", "topic_fmce")
    await create_topics(bootstrap, *topics.values())
    fast_groups(monkeypatch)
    base = {"database_url": database_url, "apply_migrations_on_start": False, **kafka_overrides(bootstrap, topics)}
    wanted = {URN: ["status", "datasetProperties"]}

    # No consumer yet: the writes wait on the MCP topic.
    queued_app = create_app(Settings(**base), registry)
    async with queued_app.router.lifespan_context(queued_app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=queued_app), base_url="http://m", headers=await bearer(queued_app)
        ) as client:
            queued = await client.post(
                "/openapi/v3/entity/dataset",
                json=[
                    {"urn": URN, "status": {"value": {"removed": False}}},
                    {"urn": URN, "datasetProperties": {"value": {"description": "async"}}},
                ],
            )
            assert queued.status_code == 202, queued.text
            trace_id = trace_id_of(queued)
            answer = await trace(client, trace_id, wanted)
            for aspect in wanted[URN]:
                assert statuses(answer, URN, aspect) == ("PENDING", "PENDING", True)
                assert answer[URN][aspect]["searchStorage"]["writeMessage"] == "Pending primary storage write."

    # The consumer applies them; a CREATE of an existing aspect is refused (FMCP) with its reason.
    consuming_app = create_app(Settings(**base, mcp_consumer_enabled=True), registry)
    async with consuming_app.router.lifespan_context(consuming_app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=consuming_app), base_url="http://m", headers=await bearer(consuming_app)
        ) as client:

            async def applied():
                answer = await trace(client, trace_id, wanted)
                return all(statuses(answer, URN, a)[0] == "ACTIVE_STATE" for a in wanted[URN]) and answer

            answer = await eventually(applied, timeout=60, what="the consumer's writes")
            # With Kafka, indexing is the Spark job's (not running here): searchable later.
            assert statuses(answer, URN, "status") == ("ACTIVE_STATE", "PENDING", True)
            row = await stored(db, URN, "status")
            assert row["systemMetadata"]["properties"]["telemetryTraceId"] == trace_id  # carried through the topic

            refused = await client.post(
                f"/openapi/v3/entity/dataset/{URN}/status?async=true&createIfNotExists=true",
                json={"value": {"removed": True}},
            )
            assert refused.status_code == 202, refused.text
            refused_id = trace_id_of(refused)

            async def failed():
                answer = await trace(client, refused_id, {URN: ["status"]}, detailed="true")
                return statuses(answer, URN, "status")[0] == "ERROR" and answer

            answer = await eventually(failed, timeout=60, what="the refused write's ERROR")
            status = answer[URN]["status"]
            assert status["success"] is False
            assert status["searchStorage"] == {"writeStatus": "ERROR", "writeMessage": "Primary storage write failed."}
            (exception,) = status["primaryStorage"]["writeExceptions"]
            assert exception["exceptionClass"] == "app.errors.ExistenceConflict"
            assert exception["message"] == "CreateIfNotExists: Cannot perform CREATE since the aspect already exists."
            # Errors only, by default: the refused aspect and nothing else.
            only_errors = await client.post(f"/openapi/v1/trace/write/{refused_id}", json={URN: ["status"]})
            assert list(only_errors.json()[URN]) == ["status"]
            assert (await stored(db, URN, "status"))["value"] == {"removed": False}
