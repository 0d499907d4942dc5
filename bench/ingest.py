"""Write-path throughput and latency, against a real metaledger process and a real Postgres.

    .venv/bin/python bench/ingest.py [--clients 4] [--batches 40] [--batch-size 100] [--singles 400] [--auth on|off]
                                     [--pipeline none|examples] [--indexer on|off|both] [--fsync on|off|both] [--statements]

Prints:
- batch UPSERT throughput: versioned aspect writes/s, `--clients` concurrent HTTP clients each POSTing
  `--batch-size` MCPs per request to /openapi/v1/proposals (every write changes the value: a new version, a
  history row, a change log);
- the same through DataHub's v3 batch endpoint (POST /openapi/v3/entity/dataset);
- single-write latency p50/p99 (one MCP per request, sequential);
- (each timed phase starts once the service's background work has caught up with the previous one: every change
  log sequenced and indexed; the indexing of a phase's own writes runs during it, as deployed)
- the raw ceiling: the same rows (lock row 0 and the key row, insert the history row, write row 0, prune, append
  the change log) written with bare asyncpg, same concurrency and batch size, and metaledger's share of it;
- CPU per v3 aspect write, from the start of the v3 phase until its writes are indexed: the service's processes (the
  API processes, the background process, the supervisor) and the Postgres server (whose difference between indexer on and off is what indexing costs the database).

`--indexer` (default both: two services, one after the other, each with its own Postgres and its own raw ceiling):
on is the embedded default (the Postgres search backend, indexed by the service's own worker); off points
METALEDGER_SEARCH_URL at a closed loopback port, so the worker's backend never starts and nothing is indexed (it
holds its position and retries, at most every 5 s). `--fsync off` measures Python and SQL rather than the disk;
`--fsync both` runs fsync off, then on (each with its own Postgres and raw ceiling), side by side in one invocation.
`--statements`: the v3 phase's top statements (pg_stat_statements on the bench's own Postgres).

It starts its own Postgres (fsync on by default, as the embedded default) under a temporary directory and its own server
(`metaledger serve --workers N`, default the machine's cores; `--workers 0`: `uvicorn app.main:app`, one process) on a
free loopback port (bench/harness.py). With `--auth on` (the default, as deployed) every
request carries a bearer token issued by `metaledger token create`; `--auth off` runs the server with
METALEDGER_AUTH_ENABLED=false, to measure what verifying a token costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import reset_statements, throwaway_service, top_statements  # noqa: E402

from app.embedded_pg import free_port  # noqa: E402

PLATFORMS = ("hive", "snowflake", "bigquery", "postgres")
HEADERS = {"content-type": "application/json"}  # + the bearer token with --auth on


def dataset_urn(client: int, i: int) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:{PLATFORMS[i % 4]},bench.c{client}.table_{i},PROD)"


def properties(round_no: int, i: int) -> dict:
    return {
        "name": f"table_{i}",
        "description": f"Table {i}, revision {round_no}: orders placed through the web shop",
        "customProperties": {"owner_team": "core", "revision": str(round_no), "rows": str(i * 1000 + round_no)},
        "tags": [],
    }


def mcp(urn: str, value: dict) -> dict:
    return {
        "entityType": "dataset",
        "entityUrn": urn,
        "changeType": "UPSERT",
        "aspectName": "datasetProperties",
        "aspect": {"value": value, "contentType": "application/json"},
        "systemMetadata": {"runId": "bench", "lastObserved": int(time.time() * 1000)},
    }


async def run_batches(base: str, clients: int, batches: int, size: int, endpoint: str, round_offset: int) -> float:
    async def one_client(c: int, http: httpx.AsyncClient) -> None:
        for b in range(batches):
            round_no = round_offset + b
            if endpoint == "v1":
                body = [mcp(dataset_urn(c, i), properties(round_no, i)) for i in range(size)]
                response = await http.post(f"{base}/openapi/v1/proposals", content=orjson.dumps(body), headers=HEADERS)
            else:
                body = [
                    {"urn": dataset_urn(c, i), "datasetProperties": {"value": properties(round_no, i)}}
                    for i in range(size)
                ]
                response = await http.post(
                    f"{base}/openapi/v3/entity/dataset?async=false", content=orjson.dumps(body), headers=HEADERS
                )
            if response.status_code != 200:
                raise RuntimeError(f"batch failed: {response.status_code} {response.text[:300]}")

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(one_client(c, http) for c in range(clients)))
        return time.perf_counter() - started


async def single_latencies(base: str, count: int) -> list[float]:
    samples = []
    async with httpx.AsyncClient(timeout=30) as http:
        for n in range(count):
            body = orjson.dumps([mcp(dataset_urn(99, n % 50), properties(10_000 + n, n % 50))])
            started = time.perf_counter()
            response = await http.post(f"{base}/openapi/v1/proposals", content=body, headers=HEADERS)
            samples.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.text
    return samples


RAW_LOCK = """
SELECT m.urn, m.aspect, m.metadata, m.systemmetadata, m.createdon, m.createdby FROM metadata_aspect_v2 m
JOIN unnest($1::text[], $2::text[]) AS k(urn, aspect) ON m.urn = k.urn AND m.aspect = k.aspect
WHERE m.version = 0 ORDER BY m.urn, m.aspect FOR UPDATE OF m"""
RAW_INSERT = """
INSERT INTO metadata_aspect_v2 (urn, aspect, version, metadata, systemmetadata, createdon, createdby)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::timestamp[], $7::text[])"""
RAW_UPSERT = """
INSERT INTO metadata_aspect_v2 (urn, aspect, version, metadata, systemmetadata, createdon, createdby)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::timestamp[], $7::text[])
ON CONFLICT (urn, aspect, version) DO UPDATE SET metadata = EXCLUDED.metadata, systemmetadata = EXCLUDED.systemmetadata,
    createdon = EXCLUDED.createdon, createdby = EXCLUDED.createdby"""
RAW_OUTBOX = """
INSERT INTO change_log_outbox (topic, message_key, urn, aspect, version, change_type, payload)
SELECT 'MetadataChangeLog_Versioned_v1', u, u, 'datasetProperties', v, 'UPSERT', p
FROM unnest($1::text[], $2::bigint[], $3::text[]) AS x(u, v, p)"""
RAW_PRUNE = """
DELETE FROM metadata_aspect_v2 m USING unnest($1::text[], $2::bigint[]) AS r(urn, cutoff)
WHERE m.urn = r.urn AND m.aspect = 'datasetProperties' AND m.version <> 0 AND m.version <= r.cutoff"""


RAW_STAMP_ACTOR = "urn:li:corpuser:datahub"


async def write_raw_rows(conn: asyncpg.Connection, urns: list[str], values: list[str], version: int) -> None:
    """The rows metaledger writes for one write of `urns`' datasetProperties (`values`, JSON text) at logical
    version `version` (the first: 1), in one transaction with bare asyncpg and no service around it: lock row 0 of
    each aspect and of its entity's key aspect, copy row 0 to a history row, write the new row 0 (and the key row on
    an entity's first write), append one change log per row to the outbox, and prune history beyond 20 versions.
    bench/ingest.py's batch ceiling runs it with a batch's URNs, bench/load.py's single-transaction ceiling with one."""
    size = len(urns)
    aspects = ["datasetProperties"] * size
    async with conn.transaction():
        locked = await conn.fetch(RAW_LOCK, urns + urns, aspects + ["datasetKey"] * size)
        previous = [r for r in locked if r["aspect"] == "datasetProperties"]
        stamp = datetime.now(UTC).replace(tzinfo=None)
        if previous:
            await conn.execute(
                RAW_INSERT,
                [r["urn"] for r in previous],
                aspects[: len(previous)],
                [version - 1] * len(previous),
                [r["metadata"] for r in previous],
                [r["systemmetadata"] for r in previous],
                [r["createdon"] for r in previous],
                [r["createdby"] for r in previous],
            )
        sm = {
            "runId": "bench",
            "lastRunId": "bench",
            "lastObserved": 1,
            "version": str(version),
            "aspectCreated": {"time": 1, "actor": RAW_STAMP_ACTOR},
            "aspectModified": {"time": 1, "actor": RAW_STAMP_ACTOR},
        }
        sms = [orjson.dumps(sm).decode()] * size
        await conn.execute(RAW_UPSERT, urns, aspects, [0] * size, values, sms, [stamp] * size, [RAW_STAMP_ACTOR] * size)
        if not previous:  # the entity's first write also writes its key aspect
            await conn.execute(
                RAW_UPSERT,
                urns,
                ["datasetKey"] * size,
                [0] * size,
                ['{"name": "x"}'] * size,
                sms,
                [stamp] * size,
                [RAW_STAMP_ACTOR] * size,
            )
        payloads = [
            orjson.dumps(
                {
                    "entityUrn": u,
                    "aspect": {"value": v},
                    "previousAspectValue": {"value": v},
                    "systemMetadata": sm,
                    "previousSystemMetadata": sm,
                }
            ).decode()
            for u, v in zip(urns, values)
        ]
        await conn.execute(RAW_OUTBOX, urns, [version] * size, payloads)
        if version > 22:
            await conn.execute(RAW_PRUNE, urns, [version - 21] * size)


async def raw_ceiling(dsn: str, clients: int, batches: int, size: int, round_offset: int) -> float:
    """metaledger's rows for the same batches (`write_raw_rows`), same concurrency and batch size: seconds taken."""
    pool = await asyncpg.create_pool(dsn, min_size=clients, max_size=clients)

    async def one_client(c: int) -> None:
        for b in range(round_offset, round_offset + batches):
            urns = [dataset_urn(100 + c, i) for i in range(size)]
            values = [orjson.dumps(properties(b, i)).decode() for i in range(size)]
            async with pool.acquire() as conn:
                await write_raw_rows(conn, urns, values, b + 1)

    started = time.perf_counter()
    await asyncio.gather(*(one_client(c) for c in range(clients)))
    elapsed = time.perf_counter() - started
    await pool.close()
    return elapsed


async def settled(dsn: str, timeout_s: float = 180, indexed: bool = True) -> None:
    """Wait until the service's background work has caught up (every change log sequenced, and indexed unless the
    indexer is off), so that each timed phase starts from a quiet machine and the previous phase's indexing does not
    run in it."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            # Index-only probes (the unsequenced rows' partial index, the feed's and the reader's state rows): the
            # wait runs inside the CPU accounting of the v3 phase, and a count or max over the whole outbox cost
            # Postgres more than the indexing it waited for.
            behind = await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM change_log_outbox WHERE feed_offset IS NULL)"
                + (
                    " OR (SELECT last_offset FROM change_log_feed_state WHERE id = 1) > "
                    "(SELECT coalesce(max(last_offset), 0) FROM feed_reader_state WHERE reader = 'search-indexer')"
                    if indexed
                    else ""
                )
            )
            if not behind:
                return
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


def example_pipeline_registry() -> Path:
    """entity_registry.yml with the example before processors as its pipeline (they must be installed: make venv).
    ignore-disallowed-words looks at datasetProperties; lowercase-tags is scoped to it too (datasetProperties has a
    `tags` field); prod-datasets-need-an-owner keeps its own scope (ownership), so it costs its scope check only."""
    import tempfile

    import yaml

    root = Path(__file__).resolve().parent.parent
    config = yaml.safe_load((root / "entity_registry.yml").read_text())
    config["changeProcessors"] = [
        {"name": "ignore-disallowed-words", "config": {"words": "confidential,secret"}},
        {"name": "lowercase-tags", "scope": {"aspects": ["globalTags", "datasetProperties"]}},
        {"name": "prod-datasets-need-an-owner"},
    ]
    path = Path(tempfile.mkdtemp(prefix="metaledger-bench-")) / "entity_registry.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--singles", type=int, default=400)
    parser.add_argument("--auth", choices=("on", "off"), default="on")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="`serve --workers` (default: the machine's cores); 0: one process, `uvicorn app.main:app`",
    )
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the service (repeatable)")
    parser.add_argument(
        "--pipeline",
        choices=("none", "examples"),
        default="none",
        help="change processors: none (an empty pipeline), or examples: the three before processors of "
        "examples/change_processors, two of them in scope of the benchmark's datasetProperties",
    )
    parser.add_argument(
        "--indexer",
        choices=("on", "off", "both"),
        default="both",
        help="the embedded indexer: on (the default a newcomer gets), off (nothing indexed), or both",
    )
    parser.add_argument(
        "--fsync",
        choices=("on", "off", "both"),
        default="on",
        help="the bench's Postgres fsync; both: off, then on, each with its own Postgres and raw ceiling",
    )
    parser.add_argument(
        "--statements", action="store_true", help="print the v3 phase's top statements (pg_stat_statements)"
    )
    parser.add_argument(
        "--settle-timeout",
        type=float,
        default=180,
        help="longest wait for the background work to catch up between phases (s)",
    )
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    workers = cores if args.workers is None else args.workers
    env = dict(item.split("=", 1) for item in args.env)
    if args.pipeline == "examples":
        env["METALEDGER_REGISTRY_PATH"] = str(example_pipeline_registry())

    modes = ("on", "off") if args.indexer == "both" else (args.indexer,)
    serving = f"`metaledger serve --workers {workers}`" if workers else "one process (`uvicorn app.main:app`)"
    print(
        f"machine: {cores} cores; {serving}; Postgres fsync {args.fsync}; auth {args.auth}; change processors: "
        f"{args.pipeline}; {args.clients} clients x {args.batches} batches x {args.batch_size} MCPs",
        flush=True,
    )
    for fsync in ("off", "on") if args.fsync == "both" else (args.fsync,):
        for indexer in modes:
            await measure(args, workers, indexer == "on", env, fsync == "on")


async def measure(args: argparse.Namespace, workers: int, indexed: bool, env: dict[str, str], durable: bool) -> None:
    if not indexed:  # nothing listens there: the worker's backend never starts
        env = {**env, "METALEDGER_SEARCH_URL": f"http://127.0.0.1:{free_port()}"}
    with throwaway_service(
        workers=workers or None, auth=args.auth == "on", env=env, durable=durable, statements=args.statements
    ) as service:
        HEADERS.update(service.headers)
        base = service.base
        writes = args.clients * args.batches * args.batch_size

        # warm-up round: creates the entities (first versions), compiles validators, fills caches
        await run_batches(base, args.clients, 2, args.batch_size, "v1", 0)
        await settled(service.dsn, args.settle_timeout, indexed)
        elapsed = await run_batches(base, args.clients, args.batches, args.batch_size, "v1", 2)
        v1_rate = writes / elapsed
        await settled(service.dsn, args.settle_timeout, indexed)
        if args.statements:
            await reset_statements(service.dsn)
        roles, pg_cpu = service.cpu_seconds_by_role(), service.postgres_cpu_seconds()
        elapsed = await run_batches(base, args.clients, args.batches, args.batch_size, "v3", 1000)
        v3_rate = writes / elapsed
        await settled(service.dsn, args.settle_timeout, indexed)
        roles = {role: spent - roles[role] for role, spent in service.cpu_seconds_by_role().items()}
        cpu, pg_cpu = sum(roles.values()), service.postgres_cpu_seconds() - pg_cpu
        statements = await top_statements(service.dsn, 12) if args.statements else []
        latencies = await single_latencies(base, args.singles)

        await raw_ceiling(service.dsn, args.clients, 2, args.batch_size, 0)  # same warm-up: first versions
        await settled(service.dsn, args.settle_timeout, indexed)
        raw_elapsed = await raw_ceiling(service.dsn, args.clients, args.batches, args.batch_size, 2)
        raw_rate = writes / raw_elapsed

        print(f"--- fsync {'on' if durable else 'off'}, embedded indexer {'on (the default)' if indexed else 'off'}")
        print(f"batch UPSERT via /openapi/v1/proposals : {v1_rate:8.0f} versioned aspect writes/s")
        print(f"batch UPSERT via /openapi/v3/entity     : {v3_rate:8.0f} versioned aspect writes/s")
        print(f"raw asyncpg ceiling (same rows)         : {raw_rate:8.0f} rows/s")
        print(
            f"metaledger / raw ceiling                : {v1_rate / raw_rate:8.1%} (v1), {v3_rate / raw_rate:.1%} (v3)"
        )
        print(
            f"CPU per v3 aspect write (until indexed) : service {cpu / writes * 1e6:.0f} us (API processes "
            f"{roles['api'] / writes * 1e6:.0f}, background {roles['background'] / writes * 1e6:.0f}, supervisor "
            f"{roles['supervisor'] / writes * 1e6:.0f}), Postgres {pg_cpu / writes * 1e6:.0f} us"
        )
        print(
            f"single write latency ({args.singles} sequential)  : p50 {percentile(latencies, 0.5):.2f} ms, p99 {percentile(latencies, 0.99):.2f} ms, mean {statistics.mean(latencies):.2f} ms"
        )
        print(f"RSS per process (MB): {'/'.join(f'{r:.0f}' for r in service.rss_mb())}")
        for ms, calls, _, query in statements:
            print(f"  {ms:9.0f} ms {calls:7d} calls  {query}")
        sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
