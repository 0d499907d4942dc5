"""The checks of a runtime model set against stored data: timeseries aspects' points are checked as versioned
aspects' values are, and a write of a runtime aspect that lands while an apply is between its checks and its commit
is not stored unchecked."""

from __future__ import annotations

import asyncio

import pytest

from app.modelset import service as runtime_models
from app.registry import load_registry
from app.settings import Settings
from tests.helpers import eventually
from tests.integration.test_runtime_models import DATASET, MODEL_SET, MODELS

USAGE = {
    "type": "record",
    "name": "Usage",
    "namespace": "com.acme",
    "Aspect": {"name": "acmeUsage", "type": "timeseries"},
    "fields": [{"name": "timestampMillis", "type": "long"}, {"name": "hits", "type": "int"}],
}
WITH_USAGE = {"aspects": [{"schema": USAGE}], "entities": [{"name": "dataset", "aspects": ["acmeUsage"]}]}


@pytest.fixture(scope="module")
def registry():
    """A registry of this module's own: the runtime models change it in place (the session's stays the base)."""
    return load_registry(Settings().registry_path)


async def test_timeseries_points_are_checked_against_the_new_schema_and_block_a_removal(client):
    assert (await client.post(MODELS, json=WITH_USAGE)).status_code == 200
    point = await client.post(
        "/openapi/v3/entity/dataset",
        params={"async": "false"},
        json=[{"urn": DATASET, "acmeUsage": {"value": {"timestampMillis": 1_700_000_000_000, "hits": 3}}}],
    )
    assert point.status_code in (200, 201), point.text

    retyped = {
        "aspects": [
            {
                "schema": {**USAGE, "fields": [USAGE["fields"][0], {"name": "hits", "type": "string"}]},
                "compatibility": "NONE",
            }
        ],
        "entities": WITH_USAGE["entities"],
    }
    refused = await client.post(MODELS, json=retyped)
    assert refused.status_code == 400, refused.text
    issue = refused.json()["issues"][0]
    assert issue["message"].startswith("StoredValueInvalid") and DATASET in issue["message"]
    assert issue["aspect"] == "acmeUsage"

    removed = await client.post(MODELS, json={"aspects": [{"schema": USAGE}], "entities": []})
    assert removed.status_code == 400 and "RemovedAspectHasValues" in removed.text, removed.text
    assert (await client.get(MODELS)).json()["version"] == 1


async def test_a_write_during_an_apply_is_checked_against_the_set_it_stores(client, db, monkeypatch):
    """The apply removes acmeRating from datasets (none holds a value when it checks); a write of it, checked
    against the set in force before, arrives while the apply holds its checks' result: it is not stored."""
    assert (await client.post(MODELS, json=MODEL_SET)).status_code == 200
    checked, release = asyncio.Event(), asyncio.Event()
    real_check = runtime_models.stored_data_refusals

    async def check_then_wait(*args):
        refusals = await real_check(*args)
        checked.set()
        await release.wait()
        return refusals

    monkeypatch.setattr(runtime_models, "stored_data_refusals", check_then_wait)
    removal = {**MODEL_SET, "entities": [e for e in MODEL_SET["entities"] if e["name"] != "dataset"]}
    apply = asyncio.create_task(client.post(MODELS, json=removal))
    await checked.wait()
    write = asyncio.create_task(
        client.post(f"/openapi/v3/entity/dataset/{DATASET}/acmeRating", json={"value": {"stars": 4}})
    )

    async def write_waits_on_the_apply() -> bool:  # the write's transaction blocked by the apply's lock of the set
        return bool(
            await db.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0"
            )
        )

    assert await eventually(write_waits_on_the_apply, timeout=30)
    assert not write.done()
    release.set()
    applied, written = await apply, await write
    assert applied.status_code == 200, applied.text
    assert written.status_code in (400, 503), written.text
    assert await db.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE aspect = 'acmeRating'") == 0
