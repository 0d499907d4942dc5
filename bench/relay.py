"""Outbox relay figures, against a real Postgres and a real Kafka-protocol broker (Tansu).

    .venv/bin/python bench/relay.py [--rows 100000] [--rate 500] [--seconds 20] [--repeat 1] [--v5-pairs 10]

Prints:
- relay throughput, with each value format in the same run (`--repeat` rounds, alternating; the best of each):
  `--rows` change logs of ~1 KiB (realistic MCL JSON, 10 versions each of rows/10 URNs) are put in the outbox
  unsequenced, then one relay (in this process) sequences, publishes (acks=all) and marks them all; MCL/s = rows /
  time from the relay's start to the last delivered mark. Every message is then read back from the topic and
  counted. `avro` (the default: DataHub's Confluent-framed Avro, encoded at publish time) against `json` (the
  outbox's JSON text as is), and what Avro costs (the share of JSON's throughput it loses). Then Avro with the
  per-aspect audit events (v5) on for `--v5-pairs` routed pairs, every change log of the run of a routed pair (each
  one also publishes its audit event: the worst case), and what they cost.
- commit -> MCL-on-topic latency at a steady ingest rate: a metaledger server (`uvicorn app.main:app`, one process,
  the relay inside it as `metaledger serve` runs it) takes `--rate` versioned aspect writes/s (batches of 10 MCPs
  to /openapi/v1/proposals, sent open-loop on a fixed schedule) for `--seconds`; a consumer in this process takes
  the arrival time of each MCL. Latency is reported from the write's acknowledgement (the commit happened before it:
  a lower bound of commit -> topic) and from the request's start (an upper bound).

It starts its own Postgres (fsync on, as the embedded default) under a temporary directory and its own broker.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg
import httpx
import orjson
from aiokafka import AIOKafkaConsumer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.avro.wire import ValueCodec  # noqa: E402
from app.db import create_engine, upgrade_database  # noqa: E402
from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port  # noqa: E402
from app.kafka.per_aspect import DerivedEvents  # noqa: E402
from app.kafka.relay import OutboxRelay  # noqa: E402
from app.kafka.topics import create_missing_topics  # noqa: E402
from app.registry import load_registry  # noqa: E402
from app.schema_registry import make_registry_client  # noqa: E402
from app.settings import Settings  # noqa: E402
from tests.kafka_broker import start_broker  # noqa: E402
from tests.processes import SYSTEM_AUTH, start_service, stop_process, wait_healthy  # noqa: E402

PLATFORMS = ("hive", "snowflake", "bigquery", "postgres")
# routed with datasetProperties when --v5-pairs asks for more than one pair
DATASET_ASPECTS = (
    "globalTags",
    "status",
    "ownership",
    "schemaMetadata",
    "editableDatasetProperties",
    "institutionalMemory",
    "glossaryTerms",
    "deprecation",
    "subTypes",
    "browsePathsV2",
    "container",
)


def machine_busy() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far (/proc/stat; zeros where there is none)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def tree_cpu(root_pid: int | None) -> float:
    """CPU seconds used so far by a process and its children (live ones, and the ones it has waited for)."""
    if not root_pid:
        return 0.0
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid == root_pid:
            ticks += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
        elif ppid == root_pid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


OTHERS: dict[str, int | None] = {}  # name → pid of the processes whose CPU the throughput runs report


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def dataset_urn(i: int, prefix: str = "bench") -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:{PLATFORMS[i % 4]},{prefix}.schema_{i % 37}.table_{i},PROD)"


def realistic_mcl(urn: str, version: int) -> str:
    """An MCL as the write path builds it for a datasetProperties update (~1 KiB)."""

    def props(v: int) -> str:
        return orjson.dumps(
            {
                "name": urn.split(",")[1],
                "description": f"Orders placed through the web shop, revision {v}",
                "customProperties": {"owner_team": "core", "revision": str(v), "rows": str(v * 1000)},
                "tags": [],
            }
        ).decode()

    def sm(v: int) -> dict:
        return {
            "runId": "bench",
            "lastRunId": "bench",
            "lastObserved": 1_763_700_000_000 + v,
            "version": str(v),
            "aspectCreated": {"time": 1_763_700_000_000, "actor": "urn:li:corpuser:datahub"},
            "aspectModified": {"time": 1_763_700_000_000 + v, "actor": "urn:li:corpuser:datahub"},
        }

    mcl = {
        "entityType": "dataset",
        "entityUrn": urn,
        "changeType": "UPSERT",
        "aspectName": "datasetProperties",
        "aspect": {"value": props(version), "contentType": "application/json"},
        "systemMetadata": sm(version),
        "headers": {"X-DataHub-Database-Aspect-Version": str(version)},
        "previousAspectValue": {"value": props(version - 1), "contentType": "application/json"},
        "previousSystemMetadata": sm(version - 1),
        "created": {"time": 1_763_700_000_000 + version, "actor": "urn:li:corpuser:datahub"},
    }
    return orjson.dumps(mcl).decode()


async def fill_outbox(dsn: str, rows: int, topic: str) -> float:
    """`rows` change logs, committed in transactions of 10k rows; returns the mean payload size."""
    conn = await asyncpg.connect(dsn)
    urns = max(1, rows // 10)
    sizes = 0
    try:
        chunk = 10_000
        for start in range(0, rows, chunk):
            records = []
            for n in range(start, min(rows, start + chunk)):
                urn, version = dataset_urn(n % urns), n // urns + 1
                payload = realistic_mcl(urn, version)
                sizes += len(payload)
                records.append((topic, urn, urn, "datasetProperties", version, "UPSERT", payload))
            await conn.copy_records_to_table(
                "change_log_outbox",
                records=records,
                columns=["topic", "message_key", "urn", "aspect", "version", "change_type", "payload"],
            )
    finally:
        await conn.close()
    return sizes / rows


async def count_topic(bootstrap: str, topic: str, expected: int, timeout: float = 120) -> int:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=16 * 1024 * 1024,
    )
    await consumer.start()
    count = 0
    try:
        deadline = time.monotonic() + timeout
        while count < expected and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500, max_records=10_000)).values():
                count += len(records)
    finally:
        await consumer.stop()
    return count


async def throughput(
    sa_url: str, dsn: str, bootstrap: str, rows: int, value_format: str = "avro", v5_pairs: int = 0
) -> tuple[float, float, float, int, float]:
    """With `v5_pairs`, per-aspect audit events are on for that many dataset pairs, datasetProperties among them:
    every change log of the run is of a routed pair (the worst case: each one also publishes its audit event)."""
    tag = uuid.uuid4().hex[:6]
    topic = f"bench_mcl_{tag}"
    routes = []
    if v5_pairs:
        aspects = ["datasetProperties", *[a for a in DATASET_ASPECTS if a != "datasetProperties"]][:v5_pairs]
        routes = [{"entityTypes": ["dataset"], "aspects": aspects}]
    settings = Settings(
        database_url=sa_url,
        kafka_bootstrap_servers=bootstrap,
        topic_mcl_versioned=topic,
        kafka_value_format=value_format,
        events_v5_routes=routes,
        events_v5_audit_topic=f"bench_audit_{tag}.{{entity}}.{{aspect}}",
    )
    engine = create_engine(sa_url, 2)
    codec = ValueCodec(settings, make_registry_client(settings, engine))
    derived = DerivedEvents(settings, load_registry(settings.registry_path), codec)
    await create_missing_topics(settings, derived.topics())
    mean_size = await fill_outbox(dsn, rows, topic)
    relay = OutboxRelay(settings, engine, codec, derived)  # no runtime models here: no watcher to follow them
    stop = asyncio.Event()
    started = time.perf_counter()
    cpu_started = time.process_time()
    machine_started = machine_busy()
    others_started = {name: tree_cpu(pid) for name, pid in OTHERS.items()}
    task = asyncio.create_task(relay.run(stop))
    sequenced_at = None
    while relay.published < rows:
        await asyncio.sleep(0.005)
        if sequenced_at is None and relay.sequenced >= rows:
            sequenced_at = time.perf_counter() - started
        if time.perf_counter() - started > 600:
            raise RuntimeError(f"the relay published {relay.published} of {rows} in 600 s")
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    busy, total = (after - before for after, before in zip(machine_busy(), machine_started))
    others = ", ".join(
        f"{name} {(tree_cpu(pid) - others_started[name]) / rows * 1e6:.1f} µs" for name, pid in OTHERS.items()
    )
    print(
        f"  {value_format}: {rows / elapsed:.0f} MCL/s, {cpu / rows * 1e6:.1f} µs of the relay process's CPU per MCL "
        f"(busy {100 * cpu / elapsed:.0f} % of the time; per MCL also {others}), the machine's cores "
        f"{100 * busy / max(total, 1):.0f} % busy",
        file=sys.stderr,
        flush=True,
    )
    stop.set()
    await task
    await engine.dispose()
    on_topic = await count_topic(bootstrap, topic, rows)
    if v5_pairs:
        audited = await count_topic(bootstrap, f"bench_audit_{tag}.dataset.datasetProperties", rows)
        print(f"  v5 audit events on the datasetProperties topic: {audited}", file=sys.stderr, flush=True)
        on_topic = min(on_topic, audited)
    return rows / elapsed, sequenced_at or elapsed, mean_size, on_topic, cpu / rows * 1e6


async def latency(sa_url: str, bootstrap: str, rate: int, seconds: float, workers: int | None = None) -> dict:
    topic = f"bench_lat_{uuid.uuid4().hex[:6]}"
    port = free_port()
    env = {
        "METALEDGER_DATABASE_URL": sa_url,
        "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
        "METALEDGER_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "METALEDGER_TOPIC_MCL_VERSIONED": topic,
    }
    server = start_service(env, port, quiet=False, workers=workers)
    base = f"http://127.0.0.1:{port}"
    batch = 10
    sent: dict[tuple[str, str], tuple[float, float]] = {}  # (urn, version) -> (request start, acknowledgement)
    arrived: dict[tuple[str, str], float] = {}
    failures = 0
    try:
        await wait_healthy(base)
        codec = ValueCodec(Settings())  # the server publishes Avro (the default); DataHub's ids decode locally
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=5,
        )
        await consumer.start()
        done = asyncio.Event()

        async def consume() -> None:
            while not done.is_set():
                for records in (await consumer.getmany(timeout_ms=20)).values():
                    now = time.perf_counter()
                    for r in records:
                        mcl = codec.decode_known(r.value)[0]
                        if mcl["aspectName"] == "datasetProperties":
                            arrived.setdefault((mcl["entityUrn"], mcl["systemMetadata"]["version"]), now)

        reader = asyncio.create_task(consume())
        urn_pool = 2000
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64), headers=SYSTEM_AUTH) as http:

            async def one(n: int) -> None:
                nonlocal failures
                body = [
                    {
                        "entityType": "dataset",
                        "entityUrn": dataset_urn((n * batch + i) % urn_pool, "lat"),
                        "aspectName": "datasetProperties",
                        "aspect": {"value": {"description": f"request {n}", "customProperties": {"n": str(n)}}},
                    }
                    for i in range(batch)
                ]
                start = time.perf_counter()
                response = await http.post(
                    f"{base}/openapi/v1/proposals",
                    content=orjson.dumps(body),
                    headers={"content-type": "application/json"},
                )
                ack = time.perf_counter()
                if response.status_code != 200:
                    failures += 1
                    return
                for result in response.json()["results"]:
                    sent[(result["urn"], result["version"])] = (start, ack)

            # warm-up (first versions, key aspects, compiled validators), not measured
            await asyncio.gather(*(one(-1 - k) for k in range(urn_pool // batch)))
            sent.clear()
            interval = batch / rate
            requests = int(seconds * rate / batch)
            t0 = time.perf_counter()
            tasks = []
            for n in range(requests):
                delay = t0 + n * interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(n)))
            await asyncio.gather(*tasks)
            achieved = len(sent) / (time.perf_counter() - t0)
        deadline = time.monotonic() + 30
        while any(key not in arrived for key in sent) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        done.set()
        await reader
        await consumer.stop()
    finally:
        stop_process(server)
    missing = sum(1 for key in sent if key not in arrived)
    from_ack = [(arrived[k] - ack) * 1000 for k, (_, ack) in sent.items() if k in arrived]
    from_start = [(arrived[k] - start) * 1000 for k, (start, _) in sent.items() if k in arrived]
    write_ms = [(ack - start) * 1000 for start, ack in sent.values()]
    return {
        "writes": len(sent),
        "achieved": achieved,
        "missing": missing,
        "failures": failures,
        "from_ack": from_ack,
        "from_start": from_start,
        "write_ms": write_ms,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="outbox rows the relay drains (throughput)")
    parser.add_argument("--rate", type=int, default=500, help="versioned aspect writes/s (latency)")
    parser.add_argument("--seconds", type=float, default=20, help="how long the steady ingest runs (latency)")
    parser.add_argument("--repeat", type=int, default=1, help="throughput rounds per value format (best kept)")
    parser.add_argument(
        "--v5-pairs",
        type=int,
        default=10,
        help="throughput with per-aspect audit events on for this many routed pairs (0: skip)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="latency: `metaledger serve --workers N` (the relay then in its background process); "
        "default: one process, `uvicorn app.main:app`",
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="metaledger-bench-relay-"))
    pg = EmbeddedPostgres(root / "pg", free_port(), database=None, durable=True)
    pg.start()
    broker = start_broker()
    OTHERS["broker"] = broker.process.pid if broker.process else None
    OTHERS["postgres"] = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
    try:
        ensure_database(pg.admin_dsn, "bench")
        dsn = pg.admin_dsn.rsplit("/", 1)[0] + "/bench"
        sa_url = dsn.replace("postgresql://", "postgresql+asyncpg://")
        upgrade_database(sa_url)

        best: dict[str, tuple[float, float, float, int, float]] = {}
        for _ in range(max(1, args.repeat)):
            for value_format in ("json", "avro"):
                result = await throughput(sa_url, dsn, broker.bootstrap_servers, args.rows, value_format)
                if value_format not in best or result[0] > best[value_format][0]:
                    best[value_format] = result
        if args.v5_pairs:
            for _ in range(max(1, args.repeat)):
                result = await throughput(sa_url, dsn, broker.bootstrap_servers, args.rows, "avro", args.v5_pairs)
                if "v5" not in best or result[0] > best["v5"][0]:
                    best["v5"] = result
        lat = await latency(sa_url, broker.bootstrap_servers, args.rate, args.seconds, args.workers)

        print(f"machine: {os.cpu_count()} cores; Postgres fsync on; broker Tansu (memory); acks=all")
        for value_format in ("avro", "json"):
            rate, sequenced_s, mean_size, on_topic, cpu_us = best[value_format]
            print(
                f"relay throughput, 1 relay, {args.rows} rows of {mean_size:.0f} B JSON, {value_format:>4} on the wire: "
                f"{rate:8.0f} MCL/s, {cpu_us:.1f} µs relay CPU per MCL (sequenced in {sequenced_s:.2f} s; {on_topic} read "
                "back from the topic)"
            )
        avro_rate, json_rate = best["avro"][0], best["json"][0]
        print(
            f"Avro costs {100 * (1 - avro_rate / json_rate):.1f} % of the JSON relay's throughput "
            f"({avro_rate:.0f} vs {json_rate:.0f} MCL/s; target: at most 15 %), "
            f"+{best['avro'][4] - best['json'][4]:.1f} µs of relay CPU per MCL"
        )
        if "v5" in best:
            v5_rate = best["v5"][0]
            print(
                f"per-aspect audit events (v5) on for {args.v5_pairs} routed pairs, every change log of a routed pair: "
                f"{v5_rate:.0f} MCL/s, {100 * (1 - v5_rate / avro_rate):.1f} % slower than with them off "
                f"({avro_rate:.0f} MCL/s; target: at most 25 %), +{best['v5'][4] - best['avro'][4]:.1f} µs of relay "
                "CPU per MCL"
            )
        print(
            f"steady ingest: {lat['writes']} versioned writes at {lat['achieved']:.0f}/s (target {args.rate}/s), "
            f"{lat['failures']} failed requests, {lat['missing']} MCLs missing"
        )
        print(
            f"commit -> MCL on topic, from the write's acknowledgement: p50 {percentile(lat['from_ack'], 0.5):.1f} ms, "
            f"p99 {percentile(lat['from_ack'], 0.99):.1f} ms, max {max(lat['from_ack']):.1f} ms"
        )
        print(
            f"                        from the request's start        : p50 {percentile(lat['from_start'], 0.5):.1f} ms, "
            f"p99 {percentile(lat['from_start'], 0.99):.1f} ms, max {max(lat['from_start']):.1f} ms"
        )
        print(
            f"write request latency (batch of 10)                     : p50 {percentile(lat['write_ms'], 0.5):.1f} ms, "
            f"p99 {percentile(lat['write_ms'], 0.99):.1f} ms"
        )
    finally:
        broker.stop()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)  # the Postgres data of 100k-row runs is gigabytes


if __name__ == "__main__":
    asyncio.run(main())
