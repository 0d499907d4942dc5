"""A large run rolled back (issue 27): how long it takes, whether the service's memory grows with the run's size, and
what single writes of another caller see meanwhile.

    .venv/bin/python bench/rollback.py [--aspects 100000] [--single-rate 20] [--workers N] [--statements]

A throwaway Postgres (fsync on) and `metaledger serve` with its defaults (`--workers`: one process when unset). Seeded:
`--aspects` datasets written by run `seed`, then each one changed by run `big` (batches of 1,000 over
/openapi/v1/proposals). Then `POST /runs?action=rollback` of `big` (DataHub's CLI call, safe) by an admin; beside it,
from a process of its own, single writes open-loop at `--single-rate`/s to other datasets (bench/loadgen.py: latency
from each request's scheduled time). Printed: the rollback's time and aspects/s, its answer's counts, the RSS of the
service's processes (sum) before, at its peak during the rollback and after; the single writes' p50/p99/max and
errors; the service's log problems. `--statements`: the Postgres statements that took the rollback's time
(pg_stat_statements).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import reset_statements, throwaway_service, top_statements  # noqa: E402
from load import create_entities, single_writes  # noqa: E402
from loadgen import StepResult, open_loop  # noqa: E402

from tests.processes import issue_token  # noqa: E402

SINGLE_ENTITIES = 200  # the single writer's datasets (not the run's)
BATCH = 1_000
RESTLI = {"X-RestLi-Protocol-Version": "2.0.0", "content-type": "application/json"}


def run_urn(i: int) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:hive,rollback.t{i:06d},PROD)"


async def write_run(http: httpx.AsyncClient, aspects: int, run_id: str, description: str) -> None:
    for start in range(0, aspects, BATCH):
        batch = [
            {
                "entityType": "dataset",
                "entityUrn": run_urn(i),
                "aspectName": "datasetProperties",
                "aspect": {"value": {"description": f"{description} {i}"}},
                "systemMetadata": {"runId": run_id},
            }
            for i in range(start, min(start + BATCH, aspects))
        ]
        response = await http.post("/openapi/v1/proposals", content=orjson.dumps(batch))
        response.raise_for_status()


def measure_single_writes(base: str, headers: dict[str, str], rate: float, seconds: float) -> StepResult:
    """In a process of its own: the single writer's client work never shares an event loop with the rollback's."""
    return asyncio.run(open_loop(base, headers, rate, seconds, single_writes(SINGLE_ENTITIES, 1), connections=2))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aspects", type=int, default=100_000)
    parser.add_argument("--single-rate", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--statements", action="store_true")
    args = parser.parse_args()

    with throwaway_service(workers=args.workers, statements=args.statements) as service:
        admin = {"authorization": f"Bearer {issue_token(service.env, 'urn:li:corpuser:admin', 'admin')}"}
        await create_entities(service, SINGLE_ENTITIES)
        async with httpx.AsyncClient(base_url=service.base, headers=service.headers, timeout=600) as http:
            started = time.perf_counter()
            await write_run(http, args.aspects, "seed", "before")
            await write_run(http, args.aspects, "big", "by the bad run")
            print(f"seeded: {args.aspects:,} aspects written twice in {time.perf_counter() - started:.1f} s")
        rss_before = sum(service.rss_mb())
        if args.statements:
            await reset_statements(service.dsn)

        # The single writer runs for about as long as the rollback: a first guess, then stopped with it.
        seconds = max(10.0, args.aspects / 2_000)
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as single_writer:
            singles = asyncio.get_running_loop().run_in_executor(
                single_writer, measure_single_writes, service.base, service.headers, args.single_rate, seconds
            )
            await asyncio.sleep(1.0)
            peak = rss_before
            async with httpx.AsyncClient(base_url=service.base, headers={**RESTLI, **admin}, timeout=3_600) as http:
                started = time.perf_counter()
                rollback = asyncio.create_task(
                    http.post(
                        "/runs?action=rollback", content=orjson.dumps({"runId": "big", "dryRun": False, "safe": True})
                    )
                )
                while not rollback.done():
                    peak = max(peak, sum(service.rss_mb()))
                    await asyncio.sleep(0.5)
                elapsed = time.perf_counter() - started
                response = rollback.result()
            step = await singles
        rss_after = sum(service.rss_mb())
        body = response.json().get("value", response.json())
        counts = {k: v for k, v in body.items() if isinstance(v, int)}
        print(
            f"rollback: HTTP {response.status_code} in {elapsed:.1f} s, {args.aspects / elapsed:,.0f} aspects/s; {counts}"
        )
        print(
            f"RSS (sum of the service's processes): before {rss_before:.0f} MB, peak {peak:.0f} MB, "
            f"after {rss_after:.0f} MB"
        )
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(step.errors.items())) or "none"
        print(
            f"single writes beside it ({args.single_rate:g}/s for {seconds:.0f} s): {step.ok} ok, p50 "
            f"{step.percentile(0.5):.1f} ms, p99 {step.percentile(0.99):.1f} ms, max "
            f"{max(step.latencies_ms, default=float('nan')):.1f} ms; errors: {errors}"
        )
        print(f"service log problems: {service.log_problems() or 'none'}")
        if args.statements:
            print("Postgres statements during the rollback (total ms, calls, rows, statement):")
            for ms, calls, rows, query in await top_statements(service.dsn, 10):
                print(f"  {ms:9.0f} {calls:7d} {rows:9.0f}  {query}")


if __name__ == "__main__":
    asyncio.run(main())
