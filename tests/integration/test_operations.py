"""The operator's view against the real Postgres: /metrics, /ready, request ids and logs, write backpressure."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any
from urllib.parse import quote

import asyncpg
import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.embedded_pg import free_port
from app.logs import JsonFormatter
from app.ops.readiness import migration_heads
from tests.helpers import DATASET, ds, mcp, propose


@pytest.fixture
def settings_overrides(request) -> dict[str, Any]:
    overrides = dict(getattr(request, "param", {}))
    if overrides.pop("live_kafka", False):
        overrides["kafka_bootstrap_servers"] = request.getfixturevalue("kafka_broker").bootstrap_servers
    return overrides


async def scrape(client) -> dict[tuple[str, frozenset], float]:
    """/metrics as {(sample name, labels): value}."""
    response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def properties(n: int, revision: int = 1) -> dict[str, Any]:
    return {"name": f"t{n}", "description": f"table {n}, revision {revision}"}


# --- /metrics ----------------------------------------------------------------------------------------------------


async def test_metrics_count_writes_requests_rejections_and_the_outbox(client, db):
    before = await scrape(client)
    urns = [ds(f"ops.metrics_{i}") for i in range(3)]
    await propose(client, *[mcp("datasetProperties", properties(i), urn=u) for i, u in enumerate(urns)])
    # the same aspect through the v3 route, whose path holds the URN
    response = await client.post(
        f"/openapi/v3/entity/dataset/{quote(DATASET, safe='')}/datasetProperties?createIfNotExists=false",
        json={"value": properties(9)},
    )
    assert response.status_code == 200, response.text
    assert (await client.get(f"/openapi/v3/entity/dataset/{quote(DATASET, safe='')}")).status_code == 200
    await propose(client, mcp("status", {"removed": 3}), expect=400)  # invalid value
    await propose(client, mcp("status", {"removed": False}, urn=urns[0], headers={"If-Version-Match": "7"}), expect=412)
    assert (await client.get("/no/such/route")).status_code == 404
    after = await scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # writes: exactly the proposals written (the key aspects the first writes add are not proposals)
    assert (
        delta("metaledger_writes_total", entity_type="dataset", aspect="datasetProperties", change_type="UPSERT") == 4
    )
    assert delta("metaledger_writes_total", entity_type="dataset", aspect="status", change_type="UPSERT") == 0
    assert delta("metaledger_write_validation_failures_total", reason="aspect_value") == 1
    assert delta("metaledger_write_conflicts_total", kind="precondition") == 1
    # requests by route template, never the raw path
    assert delta("metaledger_http_requests_total", route="/openapi/v1/proposals", method="POST", status="200") == 1
    assert delta("metaledger_http_requests_total", route="/openapi/v1/proposals", method="POST", status="400") == 1
    assert delta("metaledger_http_requests_total", route="/openapi/v1/proposals", method="POST", status="412") == 1
    assert (
        delta(
            "metaledger_http_requests_total",
            route="/openapi/v3/entity/dataset/{urn}/{aspectName}",
            method="POST",
            status="200",
        )
        == 1
    )
    assert (
        delta("metaledger_http_requests_total", route="/openapi/v3/entity/dataset/{urn}", method="GET", status="200")
        == 1
    )
    assert delta("metaledger_http_requests_total", route="unmatched", method="GET", status="404") == 1
    assert delta("metaledger_http_request_duration_seconds_count", route="/openapi/v1/proposals", method="POST") == 3
    assert not [labels for _, labels in after if any("urn:li:" in v for _, v in labels)]
    # this app's figures: the pool, the write slots, the outbox (the relay and the indexer keep up here)
    assert value(after, "metaledger_db_pool_connections_max") == 20
    assert value(after, "metaledger_writes_in_flight_limit") == 40  # 4 x the pool (writes share transactions)
    assert ("metaledger_outbox_backlog_rows", frozenset()) in after
    assert ("metaledger_indexer_lag_rows", frozenset()) in after
    assert value(after, "metaledger_change_feed_offset") <= await db.fetchval("SELECT count(*) FROM change_log_outbox")
    assert value(after, "process_resident_memory_bytes") > 0


@pytest.mark.parametrize("settings_overrides", [{"relay_enabled": False}], indirect=True)
async def test_outbox_backlog_figures_are_the_rows_not_yet_consumed(client, db):
    await propose(client, *[mcp("datasetProperties", properties(i), urn=ds(f"ops.backlog_{i}")) for i in range(4)])
    rows = await db.fetchval("SELECT count(*) FROM change_log_outbox")
    assert rows >= 8  # a key aspect and the aspect per entity, plus their platform events
    # the backlog's age is its oldest row's (the oldest transaction's): as old as it was just before the scrape, or
    # as it was just after, or between
    oldest = "SELECT extract(epoch FROM now() - created_at)::float8 FROM change_log_outbox ORDER BY txid, id LIMIT 1"
    age_before = await db.fetchval(oldest)
    samples = await scrape(client)
    age_after = await db.fetchval(oldest)
    # without the relay nothing is sequenced: every row is backlog, counted exactly
    assert value(samples, "metaledger_outbox_unsequenced_rows") == rows
    assert value(samples, "metaledger_outbox_backlog_rows") == rows
    assert 0 < age_before - 1e-3 <= value(samples, "metaledger_outbox_oldest_age_seconds") <= age_after + 1e-3
    assert value(samples, "metaledger_indexer_lag_rows") == 0  # nothing sequenced, nothing for it yet
    # once sequenced (as the relay would), the rows are the indexer's backlog until it catches up
    await db.execute("UPDATE change_log_outbox SET feed_offset = id")
    await db.execute("UPDATE change_log_feed_state SET last_offset = (SELECT max(id) FROM change_log_outbox)")
    await db.execute("UPDATE feed_reader_state SET last_offset = 0 WHERE reader = 'search-indexer'")
    samples = await scrape(client)
    assert value(samples, "metaledger_outbox_unsequenced_rows") == 0
    # the worker may already have applied some: the figures are consistent with the cursor
    cursor = await db.fetchval("SELECT last_offset FROM feed_reader_state WHERE reader = 'search-indexer'")
    feed_end = await db.fetchval("SELECT last_offset FROM change_log_feed_state")
    assert value(samples, "metaledger_indexer_lag_rows") >= feed_end - cursor


# --- request ids and logs ----------------------------------------------------------------------------------------


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(orjson.loads(self.format(record)))


@pytest.fixture
def log_lines():
    handler = _Lines()
    logger = logging.getLogger("metaledger")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


async def test_request_ids_are_echoed_generated_and_carried_by_every_log_line(client, log_lines):
    sent = "ingest-run.42:batch_7-a"
    response = await client.get("/health", headers={"X-Request-Id": sent})
    assert response.headers["x-request-id"] == sent
    generated = set()
    for bad in ("has spaces", "x" * 65, "semi;colon", None):
        headers = {"X-Request-Id": bad} if bad is not None else {}
        response = await client.get("/health", headers=headers)
        rid = response.headers["x-request-id"]
        assert rid != bad and re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", rid)
        generated.add(rid)
    assert len(generated) == 4  # unique

    rid = "write-failure-1"
    bad = mcp("status", {"removed": 3}, systemMetadata={"runId": "run-ops-1"})
    started = time.perf_counter()
    response = await client.post("/openapi/v1/proposals", json=[bad], headers={"X-Request-Id": rid})
    took_ms = (time.perf_counter() - started) * 1000
    assert response.status_code == 400 and response.headers["x-request-id"] == rid
    mine = [line for line in log_lines if line.get("request_id") == rid]
    refused = [line for line in mine if line["msg"] == "write refused"]
    assert refused and refused[0]["urn"] == DATASET and refused[0]["aspect"] == "status"
    assert refused[0]["run_id"] == "run-ops-1" and refused[0]["status"] == 400
    access = [line for line in mine if line["logger"] == "metaledger.access"]
    assert len(access) == 1
    assert access[0]["route"] == "/openapi/v1/proposals" and access[0]["status"] == 400
    assert access[0]["method"] == "POST" and 0 < access[0]["duration_ms"] <= took_ms  # the request's, measured inside
    # outside a request, no id
    logging.getLogger("metaledger.test").info("no request here")
    assert "request_id" not in log_lines[-1]


async def test_an_unexpected_error_is_a_500_with_the_request_id(app):
    async def boom():
        raise RuntimeError("boom")

    app.add_api_route("/test-only/boom", boom, include_in_schema=False)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://metaledger") as http:
        response = await http.get("/test-only/boom", headers={"X-Request-Id": "boom-1"})
    assert response.status_code == 500 and response.headers["x-request-id"] == "boom-1"
    assert response.json()["requestId"] == "boom-1"


# --- /ready ------------------------------------------------------------------------------------------------------


async def test_ready_on_a_migrated_database(client):
    response = await client.get("/ready")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ready"
    checks = body["checks"]
    assert set(checks) == {"database", "migrations", "broker", "registry", "indexing"}
    assert checks["database"]["ok"] is True
    assert checks["migrations"] == {"ok": True, "current": sorted(migration_heads()), "head": sorted(migration_heads())}
    assert checks["broker"] == {"ok": True, "configured": False}
    assert checks["registry"]["ok"] is True and checks["registry"]["counts"]["entities"] > 50
    assert checks["registry"]["schemaRegistry"] == {"ok": True, "type": "internal"}
    assert checks["indexing"]["mode"] == "embedded" and checks["indexing"]["failures"] == 0
    # liveness is a different question
    assert (await client.get("/health")).status_code == 200


async def test_ready_names_the_migrations_when_the_database_is_behind(client, db):
    await db.execute("UPDATE alembic_version SET version_num = '0005'")
    response = await client.get("/ready")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "not ready"
    failing = {name for name, check in body["checks"].items() if not check["ok"]}
    assert failing == {"migrations"}
    assert body["checks"]["migrations"]["current"] == ["0005"]
    assert "metaledger db upgrade" in body["checks"]["migrations"]["error"]


async def test_ready_names_the_database_when_it_is_unreachable(app, client, database_url, pg_admin_dsn):
    name = database_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(pg_admin_dsn)
    try:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name)
        response = await client.get("/ready")
        assert response.status_code == 503
        body = response.json()
        assert body["status"] == "not ready"
        assert body["checks"]["database"]["ok"] is False and body["checks"]["database"]["error"]
        assert body["checks"]["migrations"]["ok"] is False
        assert body["checks"]["broker"]["ok"] is True  # not configured: not the problem
        # the exposition is still rendered, with what it has (the request itself may need the database to
        # authenticate a token: that is the auth layer's answer, not this one's)
        exposition = (await app.state.ops.metrics()).decode()
        assert "metaledger_db_pool_connections_in_use" in exposition
        assert "metaledger_outbox_sample_errors_total" in exposition
    finally:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        await admin.close()
    response = await client.get("/ready")  # back: the ops connection reconnects
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "settings_overrides",
    [{"kafka_bootstrap_servers": f"127.0.0.1:{free_port()}", "relay_enabled": False}],
    indirect=True,
)
async def test_ready_names_the_broker_when_it_is_unreachable(client):
    response = await client.get("/ready")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert {name for name, check in checks.items() if not check["ok"]} == {"broker"}
    assert checks["broker"]["configured"] is True and checks["broker"]["error"]
    assert checks["indexing"]["mode"] == "spark"


@pytest.mark.parametrize("settings_overrides", [{"live_kafka": True}], indirect=True)
async def test_ready_with_a_reachable_broker(client, kafka_broker):
    response = await client.get("/ready")
    assert response.status_code == 200, response.text
    broker = response.json()["checks"]["broker"]
    # the test broker is one node
    assert broker == {"ok": True, "configured": True, "bootstrapServers": kafka_broker.bootstrap_servers, "brokers": 1}


# --- backpressure ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings_overrides", [{"max_in_flight_writes": 2, "write_queue_timeout_ms": 50}], indirect=True
)
async def test_overload_sheds_writes_with_429_and_loses_no_acknowledged_write(client, db):
    before = await scrape(client)
    writers, per_request = 40, 25

    async def write(w: int) -> tuple[list[str], httpx.Response]:
        urns = [ds(f"ops.load_{w}_{i}") for i in range(per_request)]
        proposals = [mcp("datasetProperties", properties(i, w), urn=u) for i, u in enumerate(urns)]
        return urns, await client.post("/openapi/v1/proposals", json=proposals)

    results = await asyncio.gather(*[write(w) for w in range(writers)])
    statuses = [r.status_code for _, r in results]
    assert set(statuses) <= {200, 429}, statuses  # no 5xx, nothing else
    assert statuses.count(429) > 0 and statuses.count(200) > 0, statuses
    for _urns, response in results:
        if response.status_code == 429:
            assert response.headers["retry-after"] == "1"
            assert response.json()["error"] == "Too Many Requests"
    acknowledged = [u for urns, r in results if r.status_code == 200 for u in urns]
    refused = [u for urns, r in results if r.status_code == 429 for u in urns]
    stored = {
        r["urn"]
        for r in await db.fetch("SELECT urn FROM metadata_aspect_v2 WHERE aspect = 'datasetProperties' AND version = 0")
    }
    logged = {
        r["urn"]
        for r in await db.fetch(
            "SELECT urn FROM change_log_outbox WHERE aspect = 'datasetProperties' AND topic = 'MetadataChangeLog_Versioned_v1'"
        )
    }
    assert set(acknowledged) <= stored and set(acknowledged) <= logged  # every 200 is stored with its change log
    assert not set(refused) & (stored | logged)  # a 429 wrote nothing
    after = await scrape(client)
    rejected = value(after, "metaledger_write_rejections_total", reason="in_flight") - value(
        before, "metaledger_write_rejections_total", reason="in_flight"
    )
    assert rejected == statuses.count(429)
    assert value(after, "metaledger_writes_in_flight") == 0


@pytest.mark.parametrize("settings_overrides", [{"relay_enabled": False, "max_outbox_backlog": 3}], indirect=True)
async def test_writes_answer_429_while_the_outbox_backlog_is_over_its_limit(app, client, db):
    await propose(client, *[mcp("datasetProperties", properties(i), urn=ds(f"ops.held_{i}")) for i in range(2)])
    await app.state.ops.sampler.sample()  # what the sampler task does every ops_sample_interval_s
    response = await client.post(
        "/openapi/v1/proposals", json=[mcp("datasetProperties", properties(5), urn=ds("ops.held_5"))]
    )
    assert response.status_code == 429, response.text
    assert response.headers["retry-after"] == "1" and "backlog" in response.json()["message"]
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", ds("ops.held_5")) == 0
    # reads are not refused
    assert (await client.get(f"/openapi/v3/entity/dataset/{quote(ds('ops.held_0'), safe='')}")).status_code == 200
    # once the backlog drains (here: the rows are consumed by hand), writes pass again
    await db.execute("DELETE FROM change_log_outbox")
    await app.state.ops.sampler.sample()
    await propose(client, mcp("datasetProperties", properties(5), urn=ds("ops.held_5")))
    stored = await db.fetchval(
        "SELECT metadata FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = 'datasetProperties' AND version = 0",
        ds("ops.held_5"),
    )
    assert orjson.loads(stored) == {**properties(5), "customProperties": {}, "tags": []}  # with the schema's defaults


@pytest.mark.parametrize("settings_overrides", [{"db_pool_size": 1, "db_pool_timeout_s": 0.3}], indirect=True)
async def test_an_exhausted_pool_answers_503_with_retry_after_not_500(app, client):
    engine = app.state.engine
    async with engine.connect() as first, engine.connect() as second:  # the pool's two (twice its size)
        await first.exec_driver_sql("SELECT 1")
        await second.exec_driver_sql("SELECT 1")
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await client.post("/openapi/v1/proposals", json=[mcp("status", {"removed": False})])
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1"
        assert response.json()["error"] == "Service Unavailable"
        assert loop.time() - started < 5
        exposition = (await app.state.ops.metrics()).decode()  # (a scrape's token check would need a connection too)
        assert re.search(r"^metaledger_db_pool_connections_in_use 2\.0$", exposition, re.M)
    await propose(client, mcp("status", {"removed": False}))  # connections back: writes pass
