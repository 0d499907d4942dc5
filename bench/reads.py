"""The read path measured against its database: entity GETs, GraphQL, search, lineage and timeline, each beside the
ceiling its own database gives in the same run.

    .venv/bin/python bench/reads.py [--datasets 100000] [--backend postgres|opensearch] [--rate R] [--seconds 15]
        [--mix v3get,graphql_entity,...] [--keep DIR | --reuse DIR] [--profile DIR] [--workers N]

A throwaway Postgres (fsync on, pg_stat_statements) and metaledger (uvicorn, one process; `--workers N`: `metaledger
serve --workers N`, N API processes and the background process, as `make run` serves; `--backend opensearch`: an
osmem OpenSearch-API server as its search backend) with `--datasets` datasets over four platforms: datasetProperties,
a schema of 50 fields, two owners, a tag or two, a glossary term, and upstreamLineage of 1-5 upstreams each (about 3
edges a dataset) shaped like a warehouse: one edge in ten reads one of the hubs (a thousandth of the datasets, at
least five: about 300 downstreams each), the others one of the 2,000 datasets written before it. Written through
`/openapi/v1/proposals` in batches of 500 datasets, two at a time (a 429 retried after its Retry-After), then the
background indexer waited for (the load time printed: 580 s for 10,000 on a busy 2-core machine, 1,607 s for 100,000
on a faster one, 27 GB of Postgres). `--keep DIR` keeps the loaded Postgres in DIR, `--reuse DIR` starts from it
without loading (the embedded backend only: osmem keeps nothing).

Then, for each mix (`--mix`, default all), requests as a reader:

* floor: `GET /config`, an answer that reads nothing: what uvicorn, the middleware and a FastAPI route with its
  policy cost alone — the most any read can reach on this service;
* v3get: `GET /openapi/v3/entity/dataset/{urn}` (every aspect of one dataset);
* graphql_entity: the `getDataset` query of DataHub's web app (datahub-web-react/src/graphql/dataset.graphql),
  cut to the fields metaledger's schema has;
* search: `searchAcrossEntities` for one dataset's name, 10 results and the facets;
* scroll: `POST /openapi/v3/entity/scroll` for one dataset's name (DataHub's OpenAPI search);
* lineage: `searchAcrossLineage` 1, 2 or 3 hops (the degree filter) up or down from a dataset;
* timeline: `GET /openapi/v2/timeline/v1/{urn}` (tags, ownership, schema).

Each mix is first run closed-loop (`--connections` clients back to back: its most throughput), then open-loop at
`--rate` requests/s (default: half that most: "p50 load") for `--seconds`, latency from the scheduled send. Printed:
rate offered and served, p50/p99, errors (any 5xx is a defect), the database's own time for the statements the mix
ran (pg_stat_statements, reset before it, the background workers' statements of an idle moment taken out): mean ms
per request, and p99 / that ratio; and the service's CPU per request (its processes', its idle CPU taken out: what a
machine shared with other work distorts least). The ceiling of the entity GET: bare asyncpg on `--connections`
connections running the statement the service runs for it (the latest rows of one URN) and decoding each row's JSON,
closed-loop: its throughput, p50/p99 and CPU per request, and the GET's share of it (by throughput, and by CPU).
Last (mix `deadline`), 5-hop downstream lineages from hub starts (`--starts K-L`, default 0-19: the hubs by their
downstreams, round after round), each unbudgeted (pages of 10,000 to its end), then with `X-Metaledger-Deadline-Ms:
500` and its cursor followed (at most 200 pages): each page's wall time (p50/p99, and how many over 600 ms), the
pages to complete it, and whether the pages together are the unbudgeted answer (the same results in the same order).

`--profile DIR`: py-spy records the API process during each open-loop mix (DIR/<mix>.txt, collapsed stacks) and the
top frames (by own samples, and by samples under them of app/ functions) are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

import asyncpg
import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, Service, reset_statements  # noqa: E402
from bench.loadgen import HttpConnection, RequestFactory, open_loop  # noqa: E402
from tests.processes import service_token, start_service, stop_process, wait_healthy_sync  # noqa: E402

PLATFORMS = ("hive", "snowflake", "kafka", "postgres")
BATCH = 500  # datasets a POST
FIELD_COUNT = 50
SCHEMA_FIELDS = [
    {"fieldPath": f"col_{k}", "nativeDataType": "varchar" if k % 2 else "bigint", "description": f"column {k}",
     "type": {"type": {"com.linkedin.schema.StringType" if k % 2 else "com.linkedin.schema.NumberType": {}}}}
    for k in range(FIELD_COUNT)
]  # fmt: skip
STAMP = {"time": 1_700_000_000_000, "actor": "urn:li:corpuser:bench"}
DEADLINE = "X-Metaledger-Deadline-Ms"
DEADLINE_PAGE = 10_000  # results a page of the 5-hop walk (its whole answer at 10,000 datasets)
# A cursor followed further than this does not complete the walk. A page under a 500 ms budget holds at most 666
# results: at 100,000 datasets a hub's 5-hop downstream (24,000-31,000 entities) takes about 47 pages.
MAX_PAGES = 200
IDLE_S = 3.0  # how long the background workers' statements are counted alone


def urn(i: int) -> str:
    return f"urn:li:dataset:(urn:li:dataPlatform:{PLATFORMS[i % len(PLATFORMS)]},warehouse.t{i:06d},PROD)"


def hubs(datasets: int) -> int:
    """Datasets 0..hubs-1 are the hubs: one edge in ten reads one of them (about 300 downstreams each)."""
    return max(5, datasets // 1_000)


def upstreams_of(i: int, datasets: int) -> list[int]:
    """The upstreams of dataset i (earlier datasets only: a DAG): 1-5 of them, 3 on average."""
    first = hubs(datasets)
    if i < first:
        return [] if i == 0 else [i - 1] if i % 10 else []
    rng = random.Random(i)
    found: set[int] = set()
    for _ in range(rng.choice((1, 2, 3, 3, 4, 5))):
        if rng.random() < 0.1:
            found.add(rng.randrange(first))
        else:
            found.add(max(first, i - rng.randint(1, 2_000)))
    found.discard(i)
    return sorted(found)


def _proposal(entity_urn: str, aspect: str, value: dict) -> dict:
    return {
        "entityType": "dataset",
        "entityUrn": entity_urn,
        "changeType": "UPSERT",
        "aspectName": aspect,
        "aspect": {"contentType": "application/json", "value": orjson.dumps(value).decode()},
    }


def proposals(start: int, stop: int, datasets: int) -> list[dict]:
    out = []
    for i in range(start, stop):
        u, platform = urn(i), PLATFORMS[i % len(PLATFORMS)]
        schema = {
            "schemaName": f"t{i:06d}",
            "platform": f"urn:li:dataPlatform:{platform}",
            "version": 0,
            "hash": "",
            "platformSchema": {"com.linkedin.schema.MySqlDDL": {"tableSchema": ""}},
            "fields": SCHEMA_FIELDS,
        }
        owners = [
            {"owner": f"urn:li:corpuser:owner{i % 50}", "type": "TECHNICAL_OWNER"},
            {"owner": f"urn:li:corpGroup:team{i % 7}", "type": "BUSINESS_OWNER"},
        ]
        tags = [{"tag": f"urn:li:tag:tier{i % 3}"}] + ([{"tag": "urn:li:tag:pii"}] if i % 5 == 0 else [])
        upstreams = [{"dataset": urn(j), "type": "TRANSFORMED", "auditStamp": STAMP} for j in upstreams_of(i, datasets)]
        out += [
            _proposal(u, "datasetProperties", {"name": f"t{i:06d}", "description": f"table {i} of the warehouse"}),
            _proposal(u, "schemaMetadata", schema),
            _proposal(u, "ownership", {"owners": owners, "lastModified": STAMP}),
            _proposal(u, "globalTags", {"tags": tags}),
            _proposal(
                u, "glossaryTerms", {"terms": [{"urn": f"urn:li:glossaryTerm:term{i % 20}"}], "auditStamp": STAMP}
            ),
        ]
        if upstreams:
            out.append(_proposal(u, "upstreamLineage", {"upstreams": upstreams}))
    return out


def edge_count(datasets: int) -> int:
    return sum(len(upstreams_of(i, datasets)) for i in range(datasets))


async def load(base: str, headers: dict[str, str], datasets: int) -> float:
    started = time.perf_counter()
    batches = iter(range(0, datasets, BATCH))
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=600) as http:

        async def writer() -> None:
            for start in batches:
                body = orjson.dumps(proposals(start, min(start + BATCH, datasets), datasets))
                answer = await http.post("/openapi/v1/proposals", content=body)
                while answer.status_code == 429:  # the writer's share of the write path is taken: as a client would
                    await asyncio.sleep(float(answer.headers.get("retry-after", "1")))
                    answer = await http.post("/openapi/v1/proposals", content=body)
                if answer.status_code != 200:
                    raise RuntimeError(f"load: {answer.status_code} {answer.text[:300]}")
                if start and start % 10_000 == 0:
                    print(f"  {start:,} datasets written ({time.perf_counter() - started:.0f} s)", flush=True)

        await asyncio.gather(writer(), writer())
        query = 'query q { searchAcrossEntities(input: {query: "*", types: [DATASET], count: 0}) { total } }'
        while True:  # the background indexer's documents (and lineage edges), all of them
            answer = await http.post("/api/graphql", json={"query": query})
            if answer.json()["data"]["searchAcrossEntities"]["total"] >= datasets:
                break
            await asyncio.sleep(1)
    return time.perf_counter() - started


# --- the mixes ----------------------------------------------------------------------------------------------------

GET_DATASET = """
query getDataset($urn: String!) {
  dataset(urn: $urn) {
    urn type exists name origin
    platform { urn name }
    properties { name description qualifiedName customProperties { key value } }
    editableProperties { description }
    deprecation { deprecated note }
    tags { tags { tag { urn name } } }
    glossaryTerms { terms { term { urn name } } }
    ownership { owners { owner { ... on CorpUser { urn } ... on CorpGroup { urn } } type } }
    subTypes { typeNames }
    domain { domain { urn } }
    container { urn }
    schemaMetadata(version: 0) { name version hash fields { fieldPath nativeDataType type description nullable } }
    editableSchemaMetadata { editableSchemaFieldInfo { fieldPath description } }
    viewProperties { materialized logic language }
    structuredProperties { properties { structuredProperty { urn } } }
    browsePathV2 { path { name } }
    health { type status }
  }
}"""
SEARCH = """
query search($query: String!) {
  searchAcrossEntities(input: {types: [DATASET], query: $query, start: 0, count: 10}) {
    start count total
    searchResults { entity { urn type ... on Dataset { name platform { urn } } } }
    facets { field displayName aggregations { value count } }
  }
}"""
LINEAGE = """
query lineage($urn: String!, $direction: LineageDirection!, $degrees: [String!]!) {
  searchAcrossLineage(input: {urn: $urn, direction: $direction, query: "*", start: 0, count: 20,
                              orFilters: [{and: [{field: "degree", values: $degrees}]}]}) {
    total isPartial searchResults { degree entity { urn type } }
  }
}"""
SCROLL5 = """
query scroll($urn: String!, $scrollId: String, $count: Int!) {
  scrollAcrossLineage(input: {urn: $urn, direction: DOWNSTREAM, query: "*", count: $count, scrollId: $scrollId,
                              orFilters: [{and: [{field: "degree", values: ["1", "2", "3", "4", "5"]}]}]}) {
    nextScrollId count total isPartial searchResults { degree entity { urn } }
  }
}"""


def mixes(datasets: int) -> dict[str, RequestFactory]:
    def pick(n: int) -> int:
        return (n * 7919 + 13) % datasets

    def graphql(query: str, variables: Callable[[int], dict]) -> RequestFactory:
        return lambda n: ("POST", "/api/graphql", orjson.dumps({"query": query, "variables": variables(n)}))

    def lineage_variables(n: int) -> dict:
        hops = 1 + n % 3
        return {
            "urn": urn(pick(n)),
            "direction": "DOWNSTREAM" if n % 2 else "UPSTREAM",
            "degrees": [str(d) for d in range(1, hops + 1)],
        }

    timeline = urlencode({"categories": "TAG,OWNERSHIP,TECHNICAL_SCHEMA", "startTime": 0})
    return {
        # the service's answer without its database: uvicorn, the middleware, a FastAPI route and its policy
        "floor": lambda n: ("GET", "/config", b""),
        "v3get": lambda n: ("GET", f"/openapi/v3/entity/dataset/{quote(urn(pick(n)), safe='')}", b""),
        "graphql_entity": graphql(GET_DATASET, lambda n: {"urn": urn(pick(n))}),
        "search": graphql(SEARCH, lambda n: {"query": f"t{pick(n):06d}"}),
        "scroll": lambda n: (
            "POST",
            "/openapi/v3/entity/scroll?" + urlencode({"count": 10, "query": f"t{pick(n):06d}"}),
            b'{"entities": ["dataset"], "aspects": ["datasetProperties"]}',
        ),
        "lineage": graphql(LINEAGE, lineage_variables),
        "timeline": lambda n: ("GET", f"/openapi/v2/timeline/v1/{quote(urn(pick(n)), safe='')}?{timeline}", b""),
    }


async def closed_for(
    base: str, headers: dict[str, str], clients: int, seconds: float, make: RequestFactory
) -> tuple[float, Counter]:
    """`clients` connections sending `make`'s requests back to back for `seconds`: (answers/s, errors)."""
    url = urlsplit(base)
    errors: Counter = Counter()
    answered = 0
    stop_at = time.perf_counter() + seconds
    headers = {k: v for k, v in headers.items() if k.lower() != "content-length"}

    async def client(c: int) -> None:
        nonlocal answered
        conn = HttpConnection(url.hostname or "127.0.0.1", url.port or 80)
        n = c
        try:
            while time.perf_counter() < stop_at:
                method, path, body = make(n)
                status, _, _ = await conn.request(method, path, body, headers)
                answered += 1
                if status >= 300:
                    errors[str(status)] += 1
                n += clients
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return answered / (time.perf_counter() - started), errors


# --- the database's time, and the bare-asyncpg ceiling -------------------------------------------------------------


async def statements(dsn: str) -> list[tuple[int, float, str]]:
    """pg_stat_statements since the last reset, the benchmark's own reads of it left out: (calls, total exec ms,
    the statement's text)."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT calls, total_exec_time AS ms, query FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%' "
            "ORDER BY total_exec_time DESC"
        )
    finally:
        await conn.close()
    return [(r["calls"], r["ms"], " ".join(r["query"].split())) for r in rows]


async def bare_asyncpg(dsn: str, datasets: int, connections: int, seconds: float) -> tuple[float, float, float, float]:
    """The entity GET's statement (AspectRepository.entity_latest: the latest rows of one URN) and the decoding of
    each row's JSON, closed-loop from `connections` connections for `seconds`: (requests/s, p50 ms, p99 ms, CPU ms
    of this process a request)."""
    from app.write.repository import ENTITY_LATEST

    pool = await asyncpg.create_pool(dsn, min_size=connections, max_size=connections)
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def client(c: int) -> None:
        n = c
        async with pool.acquire() as conn:
            prepared = await conn.prepare(ENTITY_LATEST)
            while time.perf_counter() < stop_at:
                started = time.perf_counter()
                for row in await prepared.fetch(urn((n * 7919 + 13) % datasets)):
                    orjson.loads(row["metadata"])
                latencies.append((time.perf_counter() - started) * 1000)
                n += connections

    started, cpu = time.perf_counter(), time.process_time()
    try:
        await asyncio.gather(*(client(c) for c in range(connections)))
    finally:
        cpu = time.process_time() - cpu
        await pool.close()
    elapsed = time.perf_counter() - started
    latencies.sort()
    n = len(latencies)
    return n / elapsed, latencies[n // 2], latencies[int(n * 0.99)], cpu * 1000 / n


# --- profiling ----------------------------------------------------------------------------------------------------


def api_pid(service: Service) -> int:
    """The process py-spy records: under `serve --workers N` the newest API process (the background process is the
    supervisor's oldest child), else the one uvicorn process (the API and its background workers' event loop)."""
    children = [p for p in service.processes()[1:] if p.ppid() == service.process.pid]
    if len(children) < 2:
        return service.process.pid
    return max(children, key=lambda p: p.create_time()).pid


@contextlib.contextmanager
def profiled(pid: int, out: Path | None, seconds: float, *, until_done: bool = False) -> Iterator[None]:
    """py-spy on `pid` for `seconds` (`until_done`: at most, stopped as the block ends) into `out` (None: no
    profile)."""
    if out is None:
        yield
        return
    py_spy = Path(sys.executable).with_name("py-spy")
    argv = [str(py_spy), "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
            "--format", "raw", "--output", str(out), "--nonblocking", "--gil"]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        if until_done:
            process.send_signal(signal.SIGINT)  # py-spy writes what it sampled, then exits
        process.wait(timeout=seconds + 30)


def top_frames(collapsed: Path, limit: int = 12) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """From py-spy's collapsed stacks: the frames holding the most samples themselves, and the app/ functions with the
    most samples under them (each share of every sample, idle ones included)."""
    own: Counter = Counter()
    under: Counter = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        total += samples
        frames = stack.split(";")
        own[_short(frames[-1])] += samples
        for name in {_short(f) for f in frames if "/app/" in f or "(app/" in f}:
            under[name] += samples
    if not total:
        return [], []
    return (
        [(name, 100 * n / total) for name, n in own.most_common(limit)],
        [(name, 100 * n / total) for name, n in under.most_common(limit)],
    )


def _short(frame: str) -> str:
    """`function (path/to/file.py:line)` → `function (file.py)`."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("/site-packages/", "/work/main/", "/lib/python3.11/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{name} ({path})"


# --- the run ------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def service_on(root: Path, backend: str, reuse: bool, workers: int = 0) -> Iterator[Service]:
    """Postgres in `root` (kept there: `reuse` starts it again) and metaledger on it: one process (`workers` 0), or
    `metaledger serve --workers N` (N API processes and the background process, as `make run` serves)."""
    from app.db import upgrade_database
    from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port

    options = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top"}
    pg = EmbeddedPostgres(root / "pg", free_port(), database=None, durable=True, server_options=options)
    pg.start()
    search: subprocess.Popen | None = None
    try:
        dsn = pg.admin_dsn.rsplit("/", 1)[0] + "/bench"
        ensure_database(pg.admin_dsn, "bench")
        url = dsn.replace("postgresql://", "postgresql+asyncpg://")
        if not reuse:
            upgrade_database(url)
        env = {"METALEDGER_DATABASE_URL": url, "METALEDGER_APPLY_MIGRATIONS_ON_START": "false"}
        if backend == "opensearch":
            from tests.search_server import osmem_binary

            port = free_port()
            search = subprocess.Popen(
                [str(osmem_binary()), "-addr", f"127.0.0.1:{port}", "-no-stdin-watch"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            env |= {"METALEDGER_SEARCH_URL": f"http://127.0.0.1:{port}", "METALEDGER_SEARCH_FLAVOR": "opensearch"}
        port = free_port()
        log = root / "service.log"
        process = start_service(env, port, quiet=True, log=log, workers=workers or None)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_healthy_sync(base, 120, process)
            token = service_token(env, "urn:li:corpuser:bench", "writer")
            headers = {"content-type": "application/json", "authorization": f"Bearer {token}"}
            yield Service(base, dsn, headers, process, env, str(root / "pg"), log)
        finally:
            stop_process(process, 30)
    finally:
        if search is not None:
            search.terminate()
            search.wait(10)
        pg.stop()


def line(name: str, served: float, offered: float, r, db_ms: float, bare_p99: float) -> str:
    """A mix's figures: the service's p99 as a multiple of the database's own time per request
    (pg_stat_statements), and of bare asyncpg's p99 for the entity GET's statement (the same run's)."""
    p50, p99 = r.percentile(0.5), r.percentile(0.99)
    ratio = f"{p99 / db_ms:.1f}x" if db_ms > 0 else "-"
    bare = f"  p99/bare-asyncpg p99 {p99 / bare_p99:.1f}x" if bare_p99 else ""
    return (
        f"{name:15} offered {offered:7.1f}/s served {served:7.1f}/s  p50 {p50:7.1f} ms  p99 {p99:7.1f} ms  "
        f"errors {dict(r.errors) or 0}  DB {db_ms:6.2f} ms/request  p99/DB {ratio}{bare}"
    )


async def measure(service: Service, args: argparse.Namespace) -> None:
    reader = service_token(service.env, "urn:li:corpuser:bench-reader", "reader")
    headers = {"content-type": "application/json", "authorization": f"Bearer {reader}"}
    chosen = mixes(args.datasets)
    names = args.mix.split(",") if args.mix else [*chosen, "deadline"]
    profile_dir = Path(args.profile) if args.profile else None
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
    await reset_statements(service.dsn)  # the background workers' own statements (the indexer's poll), idle
    idle_cpu = service.cpu_seconds()
    await asyncio.sleep(IDLE_S)
    idle_cpu = (service.cpu_seconds() - idle_cpu) / IDLE_S  # CPU s a second the service spends with no request
    idle = {text: ms / IDLE_S for _, ms, text in await statements(service.dsn)}
    results: dict[str, float] = {}
    cpu_per_request: dict[str, float] = {}
    ceiling = None
    if "v3get" in names:
        ceiling = await bare_asyncpg(service.dsn, args.datasets, args.connections, args.closed_seconds)
    for name in names:
        if name not in chosen:
            continue
        make = chosen[name]
        await open_loop(service.base, headers, 20, 2, make, connections=8)  # warm: first reads, prepared statements
        clients = args.connections
        most, errors = await closed_for(service.base, headers, clients, args.closed_seconds, make)
        rate = args.rate or max(1.0, most / 2)
        await reset_statements(service.dsn)
        out = profile_dir / f"{name}.txt" if profile_dir else None
        cpu = service.cpu_seconds()
        with profiled(api_pid(service), out, args.seconds):
            r = await open_loop(service.base, headers, rate, args.seconds, make, connections=64)
        cpu_ms = (service.cpu_seconds() - cpu - idle_cpu * args.seconds) * 1000 / max(1, r.ok)
        cpu_per_request[name] = cpu_ms
        ran = [
            (calls, max(0.0, ms - idle.get(text, 0.0) * args.seconds), text)
            for calls, ms, text in await statements(service.dsn)
        ]
        ran.sort(key=lambda s: -s[1])
        db_ms = sum(ms for _, ms, _ in ran) / max(1, r.ok)
        served = r.ok / args.seconds
        results[name] = most
        print(f"{name:15} closed-loop {clients} connections: {most:7.1f}/s, errors {dict(errors) or 0}", flush=True)
        print(line(name, served, rate, r, db_ms, ceiling[2] if ceiling else 0.0) + f"  CPU {cpu_ms:.2f} ms/request")
        for calls, ms, text in ran[:4]:
            print(f"    {calls / max(1, r.ok):5.2f}/request {ms / max(1, calls):6.3f} ms  {text[:120]}")
        if out is not None and out.exists():
            own, under = top_frames(out)
            print("    profile, own samples: " + "; ".join(f"{n} {p:.1f}%" for n, p in own[:8]))
            print("    profile, under app/:   " + "; ".join(f"{n} {p:.1f}%" for n, p in under[:10]))
    if ceiling is not None:
        rate, p50, p99, bare_cpu = ceiling
        print(
            f"bare asyncpg, the entity GET's statement + JSON decode, {args.connections} connections closed-loop: "
            f"{rate:,.0f}/s p50 {p50:.2f} ms p99 {p99:.2f} ms, CPU {bare_cpu:.3f} ms/request; v3 GET closed-loop "
            f"{results['v3get']:,.0f}/s = {100 * results['v3get'] / rate:.0f} % of it; by CPU a request (what a "
            f"busy machine distorts least): {100 * bare_cpu / cpu_per_request['v3get']:.0f} %",
            flush=True,
        )
        if "floor" in results:
            print(
                f"the floor (GET /config: no database) closed-loop {results['floor']:,.0f}/s, CPU "
                f"{cpu_per_request['floor']:.2f} ms/request = {100 * results['floor'] / rate:.0f} % of bare asyncpg; the "
                f"v3 GET is {100 * results['v3get'] / results['floor']:.0f} % of the floor",
                flush=True,
            )
    if "deadline" in names:
        first, _, last = args.starts.partition("-")
        out = profile_dir / "deadline.txt" if profile_dir else None
        with profiled(api_pid(service), out, 600, until_done=True):
            await deadline_walk(service.base, headers, args.datasets, range(int(first), int(last or first) + 1))
        if out is not None and out.exists():
            own, under = top_frames(out)
            print("    profile, own samples: " + "; ".join(f"{n} {p:.1f}%" for n, p in own[:8]))
            print("    profile, under app/:   " + "; ".join(f"{n} {p:.1f}%" for n, p in under[:12]))


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def deadline_walk(base: str, headers: dict[str, str], datasets: int, starts: range) -> None:
    """The 5-hop downstream walk from hub starts (the hubs by their downstreams, round after round: start k is the
    hub ranked k % hubs), each answered whole without a budget, then under a 500 ms budget with its cursor followed
    (at most MAX_PAGES pages): the first page's wall time, every page's, the pages to complete it, and whether the
    pages together are the unbudgeted answer (the same results in the same order: none twice, none missing)."""
    downstreams = Counter(j for i in range(datasets) for j in upstreams_of(i, datasets) if j < hubs(datasets))
    ranked = [hub for hub, _ in downstreams.most_common()]
    firsts: list[float] = []
    walls: list[float] = []
    pages_to_complete: list[int] = []
    equal = 0
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=120) as http:

        async def page(start: str, scroll_id: str | None, budget: dict[str, str]) -> tuple[dict, float]:
            started = time.perf_counter()
            answer = await http.post(
                "/api/graphql",
                json={"query": SCROLL5, "variables": {"urn": start, "scrollId": scroll_id, "count": DEADLINE_PAGE}},
                headers=budget,
            )
            wall = (time.perf_counter() - started) * 1000
            if answer.status_code != 200 or "errors" in answer.json():
                raise RuntimeError(f"5-hop lineage: {answer.status_code} {answer.text[:300]}")
            return answer.json()["data"]["scrollAcrossLineage"], wall

        for k in starts:
            start = urn(ranked[k % len(ranked)])
            # the unbudgeted answer, whole: past 10,000 results (a hub at 100,000 datasets) it takes pages too
            whole, whole_ms = await page(start, None, {})
            expected = [r["entity"]["urn"] for r in whole["searchResults"]]
            after = whole["nextScrollId"]
            while after:
                rest, wall = await page(start, after, {})
                expected += [r["entity"]["urn"] for r in rest["searchResults"]]
                after, whole_ms = rest["nextScrollId"], whole_ms + wall
            first, first_ms = await page(start, None, {DEADLINE: "500"})
            seen = [r["entity"]["urn"] for r in first["searchResults"]]
            cursor, pages, own = first["nextScrollId"], 1, [first_ms]
            while cursor and pages < MAX_PAGES:
                more, wall = await page(start, cursor, {DEADLINE: "500"})
                seen += [r["entity"]["urn"] for r in more["searchResults"]]
                cursor, pages = more["nextScrollId"], pages + 1
                own.append(wall)
            same = not cursor and seen == expected
            equal += same
            firsts.append(first_ms)
            walls += own
            pages_to_complete.append(pages)
            print(
                f"  start {k} ({start}): unbudgeted {whole['total']:,} results in {whole_ms:.0f} ms; with a 500 ms "
                f"budget: first page {first_ms:.0f} ms, partial {first['isPartial']}, {first['count']:,} results; "
                f"{pages} pages ({min(own):.0f}-{max(own):.0f} ms each): {len(seen):,} results, "
                f"{'equal' if same else 'NOT equal'}{' (given up: still a cursor)' if cursor else ''}; pages "
                f"(ms): {','.join(f'{w:.0f}' for w in own)}",
                flush=True,
            )
    print(
        f"5-hop lineage from {len(firsts)} hub starts with a 500 ms budget: first page p50 {_quantile(firsts, 0.5):.0f} "
        f"ms p99 {_quantile(firsts, 0.99):.0f} ms; every page ({len(walls)}) p50 {_quantile(walls, 0.5):.0f} ms p99 "
        f"{_quantile(walls, 0.99):.0f} ms max {max(walls):.0f} ms, {sum(w > 600 for w in walls)} over 600 ms; pages "
        f"to complete {min(pages_to_complete)}-{max(pages_to_complete)} (median "
        f"{_quantile([float(p) for p in pages_to_complete], 0.5):.0f}); equal to the unbudgeted answer: "
        f"{equal}/{len(firsts)}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", type=int, default=100_000)
    parser.add_argument("--backend", choices=("postgres", "opensearch"), default="postgres")
    parser.add_argument("--rate", type=float, default=0, help="requests/s, open loop (0: half the closed-loop most)")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--closed-seconds", type=float, default=5, help="about how long each closed-loop run lasts")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="0: one process (uvicorn); N: `metaledger serve --workers N` (make run: 2)",
    )
    parser.add_argument(
        "--mix", default="", help="comma-separated: " + ", ".join(mixes(1)) + ", deadline (the 5-hop walk)"
    )
    parser.add_argument("--keep", help="keep the loaded Postgres in this directory")
    parser.add_argument("--reuse", help="start from the Postgres --keep left here (no load)")
    parser.add_argument(
        "--starts", default="0-19", help="mix deadline: which hub starts (K-L; start k is the hub ranked k %% hubs)"
    )
    parser.add_argument("--profile", help="py-spy the API process during each open-loop mix, into this directory")
    args = parser.parse_args()
    if args.reuse and args.backend != "postgres":
        parser.error("--reuse: the embedded backend only (the search server keeps nothing)")
    root = Path(args.reuse or args.keep or tempfile.mkdtemp(prefix="metaledger-reads-"))
    root.mkdir(parents=True, exist_ok=True)
    os.chdir(ROOT)
    try:
        with service_on(root, args.backend, bool(args.reuse), args.workers) as service:
            if not args.reuse:
                seconds = asyncio.run(load(service.base, service.headers, args.datasets))
                print(
                    f"load: {args.datasets:,} datasets ({edge_count(args.datasets):,} lineage edges, "
                    f"{FIELD_COUNT} fields each) written and indexed in {seconds:.0f} s",
                    flush=True,
                )
            asyncio.run(measure(service, args))
            problems = service.log_problems()
            if problems:
                print(f"service log: {problems}")
                lines = service.log.read_text(errors="replace").splitlines()
                for i, line in enumerate(lines):  # the first of each: what an operator would look at
                    if '"level":"ERROR"' in line or "Traceback (most recent call last)" in line:
                        print("\n".join(lines[i : i + 30])[:4000])
                        break
    finally:
        if not (args.keep or args.reuse):
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
