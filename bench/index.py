"""Indexing throughput into the search server, against its raw bulk ceiling, and sync-indexed write latency.

    .venv/bin/python bench/index.py [--aspects 100000] [--batch 1000] [--writes 300]

Prints:
- indexing path: `--aspects` change logs (datasets with datasetKey, datasetProperties, ownership and
  upstreamLineage: search fields and graph edges) through `app.search.documents.changes_from_mcl` +
  `ElasticBackend.apply` (refresh off, as a bulk loader), `--batch` change logs per apply, in aspects/s;
- the raw bulk ceiling, same run, same server: a plain `_bulk` of the same documents (one `index` operation per
  change record the indexing path produced: the aspect's fields as a document, one document per edge) into fresh
  indices with the same mappings, same batch size; and the indexing path's share of it;
- sync-indexed write latency p50/p99: `--writes` sequential single-MCP writes with `X-DataHub-Sync-Index-Update:
  true` to `/openapi/v1/proposals` of a real `metaledger` server (uvicorn, own Postgres, fsync on) indexing into the
  same search server; and the same writes without the header, for comparison.

The search server is the osmem OpenSearch-API test double (tests.search_server), in memory: absolute figures are
not Elasticsearch's; the ratio between the two paths is the point.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.db import upgrade_database  # noqa: E402
from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port  # noqa: E402
from app.registry import load_registry  # noqa: E402
from app.search.documents import changes_from_mcl  # noqa: E402
from app.search.elastic import ElasticBackend  # noqa: E402
from app.search.elastic_mappings import index_mapping  # noqa: E402
from app.search.model import AspectEdges, AspectFields, EntityRemoval, TimeseriesPoint  # noqa: E402
from app.settings import Settings  # noqa: E402
from tests.processes import SYSTEM_AUTH, start_service, stop_process, wait_healthy  # noqa: E402
from tests.search_server import start_search_server  # noqa: E402

PLATFORMS = ("hive", "snowflake", "bigquery", "postgres")
ASPECTS_PER_ENTITY = 4


def urn_of(i: int) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:{PLATFORMS[i % 4]},bench.db.table_{i},PROD)"


def mcl(urn: str, aspect: str, value: dict[str, Any], version: int = 1) -> dict[str, Any]:
    return {
        "entityType": "dataset",
        "entityUrn": urn,
        "changeType": "UPSERT",
        "aspectName": aspect,
        "aspect": {"value": orjson.dumps(value).decode(), "contentType": "application/json"},
        "systemMetadata": {"version": str(version), "runId": "bench", "lastObserved": 1_700_000_000_000},
        "created": {"time": 1_700_000_000_000, "actor": "urn:li:corpuser:bench"},
    }


def change_logs(aspects: int) -> list[dict[str, Any]]:
    out = []
    audit = {"time": 1_700_000_000_000, "actor": "urn:li:corpuser:bench"}
    for i in range(aspects // ASPECTS_PER_ENTITY):
        urn = urn_of(i)
        out.append(
            mcl(
                urn,
                "datasetKey",
                {
                    "platform": f"urn:li:dataPlatform:{PLATFORMS[i % 4]}",
                    "name": f"bench.db.table_{i}",
                    "origin": "PROD",
                },
            )
        )
        out.append(
            mcl(
                urn,
                "datasetProperties",
                {
                    "name": f"table_{i}",
                    "description": f"Table {i}: orders placed through the web shop, region {i % 17}",
                    "customProperties": {"team": f"team{i % 9}"},
                    "tags": [],
                },
            )
        )
        out.append(
            mcl(
                urn,
                "ownership",
                {"owners": [{"owner": f"urn:li:corpuser:user{i % 50}", "type": "DATAOWNER"}], "lastModified": audit},
            )
        )
        ups = [{"dataset": urn_of(j), "type": "TRANSFORMED", "auditStamp": audit} for j in (i - 1, i - 2) if j >= 0]
        out.append(mcl(urn, "upstreamLineage", {"upstreams": ups}))
    return out


def raw_operations(changes: list[Any], entity_index: str, edge_index: str, ts_index: str) -> list[dict[str, Any]]:
    """The same documents as plain `index` operations: no versions read, no merging, no edge-set replacement."""
    ops: list[dict[str, Any]] = []
    for c in changes:
        if isinstance(c, AspectFields):
            ops.append({"index": {"_index": entity_index, "_id": c.urn}})
            ops.append({"urn": c.urn, **c.fields})
        elif isinstance(c, AspectEdges):
            for e in c.edges:
                ops.append(
                    {"index": {"_index": edge_index, "_id": f"{e.source}|{e.relationship}|{e.destination}|{c.aspect}"}}
                )
                ops.append(
                    {
                        "source": e.source,
                        "destination": e.destination,
                        "relationshipType": e.relationship,
                        "sourceType": e.source_type,
                        "destinationType": e.destination_type,
                        "aspect": c.aspect,
                        "version": c.version,
                        "createdOn": e.created_on,
                        "via": e.via,
                    }
                )
        elif isinstance(c, TimeseriesPoint):
            ops.append({"index": {"_index": ts_index, "_id": c.doc_id}})
            ops.append(c.fields)
        elif isinstance(c, EntityRemoval):
            ops.append({"delete": {"_index": entity_index, "_id": c.urn}})
    return ops


async def indexing_path(
    settings: Settings, registry: Any, logs: list[dict[str, Any]], batch: int
) -> tuple[float, int, list[list[Any]]]:
    backend = ElasticBackend(settings, registry, refresh=False)
    await backend.start()
    batches: list[list[Any]] = []
    records = 0
    try:
        started = time.perf_counter()
        for start in range(0, len(logs), batch):
            changes = [c for m in logs[start : start + batch] for c in changes_from_mcl(m, registry)]
            records += len(changes)
            batches.append(changes)
            await backend.apply(changes)
        elapsed = time.perf_counter() - started
    finally:
        await backend.close()
    return elapsed, records, batches


async def raw_ceiling(settings: Settings, registry: Any, batches: list[list[Any]]) -> float:
    backend = ElasticBackend(settings, registry, refresh=False)  # only for its configured client
    client = backend.client
    prefix = settings.search_index_prefix + "raw_"
    entity_index, edge_index, ts_index = prefix + "datasetindex", prefix + "graph", prefix + "ts"
    try:
        await client.indices.create(index=entity_index, mappings=index_mapping(registry, "dataset"))
        for name in (edge_index, ts_index):
            await client.indices.create(index=name)
        operations = [raw_operations(b, entity_index, edge_index, ts_index) for b in batches]  # built outside the clock
        started = time.perf_counter()
        for ops in operations:
            if ops:
                response = await client.bulk(operations=ops, refresh=False)
                if response.get("errors"):
                    raise RuntimeError(f"raw bulk errors: {str(response)[:500]}")
        return time.perf_counter() - started
    finally:
        await backend.close()


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def write_latencies(base: str, count: int, sync: bool, tag: str) -> list[float]:
    samples = []
    headers = {"X-DataHub-Sync-Index-Update": "true"} if sync else {}
    async with httpx.AsyncClient(timeout=30, headers=SYSTEM_AUTH) as http:
        for i in range(count):
            body = [
                {
                    "entityType": "dataset",
                    "entityUrn": urn_of(i),
                    "changeType": "UPSERT",
                    "aspectName": "datasetProperties",
                    "aspect": {"value": {"name": f"{tag}_{i}", "description": f"latency probe {tag} {i}"}},
                    "headers": headers,
                }
            ]
            started = time.perf_counter()
            response = await http.post(f"{base}/openapi/v1/proposals", json=body)
            samples.append((time.perf_counter() - started) * 1000)
            response.raise_for_status()
            if sync and response.json().get("index", {}).get("status") != "UPDATED":
                raise RuntimeError(f"sync index update not applied: {response.text[:300]}")
    return samples


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aspects", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--writes", type=int, default=300)
    args = parser.parse_args()

    search = start_search_server()
    root = Path(tempfile.mkdtemp(prefix="metaledger-bench-index-"))
    pg = EmbeddedPostgres(root / "pg", free_port(), database=None, durable=True)
    server = None
    try:
        registry = load_registry(Settings().registry_path)
        logs = change_logs(args.aspects)
        settings = Settings(search_url=search.url, search_flavor="opensearch", search_index_prefix="bench_")
        elapsed, records, batches = await indexing_path(settings, registry, logs, args.batch)
        raw_elapsed = await raw_ceiling(settings, registry, batches)
        rate, raw_rate = len(logs) / elapsed, len(logs) / raw_elapsed

        pg.start()
        ensure_database(pg.admin_dsn, "bench")
        sa_url = pg.admin_dsn.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://") + "/bench"
        upgrade_database(sa_url)
        port = free_port()
        server = start_service(
            {
                "METALEDGER_DATABASE_URL": sa_url,
                "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
                "METALEDGER_SEARCH_URL": search.url,
                "METALEDGER_SEARCH_FLAVOR": "opensearch",
                "METALEDGER_SEARCH_INDEX_PREFIX": "benchsvc_",
            },
            port,
            quiet=True,
        )
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(base)
        await write_latencies(base, 20, True, "warm")
        sync_ms = await write_latencies(base, args.writes, True, "sync")
        plain_ms = await write_latencies(base, args.writes, False, "plain")

        print(f"machine: {os.cpu_count()} cores; search server: osmem (in-memory OpenSearch API) at {search.url}")
        print(
            f"change logs: {len(logs)} aspects of {len(logs) // ASPECTS_PER_ENTITY} datasets -> {records} index change records; batch {args.batch}"
        )
        print(f"indexing path (changes_from_mcl + ElasticBackend.apply): {rate:9.0f} aspects/s  ({elapsed:.1f} s)")
        print(
            f"raw bulk ceiling (plain _bulk of the same documents)   : {raw_rate:9.0f} aspects/s  ({raw_elapsed:.1f} s)"
        )
        print(f"indexing path / raw ceiling                            : {rate / raw_rate:9.1%}")
        print(
            f"sync-indexed write latency ({args.writes} sequential)  : p50 {percentile(sync_ms, 0.5):.2f} ms, p99 {percentile(sync_ms, 0.99):.2f} ms, mean {statistics.mean(sync_ms):.2f} ms"
        )
        print(
            f"same writes without the header            : p50 {percentile(plain_ms, 0.5):.2f} ms, p99 {percentile(plain_ms, 0.99):.2f} ms, mean {statistics.mean(plain_ms):.2f} ms"
        )
    finally:
        stop_process(server)
        pg.stop()
        search.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
