"""What authentication costs per request, in-process (no network, so nothing else hides it).

    .venv/bin/python bench/auth.py [--requests 5000]

Prints:
- verifying a bearer token that this process has verified in the last AUTH_CACHE_SECONDS (every request but the first
  of a token): µs per request;
- the first verification of a token (signature + its row in Postgres): µs;
- the access decision a writer's write gets (`authorize_writes`, a batch of 100): µs per write;
- µs per request through the whole FastAPI stack with authentication off and on: a reader route
  (GET /openapi/v1/auth/me), one single-aspect write and one batch of 100 writes, and what auth adds. Two apps (auth
  off, auth on) run at once on one database and take turns block by block; the medians of the blocks are compared.

It starts its own Postgres (a temporary directory, fsync off: the commit's fsync would hide what is measured) and
runs the apps in this process over ASGI.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

# the repository's root, in place of this script's folder (bench/graphql.py is not the graphql package app imports)
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from app.auth.model import Principal, Role  # noqa: E402
from app.db import upgrade_database  # noqa: E402
from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port  # noqa: E402
from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.write.proposal import Draft  # noqa: E402
from tests.helpers import mint_token  # noqa: E402


async def timed(http: httpx.AsyncClient, method: str, path: str, count: int, **kw) -> float:
    """Mean µs per request over `count` requests."""
    started = time.perf_counter()
    for _ in range(count):
        response = await http.request(method, path, **kw)
        assert response.status_code < 300, response.text
    return (time.perf_counter() - started) / count * 1e6


async def run(url: str, count: int) -> None:
    # Both apps run at once on the same database and take turns, block by block (the order swapped every block), so
    # whatever the machine or the database does meanwhile falls on both alike.
    apps = {}
    for enabled in (False, True):
        apps[enabled] = create_app(
            Settings(
                database_url=url,
                apply_migrations_on_start=False,
                access_log=False,
                auth_bootstrap_admin_token=False,
                auth_enabled=enabled,
            )
        )
    async with apps[False].router.lifespan_context(apps[False]), apps[True].router.lifespan_context(apps[True]):
        headers = {"authorization": f"Bearer {await mint_token(apps[True], 'admin', 'urn:li:corpuser:bench')}"}
        clients = {
            enabled: httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://m", headers=headers)
            for enabled, app in apps.items()
        }

        def proposals(enabled: bool, count: int) -> list[dict]:  # each app writes entities of its own
            return [
                {
                    "entityType": "dataset",
                    "aspectName": "status",
                    "aspect": {"value": {"removed": False}},
                    "entityUrn": f"urn:li:dataset:(urn:li:dataPlatform:hive,bench.auth_{enabled}_{i},PROD)",
                }
                for i in range(count)
            ]

        cases = [
            ("GET /openapi/v1/auth/me", "GET", "/openapi/v1/auth/me", lambda enabled: {}, 100),
            (
                "one single-aspect write (v1)",
                "POST",
                "/openapi/v1/proposals",
                lambda enabled: {"json": proposals(enabled, 1)},
                20,
            ),
            (
                "one batch of 100 writes (v1)",
                "POST",
                "/openapi/v1/proposals",
                lambda enabled: {"json": proposals(enabled, 100)},
                4,
            ),
        ]
        results = {}
        try:
            for label, method, path, body, per_block in cases:
                for enabled in (False, True):
                    await timed(clients[enabled], method, path, per_block, **body(enabled))  # warm-up
                samples: dict[bool, list[float]] = {False: [], True: []}
                blocks = max(count // per_block // 10, 10)
                for block in range(blocks):
                    for enabled in (False, True) if block % 2 == 0 else (True, False):
                        samples[enabled].append(await timed(clients[enabled], method, path, per_block, **body(enabled)))
                results[label] = (statistics.median(samples[False]), statistics.median(samples[True]))
        finally:
            for http in clients.values():
                await http.aclose()

        auth = apps[True].state.auth
        started = time.perf_counter()
        for _ in range(count * 10):
            await auth.authenticate(headers)
        cached = (time.perf_counter() - started) / (count * 10) * 1e6
        cold = []
        for _ in range(200):
            auth._tokens.clear()
            started = time.perf_counter()
            await auth.authenticate(headers)
            cold.append((time.perf_counter() - started) * 1e6)

        # the access decision every write asks (app.auth.service.authorize_writes), for a writer without write
        # scopes: a batch of 100 tag writes, the policies and scopes already read (as within AUTH_CACHE_SECONDS)
        writer = Principal("urn:li:corpuser:bench-writer", Role.WRITER)
        drafts = [
            Draft(i, "dataset", "globalTags", urn=f"urn:li:dataset:(urn:li:dataPlatform:hive,bench.t{i},PROD)")
            for i in range(100)
        ]
        await auth.authorize_writes(writer, drafts)
        started = time.perf_counter()
        for _ in range(count):
            await auth.authorize_writes(writer, drafts)
        decided = (time.perf_counter() - started) / (count * len(drafts)) * 1e6

    print(f"token verification, cached (every request but a token's first) : {cached:8.1f} µs")
    print(
        f"token verification, first (signature + row in Postgres)      : {statistics.median(cold):8.1f} µs (median of 200)"
    )
    print(f"the write's access decision, a writer's batch of 100 (per write)  : {decided:8.2f} µs")
    print(f"{'µs per request (median of interleaved blocks)':46} {'auth off':>10} {'auth on':>10} {'cost':>8}")
    for label, (off, on) in results.items():
        print(f"{label:46} {off:10.1f} {on:10.1f} {(on - off) / off:8.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="metaledger-bench-"))
    # fsync off: a commit's fsync varies by milliseconds and would hide the microseconds measured here
    pg = EmbeddedPostgres(root / "pg", free_port(), database=None, durable=False)
    pg.start()
    try:
        ensure_database(pg.admin_dsn, "bench")
        url = pg.admin_dsn.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://") + "/bench"
        upgrade_database(url)
        asyncio.run(run(url, args.requests))
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
