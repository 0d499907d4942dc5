"""GraphQL (`/api/graphql`): DataHub's `get_urns_by_filter` over 10,000 URNs, and the latency of one-page searches.

    .venv/bin/python bench/graphql.py [--entities 100000] [--rates 20,50] [--seconds 15] [--no-vacuum]

A throwaway Postgres and metaledger (uvicorn, one process, the embedded Postgres search backend, fsync on) with
`--entities` datasets (datasetKey + datasetProperties), written through `/openapi/v1/proposals` in batches of 2,000
with `X-DataHub-Sync-Index-Update: true`; 10,000 of them on platform `snowflake`, the rest spread over three others.
Then `VACUUM (ANALYZE)`, as autovacuum would in time (`--no-vacuum`: measure the index as loaded).

Prints:
- the load: entities, seconds, MCPs/s;
- `get_urns_by_filter(platform="snowflake", entity_types=["dataset"])` with the real client (`.venv-client`, or
  METALEDGER_CLIENT_VENV) at batch sizes 5,000 (the client's default) and 1,000: URNs, GraphQL pages, seconds (the
  call alone, not the client's start-up);
- one-page searches (`scrollAcrossEntities`, count 10, the first page) sent open-loop at each of `--rates`
  requests/s for `--seconds` (latency from the scheduled send time: a stall is charged to every request it
  delays): a selective text query (one entity's name), a filter-only browse (`*`, platform and env filters),
  and, when the client is installed, `datahub search`'s bundled query (every field it selects, and the facets);
  p50/p90/p99/max, errors, and how late the generator itself fell behind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import asyncpg
import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, throwaway_service  # noqa: E402
from bench.loadgen import open_loop  # noqa: E402

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
SELECTED = 10_000  # datasets on the platform get_urns_by_filter asks for
OTHERS = ("hive", "bigquery", "postgres")
SEARCH = (
    "query q($query: String!, $orFilters: [AndFilterInput!]) { scrollAcrossEntities(input: {types: [DATASET], "
    "query: $query, count: 10, orFilters: $orFilters}) { nextScrollId total searchResults { entity { urn } } } }"
)


def platform_of(i: int) -> str:
    return "snowflake" if i < SELECTED else OTHERS[i % len(OTHERS)]


def proposals(start: int, stop: int) -> list[dict]:
    out = []
    for i in range(start, stop):
        platform = platform_of(i)
        urn = f"urn:li:dataset:(urn:li:dataPlatform:{platform},bench.t{i:06d},PROD)"
        out.append(
            {
                "entityType": "dataset",
                "entityUrn": urn,
                "changeType": "UPSERT",
                "aspectName": "datasetKey",
                "aspect": {
                    "value": {
                        "platform": f"urn:li:dataPlatform:{platform}",
                        "name": f"bench.t{i:06d}",
                        "origin": "PROD",
                    }
                },
            }
        )
        out.append(
            {
                "entityType": "dataset",
                "entityUrn": urn,
                "changeType": "UPSERT",
                "aspectName": "datasetProperties",
                "aspect": {"value": {"name": f"t{i:06d}", "description": f"orders table {i} of the benchmark"}},
            }
        )
    return out


def load(base: str, headers: dict[str, str], entities: int) -> float:
    started = time.perf_counter()
    with httpx.Client(base_url=base, headers={**headers, **SYNC}, timeout=600) as http:
        for start in range(0, entities, 1_000):  # 1,000 entities = 2,000 MCPs per request
            response = http.post(
                "/openapi/v1/proposals", content=orjson.dumps(proposals(start, min(start + 1_000, entities)))
            )
            response.raise_for_status()
            if (start // 1_000) % 10 == 9:
                print(f"  loaded {start + 1_000:,} entities, {time.perf_counter() - started:.0f}s", flush=True)
    return time.perf_counter() - started


CLIENT_SCRIPT = textwrap.dedent("""
    import json, sys, time
    from datahub.ingestion.graph.client import DataHubGraph, DatahubClientConfig
    graph = DataHubGraph(DatahubClientConfig(server=sys.argv[1], token=sys.argv[2]))
    pages = 0
    execute = graph.execute_graphql
    def counting(*args, **kw):
        global pages
        pages += 1
        return execute(*args, **kw)
    graph.execute_graphql = counting
    for batch in (5000, 1000):
        pages = 0
        started = time.perf_counter()
        urns = list(graph.get_urns_by_filter(platform="snowflake", entity_types=["dataset"], batch_size=batch))
        print(json.dumps({"batch": batch, "urns": len(urns), "distinct": len(set(urns)), "pages": pages,
                          "seconds": time.perf_counter() - started}))
""")


def client_python() -> Path | None:
    python = Path(os.environ.get("METALEDGER_CLIENT_VENV", ROOT / ".venv-client")) / "bin" / "python"
    return python if python.exists() else None


def get_urns_by_filter(base: str, token: str) -> None:
    python = client_python()
    if python is None:
        print("get_urns_by_filter: no client virtualenv (make client-venv, or METALEDGER_CLIENT_VENV): skipped")
        return
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "DATAHUB_TELEMETRY_ENABLED": "false",
    }
    done = subprocess.run(
        [str(python), "-c", CLIENT_SCRIPT, base, token], capture_output=True, text=True, env=env, timeout=900
    )
    if done.returncode != 0:
        print(f"get_urns_by_filter failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return
    for line in done.stdout.strip().splitlines():
        r = json.loads(line)
        print(
            f"get_urns_by_filter batch_size={r['batch']:,}: {r['urns']:,} URNs ({r['distinct']:,} distinct) in "
            f"{r['pages']} pages, {r['seconds']:.2f}s ({r['urns'] / r['seconds']:,.0f} URNs/s)"
        )


def searches(entities: int):
    platform = {"field": "platform", "values": ["urn:li:dataPlatform:hive"]}
    env = {"field": "origin", "values": ["PROD"]}
    not_removed = {"field": "removed", "values": ["true"], "negated": True}

    def selective(n: int) -> tuple[str, str, bytes]:
        body = {"query": SEARCH, "variables": {"query": f"t{(n * 7919) % entities:06d}"}}
        return "POST", "/api/graphql", orjson.dumps(body)

    def browse(n: int) -> tuple[str, str, bytes]:
        body = {"query": SEARCH, "variables": {"query": "*", "orFilters": [{"and": [platform, env, not_removed]}]}}
        return "POST", "/api/graphql", orjson.dumps(body)

    found = {"selective text query": selective, "filter-only browse": browse}
    cli_query = datahub_search_query()
    if cli_query:

        def cli_search(n: int) -> tuple[str, str, bytes]:
            variables = {"query": f"t{(n * 7919) % entities:06d}", "count": 10, "start": 0}
            return (
                "POST",
                "/api/graphql",
                orjson.dumps({"query": cli_query, "variables": variables, "operationName": "search"}),
            )

        found["`datahub search` (the CLI's bundled query, every field and the facets), selective"] = cli_search
    return found


def datahub_search_query() -> str | None:
    """The query `datahub search` sends (fragments + search.gql from the client's package), if the client is here."""
    python = client_python()
    if python is None:
        return None
    found = list(python.parent.parent.glob("lib/python*/site-packages/datahub/cli/gql"))
    if not found:
        return None
    return (found[0] / "fragments.gql").read_text() + (found[0] / "search.gql").read_text()


async def latency(base: str, headers: dict[str, str], entities: int, rates: list[float], seconds: float) -> None:
    for name, make in searches(entities).items():
        for rate in rates:
            r = await open_loop(base, headers, rate, seconds, make, connections=64)
            print(
                f"one-page search, {name}, {rate:g} req/s for {seconds:g}s: {r.ok} ok, errors {dict(r.errors) or 0}; "
                f"p50 {r.percentile(0.5):.1f} ms, p90 {r.percentile(0.9):.1f} ms, p99 {r.percentile(0.99):.1f} ms, "
                f"max {max(r.latencies_ms, default=float('nan')):.1f} ms; generator behind at most {r.behind_ms:.0f} ms",
                flush=True,
            )


async def vacuum_analyze(dsn: str) -> None:
    """What autovacuum does to a table some time after a bulk load, done before measuring: statistics for the
    planner, dead row versions removed, GIN pending lists merged into their indexes. Without it the figures depend
    on whether autovacuum has come round yet (it had not, 90 s after the load, in runs on a shared 2-core
    machine), and on which reads happened to prune the heap pages before the measured ones."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM (ANALYZE)")
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--rates", default="20,50")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument(
        "--no-vacuum",
        action="store_true",
        help="measure the index as loaded (no statistics, dead row versions, GIN pending lists)",
    )
    args = parser.parse_args()
    if args.entities < SELECTED:
        parser.error(f"--entities must be at least {SELECTED:,}")
    rates = [float(r) for r in args.rates.split(",")]
    with throwaway_service() as service:
        print(f"loading {args.entities:,} datasets ({2 * args.entities:,} MCPs, sync-indexed) ...", flush=True)
        seconds = load(service.base, service.headers, args.entities)
        print(f"load: {args.entities:,} entities in {seconds:.1f}s ({2 * args.entities / seconds:,.0f} MCPs/s)")
        if not args.no_vacuum:
            started = time.perf_counter()
            asyncio.run(vacuum_analyze(service.dsn))
            print(f"VACUUM (ANALYZE) after the load: {time.perf_counter() - started:.1f}s", flush=True)
        token = service.headers["authorization"].split(" ", 1)[1]
        get_urns_by_filter(service.base, token)
        asyncio.run(latency(service.base, service.headers, args.entities, rates, args.seconds))
        problems = service.log_problems()
        if problems:
            print(f"service log: {problems}")


if __name__ == "__main__":
    main()
