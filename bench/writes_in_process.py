"""What a batch write costs the API process itself: the ASGI app called in-process (no HTTP server, no socket to a
client, no background work in the process), each variant's CPU an aspect written (`time.process_time`; and the
Postgres server's, its backends' CPU over the same rounds: the write transactions alone), rounds
interleaved so that a busy machine moves them alike. bench/ingest.py's figures are throughput against a raw ceiling
on a shared machine (±15 % between runs); this is the API's own CPU, steady to a few µs.

    .venv/bin/python bench/writes_in_process.py [--batches 40] [--rounds 5] [--variants v3,v1,raw,v3-abc]

A throwaway Postgres (fsync off) and the app made as `make run`'s API process makes it (the background workers in a
process of their own: not started here; the access log off). 100 datasets are written once, then each round writes
`--batches` batches of bench/ingest.py's shape (100 `datasetProperties`, a new value each) through each variant:

* v3: `POST /openapi/v3/entity/dataset` (DataHub's v3 batch);
* v1: `POST /openapi/v1/proposals` (MCPs with a run id, as DataHub's ingestion sends them);
* raw: bench/ingest.py's raw ceiling (`write_raw_rows`: the same rows, bare asyncpg on a connection of its own, with
  asyncpg's own container checks, as that bench's client), what the service's figures compare with;
* v3-abc: v3 with asyncpg's own container checks for array parameters (app.db._builtin_containers_as_arrays undone
  for its rounds): what that change saves.
"""

from __future__ import annotations

import argparse
import asyncio
import collections.abc
import os
import statistics
import sys
import time
from pathlib import Path

import asyncpg
import orjson

sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.ingest import dataset_urn, mcp, properties, write_raw_rows  # noqa: E402
from bench.reads_in_process import call  # noqa: E402

SIZE = 100


def v3_body(round_no: int) -> bytes:
    return orjson.dumps(
        [{"urn": dataset_urn(0, i), "datasetProperties": {"value": properties(round_no, i)}} for i in range(SIZE)]
    )


def v1_body(round_no: int) -> bytes:
    return orjson.dumps([mcp(dataset_urn(1, i), properties(round_no, i)) for i in range(SIZE)])


async def measure(args: argparse.Namespace, env: dict[str, str], dsn: str, pg_data: str) -> None:
    os.environ.update(env)
    from asyncpg.protocol import protocol

    from app.main import create_app
    from app.settings import Settings
    from bench.harness import postgres_cpu_seconds
    from tests.processes import service_token

    app = create_app(Settings())
    abc = (collections.abc.Iterable, collections.abc.Sized, collections.abc.Mapping)
    async with app.router.lifespan_context(app):
        # as the engine's creation (in the lifespan, app.db.create_engine) set them
        fast = (protocol.IterableABC, protocol.SizedABC, protocol.MappingABC)
        assert fast != abc, "app.db.create_engine no longer sets asyncpg's array containers"
        token = service_token(env, "urn:li:corpuser:bench", "writer")
        headers = [(b"authorization", f"Bearer {token}".encode()), (b"content-type", b"application/json")]
        rounds = iter(range(1, 10**9))

        async def v3(_: int) -> int:
            return await call(app, "POST", "/openapi/v3/entity/dataset", v3_body(next(rounds)), headers)

        async def v1(_: int) -> int:
            return await call(app, "POST", "/openapi/v1/proposals", v1_body(next(rounds)), headers)

        raw_conn = await asyncpg.connect(dsn)
        raw_versions = iter(range(1, 10**9))

        async def raw(_: int) -> int:  # bench/ingest.py's raw ceiling: the same rows, bare asyncpg, no service
            version = next(raw_versions)
            urns = [dataset_urn(2, i) for i in range(SIZE)]
            await write_raw_rows(
                raw_conn, urns, [orjson.dumps(properties(version, i)).decode() for i in range(SIZE)], version
            )
            return 200

        variants = {"v3": (v3, fast), "v1": (v1, fast), "v3-abc": (v3, abc), "raw": (raw, abc)}
        chosen = args.variants.split(",")
        for name in chosen:  # warm: the entities' first versions, prepared statements, compiled validators
            for i in range(3):
                assert await variants[name][0](i) == 200, name
        cpu: dict[str, list[float]] = {name: [] for name in chosen}
        pg: dict[str, list[float]] = {name: [] for name in chosen}
        for _ in range(args.rounds):
            for name in chosen:
                send, checks = variants[name]
                protocol.IterableABC, protocol.SizedABC, protocol.MappingABC = checks
                started, pg_started = time.process_time(), postgres_cpu_seconds(pg_data)
                for i in range(args.batches):
                    assert await send(i) == 200, name
                writes = args.batches * SIZE
                cpu[name].append((time.process_time() - started) * 1e6 / writes)
                pg[name].append((postgres_cpu_seconds(pg_data) - pg_started) * 1e6 / writes)
        protocol.IterableABC, protocol.SizedABC, protocol.MappingABC = fast
        await raw_conn.close()
    print(
        f"CPU an aspect written, µs (median of {args.rounds} rounds of {args.batches} batches of {SIZE}; min-max), the "
        "API process and Postgres (its write transactions; no background work runs):"
    )
    for name in chosen:
        api, db = cpu[name], pg[name]
        print(
            f"  {name:7} API {statistics.median(api):6.1f}   ({min(api):.1f}-{max(api):.1f})   "
            f"Postgres {statistics.median(db):6.1f}   ({min(db):.1f}-{max(db):.1f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--variants", default="v3,v1,raw")
    args = parser.parse_args()
    from bench.harness import throwaway_postgres

    with throwaway_postgres(durable=False) as (dsn, url, pg_data):
        env = {
            "METALEDGER_DATABASE_URL": url,
            "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
            "METALEDGER_BACKGROUND_IN_PROCESS": "false",
            "METALEDGER_ACCESS_LOG": "false",
        }
        asyncio.run(measure(args, env, dsn, pg_data))


if __name__ == "__main__":
    main()
