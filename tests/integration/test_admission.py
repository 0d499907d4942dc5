"""Write admission against a real `metaledger serve` process (app.ops.backpressure): one caller's flood of large
batches is answered 429 with Retry-After while another caller's single writes are served beside it, and an
admitted write that cannot finish within its deadline answers 503 with Retry-After, nothing committed.
(Figures under load: bench/flood.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from urllib.parse import quote

import asyncpg
import httpx
import pytest

from app.embedded_pg import free_port
from tests.processes import service_token, start_service, stop_process, wait_healthy

FLOODERS, BATCH = 8, 300
SINGLE_WRITES = 30  # at least; the single writer goes on until the flood has been both admitted and refused


def batch(client: int, n: int) -> list[dict]:
    return [
        {
            "entityType": "dataset",
            "changeType": "UPSERT",
            "aspectName": "datasetProperties",
            "entityUrn": f"urn:li:dataset:(urn:li:dataPlatform:hive,flood.c{client}.b{n}.t{i},PROD)",
            "aspect": {"contentType": "application/json", "value": {"name": f"t{i}", "description": "flooded"}},
        }
        for i in range(BATCH)
    ]


def single_path(name: str) -> str:
    urn = f"urn:li:dataset:(urn:li:dataPlatform:hive,single.{name},PROD)"
    return f"/openapi/v3/entity/dataset/{quote(urn, safe='')}/datasetProperties"


@pytest.fixture(scope="module")  # one process for both tests: each leaves the budget as it found it (all answered)
def service(make_database, migrated_template):
    database_url = make_database(template=migrated_template)
    env = {
        "METALEDGER_DATABASE_URL": database_url,
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
        # a budget of two batches: the flood's share is one batch in flight, the other half is everyone else's
        "METALEDGER_WRITE_BUDGET": str(2 * BATCH),
        "METALEDGER_WRITE_DEADLINE_MS": "2000",
    }
    port = free_port()
    process = start_service(env, port, workers=1)
    try:
        yield f"http://127.0.0.1:{port}", env, database_url.replace("postgresql+asyncpg://", "postgresql://")
    finally:
        stop_process(process)


async def test_a_flood_from_one_caller_is_refused_while_another_callers_single_writes_are_served(service):
    base, env, _ = service
    await wait_healthy(base, 120)
    flood_auth = {"authorization": f"Bearer {service_token(env, 'urn:li:corpuser:flood', 'writer')}"}
    single_auth = {"authorization": f"Bearer {service_token(env, 'urn:li:corpuser:single', 'writer')}"}
    flood_statuses: list[int] = []
    flood_seconds: list[float] = []  # of the batches admitted
    retry_afters: list[str | None] = []
    single_statuses: list[int] = []
    single_seconds: list[float] = []
    warm, done = asyncio.Event(), asyncio.Event()

    async def flooder(c: int) -> None:
        await warm.wait()
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=flood_auth) as http:  # a connection each
            for n in range(10_000):
                if done.is_set():
                    return
                started = time.monotonic()
                response = await http.post("/openapi/v1/proposals", json=batch(c, n))
                flood_statuses.append(response.status_code)
                if response.status_code == 200:
                    flood_seconds.append(time.monotonic() - started)
                elif response.status_code == 429:  # back when told, as DataHub's clients do
                    retry_afters.append(response.headers.get("retry-after"))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), float(response.headers.get("retry-after") or 1))

    async def single_writer() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=single_auth) as http:
            # not measured: a process's first request to a route builds the route's state (FastAPI, seconds)
            assert (await http.post(single_path("warm-up"), json={"value": {"name": "warm-up"}})).status_code == 200
            warm.set()
            while not (flood_statuses.count(200) and flood_statuses.count(429) >= FLOODERS):  # the flood is on
                await asyncio.sleep(0.05)  # (the whole test is bounded by the wait_for below: 150 s)
            i = 0
            while i < SINGLE_WRITES or flood_statuses.count(200) < 2:  # a batch admitted while they ran
                started = time.monotonic()
                response = await http.post(single_path(f"t{i}"), json={"value": {"name": f"t{i}"}})
                single_seconds.append(time.monotonic() - started)
                single_statuses.append(response.status_code)
                i += 1
        done.set()

    await asyncio.wait_for(asyncio.gather(single_writer(), *(flooder(c) for c in range(FLOODERS))), 150)

    assert set(single_statuses) == {200}, single_statuses  # the other caller is never refused
    assert set(flood_statuses) <= {200, 429}, sorted(set(flood_statuses))  # no 5xx, no connection dropped
    assert retry_afters and all(r is not None and int(r) >= 1 for r in retry_afters), retry_afters
    single_p99 = sorted(single_seconds)[int(0.99 * len(single_seconds))]
    # the single writes wait for no flood batch: far quicker than the batches admitted beside them
    assert single_p99 < statistics.median(flood_seconds), (single_seconds, flood_seconds)


async def test_an_admitted_write_past_its_deadline_answers_503_and_commits_nothing(service):
    base, env, dsn = service
    await wait_healthy(base, 120)
    auth = {"authorization": f"Bearer {service_token(env, 'urn:li:corpuser:single', 'writer')}"}
    update = single_path("locked") + "?createIfNotExists=false"  # a new version of the existing aspect
    async with httpx.AsyncClient(base_url=base, timeout=60, headers=auth) as http:
        assert (await http.post(single_path("locked"), json={"value": {"name": "before"}})).status_code == 200
        holder = await asyncpg.connect(dsn)
        try:
            async with holder.transaction():  # another transaction holds the row the write must lock
                await holder.execute("SELECT 1 FROM metadata_aspect_v2 WHERE urn LIKE '%single.locked%' FOR UPDATE")
                started = time.monotonic()
                response = await http.post(update, json={"value": {"name": "after"}})
                waited = time.monotonic() - started
        finally:
            await holder.close()
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1" and "deadline" in response.json()["message"]
        assert waited < 30  # the deadline (2 s), not the lock, decided when it ended
        value = (await http.get(single_path("locked"))).json()
        assert value["value"]["name"] == "before", value  # nothing committed
        assert (await http.post(update, json={"value": {"name": "after"}})).status_code == 200
        value = (await http.get(single_path("locked"))).json()
        assert (value["value"]["name"], value["version"]) == ("after", "2"), value  # the lock gone, it commits
