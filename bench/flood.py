"""A flood of large batches from one caller beside single writes from another (issue 25, "the crowd"): does admission
keep the single writers served, refuse the flood with 429 and `Retry-After`, and give the memory back afterwards?

    .venv/bin/python bench/flood.py [--flooders 50] [--batch 1000] [--single-rate 20] [--single-clients 4]
                                    [--seconds 60] [--settle 60] [--workers N] [--url URL --flood-token T
                                    --single-token T] [--ignore-retry-after] [--env NAME=VALUE] [--statements]
                                    [--waits] [--pg NAME=VALUE]

Without `--url`: a throwaway Postgres (fsync on) and `metaledger serve` with its defaults (`--workers`: the machine's
cores), auth on, two writer tokens (two callers: `urn:li:corpuser:flood` and `urn:li:corpuser:single`). With
`--url`: that service, and the two tokens given (RSS is then not measured).

For `--seconds`: `--flooders` clients each loop `POST /openapi/v1/proposals` with `--batch` MCPs (datasetProperties
of new datasets) back to back, sleeping a 429's `Retry-After` as DataHub's clients do (`--ignore-retry-after`: they
retry at once); beside them, from a process of their own, `--single-clients` connections carry single writes (`POST
/openapi/v3/entity/dataset/{urn}/datasetProperties`) open-loop at `--single-rate`/s (bench/loadgen.py: latency from
each request's scheduled time). Printed: the single writes' p50/p99/max and the share accepted (2xx of sent) with
their errors by kind; the batches by status, how many 429s carried `Retry-After`, the 5xx and dropped connections;
the RSS of the service's processes (sum) before the flood, at its peak and `--settle` seconds after it ended; how far
the embedded indexer is behind at the flood's end and `--settle` seconds after; the service's log problems; the CPU
seconds of the service's processes and of Postgres during the flood and, with `--statements` (pg_stat_statements on
the throwaway Postgres), the statements that took the most of its time; with `--waits`, what the database's
sessions were doing (a lock, the WAL, CPU) sampled every 50 ms, and what the server flushed (WAL bytes and syncs,
segment files made, checkpoints, data pages written and by whom; sync times with `--pg track_wal_io_timing=on`).
The issue's targets: single writes p99 <= 100 ms and >= 95 % accepted; batches refused with 429 and Retry-After, no
5xx; RSS within 50 MB of its pre-flood value `--settle` seconds after.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import multiprocessing
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Service, reset_statements, throwaway_service, top_statements, wal_statements  # noqa: E402
from load import create_entities, single_writes  # noqa: E402
from loadgen import HttpConnection, StepResult, open_loop  # noqa: E402

from tests.processes import issue_token  # noqa: E402

ENTITIES = 500  # the single writers' datasets (each write a new version of one of them)


@dataclass
class FloodResult:
    statuses: Counter = field(default_factory=Counter)  # by status, or the exception's name
    retry_after: Counter = field(default_factory=Counter)  # the 429s' Retry-After values ("-" when missing)
    latencies_ms: list[float] = field(default_factory=list)  # of the accepted batches


def flood_batch(client: int, n: int, size: int) -> bytes:
    """`size` MCPs: datasetProperties of datasets no other batch names (each batch a transaction of new rows)."""
    return orjson.dumps(
        [
            {
                "entityType": "dataset",
                "changeType": "UPSERT",
                "aspectName": "datasetProperties",
                "entityUrn": f"urn:li:dataset:(urn:li:dataPlatform:hive,flood.c{client}.b{n}.t{i},PROD)",
                "aspect": {
                    "contentType": "application/json",
                    "value": {
                        "name": f"t{i}",
                        "description": f"flooded table {i} of batch {n} from client {client}",
                        "customProperties": {"batch": str(n)},
                    },
                },
            }
            for i in range(size)
        ]
    )


async def flood(
    base: str, headers: dict[str, str], clients: int, size: int, stop: asyncio.Event, honour_retry_after: bool
) -> FloodResult:
    url = urlsplit(base)
    result = FloodResult()

    async def client(c: int) -> None:
        conn = HttpConnection(url.hostname or "127.0.0.1", url.port or 80)
        try:
            for n in itertools.count():
                if stop.is_set():
                    return
                body = flood_batch(c, n, size)
                started = time.perf_counter()
                try:
                    status, _, answer = await asyncio.wait_for(
                        conn.request("POST", "/openapi/v1/proposals", body, headers), 120
                    )
                except (OSError, ConnectionError, asyncio.IncompleteReadError, TimeoutError) as error:
                    conn.close()
                    result.statuses[type(error).__name__] += 1
                    continue
                result.statuses[str(status)] += 1
                if 200 <= status < 300:
                    result.latencies_ms.append((time.perf_counter() - started) * 1000)
                elif status == 429:
                    retry_after = answer.get("retry-after", "-")
                    result.retry_after[retry_after] += 1
                    if honour_retry_after and retry_after != "-":
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), float(retry_after))
        finally:
            conn.close()

    await asyncio.gather(*(client(c) for c in range(clients)))
    return result


class RssSampler:
    """The service's RSS (the sum over its processes), sampled every `interval` s while running: the peak."""

    def __init__(self, rss: Callable[[], float], interval: float = 0.25) -> None:
        self.rss, self.interval, self.peak = rss, interval, 0.0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            self.peak = max(self.peak, self.rss())
            await asyncio.sleep(self.interval)

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def metrics(base: str, headers: dict[str, str]) -> list[str]:
    """The lines of one `/metrics` scrape (of whichever API process answers)."""
    url = urlsplit(base)
    conn = HttpConnection(url.hostname or "127.0.0.1", url.port or 80)
    try:
        status, text, _ = await conn.request("GET", "/metrics", b"", headers)
    finally:
        conn.close()
    return text.decode().splitlines() if status == 200 else []


async def indexer_lag(base: str, headers: dict[str, str]) -> str:
    """The embedded indexer's lag (`metaledger_indexer_lag_rows`, `_seconds`): how far search is behind the feed."""
    found = {
        line.split(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in await metrics(base, headers)
        if line.startswith(("metaledger_indexer_lag_rows ", "metaledger_indexer_lag_seconds "))
    }
    if not found:
        return "not reported"
    return (
        f"{found.get('metaledger_indexer_lag_rows', float('nan')):.0f} change logs, "
        f"{found.get('metaledger_indexer_lag_seconds', float('nan')):.1f} s"
    )


async def loop_lag(base: str, headers: dict[str, str]) -> dict[str, float]:
    """The service's event-loop lag histogram (`metaledger_event_loop_lag_seconds`, every API process summed):
    cumulative counts by bucket bound."""
    buckets: dict[str, float] = {}
    for line in await metrics(base, headers):
        if line.startswith("metaledger_event_loop_lag_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def lag_summary(before: dict[str, float], after: dict[str, float]) -> str:
    """The share of the flood's loop-lag samples over each bound (from two cumulative scrapes)."""
    total = after.get("+Inf", 0.0) - before.get("+Inf", 0.0)
    if total <= 0:
        return "no samples"
    over = [
        f"> {float(b) * 1000:g} ms: {100 * (1 - (after[b] - before.get(b, 0.0)) / total):.1f} %"
        for b in after
        if b != "+Inf" and float(b) >= 0.005
    ]
    return f"{total:.0f} samples; " + ", ".join(over)


class WaitSampler:
    """What the database's sessions are doing during the flood (`--waits`): pg_stat_activity every 50 ms, the
    sessions of this database that are not idle, counted by (wait event, the statement's first words). A session
    that waits (a lock, the WAL, I/O) is time a write spends neither in Postgres' CPU nor in Python's."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.counts: Counter = Counter()
        self.samples = 0
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> WaitSampler:
        import asyncpg

        conn = await asyncpg.connect(self.dsn)

        async def sample() -> None:
            try:
                while True:
                    rows = await conn.fetch(
                        """SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') AS waiting,
                                  left(regexp_replace(query, '\\s+', ' ', 'g'), 70) AS query
                           FROM pg_stat_activity
                           WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'active'"""
                    )
                    self.samples += 1
                    self.counts.update((r["waiting"], r["query"]) for r in rows)
                    await asyncio.sleep(0.05)
            finally:
                await conn.close()

        self._task = asyncio.create_task(sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def report(self, top: int = 15) -> None:
        print(
            f"database sessions during the flood ({self.samples} samples every 50 ms; mean sessions active, what "
            f"they waited for or CPU, statement):"
        )
        for (waiting, query), n in self.counts.most_common(top):
            print(f"  {n / max(1, self.samples):6.2f}  {waiting:28s} {query}")


# What the server flushed (pg_stat_wal, pg_stat_bgwriter): a commit waits for the WAL before its own commit record,
# and a checkpoint's or a backend's writes of data pages share the disk with those flushes.
FLUSH_FIGURES = """
    SELECT w.wal_bytes, w.wal_buffers_full, w.wal_write, w.wal_sync, w.wal_write_time, w.wal_sync_time,
           b.checkpoints_timed + b.checkpoints_req AS checkpoints, b.buffers_checkpoint, b.buffers_clean,
           b.buffers_backend, b.buffers_backend_fsync,
           (SELECT count(*) FROM pg_ls_waldir()) AS wal_segments
    FROM pg_stat_wal w, pg_stat_bgwriter b
"""


async def flush_figures(dsn: str) -> dict[str, float]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return {k: float(v) for k, v in dict(await conn.fetchrow(FLUSH_FIGURES)).items()}
    finally:
        await conn.close()


def flush_report(before: dict[str, float], after: dict[str, float], seconds: float) -> str:
    d = {k: after[k] - before[k] for k in after}
    syncs = max(1.0, d["wal_sync"])
    timing = (
        f", {d['wal_sync_time'] / syncs:.2f} ms a sync"
        if d["wal_sync_time"]
        else " (track_wal_io_timing off: no sync times)"
    )
    return (
        f"WAL during the flood: {d['wal_bytes'] / 1e6 / seconds:.1f} MB/s, {d['wal_sync'] / seconds:.0f} syncs/s"
        f"{timing}, WAL buffers full {d['wal_buffers_full']:.0f} times, {d['wal_segments']:+.0f} segment files; "
        f"checkpoints {d['checkpoints']:.0f}; data pages written by the checkpointer {d['buffers_checkpoint']:.0f}, "
        f"the background writer {d['buffers_clean']:.0f}, the backends {d['buffers_backend']:.0f}"
    )


def report(
    args,
    single: StepResult,
    flooded: FloodResult,
    rss: tuple[float, float, float] | None,
    log_problems: dict[str, int] | None,
    lag: str,
) -> None:
    accepted = 100 * single.ok / max(1, single.sent)
    errors = ", ".join(f"{k}: {v}" for k, v in sorted(single.errors.items())) or "none"
    print(
        f"single writes ({args.single_clients} connections, {args.single_rate:.0f}/s open-loop): sent {single.sent}, "
        f"p50 {single.percentile(0.5):.0f} ms, p99 {single.percentile(0.99):.0f} ms, "
        f"max {max(single.latencies_ms, default=float('nan')):.0f} ms, accepted {accepted:.1f} %; errors: {errors}"
    )
    total = sum(flooded.statuses.values())
    statuses = ", ".join(f"{k}: {v}" for k, v in sorted(flooded.statuses.items()))
    refused = flooded.statuses["429"]
    with_header = refused - flooded.retry_after["-"]
    server_errors = sum(v for k, v in flooded.statuses.items() if k.isdigit() and int(k) >= 500)
    dropped = sum(v for k, v in flooded.statuses.items() if not k.isdigit())
    print(
        f"batches ({args.flooders} clients x {args.batch} MCPs): {total} answered ({statuses}); "
        f"429: {refused}, {with_header} with Retry-After "
        f"({', '.join(f'{k} s: {v}' for k, v in sorted(flooded.retry_after.items())) or '-'}); "
        f"accepted p50 {pct(flooded.latencies_ms, 0.5):.0f} ms, p99 {pct(flooded.latencies_ms, 0.99):.0f} ms"
    )
    single_5xx = sum(v for k, v in single.errors.items() if k.isdigit() and int(k) >= 500)
    print(
        f"5xx: {server_errors + single_5xx} (batches {server_errors}, single writes {single_5xx}); "
        f"connections dropped: batches {dropped}, single writes "
        f"{sum(v for k, v in single.errors.items() if not k.isdigit())}"
    )
    print(f"event-loop lag of the API processes during the flood (samples every 20 ms): {lag}")
    if rss is not None:
        before, peak, after = rss
        print(
            f"RSS of the service's processes: before {before:.0f} MB, peak {peak:.0f} MB, {args.settle:.0f} s after "
            f"{after:.0f} MB ({after - before:+.0f} MB)"
        )
    if log_problems is not None:
        print(f"the service's log: {log_problems or 'no traceback, no ERROR or WARNING line'}")
    p99_ok = single.percentile(0.99) <= 100 and accepted >= 95
    flood_ok = refused > 0 and with_header == refused and server_errors + single_5xx == 0
    rss_ok = rss is None or rss[2] - rss[0] <= 50
    print(
        f"targets: single writes p99 <= 100 ms and >= 95 % accepted: {'met' if p99_ok else 'NOT met'}; "
        f"batches 429 with Retry-After, no 5xx: {'met' if flood_ok else 'NOT met'}; "
        f"RSS within 50 MB after {args.settle:.0f} s: {'met' if rss_ok else 'NOT met'}"
    )


def measure_single_writes(base: str, headers: dict[str, str], rate: float, seconds: float, clients: int) -> StepResult:
    """The single writers, in a process of their own (as they would be on another machine): the flood's 50 clients
    in this process keep its event loop busy, and a single write's latency would count their turns too."""
    return asyncio.run(open_loop(base, headers, rate, seconds, single_writes(ENTITIES, 1), connections=clients))


def _started() -> None:
    """Nothing: the single writers' process is started (Python and the bench's imports loaded) before the flood."""


async def run(
    args, base: str, flood_headers: dict[str, str], single_headers: dict[str, str], service: Service | None
) -> None:
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as single_writer:
        await asyncio.get_running_loop().run_in_executor(single_writer, _started)
        await _run(args, base, flood_headers, single_headers, service, single_writer)


async def _run(
    args,
    base: str,
    flood_headers: dict[str, str],
    single_headers: dict[str, str],
    service: Service | None,
    single_writer: ProcessPoolExecutor,
) -> None:
    def rss() -> float:
        return sum(service.rss_mb()) if service is not None else 0.0

    def rss_by_process() -> str:
        """Which of the service's processes hold the memory."""
        if service is None:
            return "-"
        return ", ".join(f"{p.pid}: {p.memory_info().rss / 1e6:.0f}" for p in service.processes())

    await create_entities(Service(base, "", single_headers, None), ENTITIES)  # type: ignore[arg-type]
    # warm-up, not reported: every process's connections opened, validators compiled, caches filled, and its routes'
    # state built (FastAPI builds a route's on the process's first request to it: seconds for the v3 routes); on
    # many connections, so that every process takes some (the single writer's token: the flood's pace in admission
    # is learned from its own batches)
    await open_loop(
        base, single_headers, args.single_rate, 5, single_writes(ENTITIES, 99), connections=4 * args.single_clients
    )
    warm_up = flood_batch(-1, 0, 10)
    await open_loop(base, single_headers, 10, 2, lambda i: ("POST", "/openapi/v1/proposals", warm_up), connections=8)
    await asyncio.sleep(2)
    before, before_by_process = rss(), rss_by_process()
    lag_before = await loop_lag(base, single_headers)
    if args.statements:
        await reset_statements(service.dsn)
    cpu_before = (service.cpu_seconds(), service.postgres_cpu_seconds()) if service is not None else None
    flood_started = time.perf_counter()
    stop = asyncio.Event()
    waits = WaitSampler(service.dsn) if args.waits else None
    flushed_before = await flush_figures(service.dsn) if args.waits else None
    async with contextlib.AsyncExitStack() as stack:
        sampler = stack.enter_context(RssSampler(rss))
        flooding = asyncio.create_task(
            flood(base, flood_headers, args.flooders, args.batch, stop, not args.ignore_retry_after)
        )
        await asyncio.sleep(2)  # the flood is on before the single writes are measured
        if waits is not None:
            await stack.enter_async_context(waits)
        single = await asyncio.get_running_loop().run_in_executor(
            single_writer,
            measure_single_writes,
            base,
            single_headers,
            args.single_rate,
            args.seconds,
            args.single_clients,
        )
        stop.set()
        flooded = await flooding
    if service is not None:
        assert cpu_before is not None
        wall = time.perf_counter() - flood_started
        print(
            f"CPU during the flood ({wall:.0f} s, in cores): service "
            f"{(service.cpu_seconds() - cpu_before[0]) / wall:.2f}, Postgres "
            f"{(service.postgres_cpu_seconds() - cpu_before[1]) / wall:.2f}"
        )
    if args.statements:
        print("Postgres statements during the flood (total ms, calls, rows, statement):")
        for ms, calls, rows, query in await top_statements(service.dsn):
            print(f"  {ms:9.0f} {calls:7d} {rows:9.0f}  {query}")
        print("their WAL (MB, full-page images, statement):")
        for mb, fpi, query in await wal_statements(service.dsn):
            print(f"  {mb:9.1f} {fpi:7d}  {query}")
    if waits is not None:
        waits.report()
        print(flush_report(flushed_before, await flush_figures(service.dsn), time.perf_counter() - flood_started))
    lag = lag_summary(lag_before, await loop_lag(base, single_headers))
    print(
        f"flood over; search behind the feed: {await indexer_lag(base, single_headers)}; waiting "
        f"{args.settle:.0f} s for the memory to settle",
        flush=True,
    )
    await asyncio.sleep(args.settle)
    print(f"search behind the feed {args.settle:.0f} s after: {await indexer_lag(base, single_headers)}")
    after = rss()
    print(f"RSS by process (pid: MB): before {before_by_process}; after {rss_by_process()}")
    report(
        args,
        single,
        flooded,
        (before, sampler.peak, after) if service is not None else None,
        service.log_problems() if service is not None else None,
        lag,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flooders", type=int, default=50)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--single-rate", type=float, default=20)
    parser.add_argument("--single-clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--settle", type=float, default=60)
    parser.add_argument("--workers", type=int, default=None, help="`serve --workers` (default: the machine's cores)")
    parser.add_argument("--url", default=None, help="a running service instead of a throwaway one")
    parser.add_argument("--flood-token", default=None)
    parser.add_argument("--single-token", default=None)
    parser.add_argument("--ignore-retry-after", action="store_true")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the service (repeatable)")
    parser.add_argument(
        "--pg", action="append", default=[], help="NAME=VALUE, a setting of the throwaway Postgres (repeatable)"
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="pg_stat_statements on the throwaway Postgres: print the flood's costliest statements",
    )
    parser.add_argument(
        "--waits",
        action="store_true",
        help="sample the throwaway Postgres' active sessions: what the flood's statements wait for",
    )
    parser.add_argument("--keep-log", type=Path, default=None, help="copy the service's log there at the end")
    args = parser.parse_args()

    def headers(token: str | None) -> dict[str, str]:
        return {"content-type": "application/json", **({"authorization": f"Bearer {token}"} if token else {})}

    if args.url:
        if args.statements or args.waits:
            parser.error("--statements and --waits need the throwaway service (no --url)")
        await run(args, args.url.rstrip("/"), headers(args.flood_token), headers(args.single_token), None)
        return
    workers = args.workers or len(os.sched_getaffinity(0))
    env = dict(item.split("=", 1) for item in args.env)
    server_options = dict(item.split("=", 1) for item in args.pg)
    with throwaway_service(
        workers=workers, env=env, statements=args.statements, server_options=server_options
    ) as service:
        flood_token = issue_token(service.env, "urn:li:corpuser:flood", "writer")
        single_token = issue_token(service.env, "urn:li:corpuser:single", "writer")
        print(
            f"`metaledger serve --workers {workers}`; Postgres fsync on; auth on; {args.flooders} flooders x "
            f"{args.batch} MCPs ({'ignoring' if args.ignore_retry_after else 'honouring'} Retry-After) beside "
            f"{args.single_clients} single-write connections at {args.single_rate:.0f}/s for {args.seconds:.0f} s",
            flush=True,
        )
        try:
            await run(args, service.base, headers(flood_token), headers(single_token), service)
        finally:
            if args.keep_log is not None and service.log is not None and service.log.exists():
                shutil.copyfile(service.log, args.keep_log)


if __name__ == "__main__":
    asyncio.run(main())
