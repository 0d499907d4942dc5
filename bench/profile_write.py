"""Where a write spends its CPU: py-spy samples the running service while it takes single writes, then batches.

    .venv/bin/python bench/profile_write.py [--workers 1] [--rate 150] [--seconds 20] [--batches 60] [--top 25]
                                            [--single v3,proposals,restli] [--batch v1,v3] [--fsync on|off] [--keep DIR]

A throwaway Postgres (fsync on; `--fsync off`: Python and SQL rather than the disk) and metaledger with everything of the embedded default running (auth, the relay's
sequencer, the embedded indexing worker). With `--workers 1` (the default) one process does all of it, so one
profile shows the request path and the background work side by side; with more, every process is sampled
(`py-spy --subprocesses`). The workloads, each profiled on its own:
- single: `--rate` single-aspect writes/s (existing entities) for `--seconds`, through each route of `--single`:
  `v3` (POST /openapi/v3/entity/dataset/{urn}/datasetProperties), `proposals` (POST /openapi/v1/proposals, one MCP),
  `restli` (POST /aspects?action=ingestProposal, as DataHub's Python client sends it);
- batch: `--batches` requests of 100 MCPs from 4 clients through each route of `--batch`: `v1` (POST
  /openapi/v1/proposals) and `v3` (POST /openapi/v3/entity/dataset, DataHub's v3 batch).
For each: CPU ms per write, then the share of CPU samples by stage (the first matching rule below, from the leaf
frame up; the background workers first, by their task), and the `--top` hottest functions by own time. `--keep DIR`
keeps py-spy's raw stacks (flamegraph.pl / speedscope can read them).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Service, reset_statements, throwaway_service, top_statements  # noqa: E402
from load import create_entities, dataset_urn, properties, single_writes  # noqa: E402
from loadgen import closed_loop, open_loop  # noqa: E402

PY_SPY = Path(sys.executable).with_name("py-spy")
RATE_HZ = 250

# (stage, regex on a frame "function (file:line)"); background tasks are recognised anywhere in the stack first.
BACKGROUND = [
    ("background: indexing worker", r"app/search/worker\.py"),
    ("background: relay / sequencer", r"app/kafka/relay\.py|app/changelog/sequencer\.py"),
    ("background: ops sampler", r"app/ops/sampler\.py"),
]
STAGES = [
    ("SQL: asyncpg", r"\(asyncpg/"),
    ("SQL: SQLAlchemy", r"\(sqlalchemy/"),
    ("schema validation", r"\(app/registry/validator\.py|\(fastjsonschema/|\(jsonschema/"),
    ("PATCH and write rules", r"app/write/(patch|rules|plugins)\.py"),
    ("change log and entity change events", r"app/write/mcl\.py|app/changelog/"),
    ("sync search indexing", r"app/search/"),
    ("write pipeline (app/write)", r"app/write/"),
    ("gateway and drafts (app/ingest)", r"app/ingest/"),
    ("auth", r"app/auth/"),
    ("request/response JSON and envelopes (app/api)", r"app/api/"),
    (
        "metrics, request ids, access log",
        r"\(app/ops/|\(prometheus_client/|\(logging/|\(app/logs\.py|\(pythonjsonlogger/",
    ),
    ("pydantic", r"\(pydantic"),
    ("HTTP: uvicorn/starlette/fastapi", r"\(uvicorn/|\(starlette/|\(fastapi/|\(h11/|\(httptools/"),
    ("event loop", r"\(asyncio/|\(uvloop/"),
    ("other app code", r"\(app/"),
]
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^:()]*)(?::\d+)?\)$")


def mcp(i: int, revision: int) -> dict:
    """A proposal of the same new version of one existing entity's datasetProperties that `single_writes` writes."""
    return {
        "entityType": "dataset",
        "entityUrn": dataset_urn(i),
        "changeType": "UPSERT",
        "aspectName": "datasetProperties",
        "aspect": {"value": orjson.dumps(properties(i, revision)).decode(), "contentType": "application/json"},
    }


def single_writes_by_route(entities: int, step: int) -> dict[str, Callable[[int], tuple[str, str, bytes]]]:
    """The single-write workload through each route that takes one: the n-th request writes what `single_writes`'
    n-th does."""

    def proposals(n: int) -> tuple[str, str, bytes]:
        return "POST", "/openapi/v1/proposals", orjson.dumps([mcp(n % entities, step * 1_000_000 + n + 1)])

    def restli(n: int) -> tuple[str, str, bytes]:
        body = {"proposal": mcp(n % entities, step * 1_000_000 + n + 1), "async": "false"}
        return "POST", "/aspects?action=ingestProposal", orjson.dumps(body)

    return {"v3": single_writes(entities, step), "proposals": proposals, "restli": restli}


SINGLE_ROUTES = frozenset(single_writes_by_route(1, 0))


def stage_of(frames: list[str]) -> str:
    for stage, pattern in BACKGROUND:
        if any(re.search(pattern, f) for f in frames):
            return stage
    for frame in reversed(frames):  # leaf first
        for stage, pattern in STAGES:
            if re.search(pattern, frame):
                return stage
    return "other (interpreter, GC, libraries)"


def read_raw(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
            stacks.append((frames, int(count)))
    return stacks


def report(
    name: str,
    stacks: list[tuple[list[str], int]],
    writes: int,
    seconds: float,
    top: int,
    cpu: tuple[float, float] | None = None,
    roles: dict[str, float] | None = None,
) -> None:
    total = sum(c for _, c in stacks)
    sampled_s = total / RATE_HZ
    print(f"\n== {name}: {writes} writes in {seconds:.1f} s")
    if cpu is not None:
        print(
            f"   CPU per write (the kernel's count, py-spy's own cost included): service {cpu[0] * 1000 / max(writes, 1):.2f} ms, "
            f"Postgres {cpu[1] * 1000 / max(writes, 1):.2f} ms"
            + (
                " (service: "
                + ", ".join(f"{role} {spent * 1000 / max(writes, 1):.2f} ms" for role, spent in roles.items())
                + ")"
                if roles
                else ""
            )
        )
    print(f"   py-spy: {sampled_s:.1f} s of samples in the service (a runnable thread waiting for a core counts too)")
    by_stage: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    for frames, count in stacks:
        by_stage[stage_of(frames)] += count
        if frames:
            match = _FRAME.match(frames[-1])
            own[f"{match['func']} ({Path(match['file']).name})" if match else frames[-1]] += count
    for stage, count in by_stage.most_common():
        # a stage's CPU per write: its share of the samples times the service's CPU per write (the kernel's figure)
        per_write = count / total * (cpu[0] if cpu else sampled_s) * 1000 / max(writes, 1)
        print(f"  {count / total:6.1%}  {per_write:7.3f} ms/write  {stage}")
    print("  by the innermost metaledger function (library calls it makes included):")
    for func, count in by_app_function(stacks).most_common(top):
        print(f"  {count / total:6.1%}  {func}")
    print("  hottest functions (own time):")
    for func, count in own.most_common(top):
        print(f"  {count / total:6.1%}  {func}")


def by_app_function(stacks: list[tuple[list[str], int]]) -> collections.Counter:
    found: collections.Counter = collections.Counter()
    for frames, count in stacks:
        for frame in reversed(frames):
            match = _FRAME.match(frame)
            if match and match["file"].startswith("app/"):
                found[f"{match['func']} ({match['file']})"] += count
                break
        else:
            found["(no metaledger frame: the server, the event loop)"] += count
    return found


def print_statements(statements: list, writes: int) -> None:
    print("  Postgres, by statement (execution + planning time; ms per write, calls per write):")
    for ms, calls, _rows, query in statements:
        print(f"  {ms / writes:7.3f} ms  {calls / writes:6.2f}  {query}")


def start_spy(service: Service, out: Path, workers: int) -> subprocess.Popen:
    # --gil: only samples of a thread holding the GIL (uvloop waiting in epoll, or asyncpg waiting on its socket,
    # release it; without --gil they counted as busy)
    argv = [
        str(PY_SPY),
        "record",
        "--format",
        "raw",
        "--rate",
        str(RATE_HZ),
        "--output",
        str(out),
        "--nonblocking",
        "--gil",
        "--pid",
        str(service.process.pid),
    ]
    if workers > 1:
        argv.append("--subprocesses")
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attaches
    return spy


def stop_spy(spy: subprocess.Popen) -> None:
    spy.send_signal(2)  # SIGINT: py-spy writes its file and exits
    try:
        spy.wait(30)
    except subprocess.TimeoutExpired:
        spy.kill()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1, help="`serve --workers`; 0: `uvicorn app.main:app`")
    parser.add_argument("--rate", type=float, default=150)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--entities", type=int, default=1000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--single",
        default="v3",
        help="the single-write routes to profile, each on its own: v3, proposals, restli (comma-separated)",
    )
    parser.add_argument("--batch", default="v1", help="the batch routes to profile: v1, v3 (comma-separated)")
    parser.add_argument("--fsync", choices=("on", "off"), default="on", help="the bench's Postgres fsync")
    parser.add_argument("--keep", type=Path, default=None)
    parser.add_argument("--statements", action="store_true", help="Postgres's time by statement (pg_stat_statements)")
    args = parser.parse_args()
    routes = args.single.split(",") if args.single else []
    if not set(routes) <= SINGLE_ROUTES:
        parser.error(f"--single: unknown routes {sorted(set(routes) - SINGLE_ROUTES)}")
    out_dir = args.keep or Path(tempfile.mkdtemp(prefix="metaledger-profile-"))
    out_dir.mkdir(parents=True, exist_ok=True)

    batch_routes = args.batch.split(",") if args.batch else []
    if not set(batch_routes) <= {"v1", "v3"}:
        parser.error(f"--batch: unknown routes {sorted(set(batch_routes) - {'v1', 'v3'})}")
    with throwaway_service(
        workers=args.workers or None, statements=args.statements, durable=args.fsync == "on"
    ) as service:
        await create_entities(service, args.entities)
        # warm-up: validators compiled, caches filled, connections opened
        await open_loop(service.base, service.headers, 50, 2, single_writes(args.entities, 99))

        if args.statements:
            await reset_statements(service.dsn)
        for n, route in enumerate(routes):
            raw = out_dir / f"single-{route}.txt"
            spy = start_spy(service, raw, args.workers)
            cpu0 = (service.cpu_seconds(), service.postgres_cpu_seconds())
            roles0 = service.cpu_seconds_by_role()
            started = time.perf_counter()
            writes = single_writes_by_route(args.entities, n)[route]
            step = await open_loop(service.base, service.headers, args.rate, args.seconds, writes)
            elapsed = time.perf_counter() - started
            await asyncio.sleep(1.0)  # the background work of the last writes
            cpu = (service.cpu_seconds() - cpu0[0], service.postgres_cpu_seconds() - cpu0[1])
            roles = {role: spent - roles0[role] for role, spent in service.cpu_seconds_by_role().items()}
            stop_spy(spy)
            report(
                f"single writes via {route} at {args.rate:.0f}/s (p50 {step.percentile(0.5):.1f} ms, "
                f"p99 {step.percentile(0.99):.1f} ms, errors {dict(step.errors) or 0})",
                read_raw(raw),
                step.ok,
                elapsed,
                args.top,
                cpu,
                roles,
            )
            if args.statements:
                print_statements(await top_statements(service.dsn), step.ok)
                await reset_statements(service.dsn)

        def batch_v1(n: int) -> tuple[str, str, bytes]:
            body = [
                {
                    "entityType": "dataset",
                    "entityUrn": dataset_urn((n * 100 + i) % args.entities),
                    "changeType": "UPSERT",
                    "aspectName": "datasetProperties",
                    "aspect": {
                        "value": orjson.dumps(properties(i, 5_000_000 + n)).decode(),
                        "contentType": "application/json",
                    },
                    "systemMetadata": {"runId": "profile", "lastObserved": int(time.time() * 1000)},
                }
                for i in range(100)
            ]
            return "POST", "/openapi/v1/proposals", orjson.dumps(body)

        def batch_v3(n: int) -> tuple[str, str, bytes]:
            body = [
                {
                    "urn": dataset_urn((n * 100 + i) % args.entities),
                    "datasetProperties": {"value": properties(i, 6_000_000 + n)},
                }
                for i in range(100)
            ]
            return "POST", "/openapi/v3/entity/dataset?async=false", orjson.dumps(body)

        paths = {"v1": ("/openapi/v1/proposals", batch_v1), "v3": ("/openapi/v3/entity/dataset", batch_v3)}
        for route in batch_routes:
            path, batch = paths[route]
            raw = out_dir / f"batch-{route}.txt"
            spy = start_spy(service, raw, args.workers)
            cpu0 = (service.cpu_seconds(), service.postgres_cpu_seconds())
            roles0 = service.cpu_seconds_by_role()
            elapsed, errors = await closed_loop(service.base, service.headers, 4, args.batches // 4, batch)
            await asyncio.sleep(1.0)
            cpu = (service.cpu_seconds() - cpu0[0], service.postgres_cpu_seconds() - cpu0[1])
            roles = {role: spent - roles0[role] for role, spent in service.cpu_seconds_by_role().items()}
            stop_spy(spy)
            writes = args.batches // 4 * 4 * 100
            report(
                f"batches of 100 via {path}, 4 clients ({writes / elapsed:.0f} writes/s, errors {dict(errors) or 0})",
                read_raw(raw),
                writes,
                elapsed,
                args.top,
                cpu,
                roles,
            )
            if args.statements:
                print_statements(await top_statements(service.dsn), writes)
                await reset_statements(service.dsn)
    if args.keep is None:
        shutil.rmtree(out_dir, ignore_errors=True)
    else:
        print(f"\nraw stacks in {out_dir}")


if __name__ == "__main__":
    asyncio.run(main())
