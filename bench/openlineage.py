"""OpenLineage events/s through DataHub's OpenLineage endpoint, against a real metaledger process and Postgres.

    .venv/bin/python bench/openlineage.py [--workers 0] [--clients 4] [--runs 200] [--batch-size 50]

Each run is two RunEvents (START, then COMPLETE) of its own job, reading two input datasets and writing one output
with a schema facet and a column-lineage facet (about 25 aspect writes per run), so every event writes new values.
- single: `--clients` concurrent clients POST one event per request (`--runs` runs: twice as many events);
- batched: the same number of runs again, `--batch-size` events per request (a JSON array).
Prints events/s and the p50/p99 latency of a request for each (a 429, the admission's answer to a batch that would
wait too long, is retried after its Retry-After, as OpenLineage's clients do, and counted). A throwaway Postgres (fsync
on) and metaledger (bench/harness.py; `--workers 0`, the default: one process, `uvicorn app.main:app`).
First, in this process, the CPU time of the spec check (app.openlineage.validation) per event: with no facet seen
before, and again with every facet remembered (a run's events carry the same facets again).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import throwaway_service  # noqa: E402

from app.openlineage.validation import validate_events  # noqa: E402  (harness puts the repository on the path)

PATH = "/openapi/openlineage/api/v1/lineage"
PRODUCER = "https://github.com/OpenLineage/OpenLineage/tree/1.54.0/client/python"
PG = "postgres://warehouse:5432"


def _facet(**fields):
    return {"_producer": PRODUCER, "_schemaURL": "https://openlineage.io/spec/facets/1-0-0/X.json", **fields}


def run_events(n: int) -> list[dict]:
    """START and COMPLETE of run `n` (job `bench.job_<n>`)."""
    run_id = str(uuid.uuid4())
    inputs = [{"namespace": PG, "name": f"shop.public.src_{n}_{i}"} for i in range(2)]
    output = {
        "namespace": "s3://lake",
        "name": f"marts/out_{n}",
        "facets": {
            "schema": _facet(fields=[{"name": f"c{i}", "type": "integer"} for i in range(10)]),
            "columnLineage": _facet(
                fields={
                    f"c{i}": {"inputFields": [{"namespace": PG, "name": f"shop.public.src_{n}_0", "field": f"c{i}"}]}
                    for i in range(10)
                }
            ),
        },
    }
    return [
        {
            "eventType": state,
            "eventTime": f"2024-06-01T08:0{minute}:00+00:00",
            "producer": PRODUCER,
            "schemaURL": "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent",
            "run": {"runId": run_id, "facets": {"processing_engine": _facet(name="spark", version="3.5.1")}},
            "job": {"namespace": "bench", "name": f"bench.job_{n}"},
            "inputs": inputs,
            "outputs": [output],
        }
        for minute, state in ((0, "START"), (2, "COMPLETE"))
    ]


async def post_all(base: str, headers: dict, bodies: list[bytes], clients: int) -> tuple[float, list[float], int]:
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    latencies: list[float] = []
    retried = 0

    async def client() -> None:
        nonlocal retried
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as http:
            while not queue.empty():
                body = queue.get_nowait()
                started = time.perf_counter()
                response = await http.post(PATH, content=body)
                while response.status_code == 429:
                    retried += 1
                    await asyncio.sleep(float(response.headers.get("Retry-After", "0.2")))
                    response = await http.post(PATH, content=body)
                latencies.append(time.perf_counter() - started)
                if response.status_code != 200:
                    raise SystemExit(f"{response.status_code}: {response.text[:500]}")

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - started, latencies, retried


def report(label: str, events: int, elapsed: float, latencies: list[float], retried: int) -> None:
    p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else latencies[0]
    print(
        f"{label:<8} {events:>6} events in {elapsed:6.1f} s: {events / elapsed:8.1f} events/s; "
        f"request p50 {statistics.median(latencies) * 1000:7.1f} ms, p99 {p99 * 1000:7.1f} ms ({len(latencies)} requests, "
        f"{retried} 429s retried)"
    )


def validation_cost(runs: int) -> None:
    events = [e for n in range(runs) for e in run_events(-1 - n)]
    costs = []
    for _ in range(2):  # the second pass finds every facet remembered
        started = time.process_time()
        validate_events(events)
        costs.append((time.process_time() - started) / len(events) * 1000)
    print(f"spec check: {costs[0]:.3f} ms of CPU per event, facets first seen; {costs[1]:.3f} ms, facets remembered")


async def main(args: argparse.Namespace) -> None:
    validation_cost(args.runs)
    with throwaway_service(workers=args.workers or None) as service:
        singles = [orjson.dumps(e) for n in range(args.runs) for e in run_events(n)]
        # a run's START goes before its COMPLETE: the clients take events in order, and one run's two are adjacent
        report("single", len(singles), *await post_all(service.base, service.headers, singles, args.clients))
        events = [e for n in range(args.runs, 2 * args.runs) for e in run_events(n)]
        batches = [orjson.dumps(events[i : i + args.batch_size]) for i in range(0, len(events), args.batch_size)]
        report("batched", len(events), *await post_all(service.base, service.headers, batches, args.clients))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=50)
    asyncio.run(main(parser.parse_args()))
