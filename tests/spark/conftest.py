"""Spark tests: one local[2] SparkSession for the whole run (starting one costs ~5-10 s), with the real Postgres,
the Kafka-protocol broker and the OpenSearch-API server from the shared fixtures."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import asyncpg
import httpx
import pytest
import pytest_asyncio

from app.main import create_app
from app.settings import Settings
from tests.helpers import bearer
from tests.spark.dataset import drop_prefix, proposals


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/spark/" in str(item.fspath):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session", autouse=True)
def spark_scratch(tmp_path_factory) -> Iterator[Path]:
    """Spark's scratch space (its local directories, and the JVMs' temporary directory where spark-submit copies the
    archives it ships) under the run's temporary directory, for every Spark process the tests start: the test
    session's driver, the jobs, the cluster's workers and executors. Under /tmp, each run left 60-130 MB there
    (the processes the tests kill never clean up) that no later run removed."""
    scratch = tmp_path_factory.mktemp("spark-scratch")
    (scratch / "java").mkdir()
    saved = {name: os.environ.get(name) for name in ("SPARK_LOCAL_DIRS", "SPARK_SUBMIT_OPTS")}
    os.environ["SPARK_LOCAL_DIRS"] = str(scratch)
    os.environ["SPARK_SUBMIT_OPTS"] = f"{saved['SPARK_SUBMIT_OPTS'] or ''} -Djava.io.tmpdir={scratch / 'java'}".strip()
    yield scratch
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from spark_indexer.session import build_session

    session = build_session(
        "local[2]",
        app_name="metaledger-tests",
        conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"},
    )
    yield session
    session.stop()


@pytest.fixture
def index_prefix() -> str:
    """Index names of one test (the search server lives for the whole run)."""
    return f"t{uuid.uuid4().hex[:8]}_"


@pytest.fixture
def work_dir(tmp_path: Path) -> Path:
    return tmp_path / "spark"


@pytest_asyncio.fixture(scope="session")
async def ingested(make_database, migrated_template, registry, search_server) -> SimpleNamespace:
    """The shared data set (tests/spark/dataset.py), once per test process (~25 s), not per module: a database and a
    live index (prefix `reference`) built by the app from ~360 proposals. No test changes the stored aspects or the
    reference index: one that writes an index restores into a prefix of its own (added to `prefixes`, dropped at the
    end); the Postgres backend's search tables in the database are the embedded-backend test's alone."""
    database_url = make_database(template=migrated_template)
    reference = f"t{uuid.uuid4().hex[:8]}_"
    settings = Settings(
        database_url=database_url,
        apply_migrations_on_start=False,
        search_url=search_server.url,
        search_flavor="opensearch",
        search_index_prefix=reference,
    )
    application = create_app(settings, registry)
    async with application.router.lifespan_context(application):
        assert application.state.search.started, application.state.search.last_error
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application),
            base_url="http://metaledger",
            headers=await bearer(application),
        ) as http:
            for batch in proposals():
                response = await http.post("/openapi/v1/proposals", json=batch)
                assert response.status_code == 200, response.text
        conn = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:  # the embedded worker applies the same change logs again (no-ops): let it finish first
            for _ in range(200):
                pending = await conn.fetchval("SELECT count(*) FROM change_log_outbox WHERE feed_offset IS NULL")
                last = await conn.fetchval("SELECT last_offset FROM feed_reader_state WHERE reader = 'search-indexer'")
                top = await conn.fetchval("SELECT coalesce(max(feed_offset), 0) FROM change_log_outbox")
                if pending == 0 and last is not None and last >= top:
                    break
                await asyncio.sleep(0.05)
            rows = await conn.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE version = 0")
        finally:
            await conn.close()
    data = SimpleNamespace(
        database_url=database_url, search_url=search_server.url, reference=reference, rows=rows, prefixes=[reference]
    )
    yield data
    for prefix in data.prefixes:
        drop_prefix(search_server.url, prefix)
