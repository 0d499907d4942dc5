"""The PySpark indexer's throughput, against the raw bulk ceiling of the same search server in the same run.

    .venv/bin/python bench/spark_indexer.py [--mcls 100000] [--restore 120000] [--partitions 2] [--master local[2]]
                                            [--replay-clients 1,2,4]

Prints:
- stream: `--mcls` change logs (datasets × datasetKey, datasetProperties, ownership, upstreamLineage, as
  bench/index.py builds them) produced to a Kafka-protocol topic (Tansu) with `--partitions` partitions, then
  `python -m spark_indexer stream --once`'s work (metaledger's Kafka source → plan → changes_from_mcl → bulk apply)
  timed in-process: overall MCL/s (first record read to last batch written) and steady MCL/s (batches after the
  first, whose time includes Python workers starting and indices being checked);
- restore-indices: `--restore` latest rows written straight into `metadata_aspect_v2` of a throwaway Postgres,
  then `restore_indices(clean=True)` into fresh indices with an alias swap, in aspects/s;
- the raw bulk ceiling: a plain `_bulk` of the same documents (bench/index.py's `raw_ceiling`), one client, and the
  same split over `--partitions` concurrent clients (what Spark's parallel tasks can use at most);
- the raw ceiling for the indexer's own documents: the `_bulk` bodies one in-process indexing task sends for the same
  change logs (merged entity documents, edges, markers), recorded, then sent again as they are and timed (the raw
  ceiling above writes four cheap per-aspect documents per entity under one id, of which the server keeps the
  last: a yardstick the real documents cannot reach); then sent again from each count of `--replay-clients`
  concurrent clients, with the search server's CPU (what more concurrency gets from it);
- each path as a share of both ceilings.

The search server is osmem (in-memory OpenSearch API, a test double): absolute figures are not Elasticsearch's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from datetime import UTC  # noqa: E402 - after the checkout and bench/ are put on sys.path

import index as index_bench  # noqa: E402  (bench/index.py: the same documents and the raw ceiling)

from app.db import upgrade_database  # noqa: E402
from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port  # noqa: E402
from app.registry import load_registry  # noqa: E402
from app.search.documents import changes_from_mcl  # noqa: E402
from app.settings import Settings  # noqa: E402
from spark_indexer.config import IndexerSettings  # noqa: E402
from tests.kafka_broker import start_broker  # noqa: E402
from tests.search_server import start_search_server  # noqa: E402


async def produce(bootstrap: str, topic: str, partitions: int, logs: list[dict[str, Any]]) -> float:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, max_batch_size=1 << 20, compression_type="lz4"
    )
    await producer.start()
    started = time.perf_counter()
    try:
        futures = [await producer.send(topic, orjson.dumps(m), key=m["entityUrn"].encode()) for m in logs]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.perf_counter() - started


async def write_rows(dsn: str, logs: list[dict[str, Any]]) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        from datetime import datetime

        now = datetime.now(UTC).replace(tzinfo=None)
        rows = [
            (
                m["entityUrn"],
                m["aspectName"],
                0,
                m["aspect"]["value"],
                orjson.dumps(m["systemMetadata"]).decode(),
                now,
                "urn:li:corpuser:bench",
                None,
            )
            for m in logs
        ]
        await conn.copy_records_to_table(
            "metadata_aspect_v2",
            records=rows,
            columns=["urn", "aspect", "version", "metadata", "systemmetadata", "createdon", "createdby", "createdfor"],
        )
    finally:
        await conn.close()


async def parallel_raw(
    settings: Settings, registry: Any, logs: list[dict[str, Any]], batch: int, clients: int
) -> float:
    """The raw ceiling with `clients` concurrent bulk writers (each its own slice of the documents)."""
    batches = [
        [c for m in logs[s : s + batch] for c in changes_from_mcl(m, registry)] for s in range(0, len(logs), batch)
    ]
    slices = [batches[i::clients] for i in range(clients)]
    started = time.perf_counter()
    await asyncio.gather(
        *(
            index_bench.raw_ceiling(
                settings.model_copy(update={"search_index_prefix": f"{settings.search_index_prefix}p{i}_"}),
                registry,
                part,
            )
            for i, part in enumerate(slices)
        )
    )
    return time.perf_counter() - started


def own_documents_ceiling(
    settings: IndexerSettings, logs: list[dict[str, Any]], chunk: int, server: Any, clients: list[int]
) -> tuple[float, float, list[tuple[int, float, float]]]:
    """The raw ceiling for the documents the indexer itself writes: what one Spark task does (`IndexTask`), run in
    this process into `rec_` indices while every `_bulk` body it sends is recorded; then the same bodies sent again
    as they are (index names moved to fresh `rep_` indices with the same mappings), one after the other, timed.
    Returns (in-process task seconds, replay seconds, and for each count of `clients` a replay into fresh indices
    from that many concurrent clients, each a share of the bodies in turn: (clients, seconds, the CPU seconds of
    `server`, the search server's `ServerClock`)). The indexer's reads (`_mget`, to merge an entity's current
    document) are not replayed: they are part of its cost, not of the server's ceiling."""
    from profile_spark_indexer import records_of  # bench/: the same Kafka records the stream reads

    from spark_indexer import batch
    from spark_indexer.sink import WorkerRuntime

    rec = settings.model_copy(update={"search_index_prefix": "rec_"})
    runtime = WorkerRuntime(rec)
    backend = runtime.started_backend()
    bodies: list[tuple[str, str, bytes]] = []
    for node in backend.client.transport.node_pool.all():
        perform = node.perform_request

        async def recording(method: str, target: str, *args: Any, _perform: Any = perform, **kwargs: Any) -> Any:
            if "_bulk" in target and kwargs.get("body"):
                bodies.append((method, target, bytes(kwargs["body"])))
            return await _perform(method, target, *args, **kwargs)

        node.perform_request = recording
    t0 = time.perf_counter()
    batch.IndexTask(runtime, chunk).run(records_of(logs, rec.topic_mcl_versioned, 1), rec.topic_mcl_timeseries)
    task_s = time.perf_counter() - t0

    async def replay(prefix: str, clients: int) -> float:
        client = backend.client
        names = {name.decode() for _, _, body in bodies for name in re.findall(rb'"_index":"(rec_[^"]+)"', body)}
        for name in sorted(names):  # an alias or an index: the mappings of what it names
            mapping = next(iter((await client.indices.get_mapping(index=name)).body.values()))
            await client.indices.create(
                index=prefix + name.removeprefix("rec_"), mappings=mapping.get("mappings") or {}
            )
        node = backend.client.transport.node_pool.get()
        headers = {"content-type": "application/x-ndjson", "accept": "application/json"}
        moved = [
            (m, t.replace("rec_", prefix), b.replace(b'"_index":"rec_', b'"_index":"' + prefix.encode()))
            for m, t, b in bodies
        ]

        async def send(share: list[tuple[str, str, bytes]]) -> None:
            for method, target, body in share:
                response, data = await node.perform_request(method, target, body=body, headers=headers)
                if response.status >= 300 or b'"errors":true' in data[:200]:
                    raise RuntimeError(f"replayed bulk refused: {response.status} {data[:300]!r}")

        started = time.perf_counter()
        await asyncio.gather(*(send(moved[i::clients]) for i in range(clients)))
        return time.perf_counter() - started

    for node in backend.client.transport.node_pool.all():
        del node.perform_request  # the replays are not recorded
    replay_s = runtime.run(replay("rep_", 1))
    concurrent = []
    for n, count in enumerate(clients):
        cpu_started = server.cpu()
        seconds = runtime.run(replay(f"rep{n}_", count))
        concurrent.append((count, seconds, server.cpu() - cpu_started))
    runtime.reset_backend()
    return task_s, replay_s, concurrent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mcls", type=int, default=100_000)
    parser.add_argument("--restore", type=int, default=120_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--index-partitions", type=int, default=0, help="spark_index_partitions (0: the topic's partitions)"
    )
    parser.add_argument("--batch", type=int, default=2000, help="changes per bulk call (spark_apply_chunk)")
    parser.add_argument(
        "--replay-clients",
        default="1,2,4",
        help="the own bodies replayed again from each of these counts of concurrent clients, with the server's CPU",
    )
    args = parser.parse_args()

    search = start_search_server()
    broker = start_broker()
    root = Path(tempfile.mkdtemp(prefix="metaledger-bench-spark-"))
    pg = EmbeddedPostgres(root / "pg", free_port(), database=None, durable=True)
    try:
        registry = load_registry(Settings().registry_path)
        logs = index_bench.change_logs(args.mcls)
        restore_logs = index_bench.change_logs(args.restore)
        pg.start()
        ensure_database(pg.admin_dsn, "bench")
        dsn = pg.admin_dsn.rsplit("/", 1)[0] + "/bench"
        sa_url = dsn.replace("postgresql://", "postgresql+asyncpg://")
        upgrade_database(sa_url)
        topic = "bench_mclv"
        produce_s = asyncio.run(produce(broker.bootstrap_servers, topic, args.partitions, logs))
        if restore_logs:
            asyncio.run(write_rows(dsn, restore_logs))

        from spark_indexer.restore import restore_indices
        from spark_indexer.session import build_session
        from spark_indexer.stream import run_stream

        settings = IndexerSettings(
            database_url=sa_url,
            kafka_bootstrap_servers=broker.bootstrap_servers,
            topic_mcl_versioned=topic,
            topic_mcl_timeseries="bench_mclt",
            search_url=search.url,
            search_flavor="opensearch",
            search_index_prefix="spark_",
            spark_work_dir=root / "spark",
            spark_apply_chunk=args.batch,
            spark_index_partitions=args.index_partitions,
            spark_max_offsets_per_trigger=20_000,
            spark_trigger_interval_s=0.1,
        )
        t0 = time.perf_counter()
        spark = build_session(args.master, conf={"spark.sql.shuffle.partitions": str(args.partitions)})
        session_s = time.perf_counter() - t0

        from profile_spark_indexer import ServerClock

        server = ServerClock(search.process.pid)
        server_started = server.cpu()
        t0 = time.perf_counter()
        result = run_stream(spark, settings, once=True, echo=False)
        stream_s = time.perf_counter() - t0
        stream_server_s = server.cpu() - server_started
        if result.dead_letters:
            for row in spark.read.parquet(str(settings.dead_letter_dir)).groupBy("reason").count().collect():
                print(f"dead letters: {row['count']} x {row['reason'][:300]}")
        for b in result.batches:
            print(b.line())
        steady = result.batches[1:] or result.batches
        steady_rate = sum(b.rows for b in steady) / max(1e-9, sum(b.seconds for b in steady))

        restored, restore_s = None, 0.0
        if args.restore:
            restore_settings = settings.model_copy(update={"search_index_prefix": "restore_"})
            t0 = time.perf_counter()
            restored = restore_indices(spark, restore_settings, clean=True, progress=False)
            restore_s = time.perf_counter() - t0
        spark.stop()

        raw_settings = Settings(search_url=search.url, search_flavor="opensearch", search_index_prefix="raw_")
        one_s = asyncio.run(
            index_bench.raw_ceiling(
                raw_settings,
                registry,
                [
                    [c for m in logs[s : s + args.batch] for c in changes_from_mcl(m, registry)]
                    for s in range(0, len(logs), args.batch)
                ],
            )
        )
        many_s = asyncio.run(
            parallel_raw(
                raw_settings.model_copy(update={"search_index_prefix": "rawp_"}),
                registry,
                logs,
                args.batch,
                args.partitions,
            )
        )
        one_rate, many_rate = len(logs) / one_s, len(logs) / many_s
        task_s, replay_s, concurrent = own_documents_ceiling(
            settings, logs, args.batch, server, [int(c) for c in args.replay_clients.split(",") if c]
        )
        own_rate = len(logs) / replay_s

        print(f"machine: {os.cpu_count()} cores; Spark {args.master}; search: osmem at {search.url}; broker: Tansu")
        print(
            f"produced {len(logs):,} MCLs to {args.partitions} partition(s) in {produce_s:.1f} s; Spark session start {session_s:.1f} s"
        )
        print(
            f"stream --once       : {len(logs) / stream_s:9,.0f} MCL/s overall ({stream_s:.1f} s, {len(result.batches)} batches, "
            f"{result.dead_letters} dead letters); steady {steady_rate:,.0f} MCL/s; the search server "
            f"{stream_server_s / stream_s:.2f} cores ({stream_server_s * 1e6 / len(logs):,.0f} µs of its CPU an MCL)"
        )
        if restored is not None:
            print(
                f"restore-indices     : {restored.rows_read / restore_s:9,.0f} aspects/s ({restored.rows_read:,} rows in {restore_s:.1f} s, --clean, alias swap)"
            )
        print(f"raw bulk, 1 client  : {one_rate:9,.0f} aspects/s ({one_s:.1f} s)")
        print(f"raw bulk, {args.partitions} clients : {many_rate:9,.0f} aspects/s ({many_s:.1f} s)")
        print(
            f"raw bulk of the indexer's own bodies: {own_rate:9,.0f} MCL/s ({replay_s:.1f} s; recorded from one "
            f"in-process task, {len(logs) / task_s:,.0f} MCL/s with its reads and Python)"
        )
        for count, seconds, server_s in concurrent:
            print(
                f"  again from {count} client(s)  : {len(logs) / seconds:9,.0f} MCL/s, the search server "
                f"{server_s / seconds:.2f} cores ({server_s * 1e6 / len(logs):,.0f} µs of its CPU an MCL)"
            )
        ceiling = max(one_rate, many_rate)
        print(
            f"stream steady / best ceiling  : {steady_rate / ceiling:6.1%}   / own-documents ceiling: {steady_rate / own_rate:6.1%}"
        )
        if restored is not None:
            print(
                f"restore / best ceiling        : {restored.rows_read / restore_s / ceiling:6.1%}   / own-documents ceiling: "
                f"{restored.rows_read / restore_s / own_rate:6.1%}"
            )
    finally:
        pg.stop()
        broker.stop()
        search.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
