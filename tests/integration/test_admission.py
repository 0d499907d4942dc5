"""Write admission against a real `metaledger serve` process (app.ops.backpressure): an admitted write that cannot
finish within its deadline answers 503 with Retry-After, nothing committed. (A flood beside single writes, with
figures: bench/flood.py.)"""

from __future__ import annotations

import time
from urllib.parse import quote

import asyncpg
import httpx
import pytest

from app.embedded_pg import free_port
from tests.processes import issue_token, start_service, stop_process, wait_healthy


def single_path(name: str) -> str:
    urn = f"urn:li:dataset:(urn:li:dataPlatform:hive,single.{name},PROD)"
    return f"/openapi/v3/entity/dataset/{quote(urn, safe='')}/datasetProperties"


@pytest.fixture
def service(make_database, migrated_template):
    database_url = make_database(template=migrated_template)
    env = {"METALEDGER_DATABASE_URL": database_url, "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
           "METALEDGER_WRITE_DEADLINE_MS": "2000"}
    port = free_port()
    process = start_service(env, port, workers=1)
    try:
        yield f"http://127.0.0.1:{port}", env, database_url.replace("postgresql+asyncpg://", "postgresql://")
    finally:
        stop_process(process)


async def test_an_admitted_write_past_its_deadline_answers_503_and_commits_nothing(service):
    base, env, dsn = service
    await wait_healthy(base, 120)
    auth = {"authorization": f"Bearer {issue_token(env, 'urn:li:corpuser:single', 'writer')}"}
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
