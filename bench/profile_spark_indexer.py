"""Where the Spark indexer's time goes, stage by stage, on bench/spark_indexer.py's change logs.

    .venv/bin/python bench/profile_spark_indexer.py [--mcls 20000] [--restore 20000] [--chunk 2000] [--spark]
                                                    [--cprofile FILE]

The per-partition functions run in this process (what one Spark task does, without Spark) against an osmem search
server, with every stage timed:

- stream (`spark_indexer.batch.IndexTask` on Kafka records holding the change logs as JSON, as the bench produces
  them): decode (raw value → MCL dict), plan (parse checks, newest version per aspect; decode excluded),
  changes_from_mcl (document building), apply: backend merge (grouping, read-merge of current documents, ops),
  body encoding (the client's serializer: NDJSON/JSON out), response decoding, HTTP round trips (request sent →
  response read: the server's work plus the wire), of which the search server's own CPU time is shown;
- restore (`spark_indexer.restore._apply_partition`'s work on rows of `metadata_aspect_v2`, into a rebuild target):
  row → change log → changes, then the same apply stages;
- with `--spark`: the same stream task under Spark (`mapInArrow` over a DataFrame of the records, local[2], two
  partitions), wall time vs the time inside the tasks: the difference is Spark's (JVM↔Python Arrow transfer,
  workers, scheduling).

Shares are of the stage totals of the path (wall time, one task, sequential). `--cprofile FILE` also writes a
cProfile of the in-process stream task (read it with `python -m pstats FILE`).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import index as index_bench  # noqa: E402  (bench/index.py: the same change logs as bench/spark_indexer.py)

from tests.search_server import start_search_server  # noqa: E402

TIMES: dict[str, float] = defaultdict(float)
COUNTS: dict[str, int] = defaultdict(int)


@contextmanager
def timed(stage: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        TIMES[stage] += time.perf_counter() - t0
        COUNTS[stage] += 1


class ServerClock:
    """CPU seconds the search server process used."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)

    def cpu(self) -> float:
        t = self.process.cpu_times()
        return t.user + t.system


def instrument(backend: Any, server: ServerClock) -> None:
    """Time the client's serializer (body encoding, response decoding) and its node's HTTP calls."""
    transport = backend.client.transport
    serializers = transport.serializers
    dumps, loads = serializers.dumps, serializers.loads

    def timed_dumps(data: Any, mimetype: Any = None) -> bytes:
        with timed("apply: body encoding"):
            return dumps(data, mimetype)

    def timed_loads(data: bytes, mimetype: Any = None) -> Any:
        with timed("apply: response decoding"):
            return loads(data, mimetype)

    serializers.dumps, serializers.loads = timed_dumps, timed_loads
    for node in transport.node_pool.all():
        perform = node.perform_request

        async def timed_perform(*args: Any, _perform: Any = perform, **kwargs: Any) -> Any:
            cpu0 = server.cpu()
            t0 = time.perf_counter()
            with timed("apply: HTTP round trips"):
                response = await _perform(*args, **kwargs)
            kind = "_bulk" if "_bulk" in args[1] else "_mget" if "_mget" in args[1] else "other"
            TIMES[f"  {kind} round trips"] += time.perf_counter() - t0
            TIMES[f"  {kind} search server CPU"] += server.cpu() - cpu0
            TIMES["  of which search server CPU"] += server.cpu() - cpu0
            return response

        node.perform_request = timed_perform


def records_of(logs: list[dict[str, Any]], topic: str, partitions: int) -> list[Any]:
    from spark_indexer.batch import Record

    out = []
    offsets = [0] * partitions
    for m in logs:
        key = m["entityUrn"].encode()
        p = hash(key) % partitions
        out.append(Record(topic, p, offsets[p], key, orjson.dumps(m)))
        offsets[p] += 1
    return sorted(out, key=lambda r: (r.partition, r.offset))


def report(title: str, total: float, stages: list[str]) -> None:
    print(f"\n{title}: {total:.2f} s")
    print(f"  {'stage':<40} {'seconds':>8} {'share':>7}")
    accounted = 0.0
    for stage in stages:
        seconds = TIMES.get(stage, 0.0)
        if not stage.startswith("  "):
            accounted += seconds
        print(f"  {stage:<40} {seconds:8.2f} {seconds / total:7.1%}")
    other = total - accounted
    print(f"  {'other (task loop, results)':<40} {other:8.2f} {other / total:7.1%}")


APPLY_STAGES = [
    "apply: backend merge",
    "apply: body encoding",
    "apply: response decoding",
    "apply: HTTP round trips",
    "  of which search server CPU",
    "  _mget round trips",
    "  _mget search server CPU",
    "  _bulk round trips",
    "  _bulk search server CPU",
]


def apply_split(apply_total: float) -> None:
    """The backend's own Python work: apply time minus the instrumented parts."""
    TIMES["apply: backend merge"] = apply_total - sum(
        TIMES[s] for s in ("apply: body encoding", "apply: response decoding", "apply: HTTP round trips")
    )


def profile_stream(
    settings: Any, server: ServerClock, logs: list[dict[str, Any]], chunk: int, cprofile: str | None
) -> None:
    from spark_indexer import batch
    from spark_indexer.sink import WorkerRuntime

    runtime = WorkerRuntime(settings)
    runtime.started_backend()
    instrument(runtime.backend, server)
    TIMES.clear()
    decode = runtime.decode

    def timed_decode(raw: bytes) -> Any:
        with timed("decode"):
            return decode(raw)

    runtime.decode = timed_decode
    task = batch.IndexTask(runtime, chunk)
    changes_of, apply = task.changes_of, task._apply

    def timed_changes_of(items: Any, dead: Any) -> Any:
        with timed("changes_from_mcl (documents)"):
            return changes_of(items, dead)

    def timed_apply(changes: Any) -> None:
        with timed("apply"):
            apply(changes)

    plan = batch.plan

    def timed_plan(*args: Any, **kwargs: Any) -> Any:
        with timed("plan+decode"):
            return plan(*args, **kwargs)

    task.changes_of, task._apply = timed_changes_of, timed_apply
    batch.plan = timed_plan
    records = records_of(logs, settings.topic_mcl_versioned, 1)
    profiler = cProfile.Profile() if cprofile else None
    t0 = time.perf_counter()
    try:
        if profiler:
            profiler.enable()
        result = task.run(records, settings.topic_mcl_timeseries)
        if profiler:
            profiler.disable()
    finally:
        batch.plan = plan
    total = time.perf_counter() - t0
    if profiler:
        profiler.dump_stats(cprofile)
    TIMES["plan"] = TIMES["plan+decode"] - TIMES["decode"]
    apply_split(TIMES["apply"])
    report(
        f"stream task, in-process ({len(records):,} records, {result.changes:,} changes, "
        f"{len(records) / total:,.0f} MCL/s)",
        total,
        ["decode", "plan", "changes_from_mcl (documents)", *APPLY_STAGES],
    )
    runtime.reset_backend()


def profile_restore(settings: Any, server: ServerClock, logs: list[dict[str, Any]], chunk: int) -> None:
    from app.search.documents import IndexLimits
    from spark_indexer.restore import backend_for_task, row_changes
    from spark_indexer.sink import registry_for

    registry = registry_for(settings)
    limits = IndexLimits.from_settings(settings)
    rows = sorted(
        (
            (m["entityUrn"], m["aspectName"], 0, m["aspect"]["value"], orjson.dumps(m["systemMetadata"]).decode())
            for m in logs
        ),
        key=lambda r: (r[0], r[1]),
    )

    async def run() -> float:
        from app.search.service import make_backend

        admin = make_backend(settings, registry, None, refresh=False)
        target = await admin.create_rebuild_target([], stamp="profile")
        await admin.close()
        backend, _ = backend_for_task(settings, registry, target)
        instrument(backend, server)
        TIMES.clear()
        t0 = time.perf_counter()
        pending: list[Any] = []
        last = None
        for urn, aspect, version, metadata, sm in rows:
            if urn != last and len(pending) >= chunk:
                with timed("apply"):
                    await backend.apply(pending)
                pending = []
            last = urn
            with timed("row → changes (documents)"):
                pending.extend(row_changes(registry, urn, aspect, version, metadata, sm, limits))
        if pending:
            with timed("apply"):
                await backend.apply(pending)
        total = time.perf_counter() - t0
        await backend.close()
        return total

    total = asyncio.run(run())
    apply_split(TIMES["apply"])
    report(
        f"restore task, in-process, sequential ({len(rows):,} rows, {len(rows) / total:,.0f} aspects/s)",
        total,
        ["row → changes (documents)", *APPLY_STAGES],
    )


def profile_spark(settings: Any, logs: list[dict[str, Any]], chunk: int) -> None:
    import pyarrow as pa

    from spark_indexer.batch import RESULT_SCHEMA, index_partition_fn
    from spark_indexer.session import build_session
    from spark_indexer.sink import settings_payload

    spark = build_session("local[2]", conf={"spark.sql.shuffle.partitions": "2"})
    try:
        records = records_of(logs, settings.topic_mcl_versioned, 2)

        def frame(recs: list[Any]) -> Any:
            table = pa.table(
                {
                    "topic": [r.topic for r in recs],
                    "partition": pa.array([r.partition for r in recs], pa.int32()),
                    "offset": pa.array([r.offset for r in recs], pa.int64()),
                    "key": [r.key for r in recs],
                    "value": [r.value for r in recs],
                }
            )
            return spark.createDataFrame(table.to_pandas()).repartition(2, "partition").cache()

        fn = index_partition_fn(
            orjson.loads(orjson.dumps(settings_payload(settings))), settings.topic_mcl_timeseries, chunk
        )
        warm = frame(records[:2000])
        warm.count()
        warm.mapInArrow(fn, RESULT_SCHEMA).collect()  # Python workers up, registry loaded, indices checked
        df = frame(records)
        df.count()
        t0 = time.perf_counter()
        rows = df.mapInArrow(fn, RESULT_SCHEMA).collect()
        wall = time.perf_counter() - t0
        in_tasks = sum(r["count"] for r in rows if r["kind"] == "millis") / 1000
        print(
            f"\nstream under Spark (local[2], 2 tasks, {len(records):,} records): wall {wall:.2f} s, "
            f"{len(records) / wall:,.0f} MCL/s"
        )
        print(f"  inside the tasks (summed over 2 tasks)  {in_tasks:8.2f} s")
        print(
            f"  Spark (wall - longest possible task)    {max(0.0, wall - in_tasks / 2):8.2f} s "
            f"({max(0.0, wall - in_tasks / 2) / wall:.1%} of wall, assuming balanced tasks)"
        )
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mcls", type=int, default=20_000)
    parser.add_argument("--restore", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=2000)
    parser.add_argument("--spark", action="store_true", help="also run the stream task under Spark")
    parser.add_argument("--cprofile", default=None, help="write a cProfile of the stream task here")
    args = parser.parse_args()

    from spark_indexer.config import IndexerSettings

    search = start_search_server()
    try:
        server = ServerClock(search.process.pid)
        settings = IndexerSettings(
            search_url=search.url,
            search_flavor="opensearch",
            search_index_prefix="prof_",
            topic_mcl_versioned="bench_mclv",
            topic_mcl_timeseries="bench_mclt",
            spark_apply_chunk=args.chunk,
        )
        if args.mcls:
            profile_stream(settings, server, index_bench.change_logs(args.mcls), args.chunk, args.cprofile)
        if args.restore:
            profile_restore(
                settings.model_copy(update={"search_index_prefix": "profr_"}),
                server,
                index_bench.change_logs(args.restore),
                args.chunk,
            )
        if args.spark and args.mcls:
            profile_spark(
                settings.model_copy(update={"search_index_prefix": "profs_"}),
                index_bench.change_logs(args.mcls),
                args.chunk,
            )
    finally:
        search.stop()


if __name__ == "__main__":
    main()
