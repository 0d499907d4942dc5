"""The timeseries archive's rows as the index tasks give them back (`spark_indexer.batch.Point`): every decoded record
of the timeseries topic that has an URN, an aspect name and a `timestampMillis`, whether or not the registry knows
it, and nothing else (no Spark: the task's planning and its Arrow result)."""

from __future__ import annotations

import orjson
import pytest

from app.registry import load_registry
from app.settings import Settings
from spark_indexer.batch import POINT, RESULT_SCHEMA, Record, TaskResult, plan, result_batch

VERSIONED, TIMESERIES = "mclv", "mclt"
URN = "urn:li:dataset:(urn:li:dataPlatform:hive,db.orders,PROD)"


@pytest.fixture(scope="module")
def registry():
    return load_registry(Settings().registry_path)


def change_log(aspect: str, value: dict, **extra) -> bytes:
    return orjson.dumps(
        {
            "entityType": "dataset",
            "entityUrn": URN,
            "aspectName": aspect,
            "changeType": "UPSERT",
            "aspect": {"value": orjson.dumps(value).decode(), "contentType": "application/json"},
            "systemMetadata": {"version": "1", "runId": "run-7"},
            **extra,
        }
    )


def test_points_are_the_timeseries_topics_placeable_records_known_or_not(registry):
    profile = {"timestampMillis": 1_763_700_000_000, "rowCount": 5}
    records = [
        Record(TIMESERIES, 1, 10, b"k", change_log("datasetProfile", profile)),
        Record(TIMESERIES, 1, 11, b"k", change_log("warpDriveProfile", {"timestampMillis": "1763700000001"})),
        Record(TIMESERIES, 1, 12, b"k", change_log("datasetProfile", {"rowCount": 6})),  # no time: not placeable
        Record(TIMESERIES, 1, 13, b"k", b"{not json"),
        Record(VERSIONED, 0, 3, b"k", change_log("datasetProperties", {"timestampMillis": 1, "name": "orders"})),
    ]
    result = plan(records, registry, TIMESERIES)

    assert [(p.record.offset, p.urn, p.entity_type, p.aspect, p.timestamp_ms, p.run_id) for p in result.points] == [
        (10, URN, "dataset", "datasetProfile", 1_763_700_000_000, "run-7"),
        (11, URN, "dataset", "warpDriveProfile", 1_763_700_000_001, "run-7"),
    ]
    assert orjson.loads(result.points[0].event) == profile
    assert sorted(d.record.offset for d in result.dead) == [11, 13]  # the unknown aspect is archived and dead-lettered
    assert sorted(p.record.offset for p in result.to_apply) == [3, 10, 12]  # indexing is as before


def test_a_tasks_points_are_rows_of_its_result_and_counted(registry):
    records = [
        Record(TIMESERIES, 0, i, b"k", change_log("datasetProfile", {"timestampMillis": 1000 + i})) for i in range(3)
    ]
    result = TaskResult(rows=3, points=plan(records, registry, TIMESERIES).points)
    batch = result_batch(result)

    assert batch.schema.names == [column.split()[0] for column in RESULT_SCHEMA.split(", ")]
    rows = batch.to_pylist()
    assert [(r["offset"], r["timestamp_ms"], r["aspect"]) for r in rows if r["kind"] == POINT] == [
        (0, 1000, "datasetProfile"),
        (1, 1001, "datasetProfile"),
        (2, 1002, "datasetProfile"),
    ]
    assert [r["count"] for r in rows if r["kind"] == "timeseries_rows"] == [3]
