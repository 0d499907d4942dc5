"""The indexing runtime: which backend serves this process, how change logs reach it, and sync indexing.

* `make_backend(settings, registry, engine)`: Elasticsearch/OpenSearch (`app.search.elastic.ElasticBackend`) when
  `search_url` is set, else the embedded Postgres backend (`app.search.postgres.PostgresBackend`).
* `SearchRuntime` (`app.state.search`): the backend plus its start-up state. A backend that cannot start (the search
  server is down) does not stop the service: writes keep committing, sync index updates answer PENDING, reads
  answer 503, and the runtime retries `start()` on the next use (and the worker keeps trying).
* `Indexer`: change logs (MCL JSON, versioned and timeseries topics) → `changes_from_mcl` → `backend.apply`. Used by
  the worker (outbox rows in feed order, app.search.worker) and by sync indexing (a write's own change logs).
* Sync indexing (called by the ingest gateway): a proposal carrying `X-DataHub-Sync-Index-Update: true` (its MCP
  `headers`, case-insensitive, or the HTTP request header of that name, a metaledger extension) has its change logs
  applied to the backend after the commit and before the response. The outcome is UPDATED or PENDING (backend failed or timed out: the write
  stands and the worker catches up), never an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from app.flags import parse_bool
from app.registry import EntityRegistry
from app.search.model import IndexChange, SearchBackend, SearchUnavailable
from app.settings import Settings

log = logging.getLogger("metaledger.search")

SYNC_INDEX_HEADER = "x-datahub-sync-index-update"
INDEX_STATUS_HEADER = "X-Metaledger-Index-Update"
RESTART_INTERVAL_S = 1.0  # a backend that failed to start is retried at most this often (per use)


def make_backend(
    settings: Settings, registry: EntityRegistry, engine: Any, *, refresh: bool | str = "wait_for"
) -> SearchBackend:
    """Elasticsearch/OpenSearch when `search_url` is set, else the embedded Postgres backend (on `engine`).
    `refresh`: Elasticsearch's write refresh ("wait_for" for read-your-writes; False for bulk loaders)."""
    if settings.search_url:
        from app.search.elastic import ElasticBackend

        return ElasticBackend(settings, registry, refresh=refresh)
    from app.search.postgres import PostgresBackend

    return PostgresBackend(settings, registry, engine)


class SearchRuntime:
    """The process's backend and whether it is started; shared by the endpoints, sync indexing and the worker."""

    def __init__(self, settings: Settings, registry: EntityRegistry, backend: SearchBackend) -> None:
        self.settings = settings
        self.registry = registry
        self.backend = backend
        self.started = False
        self.last_error: str | None = None
        self._lock = asyncio.Lock()
        self._next_attempt = 0.0
        self.indexer = Indexer(settings, registry, backend)
        self.sync_timeout_s = settings.search_sync_timeout_s

    @classmethod
    def create(cls, settings: Settings, registry: EntityRegistry, engine: Any) -> SearchRuntime:
        return cls(settings, registry, make_backend(settings, registry, engine))

    async def start(self, *, force: bool = False) -> bool:
        """Start the backend if it is not started; False (and the error kept) when it cannot be reached now."""
        if self.started:
            return True
        async with self._lock:
            if self.started:
                return True
            if not force and time.monotonic() < self._next_attempt:
                return False
            try:
                await asyncio.wait_for(self.backend.start(), timeout=max(self.sync_timeout_s, 30.0))
            except Exception as error:  # noqa: BLE001 - the search server may be down; the service still runs
                self.last_error = f"{type(error).__name__}: {error}"
                self._next_attempt = time.monotonic() + RESTART_INTERVAL_S
                log.warning("search backend unavailable", extra={"error": self.last_error})
                return False
            self.started = True
            self.last_error = None
            return True

    async def ready_backend(self) -> SearchBackend:
        """The started backend, for reads; SearchUnavailable when it cannot be started now."""
        if not await self.start():
            raise SearchUnavailable(self.last_error or "the search backend is not available")
        return self.backend

    async def close(self) -> None:
        try:
            await self.backend.close()
        except Exception as error:  # noqa: BLE001
            log.warning("search backend close failed", extra={"error": f"{type(error).__name__}: {error}"})


@dataclass(slots=True)
class IndexItem:
    """One change log's index changes, and the caller's handle on it (the worker's: its outbox row id)."""

    key: Any
    changes: list[IndexChange]


class Indexer:
    """Change logs → index changes (within the settings' `IndexLimits`) → the backend."""

    def __init__(self, settings: Settings, registry: EntityRegistry, backend: SearchBackend) -> None:
        from app.search.documents import IndexLimits

        self.settings = settings
        self.registry = registry
        self.backend = backend
        self.topics = (settings.topic_mcl_versioned, settings.topic_mcl_timeseries)
        self.limits = IndexLimits.from_settings(settings)

    def changes_of(self, mcl: dict[str, Any]) -> list[IndexChange]:
        """One change log's index changes; raises when they cannot be built."""
        from app.search.documents import changes_from_mcl

        return changes_from_mcl(mcl, self.registry, self.limits)

    def changes(self, mcls: Iterable[dict[str, Any]]) -> list[IndexChange]:
        out: list[IndexChange] = []
        for mcl in mcls:
            try:
                out.extend(self.changes_of(mcl))
            except Exception as error:  # noqa: BLE001 - one unindexable change log must not stop the feed
                log.error(
                    "change log not indexable; skipped",
                    extra={
                        "urn": mcl.get("entityUrn"),
                        "aspect": mcl.get("aspectName"),
                        "error": f"{type(error).__name__}: {error}",
                    },
                )
        return out

    async def apply_isolating(self, items: Sequence[IndexItem]) -> list[tuple[Any, str]]:
        """Apply the items' changes in bulk, in order. A bulk the backend refuses for its data is split in halves, down
        to single items (bulk → one by one, as a consumer isolates a poison record): every other item is applied, in
        order, and the refused ones are returned as (key, reason). Transient errors (app.search.failures.is_transient)
        propagate: nothing is a row's fault then, the caller retries the whole."""
        refused: list[tuple[Any, str]] = []
        await self._apply_split([item for item in items if item.changes], refused)
        return refused

    async def _apply_split(self, items: list[IndexItem], refused: list[tuple[Any, str]]) -> None:
        from app.search.failures import describe, is_transient

        if not items:
            return
        try:
            await self.backend.apply([c for item in items for c in item.changes])
            return
        except Exception as error:  # noqa: BLE001 - sorted below: transient (raise) or the data's (isolate)
            if is_transient(error):
                raise
            if len(items) == 1:
                refused.append((items[0].key, describe(error)))
                return
        middle = len(items) // 2
        await self._apply_split(items[:middle], refused)
        await self._apply_split(items[middle:], refused)

    async def apply_mcls(self, mcls: Sequence[dict[str, Any]]) -> int:
        changes = self.changes(mcls)
        if changes:
            await self.backend.apply(changes)
        return len(changes)

    def mcls_of_rows(self, rows: Iterable[Any]) -> list[dict[str, Any]]:
        """The MCLs among outbox rows (objects with `topic` and `payload`, e.g. `OutboxRow`); platform events are not
        indexed."""
        return [orjson.loads(row.payload) for row in rows if row.topic in self.topics]


# --- sync indexing ----------------------------------------------------------------------------------------------


def wants_sync_index(request_headers: Any, proposals: Iterable[Any]) -> bool:
    """True when the HTTP request or any proposal carries `X-DataHub-Sync-Index-Update: true`."""
    if request_headers is not None and parse_bool(request_headers.get(SYNC_INDEX_HEADER), False, SYNC_INDEX_HEADER):
        return True
    for proposal in proposals:
        for key, value in (getattr(proposal, "headers", None) or {}).items():
            if key.lower() == SYNC_INDEX_HEADER and parse_bool(value, False, SYNC_INDEX_HEADER):
                return True
    return False


@dataclass(slots=True)
class IndexOutcome:
    status: str  # "UPDATED" | "PENDING"
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, **({"error": self.error} if self.error else {})}

    def headers(self) -> dict[str, str]:
        return {INDEX_STATUS_HEADER: self.status}


async def sync_index(runtime: SearchRuntime | None, outbox_rows: Sequence[Any]) -> IndexOutcome:
    """Apply a committed write's change logs to the backend now. Never raises: PENDING when the backend fails."""
    if runtime is None:
        return IndexOutcome("PENDING", "no search backend is configured in this process")
    try:
        mcls = runtime.indexer.mcls_of_rows(outbox_rows)
        if not await runtime.start():
            return IndexOutcome("PENDING", f"search backend unavailable: {runtime.last_error}")
        await asyncio.wait_for(runtime.indexer.apply_mcls(mcls), timeout=runtime.sync_timeout_s)
    except Exception as error:  # noqa: BLE001 - the write stands; the worker catches up
        message = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        log.warning("sync index update failed; pending", extra={"error": message})
        return IndexOutcome("PENDING", message)
    return IndexOutcome("UPDATED")
