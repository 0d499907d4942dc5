"""What the audit log costs a write: the same workload with its entries written and not, in one process, alternating.

    .venv/bin/python bench/audit.py [--rounds 2] [--entities 400] [--batches 5] [--singles 50] [--clients 4]

A throwaway Postgres (fsync on, bench/harness.py) and metaledger's app in this process (auth on, its background work
in process, as `serve --workers 1` runs), driven through its ASGI interface by `--clients` concurrent clients:
- batches: each client POSTs `--batches` batches of 100 MCPs (a new version of datasetProperties each) to
  /openapi/v1/proposals;
- singles: each client sends `--singles` one-MCP writes back to back.
Rounds alternate the audit log on and off (off: the write statement inserts no entries, `change_params` answering
none), so that the machine's drift falls on both; with it on, the chain's sealer (app.audit.service.AuditSealer)
runs meanwhile, as the background process would. Prints writes/s of each round, then on/off over all rounds. Without
a quiet machine, compare several rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from unittest import mock

import httpx

BENCH = str(Path(__file__).resolve().parent)
sys.path.insert(0, BENCH)

from harness import throwaway_postgres  # noqa: E402

sys.path[:] = [p for p in sys.path if p != BENCH]  # bench/graphql.py is not the graphql package app imports

from app.audit import repository as audit_log  # noqa: E402
from app.audit.service import AuditSealer  # noqa: E402
from app.auth.model import Role  # noqa: E402
from app.main import create_app  # noqa: E402
from app.settings import Settings  # noqa: E402


def proposal(i: int, revision: int) -> dict:
    return {
        "entityType": "dataset",
        "entityUrn": f"urn:li:dataset:(urn:li:dataPlatform:hive,bench.audit.t{i},PROD)",
        "changeType": "UPSERT",
        "aspectName": "datasetProperties",
        "aspect": {
            "value": {"name": f"t{i}", "description": f"revision {revision}", "customProperties": {}, "tags": []},
            "contentType": "application/json",
        },
    }


def no_entries(changes, actions) -> tuple[list, ...]:
    return tuple([] for _ in range(audit_log.INSERT_PARAMS))


async def phase(http: httpx.AsyncClient, args: argparse.Namespace, revision: int) -> tuple[float, float]:
    """(batch writes/s, single writes/s)."""

    async def batches(client: int) -> None:
        for n in range(args.batches):
            first = (client * args.batches + n) * 100
            body = [proposal((first + k) % args.entities, revision) for k in range(100)]
            response = await http.post("/openapi/v1/proposals", json=body)
            assert response.status_code == 200, response.text

    async def singles(client: int) -> None:
        for n in range(args.singles):
            body = [proposal((client * args.singles + n) % args.entities, revision)]
            response = await http.post("/openapi/v1/proposals", json=body)
            assert response.status_code == 200, response.text

    started = time.perf_counter()
    await asyncio.gather(*(batches(c) for c in range(args.clients)))
    batch_rate = args.clients * args.batches * 100 / (time.perf_counter() - started)
    started = time.perf_counter()
    await asyncio.gather(*(singles(c) for c in range(args.clients)))
    return batch_rate, args.clients * args.singles / (time.perf_counter() - started)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--entities", type=int, default=400)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--singles", type=int, default=50)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    with throwaway_postgres() as (dsn, url, _):
        settings = Settings(database_url=url, apply_migrations_on_start=False, auth_bootstrap_admin_token=False)
        app = create_app(settings)
        async with app.router.lifespan_context(app):
            issued = await app.state.auth.create_token("urn:li:corpuser:bench", Role.WRITER, created_by="bench")
            assert issued is not None
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app),
                base_url="http://metaledger",
                headers={"Authorization": f"Bearer {issued[0]}"},
                timeout=120,
            ) as http:
                await phase(http, argparse.Namespace(**{**vars(args), "batches": 1, "singles": 5}), 0)  # warm up
                rates: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
                for round_no in range(args.rounds):
                    for mode in ("on", "off") if round_no % 2 == 0 else ("off", "on"):
                        revision = len(rates["on"]) + len(rates["off"]) + 1
                        if mode == "on":
                            stop = asyncio.Event()
                            sealer = asyncio.create_task(AuditSealer(settings, app.state.engine).run(stop))
                            rate = await phase(http, args, revision)
                            stop.set()
                            await sealer
                        else:
                            with mock.patch.object(audit_log, "change_params", no_entries):
                                rate = await phase(http, args, revision)
                        rates[mode].append(rate)
                        print(f"round {round_no + 1} audit {mode:>3}: batches {rate[0]:7.0f} writes/s   "
                              f"singles {rate[1]:6.0f} writes/s", flush=True)  # fmt: skip
    on = [sum(r[i] for r in rates["on"]) for i in (0, 1)]
    off = [sum(r[i] for r in rates["off"]) for i in (0, 1)]
    print(f"on/off: batches {on[0] / off[0]:.3f}   singles {on[1] / off[1]:.3f}")


if __name__ == "__main__":
    asyncio.run(main())
