"""A read that cannot finish within METALEDGER_READ_TIMEOUT_S is cancelled in the database and answered 503 with
Retry-After: it does not hold its connection, or its caller, for as long as the database makes it wait."""

from __future__ import annotations

import time

import asyncpg
import pytest

from tests.helpers import DATASET, mcp, propose


@pytest.mark.parametrize("settings_overrides", [{"read_timeout_s": 0.5}])
async def test_a_search_past_the_read_timeout_answers_503_with_retry_after(client, database_url):
    await propose(client, mcp("datasetProperties", {"name": "orders"}, sync=True))  # indexed before the answer
    before = await client.get("/openapi/v3/entity/dataset", params={"count": 5})
    assert before.status_code == 200 and [e["urn"] for e in before.json()["entities"]] == [DATASET], before.text
    blocker = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        async with blocker.transaction():
            # every read of the search documents now waits for this lock
            await blocker.execute("LOCK TABLE search_document IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            # another page size than before: the result cache (app.search.postgres) cannot answer it
            response = await client.get("/openapi/v3/entity/dataset", params={"count": 4})
            waited = time.monotonic() - started
    finally:
        await blocker.close()
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    assert waited < 5, waited  # cancelled at its timeout, not after the lock went
    # the lock is gone: the same read answers again, as it did before
    again = await client.get("/openapi/v3/entity/dataset", params={"count": 5})
    assert again.status_code == 200 and again.json() == before.json(), again.text
