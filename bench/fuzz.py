"""Schemathesis over every operation of the committed OpenAPI document, for longer than CI can (tests/fuzz.py has the
checks: no server error, no undocumented status, no schema-violating response).

    .venv/bin/python bench/fuzz.py [--max-examples 10] [--max-time 1800] [--seed N] [--workers 1]

It starts its own Postgres (a temporary directory) and metaledger process, issues an admin token, runs schemathesis
and prints its summary; the exit status is schemathesis's.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.db import upgrade_database  # noqa: E402
from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port  # noqa: E402
from tests.fuzz import fuzz  # noqa: E402
from tests.processes import issue_token, start_service, stop_process, wait_healthy  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-examples", type=int, default=10)
    parser.add_argument("--max-time", type=int, default=1800, help="seconds")
    parser.add_argument("--seed", type=int, default=20261124)
    parser.add_argument(
        "--workers", type=int, default=1, help="schemathesis threads (more hit CPython 3.11.7 gh-106905)"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="metaledger-bench-"))
    pg = EmbeddedPostgres(root / "pg", free_port(), database=None, durable=False)
    pg.start()
    service = None
    try:
        ensure_database(pg.admin_dsn, "fuzz")
        url = pg.admin_dsn.rsplit("/", 1)[0].replace("postgresql://", "postgresql+asyncpg://") + "/fuzz"
        upgrade_database(url)
        env = {
            "METALEDGER_DATABASE_URL": url,
            "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
            "METALEDGER_KAFKA_BOOTSTRAP_SERVERS": "",
            "METALEDGER_ACCESS_LOG": "false",
        }
        port = free_port()
        service = start_service(env, port)
        asyncio.run(wait_healthy(f"http://127.0.0.1:{port}", process=service))
        run = fuzz(
            f"http://127.0.0.1:{port}",
            issue_token(env),
            seed=args.seed,
            max_examples=args.max_examples,
            max_time_s=args.max_time,
            workers=args.workers,
            report_dir=root / "report",
        )
        print(run.failures)
        print(run.summary)
        print(f"requests generated: {run.generated}")
        return run.returncode
    finally:
        stop_process(service)
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
