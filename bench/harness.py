"""What the benchmarks share: a throwaway Postgres and a metaledger service on loopback, and the processes' RSS.

with throwaway_service(workers=2) as service:      # Postgres (fsync on) + `metaledger serve --workers 2`
    service.base, service.headers, service.dsn, service.rss_mb()
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.db import upgrade_database  # noqa: E402
from app.embedded_pg import EmbeddedPostgres, ensure_database, free_port  # noqa: E402
from tests.processes import issue_token, start_service, stop_process, wait_healthy_sync  # noqa: E402


@dataclass
class Service:
    base: str
    dsn: str  # asyncpg's DSN of the service's database
    headers: dict[str, str]
    process: subprocess.Popen
    env: dict[str, str] = field(default_factory=dict)
    pg_data: str = ""  # the Postgres data directory (finds its processes)
    log: Path | None = None  # the service's output

    def log_problems(self) -> dict[str, int]:
        """Lines of the service's output an operator would have to look at: tracebacks, unhandled exceptions,
        ERROR and WARNING log lines (by level)."""
        if self.log is None or not self.log.exists():
            return {}
        found: dict[str, int] = {}
        for line in self.log.read_text(errors="replace").splitlines():
            for marker, name in (
                ("Traceback (most recent call last)", "traceback"),
                ("Exception in ASGI application", "unhandled exception"),
                ('"level":"ERROR"', "ERROR"),
                ('"level":"WARNING"', "WARNING"),
            ):
                if marker in line:
                    found[name] = found.get(name, 0) + 1
        return found

    def processes(self) -> list[psutil.Process]:
        """The service's processes: the one started and its descendants (API workers, the background process);
        multiprocessing's resource tracker and the Postgres server are not the service's."""
        try:
            root = psutil.Process(self.process.pid)
            found = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        return [p for p in found if "resource_tracker" not in " ".join(_cmdline(p))]

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the service's processes have used so far (exited workers not counted)."""
        total = 0.0
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                times = p.cpu_times()
                total += times.user + times.system
        return total

    def cpu_seconds_by_role(self) -> dict[str, float]:
        """CPU time (user + system) so far of the service's processes by role: `api` (the API processes together),
        `background` and `supervisor`. Under `serve --workers N` the background process is the supervisor's oldest
        child (app.supervisor starts it before the API processes); one process (`uvicorn app.main:app`) is all `api`."""
        roles = {"api": 0.0, "background": 0.0, "supervisor": 0.0}
        processes = self.processes()
        if not processes:
            return roles
        root, children = processes[0], processes[1:]
        with contextlib.suppress(psutil.Error):
            direct = sorted((p for p in children if p.ppid() == root.pid), key=lambda p: p.create_time())
            background = direct[0].pid if direct else None
            for p in processes:
                times = p.cpu_times()
                if not children or (p.pid != root.pid and p.pid != background):
                    role = "api"
                else:
                    role = "supervisor" if p.pid == root.pid else "background"
                roles[role] += times.user + times.system
        return roles

    def postgres_cpu_seconds(self) -> float:
        """CPU time of the benchmark's Postgres server and its backends so far."""
        return postgres_cpu_seconds(self.pg_data)

    def rss_mb(self) -> list[float]:
        """RSS of each of the service's processes, in MB (largest first)."""
        sizes = []
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                sizes.append(p.memory_info().rss / 1e6)
        return sorted(sizes, reverse=True)


def postgres_cpu_seconds(pg_data: str) -> float:
    """CPU time of the Postgres server of data directory `pg_data` and its backends so far."""
    total = 0.0
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if pg_data and any(pg_data in part for part in p.info["cmdline"] or ()):
                for q in [p, *p.children(recursive=True)]:
                    times = q.cpu_times()
                    total += times.user + times.system
                return total
    return total


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@contextlib.contextmanager
def throwaway_postgres(
    durable: bool = True,
    statements: bool = False,
    server_options: dict[str, str] | None = None,
) -> Iterator[tuple[str, str, str]]:
    """A migrated database in a Postgres of its own (fsync on unless `durable=False`): (asyncpg DSN, SQLAlchemy URL,
    data directory). `statements`: with pg_stat_statements (`top_statements`)."""
    root = Path(tempfile.mkdtemp(prefix="metaledger-bench-"))
    options = (
        {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "all"} if statements else {}
    )
    options.update(server_options or {})
    pg = EmbeddedPostgres(root / "pg", free_port(), database=None, durable=durable, server_options=options)
    pg.start()
    try:
        dsn = pg.admin_dsn.rsplit("/", 1)[0] + "/bench"
        ensure_database(pg.admin_dsn, "bench")
        url = dsn.replace("postgresql://", "postgresql+asyncpg://")
        upgrade_database(url)
        yield dsn, url, str(root / "pg")
    finally:
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def throwaway_service(
    workers: int | None = None,
    auth: bool = True,
    env: dict[str, str] | None = None,
    quiet: bool = True,
    durable: bool = True,
    statements: bool = False,
    server_options: dict[str, str] | None = None,
) -> Iterator[Service]:
    """A throwaway Postgres and metaledger on a free port: one process (`workers=None`, `uvicorn app.main:app`) or
    `metaledger serve --workers N`. With `auth`, requests carry a writer's bearer token."""
    with throwaway_postgres(durable, statements, server_options) as (dsn, url, pg_data):
        service_env = {
            "METALEDGER_DATABASE_URL": url,
            "METALEDGER_APPLY_MIGRATIONS_ON_START": "false",
            "METALEDGER_AUTH_ENABLED": "true" if auth else "false",
            **(env or {}),
        }
        headers = {"content-type": "application/json"}
        if auth:
            headers["authorization"] = f"Bearer {issue_token(service_env, 'urn:li:corpuser:bench', 'writer')}"
        port = free_port()
        log = Path(pg_data).parent / "service.log"
        process = start_service(service_env, port, quiet=quiet, workers=workers, log=None if not quiet else log)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_healthy_sync(base, 120, process)
            yield Service(base, dsn, headers, process, service_env, pg_data, log)
        finally:
            stop_process(process, 30)


async def reset_statements(dsn: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute("SELECT pg_stat_statements_reset()")
    finally:
        await conn.close()


async def top_statements(dsn: str, limit: int = 15) -> list[tuple[float, int, float, str]]:
    """pg_stat_statements since the last reset: (total ms, calls, rows, the statement's first 110 characters)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT total_exec_time + total_plan_time AS ms, calls, rows, query FROM pg_stat_statements "
            "ORDER BY 1 DESC LIMIT $1",
            limit,
        )
    finally:
        await conn.close()
    return [(r["ms"], r["calls"], r["rows"], " ".join(r["query"].split())[:110]) for r in rows]


async def wal_statements(dsn: str, limit: int = 8) -> list[tuple[float, int, str]]:
    """pg_stat_statements since the last reset, by the WAL they wrote: (MB, full-page images, the statement's first
    110 characters). A commit waits for the WAL written before it to reach the disk: WAL volume is latency too."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT wal_bytes / 1e6 AS mb, wal_fpi, query FROM pg_stat_statements ORDER BY wal_bytes DESC LIMIT $1",
            limit,
        )
    finally:
        await conn.close()
    return [(float(r["mb"]), r["wal_fpi"], " ".join(r["query"].split())[:110]) for r in rows]
