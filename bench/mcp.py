"""metaledger's MCP endpoint (`/mcp`) against the same GraphQL operations sent to `/api/graphql` directly: DataHub's
`get_entities` (its `GetEntity` operation, 995 fields for a dataset) and `search` (its `search` operation, a
one-page text search with facets).

    .venv/bin/python bench/mcp.py [--entities 2000] [--clients 8] [--requests 50] [--rate 0] [--seconds 15]

A throwaway Postgres and metaledger (uvicorn, one process, the embedded Postgres search backend, fsync on) with
`--entities` datasets (datasetProperties, a schema of 10 fields, a tag), written through `/openapi/v1/proposals`
with `X-DataHub-Sync-Index-Update: true`. Each tool call is one `POST /mcp` (a stateless JSON-RPC `tools/call`,
as the `mcp` client sends it after `initialize`); its GraphQL twin is the `POST /api/graphql` the tool runs
in-process, with the same variables. Each call names another dataset (a selective search: its name).

Prints, for each of the four: the throughput of `--clients` connections sending `--requests` each back to back
(closed loop: calls per second), then the latency of an open-loop schedule at `--rate` calls/s (default: half the
slower throughput of the pair, so that both run the same schedule below saturation) for `--seconds`: p50, p99, max,
errors, and how late the generator fell behind. A tool result with `isError` counts as an error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, throwaway_service  # noqa: E402
from bench.loadgen import RequestFactory, closed_loop, open_loop  # noqa: E402

SYNC = {"X-DataHub-Sync-Index-Update": "true"}
MCP_HEADERS = {"accept": "application/json, text/event-stream"}
TAG = "urn:li:tag:bench"


def operation(file: str) -> str:
    """DataHub's operation as the tools send it (app.mcp.call.operation; not imported: this directory's graphql.py
    would stand for graphql-core in the imports of app.graphql)."""
    lines = (ROOT / "app" / "mcp" / "gql" / file).read_text().split("\n")
    return "\n".join("# " + line if "#[CLOUD]" in line or "#[NEWER_GMS]" in line else line for line in lines)


def urn(i: int) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:hive,bench.t{i:06d},PROD)"


def proposals(start: int, stop: int) -> list[dict]:
    fields = [
        {"fieldPath": f"c{k}", "nativeDataType": "int", "type": {"type": {"com.linkedin.schema.NumberType": {}}}}
        for k in range(10)
    ]
    out: list[dict] = [
        {"entityType": "tag", "entityUrn": TAG, "changeType": "UPSERT", "aspectName": "tagProperties",
         "aspect": {"contentType": "application/json", "value": orjson.dumps({"name": "bench"}).decode()}}
    ]  # fmt: skip
    for i in range(start, stop):
        for aspect, value in (
            ("datasetProperties", {"name": f"t{i:06d}", "description": f"table {i} of the bench"}),
            ("schemaMetadata", {"schemaName": f"t{i:06d}", "platform": "urn:li:dataPlatform:hive", "version": 0,
                                "hash": "", "platformSchema": {"com.linkedin.schema.MySqlDDL": {"tableSchema": ""}},
                                "fields": fields}),
            ("globalTags", {"tags": [{"tag": TAG}]}),
        ):  # fmt: skip
            out.append(
                {"entityType": "dataset", "entityUrn": urn(i), "changeType": "UPSERT", "aspectName": aspect,
                 "aspect": {"contentType": "application/json", "value": orjson.dumps(value).decode()}}
            )  # fmt: skip
    return out


def load(base: str, headers: dict[str, str], entities: int) -> float:
    started = time.perf_counter()
    with httpx.Client(base_url=base, headers={**headers, **SYNC}, timeout=600) as http:
        for start in range(0, entities, 500):
            body = orjson.dumps(proposals(start, min(start + 500, entities)))
            http.post("/openapi/v1/proposals", content=body).raise_for_status()
    return time.perf_counter() - started


def tool_call(name: str, arguments: Callable[[int], dict]) -> RequestFactory:
    def make(n: int) -> tuple[str, str, bytes]:
        message = {
            "jsonrpc": "2.0",
            "id": n,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments(n)},
        }
        return "POST", "/mcp", orjson.dumps(message)

    return make


def graphql(query: str, operation_name: str, variables: Callable[[int], dict]) -> RequestFactory:
    def make(n: int) -> tuple[str, str, bytes]:
        return (
            "POST",
            "/api/graphql",
            orjson.dumps({"query": query, "variables": variables(n), "operationName": operation_name}),
        )

    return make


def pairs(entities: int) -> dict[str, tuple[RequestFactory, RequestFactory]]:
    def pick(n: int) -> int:
        return (n * 7919) % entities

    search_variables = {"types": None, "orFilters": None, "count": 10, "start": 0, "viewUrn": None}
    return {
        "get_entities": (
            tool_call("get_entities", lambda n: {"urns": [urn(pick(n))]}),
            graphql(operation("entity_details.gql"), "GetEntity", lambda n: {"urn": urn(pick(n))}),
        ),
        "search": (
            tool_call("search", lambda n: {"query": f"t{pick(n):06d}"}),
            graphql(operation("search.gql"), "search", lambda n: {**search_variables, "query": f"t{pick(n):06d}"}),
        ),
    }


def check(base: str, headers: dict[str, str], make: RequestFactory) -> int:
    """One request, answered without an error (HTTP, GraphQL or tool): the bytes of its answer."""
    method, path, body = make(1)
    answer = httpx.request(method, base + path, content=body, headers=headers, timeout=60)
    answer.raise_for_status()
    document = answer.json()
    result = document.get("result") or {}
    if document.get("errors") or document.get("error") or result.get("isError"):
        raise SystemExit(f"{path} answered an error: {answer.text[:500]}")
    return len(answer.content)


async def measure(base: str, headers: dict[str, str], args: argparse.Namespace, entities: int) -> None:
    for tool, (via_mcp, direct) in pairs(entities).items():
        throughput: dict[str, float] = {}
        for label, make, extra in (("/mcp", via_mcp, MCP_HEADERS), ("/api/graphql", direct, {})):
            sent = {**headers, **extra}
            size = check(base, sent, make)
            await closed_loop(base, sent, args.clients, 5, make)  # warm: documents checked once, caches filled
            seconds, errors = await closed_loop(base, sent, args.clients, args.requests, make)
            throughput[label] = args.clients * args.requests / seconds
            print(
                f"{tool} via {label}: {throughput[label]:.1f} calls/s ({args.clients} clients x {args.requests}, "
                f"errors {dict(errors) or 0}; answer {size:,} bytes)",
                flush=True,
            )
        rate = args.rate or max(1.0, round(min(throughput.values()) / 2, 1))
        for label, make, extra in (("/mcp", via_mcp, MCP_HEADERS), ("/api/graphql", direct, {})):
            r = await open_loop(base, {**headers, **extra}, rate, args.seconds, make, connections=32)
            print(
                f"{tool} via {label}, open loop at {rate:g}/s for {args.seconds:g}s: {r.ok} ok, errors "
                f"{dict(r.errors) or 0}; p50 {r.percentile(0.5):.1f} ms, p99 {r.percentile(0.99):.1f} ms, max "
                f"{max(r.latencies_ms, default=float('nan')):.1f} ms; generator behind at most {r.behind_ms:.0f} ms",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=2_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=50, help="per client, closed loop")
    parser.add_argument("--rate", type=float, default=0, help="open-loop calls/s (0: half the slower throughput)")
    parser.add_argument("--seconds", type=float, default=15)
    args = parser.parse_args()
    with throwaway_service() as service:
        seconds = load(service.base, service.headers, args.entities)
        print(f"load: {args.entities:,} datasets in {seconds:.1f}s", flush=True)
        asyncio.run(measure(service.base, service.headers, args, args.entities))
        problems = service.log_problems()
        if problems:
            print(f"service log: {problems}")


if __name__ == "__main__":
    main()
