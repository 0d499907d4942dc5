"""Spark tests: one local[2] SparkSession for the whole run (starting one costs ~5-10 s), with the real Postgres,
the Kafka-protocol broker and the OpenSearch-API server from the shared fixtures."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/spark/" in str(item.fspath):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from spark_indexer.session import build_session

    session = build_session("local[2]", app_name="metaledger-tests", conf={"spark.sql.shuffle.partitions": "2",
                                                                            "spark.default.parallelism": "2"})
    yield session
    session.stop()


@pytest.fixture
def index_prefix() -> str:
    """Index names of one test (the search server lives for the whole run)."""
    return f"t{uuid.uuid4().hex[:8]}_"


@pytest.fixture
def work_dir(tmp_path: Path) -> Path:
    return tmp_path / "spark"
