"""What a batch write costs the API process itself: the ASGI app called in-process (no HTTP server, no socket to a
client, no background work in the process), each variant's CPU an aspect written (`time.process_time`; and the
Postgres server's, its backends' CPU over the same rounds: the write transactions alone), rounds
interleaved so that a busy machine moves them alike. bench/ingest.py's figures are throughput against a raw ceiling
on a shared machine (±15 % between runs); this is the API's own CPU, steady to a few µs.

    .venv/bin/python bench/writes_in_process.py [--batches 40] [--rounds 5]
                                                [--variants v3,v1,raw,v3-abc,floor,essentials]

A throwaway Postgres (fsync off) and the app made as `make run`'s API process makes it (the background workers in a
process of their own: not started here; the access log off). 100 datasets are written once, then each round writes
`--batches` batches of bench/ingest.py's shape (100 `datasetProperties`, a new value each) through each variant:

* v3: `POST /openapi/v3/entity/dataset` (DataHub's v3 batch);
* v1: `POST /openapi/v1/proposals` (MCPs with a run id, as DataHub's ingestion sends them);
* raw: bench/ingest.py's raw ceiling (`write_raw_rows`: the same rows, bare asyncpg on a connection of its own, with
  asyncpg's own container checks, as that bench's client), what the service's figures compare with;
* v3-abc: v3 with asyncpg's own container checks for array parameters (app.db._builtin_containers_as_arrays undone
  for its rounds): what that change saves;
* floor: v3's body POSTed through the same app (every middleware) to a route the bench adds, which parses it
  (orjson) and answers one small JSON: what the framework and the body's parsing cost, with nothing of the write;
* essentials: what any implementation of the contract computes for each aspect of v3's batch, in a bare loop with
  no objects of metaledger's own: the value validated against its schema and encoded, the system metadata, the
  change log with the previous and new values (`build_change_log`), the Entity Change Events of the change and their
  Platform Event envelopes, the audit entry's values, the response's entity; no SQL (the raw variant's client CPU is
  the SQL's part). With floor and raw, a lower bound for the API process's CPU an aspect however the write path
  were arranged.
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
from fastapi import Request, Response  # at module level: the route's annotations are resolved from these globals

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

    from app.changelog.entity_change_events import entity_change_events, platform_event, platform_event_key
    from app.main import create_app
    from app.settings import Settings
    from app.write.mcl import build_change_log
    from app.write.proposal import AuditStamp, ChangeType, Proposal
    from bench.harness import postgres_cpu_seconds
    from tests.processes import service_token

    app = create_app(Settings())

    async def parse_only(request: Request) -> Response:
        items = orjson.loads(await request.body())
        return Response(orjson.dumps({"items": len(items)}), media_type="application/json")

    app.router.add_api_route("/bench/floor", parse_only, methods=["POST"])
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

        async def floor(_: int) -> int:
            return await call(app, "POST", "/bench/floor", v3_body(next(rounds)), headers)

        spec = app.state.registry.aspect("dataset", "datasetProperties")
        previous = {  # each aspect's stored row: its value, the value's text, its system metadata
            dataset_urn(0, i): (
                properties(0, i),
                orjson.dumps(properties(0, i)).decode(),
                {"version": "1", "runId": "no-run-id-provided"},
            )
            for i in range(SIZE)
        }

        async def essentials(_: int) -> int:
            audit = AuditStamp.now("urn:li:corpuser:bench")
            items = orjson.loads(v3_body(next(rounds)))
            entities = []
            for index, item in enumerate(items):
                urn = item["urn"]
                value = spec.validate(item["datasetProperties"]["value"])
                value_json = orjson.dumps(value).decode()
                old_value, old_json, old_sm = previous[urn]
                sm = {"lastObserved": audit.time, "runId": "no-run-id-provided", "lastRunId": old_sm["runId"]}
                sm["version"] = str(int(old_sm["version"]) + 1)
                proposal = Proposal(index, "dataset", urn, "datasetProperties", ChangeType.UPSERT, value=value)
                build_change_log(
                    proposal,
                    change_type=ChangeType.UPSERT,
                    aspect_name="datasetProperties",
                    aspect_json=value_json,
                    system_metadata=sm,
                    previous_json=old_json,
                    previous_system_metadata=old_sm,
                    created=audit,
                )
                for event in entity_change_events(
                    entity_type="dataset",
                    urn=urn,
                    aspect_name="datasetProperties",
                    change_type="UPSERT",
                    previous=old_value,
                    current=value,
                    audit=audit.to_json(),
                ):
                    platform_event_key(event)
                    orjson.dumps(platform_event(event))
                (  # the audit entry's values
                    "aspect.write", audit.actor, None, "bench", urn, "datasetProperties", "UPSERT",
                    int(old_sm["version"]), int(sm["version"]), sm.get("runId"), None,
                )  # fmt: skip
                entities.append({"urn": urn, "datasetProperties": {"value": value, "systemMetadata": sm}})
            orjson.dumps(entities)
            return 200

        raw_conn = await asyncpg.connect(dsn)
        raw_versions = iter(range(1, 10**9))

        async def raw(_: int) -> int:  # bench/ingest.py's raw ceiling: the same rows, bare asyncpg, no service
            version = next(raw_versions)
            urns = [dataset_urn(2, i) for i in range(SIZE)]
            await write_raw_rows(
                raw_conn, urns, [orjson.dumps(properties(version, i)).decode() for i in range(SIZE)], version
            )
            return 200

        variants = {
            "v3": (v3, fast),
            "v1": (v1, fast),
            "v3-abc": (v3, abc),
            "raw": (raw, abc),
            "floor": (floor, fast),
            "essentials": (essentials, fast),
        }
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
