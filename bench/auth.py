"""What authentication costs per request, in-process (no network, so nothing else hides it).

    .venv/bin/python bench/auth.py [--requests 5000]

Prints:
- verifying a bearer token that this process has verified in the last AUTH_CACHE_SECONDS (every request but the first
  of a token): µs per request;
- the first verification of a token (signature + its row in Postgres): µs;
- µs per request through the whole FastAPI stack with authentication off and on (alternating, best of two): a reader
  route (GET /openapi/v1/auth/me), one single-aspect write and one batch of 100 writes, and what auth adds.

It starts its own Postgres (a temporary directory, fsync on) and runs the app in this process over ASGI.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.db import upgrade_database  # noqa: E402
from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port  # noqa: E402
from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402
from tests.helpers import mint_token  # noqa: E402


async def per_request(http: httpx.AsyncClient, method: str, path: str, count: int, **kw) -> float:
    """Median over 5 rounds of the mean µs per request."""
    rounds = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(count // 5):
            response = await http.request(method, path, **kw)
            assert response.status_code < 300, response.text
        rounds.append((time.perf_counter() - started) / (count // 5) * 1e6)
    return statistics.median(rounds)


async def measure(url: str, count: int, auth_enabled: bool, tag: str) -> dict[str, float]:
    """µs per request of a reader route, one single-aspect write and one batch of 100, with auth on or off."""
    settings = Settings(database_url=url, apply_migrations_on_start=False, auth_bootstrap_admin_token=False,
                        auth_enabled=auth_enabled, access_log=False)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        headers = {"authorization": f"Bearer {await mint_token(app, 'admin', 'urn:li:corpuser:bench')}"}
        figures = {}
        if auth_enabled:
            auth = app.state.auth
            await auth.authenticate(headers)
            started = time.perf_counter()
            for _ in range(count * 10):
                await auth.authenticate(headers)
            figures["cached"] = (time.perf_counter() - started) / (count * 10) * 1e6
            cold = []
            for _ in range(200):
                auth._tokens.clear()
                started = time.perf_counter()
                await auth.authenticate(headers)
                cold.append((time.perf_counter() - started) * 1e6)
            figures["cold"] = statistics.median(cold)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://m", headers=headers) as http:
            urn = f"urn:li:dataset:(urn:li:dataPlatform:hive,bench.{tag},PROD)"
            single = [{"entityType": "dataset", "entityUrn": urn, "aspectName": "status",
                       "aspect": {"value": {"removed": False}}}]
            batch = [{"entityType": "dataset", "entityUrn": urn.replace(tag, f"{tag}{i}"), "aspectName": "status",
                      "aspect": {"value": {"removed": False}}} for i in range(100)]
            await per_request(http, "POST", "/openapi/v1/proposals", 50, json=single)  # warm-up
            figures["me"] = await per_request(http, "GET", "/openapi/v1/auth/me", count)
            figures["write"] = await per_request(http, "POST", "/openapi/v1/proposals", max(count // 10, 50), json=single)
            figures["batch"] = await per_request(http, "POST", "/openapi/v1/proposals", 50, json=batch)
    return figures


async def run(url: str, count: int) -> None:
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for round_no in range(2):  # alternating, so drift in the machine hits both alike
        for enabled in (False, True):
            runs[enabled].append(await measure(url, count, enabled, f"r{round_no}{int(enabled)}"))

    def best(enabled: bool, key: str) -> float:
        return min(r[key] for r in runs[enabled])

    print(f"token verification, cached (every request but a token's first) : {best(True, 'cached'):8.1f} µs")
    print(f"token verification, first (signature + row in Postgres)      : {best(True, 'cold'):8.1f} µs (median of 200)")
    print(f"{'µs per request (best of 2)':46} {'auth off':>10} {'auth on':>10} {'cost':>8}")
    for key, label in (("me", "GET /openapi/v1/auth/me"), ("write", "one single-aspect write (v1)"),
                       ("batch", "one batch of 100 writes (v1)")):
        off, on = best(False, key), best(True, key)
        print(f"{label:46} {off:10.1f} {on:10.1f} {(on - off) / off:8.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="metaledger-bench-"))
    pg = EmbeddedPostgres(root / "pg", free_port(), database=None, durable=True)
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
