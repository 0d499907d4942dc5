"""The plans of the embedded search backend's statements (`app.search.postgres`) on a large index: EXPLAIN (ANALYZE,
BUFFERS) of every statement one `search` call runs, with the time of each.

    .venv/bin/python bench/search_plans.py --data /tmp/plans [--entities 100000] [--revision head] [--keep]

A Postgres of its own under `--data` (kept between runs with `--keep`, so a second run skips the load), migrated to
`--revision`, with `--entities` datasets applied through `PostgresBackend.apply` (datasetKey + datasetProperties,
as bench/graphql.py writes them: 10,000 on platform snowflake, the rest spread over three others; every 50th
soft-deleted). Then, for each search (a selective text query, the same with a platform filter, a text query that
matches every document, the filter-only browse of bench/graphql.py): each statement's plan and execution time.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.db import create_engine, upgrade_database  # noqa: E402
from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port  # noqa: E402
from app.registry import load_registry  # noqa: E402
from app.search.model import AspectFields, Criterion  # noqa: E402
from app.search.postgres import PostgresBackend  # noqa: E402
from app.settings import Settings  # noqa: E402

SELECTED = 10_000
OTHERS = ("hive", "bigquery", "postgres")


def platform_of(i: int) -> str:
    return "snowflake" if i < SELECTED else OTHERS[i % len(OTHERS)]


def changes(start: int, stop: int) -> list[AspectFields]:
    out: list[AspectFields] = []
    for i in range(start, stop):
        platform = platform_of(i)
        urn = f"urn:li:dataset:(urn:li:dataPlatform:{platform},bench.t{i:06d},PROD)"
        out.append(
            AspectFields(
                "dataset",
                urn,
                "datasetKey",
                1,
                {"platform": f"urn:li:dataPlatform:{platform}", "name": f"bench.t{i:06d}", "origin": "PROD"},
            )
        )
        out.append(
            AspectFields(
                "dataset",
                urn,
                "datasetProperties",
                1,
                {"name": f"t{i:06d}", "description": f"orders table {i} of the benchmark"},
            )
        )
        if i % 50 == 49:
            out.append(AspectFields("dataset", urn, "status", 1, {"removed": True}))
    return out


class Explaining:
    """A driver connection whose reads are run under EXPLAIN (ANALYZE, BUFFERS) first; the plans are kept."""

    def __init__(self, conn: Any, plans: list[tuple[str, str]]) -> None:
        self._conn, self._plans = conn, plans

    async def _explain(self, sql: str, args: tuple[Any, ...]) -> None:
        rows = await self._conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", *args)
        self._plans.append((" ".join(sql.split())[:160], "\n".join(r[0] for r in rows)))

    async def fetch(self, sql: str, *args: Any) -> Any:
        await self._explain(sql, args)
        return await self._conn.fetch(sql, *args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        await self._explain(sql, args)
        return await self._conn.fetchval(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def searches() -> dict[str, dict[str, Any]]:
    browse = (
        (
            Criterion("platform", ("urn:li:dataPlatform:hive",)),
            Criterion("origin", ("PROD",)),
            Criterion("removed", ("true",), negated=True),
        ),
    )
    return {
        "selective text query 't012345'": {"query": "t012345"},
        "selective text query 't012345', platform filter": {
            "query": "t012345",
            "filters": {"platform": ["urn:li:dataPlatform:hive"]},
        },
        "exact name 'bench.t012345'": {"query": "bench.t012345"},
        "text query matching every document 'orders'": {"query": "orders"},
        "filter-only browse '*' (platform, origin, not removed)": {"query": "*", "any_of": browse},
    }


async def run(url: str, entities: int, load: bool) -> None:
    registry = load_registry(Settings().registry_path)
    engine = create_engine(url)
    backend = PostgresBackend(Settings(database_url=url), registry, engine)
    if load:
        started = time.perf_counter()
        for start in range(0, entities, 2_000):
            await backend.apply(changes(start, min(start + 2_000, entities)))
        async with engine.connect() as connection:
            raw = (await connection.get_raw_connection()).driver_connection
            await raw.execute("VACUUM ANALYZE search_document")
        print(f"loaded {entities:,} documents in {time.perf_counter() - started:.1f}s", flush=True)
    plain = backend._connection

    for name, kwargs in searches().items():
        plans: list[tuple[str, str]] = []

        @asynccontextmanager
        async def explaining(*, readonly: bool = True, _plans: list = plans):
            async with plain(readonly=readonly) as conn:
                yield Explaining(conn, _plans)

        await backend.search("dataset", kwargs.pop("query"), count=10, facets=False, **kwargs)  # warm the cache
        backend._connection = explaining  # type: ignore[method-assign]
        query = searches()[name]
        page = await backend.search("dataset", query.pop("query"), count=10, facets=False, **query)
        backend._connection = plain  # type: ignore[method-assign]
        print(f"\n=== {name}: {page.total} matches, {len(page.hits)} hits")
        for sql, plan in plans:
            print(f"--- {sql}\n{plan}")
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--revision", default="head")
    parser.add_argument(
        "--keep", action="store_true", help="leave the Postgres running (and its data) for the next run"
    )
    args = parser.parse_args()
    pg = EmbeddedPostgres(args.data, free_port(), database=None, durable=False)
    fresh = not (args.data / "data" / "PG_VERSION").exists()
    pg.start()
    try:
        ensure_database(pg.admin_dsn, "plans")
        url = pg.url("plans")
        upgrade_database(url, args.revision)
        asyncio.run(run(url, args.entities, load=fresh))
    finally:
        if not args.keep:
            pg.stop()


if __name__ == "__main__":
    main()
