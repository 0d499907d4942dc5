"""`/ready`: whether this process can serve writes now, and which part cannot.

    {"status": "ready" | "not ready",
     "checks": {"database": {...}, "migrations": {...}, "broker": {...}, "registry": {...}, "indexing": {...}}}

Every check has `ok`; the answer is ready when all but `indexing` and `replicas` are ok (both are informational:
indexing's lag and failures are reported, a lagging index or change logs the backend refused do not take the service
out of rotation; `replicas`, with METALEDGER_READ_DATABASE_URLS, names each read replica and its state: one out of
rotation leaves its reads to the primary, which serves them). The database and the migrations
are one statement on the ops connection (`SELECT version_num FROM alembic_version`) within `ready_timeout_s`; the
broker (when `kafka_bootstrap_servers` is set) and an external schema registry are asked at most every
`ready_cache_s`, each within `ready_timeout_s`. A process stopping on SIGTERM (app.ops.drain) adds
`"process": {"ok": false, "error": ...}`: a load balancer takes it out of rotation.
"""

from __future__ import annotations

import ast
import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any

import httpx

from app.db import MIGRATIONS_DIR
from app.ops.sampler import OutboxSampler
from app.registry import EntityRegistry
from app.replicas import ReplicaPool
from app.settings import Settings

_INFORMATIONAL = ("indexing", "replicas")  # reported, never a reason to be out of rotation


@cache
def migration_heads() -> frozenset[str]:
    """The head revision(s) of migrations/, read once per process: the revisions no other revision revises. Read from
    the scripts' `revision` and `down_revision` assignments, as Alembic declares them, without importing Alembic and
    every script (a process that applies no migration would pay ~0.4 s for it)."""
    revised: set[str] = set()
    revisions: set[str] = set()
    for script in (MIGRATIONS_DIR / "versions").glob("*.py"):
        for node in ast.parse(script.read_bytes(), str(script)).body:
            if isinstance(node, ast.Assign):
                target = node.targets[0]
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                target = node.target
            else:
                continue
            if isinstance(target, ast.Name) and target.id in ("revision", "down_revision") and node.value is not None:
                value = ast.literal_eval(node.value)
                if target.id == "revision":
                    revisions.add(value)
                elif value is not None:
                    revised.update((value,) if isinstance(value, str) else value)
    return frozenset(revisions - revised)


class _Cached:
    """A check's last result, reused for `ttl_s`."""

    def __init__(self, ttl_s: float, probe: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self.ttl_s = ttl_s
        self.probe = probe
        self.result: dict[str, Any] | None = None
        self.expires = 0.0
        self._lock = asyncio.Lock()

    async def get(self) -> dict[str, Any]:
        async with self._lock:
            if self.result is None or time.monotonic() >= self.expires:
                self.result = await self.probe()
                self.expires = time.monotonic() + self.ttl_s
            return self.result


def _error(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "no answer within the readiness timeout"
    return f"{type(error).__name__}: {error}"[:300]


class Readiness:
    def __init__(
        self,
        settings: Settings,
        sampler: OutboxSampler,
        registry: EntityRegistry | None,
        schema_registry: Any,
        replicas: ReplicaPool | None = None,
    ) -> None:
        self.settings = settings
        self.replicas = replicas
        self.sampler = sampler
        self.registry = registry
        self.schema_registry_url = settings.schema_registry_url
        self.timeout_s = settings.ready_timeout_s
        self.heads: frozenset[str] | None = None
        self.background: Any = None  # app.background.Background, once started (indexing figures)
        self.stopping: str | None = None  # why the process is going away (app.ops.drain): then it is not ready
        self._broker = _Cached(settings.ready_cache_s, self._probe_broker)
        self._external_registry = _Cached(settings.ready_cache_s, self._probe_external_registry)

    async def start(self) -> None:
        self.heads = await asyncio.to_thread(migration_heads)

    async def check(self) -> tuple[bool, dict[str, Any]]:
        database, migrations = await self._database()
        checks = {
            "database": database,
            "migrations": migrations,
            "broker": await self._broker_check(),
            "registry": await self._registry(database["ok"]),
            "indexing": self._indexing(),
        }
        if self.replicas is not None:
            checks["replicas"] = self.replicas.describe()
        if self.stopping is not None:
            checks["process"] = {"ok": False, "error": self.stopping}
        ready = all(check["ok"] for name, check in checks.items() if name not in _INFORMATIONAL)
        return ready, {"status": "ready" if ready else "not ready", "checks": checks}

    async def _database(self) -> tuple[dict[str, Any], dict[str, Any]]:
        started = time.perf_counter()
        try:
            rows = await self.sampler.run_on_connection(
                lambda conn: conn.fetch("SELECT version_num FROM alembic_version")
            )
        except Exception as error:  # noqa: BLE001 - readiness reports every failure
            message = _error(error)
            return {"ok": False, "error": message}, {"ok": False, "error": "the database cannot be read"}
        database = {"ok": True, "latencyMs": round((time.perf_counter() - started) * 1000, 2)}
        current = sorted(r["version_num"] for r in rows)
        heads = sorted(self.heads or migration_heads())
        migrations: dict[str, Any] = {"ok": current == heads, "current": current, "head": heads}
        if current != heads:
            migrations["error"] = (
                f"the database is at revision {', '.join(current) or 'none'}, the code needs "
                f"{', '.join(heads)}: run `metaledger db upgrade`"
            )
        return database, migrations

    async def _broker_check(self) -> dict[str, Any]:
        if not self.settings.kafka_bootstrap_servers:
            return {"ok": True, "configured": False}
        return await self._broker.get()

    async def _probe_broker(self) -> dict[str, Any]:
        from aiokafka.client import AIOKafkaClient

        servers = self.settings.kafka_bootstrap_servers
        client = AIOKafkaClient(
            bootstrap_servers=servers,
            client_id=f"{self.settings.kafka_client_id}-ready",
            request_timeout_ms=int(self.timeout_s * 1000),
        )
        try:
            async with asyncio.timeout(self.timeout_s):
                await client.bootstrap()
            brokers = len(client.cluster.brokers())
            return {"ok": True, "configured": True, "bootstrapServers": servers, "brokers": brokers}
        except Exception as error:  # noqa: BLE001
            return {"ok": False, "configured": True, "bootstrapServers": servers, "error": _error(error)}
        finally:
            try:
                await asyncio.wait_for(client.close(), timeout=self.timeout_s)
            except Exception:  # noqa: BLE001 - closing a client that never connected
                pass

    async def _registry(self, database_ok: bool) -> dict[str, Any]:
        result: dict[str, Any] = {"ok": self.registry is not None}
        if self.registry is None:
            result["error"] = "the entity registry is not loaded"
        else:
            result["counts"] = self.registry.counts()
        if self.schema_registry_url:
            schema_registry = await self._external_registry.get()
        else:  # metaledger's own, in Postgres
            schema_registry = {"ok": database_ok, "type": "internal"}
            if not database_ok:
                schema_registry["error"] = "its tables are in the database, which cannot be read"
        result["schemaRegistry"] = schema_registry
        result["ok"] = result["ok"] and schema_registry["ok"]
        return result

    async def _probe_external_registry(self) -> dict[str, Any]:
        assert self.schema_registry_url is not None  # probed only when one is set (`check`)
        url = self.schema_registry_url.rstrip("/")
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as http:
                response = await http.get(f"{url}/subjects")
            if response.status_code >= 400:
                return {"ok": False, "type": "external", "url": url, "error": f"answered {response.status_code}"}
            return {"ok": True, "type": "external", "url": url}
        except Exception as error:  # noqa: BLE001
            return {"ok": False, "type": "external", "url": url, "error": _error(error)}

    def _indexing(self) -> dict[str, Any]:
        """Informational: never makes the service not ready, however far behind or however many change logs fail.
        A refused change log is one entity's search copy (recorded, retried; trace says ERROR): refusing traffic
        would turn it into an outage of reads and writes that are fine. Alert on `metaledger_indexer_failing_rows`
        and the lag instead."""
        if self.settings.kafka_bootstrap_servers:
            return {"ok": True, "mode": "spark", "note": "indexing is the Spark job's (it reports its own metrics)"}
        result: dict[str, Any] = {"ok": True, "mode": "embedded"}
        sample = self.sampler.latest
        if sample is not None:
            result.update(
                lagRows=sample.indexer_lag,
                lagSeconds=round(sample.indexer_lag_s or 0.0, 3),
                failingRows=sample.failing_rows,
                sampleAgeSeconds=round(sample.age_s, 3),
            )
            if sample.failing_rows:
                result.update(
                    oldestFailureSeconds=round(sample.failing_age_s or 0.0, 3), lastFailure=sample.last_failure
                )
        worker = find_worker(self.background, "IndexWorker")
        if worker is not None:
            result.update(
                failures=worker.failures,
                failedRows=worker.rows_failed,
                retriedRows=worker.retries_indexed,
                appliedRows=worker.applied_rows,
            )
            search_error = getattr(getattr(worker, "runtime", None), "last_error", None)
            if search_error:
                result["searchError"] = search_error
        return result


def find_worker(background: Any, name: str) -> Any:
    for worker in getattr(background, "workers", None) or ():
        if type(worker).__name__ == name:
            return worker
    return None
