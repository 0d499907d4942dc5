"""The indexers that run outside the API's requests follow the runtime model set (issue 28): the embedded indexer
(app.search.worker) whose registry is behind the stored set takes it up before it builds a change log it does not
know, and restore-indices and reconcile (spark_indexer) index and compare under the set stored when they start.
The service runs no background process here: the change logs are indexed by the worker or the restore task the test
runs, or not at all."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from app.changelog import outbox
from app.modelset.watcher import ModelWatcher
from app.registry import load_registry
from app.search.service import SearchRuntime
from app.search.worker import IndexWorker
from app.settings import Settings
from tests.helpers import ds

MODELS = "/openapi/v1/models"
GOLD = ds("rated.gold")
RATING = {
    "type": "record",
    "name": "Rating",
    "namespace": "com.acme",
    "Aspect": {"name": "acmeRating"},
    "fields": [
        {"name": "stars", "type": "int"},
        {
            "name": "note",
            "type": ["null", "string"],
            "default": None,
            "Searchable": {"fieldType": "TEXT", "fieldName": "ratingNote"},
        },
    ],
}
MODEL_SET = {"aspects": [{"schema": RATING}], "entities": [{"name": "dataset", "aspects": ["acmeRating"]}]}


@pytest.fixture(scope="module")
def registry():
    """A registry of this module's own: the runtime models change it in place (the session's stays the base)."""
    return load_registry(Settings().registry_path)


@pytest.fixture
def settings_overrides():
    return {"background_in_process": False}


async def rated(client) -> None:
    """The set applied (the app's registry takes it up at once) and GOLD rated; nothing indexes it yet."""
    applied = await client.post(MODELS, json=MODEL_SET)
    assert applied.status_code == 200, applied.text
    written = await client.post(
        f"/openapi/v3/entity/dataset/{GOLD}/acmeRating", json={"value": {"stars": 5, "note": "crunchy ledger"}}
    )
    assert written.status_code in (200, 201), written.text
    assert await found(client, "crunchy") == []


async def found(client, text: str) -> list[str]:
    response = await client.get("/openapi/v3/entity/dataset", params={"query": text})
    assert response.status_code == 200, response.text
    return [e["urn"] for e in response.json()["entities"]]


async def test_an_embedded_indexer_behind_the_stored_set_takes_it_up_and_indexes_the_runtime_field(app, client, db):
    await rated(client)
    # another process's registry, its ModelWatcher not polled since the apply
    behind = load_registry(Settings().registry_path)
    settings = app.state.settings
    watcher = ModelWatcher(settings, app.state.sessionmaker, behind)  # as the background process hands its own
    worker = IndexWorker(settings, app.state.engine, SearchRuntime.create(settings, behind, app.state.engine), watcher)
    await outbox.sequence(db, 100)
    last = await db.fetchval("SELECT max(feed_offset) FROM change_log_outbox")
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    try:
        deadline = time.monotonic() + 10
        while worker.last_offset < last:
            assert time.monotonic() < deadline, "the change logs were not consumed"
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await running
    assert behind.runtime_version == 1 and worker.rows_failed == 0
    assert await found(client, "crunchy") == [GOLD]


def restore_task(settings: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What one restore-indices task does with `rows` (its Spark partition), without Spark: the stats it yields."""
    import pyarrow as pa

    from spark_indexer.restore import _apply_partition
    from spark_indexer.sink import settings_payload

    columns = ("urn", "aspect", "version", "metadata", "systemmetadata")
    batch = pa.RecordBatch.from_pylist([{c: row[c] for c in columns} for row in rows])
    (stats,) = _apply_partition(settings_payload(settings), None, 100, None)(iter([batch]))
    return stats.to_pylist()[0]


async def test_restore_and_reconcile_take_up_the_set_stored_when_they_start(client, database_url):
    from spark_indexer.config import IndexerSettings
    from spark_indexer.postgres_source import RowFilter, fetch_latest
    from spark_indexer.reconcile import indexed_aspects
    from spark_indexer.sink import current_registry

    await rated(client)
    settings = IndexerSettings(database_url=database_url)
    # the driver's registry (reconcile's expected side), taken up on this test's running event loop
    registry = current_registry(settings)
    assert registry.runtime_version == 1 and "acmeRating" in indexed_aspects(registry, ["dataset"])[0]
    rows = await fetch_latest(database_url, RowFilter.of(entities=["dataset"]))
    stats = await asyncio.to_thread(restore_task, settings, rows)
    assert (stats["rows"], stats["indexed"], stats["failed"]) == (len(rows), len(rows), 0)
    assert await found(client, "crunchy") == [GOLD]
