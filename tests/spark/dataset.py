"""The Spark tests' shared data set (restore-indices, reconcile, the CLI): ~60 entities — 50 datasets with six aspects
each, some updated twice, corpusers, tags — and helpers on the search server's indices. The `ingested` fixture that
writes it through the app lives in tests/spark/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx

from spark_indexer.config import IndexerSettings
from tests.helpers import mcp

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
N_DATASETS = 50


def ds(i: int) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:hive,db{i % 5}.table{i:02d},PROD)"


def user(k: int) -> str:
    return f"urn:li:corpuser:user{k}"


def tag(k: int) -> str:
    return f"urn:li:tag:tag{k}"


def schema(i: int) -> dict[str, Any]:
    return {
        "schemaName": f"db{i % 5}.table{i:02d}",
        "platform": "urn:li:dataPlatform:hive",
        "version": 0,
        "hash": "",
        "platformSchema": {"com.linkedin.schema.MySqlDDL": {"tableSchema": "CREATE TABLE t (id INT)"}},
        "fields": [
            {
                "fieldPath": "id",
                "nativeDataType": "INT",
                "type": {"type": {"com.linkedin.schema.NumberType": {}}},
                "globalTags": {"tags": [{"tag": tag(i % 3)}]},
            },
            {
                "fieldPath": f"col_{i}",
                "nativeDataType": "VARCHAR",
                "description": f"column {i}",
                "type": {"type": {"com.linkedin.schema.StringType": {}}},
            },
        ],
    }


def dataset_aspects(i: int, generation: int = 1) -> dict[str, Any]:
    stamp = {"time": 1_700_000_000_000 + i, "actor": "urn:li:corpuser:admin"}
    aspects: dict[str, Any] = {
        "datasetProperties": {
            "name": f"table{i:02d}",
            "description": f"table number {i} generation {generation}",
            "customProperties": {"team": f"team{i % 4}"},
        },
        "schemaMetadata": schema(i),
        "ownership": {"owners": [{"owner": user(i % 5), "type": "DATAOWNER"}], "lastModified": stamp},
        "globalTags": {"tags": [{"tag": tag(i % 3)}]},
        "status": {"removed": i % 10 == 9},
    }
    if i > 0:
        aspects["upstreamLineage"] = {"upstreams": [{"auditStamp": stamp, "dataset": ds(i - 1), "type": "TRANSFORMED"}]}
    return aspects


def proposals() -> Iterator[list[dict[str, Any]]]:
    """The data set as batches of sync-indexed proposals."""

    def sync_mcp(entity: str, urn: str, aspect: str, value: dict[str, Any]) -> dict[str, Any]:
        return mcp(aspect, value, urn, entity=entity, content_type=None, headers=SYNC)

    batch = [
        sync_mcp(
            "corpuser",
            user(k),
            "corpUserInfo",
            {"active": True, "displayName": f"User {k}", "fullName": f"User Number{k}", "email": f"u{k}@example.com"},
        )
        for k in range(5)
    ]
    batch += [
        sync_mcp("tag", tag(k), "tagProperties", {"name": f"tag{k}", "description": f"tag {k}"}) for k in range(3)
    ]
    yield batch
    for start in range(0, N_DATASETS, 10):
        yield [
            sync_mcp("dataset", ds(i), a, v) for i in range(start, start + 10) for a, v in dataset_aspects(i).items()
        ]
    # a second generation for some: versions > 1
    yield [
        sync_mcp("dataset", ds(i), a, v)
        for i in range(0, 10)
        for a, v in dataset_aspects(i, 2).items()
        if a in ("datasetProperties", "ownership")
    ]


# --- index helpers (sync: the restore functions run their own event loops) ----------------------------------------


def dump(url: str, index: str) -> dict[str, dict[str, Any]]:
    """Every document of an index/alias: id -> source."""
    response = httpx.post(f"{url}/{index}/_search", json={"query": {"match_all": {}}, "size": 10_000}, timeout=60)
    if response.status_code == 404:
        return {}
    response.raise_for_status()
    return {h["_id"]: h["_source"] for h in response.json()["hits"]["hits"]}


def indices_with(url: str, prefix: str) -> list[str]:
    return sorted(
        i["index"]
        for i in httpx.get(f"{url}/_cat/indices?format=json", timeout=30).json()
        if i["index"].startswith(prefix)
    )


def drop_prefix(url: str, prefix: str) -> None:
    names = indices_with(url, prefix)
    for start in range(0, len(names), 50):
        httpx.delete(f"{url}/{','.join(names[start : start + 50])}", timeout=30).raise_for_status()


def indexer_settings(data: SimpleNamespace, prefix: str | None, **overrides: Any) -> IndexerSettings:
    search = (
        {"search_url": data.search_url, "search_flavor": "opensearch", "search_index_prefix": prefix}
        if prefix
        else {"search_url": None}
    )
    values = {"database_url": data.database_url, "spark_restore_partitions": 4, "spark_apply_chunk": 500, **search}
    return IndexerSettings(**{**values, **overrides})
