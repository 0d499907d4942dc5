"""What a read costs the app itself: the ASGI app called in-process (no HTTP server, no socket to a client), each
variant's CPU a request (`time.process_time`), rounds interleaved so that a busy machine moves them alike.

    .venv/bin/python bench/reads_in_process.py [--dir DIR] [--requests 2000] [--rounds 5] [--idle-ms 0]
                                               [--variants star,policy,v3get,getDataset,search,read,raw]

A throwaway Postgres (`--dir`: kept there and reused) with 300 datasets of bench/reads.py's shape (50-field schemas,
owners, tags, terms, lineage), the app made and started as `make run`'s API process makes it (background workers
included, the access log off), then `--rounds` rounds of `--requests` requests of each variant:

* star: a Starlette route (no FastAPI) behind every middleware: the app's floor;
* policy: a FastAPI route with the READ policy and nothing else;
* v3get: `GET /openapi/v3/entity/dataset/{urn}`, as a reader;
* getDataset: DataHub's `getDataset` GraphQL query (bench/reads.py's GET_DATASET), as a reader;
* search: `searchAcrossEntities` for one dataset's name with the facets (bench/reads.py's SEARCH), as a reader (the
  rows of a search asked again come from the result cache, as they do between two writes of the index);
* read: the GET's read alone (a pooled connection, the entity reader, the connection given back);
* raw: bare asyncpg on a connection of its own, the GET's statement and each row's JSON decoded.

`--idle-ms`: sleep that long between two requests (the process idle, as a server between requests at a low rate):
the CPU a database round trip costs grows with the idle time before it (the wake-up of an idle virtual CPU is
charged to the syscalls).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, unquote

import asyncpg
import orjson

# The project's root in place of this script's folder: bench/graphql.py would stand for the graphql package the app
# imports in this process.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.reads import GET_DATASET, SEARCH, proposals, urn  # noqa: E402

DATASETS = 300


async def call(app, method: str, path: str, body: bytes = b"", headers: list | None = None) -> int:
    """One request through the whole ASGI app; its status."""
    status = 0

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    raw_path, _, query = path.partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
        "path": unquote(raw_path), "raw_path": raw_path.encode(), "query_string": query.encode(), "root_path": "",
        "headers": [(b"host", b"bench"), *(headers or []), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80), "state": {},
    }  # fmt: skip
    await app(scope, receive, send)
    return status


async def measure(args: argparse.Namespace, dsn: str, env: dict[str, str], loaded: Path) -> None:
    os.environ.update(env)
    from starlette.datastructures import Headers
    from starlette.responses import Response
    from starlette.routing import Route

    from app.api.deps import ALLOW_READ
    from app.api.http import json_response
    from app.db import PooledConnection
    from app.main import create_app
    from app.settings import Settings
    from app.write.reader import EntityReader
    from app.write.repository import ENTITY_LATEST
    from tests.processes import service_token

    app = create_app(Settings())

    @app.get("/bench/policy", dependencies=[ALLOW_READ])
    async def policy() -> Response:
        return json_response({"ok": 1})

    async def star(request) -> Response:
        return Response(b'{"ok":1}', media_type="application/json")

    app.router.routes.append(Route("/bench/star", star))
    async with app.router.lifespan_context(app):
        writer = [(b"authorization", f"Bearer {service_token(env, 'urn:li:corpuser:bench', 'writer')}".encode())]
        reader = [(b"authorization", f"Bearer {service_token(env, 'urn:li:corpuser:reader', 'reader')}".encode())]
        if not loaded.exists():
            for start in range(0, DATASETS, 100):
                body = orjson.dumps(proposals(start, start + 100, DATASETS))
                json = [*writer, (b"content-type", b"application/json")]
                assert await call(app, "POST", "/openapi/v1/proposals", body, json) == 200
            loaded.touch()
        conn = await asyncpg.connect(dsn)
        statement = await conn.prepare(ENTITY_LATEST)

        async def raw(i: int) -> int:
            for row in await statement.fetch(urn(i % DATASETS)):
                orjson.loads(row["metadata"])
            return 200

        principal = await app.state.auth.authenticate(Headers(raw=reader))

        async def read(i: int) -> int:
            async with PooledConnection(app.state.engine) as connection:
                await EntityReader(connection, app.state.registry, principal).entity("dataset", urn(i % DATASETS), None)
            return 200

        def path_of(i: int) -> str:
            return quote(urn(i % DATASETS), safe="")

        variants = {
            "star": lambda i: call(app, "GET", "/bench/star", headers=reader),
            "policy": lambda i: call(app, "GET", "/bench/policy", headers=reader),
            "v3get": lambda i: call(app, "GET", f"/openapi/v3/entity/dataset/{path_of(i)}", headers=reader),
            "getDataset": lambda i: call(
                app,
                "POST",
                "/api/graphql",
                orjson.dumps({"query": GET_DATASET, "variables": {"urn": urn(i % DATASETS)}}),
                [*reader, (b"content-type", b"application/json")],
            ),
            "search": lambda i: call(
                app,
                "POST",
                "/api/graphql",
                orjson.dumps({"query": SEARCH, "variables": {"query": f"t{i % DATASETS:06d}"}}),
                [*reader, (b"content-type", b"application/json")],
            ),
            "read": read,
            "raw": raw,
        }
        chosen = args.variants.split(",")
        for name in chosen:  # warm: prepared statements, caches, the first request's lazy work
            for i in range(20):
                status = await variants[name](i)
                assert status == 200, f"{name}: {status}"
        idle = args.idle_ms / 1000
        cpu: dict[str, list[float]] = {name: [] for name in chosen}
        for _ in range(args.rounds):
            for name in chosen:
                send = variants[name]
                started = time.process_time()
                for i in range(args.requests):
                    if idle:
                        time.sleep(idle)
                    await send(i)
                cpu[name].append((time.process_time() - started) * 1e6 / args.requests)
        await conn.close()
    idle_note = f", {args.idle_ms} ms idle between requests" if idle else ""
    print(f"CPU a request, µs (median of {args.rounds} rounds of {args.requests}{idle_note}; min-max):")
    for name, values in cpu.items():
        print(f"  {name:11} {statistics.median(values):7.0f}   ({min(values):.0f}-{max(values):.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="keep the Postgres here and reuse it")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle-ms", type=float, default=0)
    parser.add_argument("--variants", default="star,policy,v3get,getDataset,search,read,raw")
    args = parser.parse_args()
    from app.db import upgrade_database
    from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port

    root = Path(args.dir or tempfile.mkdtemp(prefix="metaledger-reads-in-process-"))
    fresh = not (root / "pg").exists()
    pg = EmbeddedPostgres(root / "pg", free_port(), database=None, durable=False)
    pg.start()
    try:
        dsn = pg.admin_dsn.rsplit("/", 1)[0] + "/bench"
        ensure_database(pg.admin_dsn, "bench")
        url = dsn.replace("postgresql://", "postgresql+asyncpg://")
        if fresh:
            upgrade_database(url)
        env = {"METALEDGER_DATABASE_URL": url, "METALEDGER_APPLY_MIGRATIONS_ON_START": "false"}
        env["METALEDGER_ACCESS_LOG"] = "false"  # a line to stderr a request: the server's cost, not the app's
        asyncio.run(measure(args, dsn, env, root / "loaded"))
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
