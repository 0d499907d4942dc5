"""The job's storage settings are Hadoop filesystem URIs, kept as written from the environment to Spark's API (a
`Path` would turn `s3a://bucket/p` into `s3a:/bucket/p`), on the driver and in the payload executors get."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from spark_indexer import stream
from spark_indexer.config import IndexerSettings
from spark_indexer.sink import settings_from_payload, settings_payload

URIS = ["s3a://bucket/p", "hdfs://nn:8020/p", "file:///p", "abfss://container@account.dfs.core.windows.net/p"]


class Recorder:
    """Stands in for Spark's DataFrame, writers and session: records every call with its arguments."""

    def __init__(self, calls: list[tuple[str, tuple[Any, ...]]]) -> None:
        self.calls = calls

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Recorder:
            self.calls.append((name, args))
            return self

        return call

    writeStream = write = sparkContext = property(lambda self: self)  # noqa: N815 - Spark's names


@pytest.mark.parametrize("uri", URIS)
def test_storage_uris_reach_spark_unchanged(uri, monkeypatch):
    for name in ("CHECKPOINT", "DEAD_LETTER", "TIMESERIES"):
        monkeypatch.setenv(f"METALEDGER_SPARK_{name}_DIR", f"{uri}/{name.lower()}")
    settings = IndexerSettings(kafka_bootstrap_servers="broker:9092", search_url="http://search:9200")
    assert (settings.checkpoint_dir, settings.dead_letter_dir, settings.timeseries_dir) == (
        f"{uri}/checkpoint",
        f"{uri}/dead_letter",
        f"{uri}/timeseries",
    )
    on_executor = settings_from_payload(orjson.loads(orjson.dumps(settings_payload(settings))))
    assert on_executor.dead_letter_dir == f"{uri}/dead_letter" and on_executor.timeseries_dir == f"{uri}/timeseries"

    calls: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr("spark_indexer.kafka_source.read_stream", lambda spark, s, topics: Recorder(calls))
    stream.run_stream(Recorder(calls), settings, once=True, echo=False)
    assert ("option", ("checkpointLocation", f"{uri}/checkpoint")) in calls

    calls.clear()
    sink = stream.BatchSink(Recorder(calls), settings, echo=False)
    sink._write_dead_letters(
        [
            {
                "topic": "t",
                "partition": 0,
                "offset": 1,
                "urn": None,
                "aspect": None,
                "reason": "r",
                "key": None,
                "value": b"x",
            }
        ],
        batch_id=3,
    )
    assert ("parquet", (f"{uri}/dead_letter",)) in calls


@pytest.mark.parametrize("uri", URIS)
def test_the_work_dir_is_the_parent_of_every_location(uri):
    settings = IndexerSettings(spark_work_dir=uri)
    assert settings.spark_work_dir == uri
    assert [settings.checkpoint_dir, settings.dead_letter_dir, settings.timeseries_dir] == [
        f"{uri}/checkpoint",
        f"{uri}/dead_letter",
        f"{uri}/timeseries",
    ]


def test_the_timeseries_replay_marker_lives_under_the_timeseries_uri(spark, tmp_path, monkeypatch):
    """Written through Hadoop's FileSystem at the URI, not on the driver's working directory."""
    monkeypatch.chdir(tmp_path)
    root = (tmp_path / "shared" / "timeseries").as_uri()
    settings = IndexerSettings(spark_timeseries_dir=root, search_url="http://search:9200")
    sink = stream.BatchSink(spark, settings, echo=False)
    assert sink._archive_timeseries(None, 7, points=0) == 0
    markers = list((tmp_path / "shared" / "timeseries" / "_batches").glob("[!.]*"))  # Hadoop's .crc beside it
    assert [m.name.rsplit("-", 1)[1] for m in markers] == ["7"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared"]
    assert sink._archive_timeseries(None, 7, points=3) == 0  # marked: a replayed batch writes nothing
