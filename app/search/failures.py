"""Indexing failures: change logs the search backend refused, recorded per row, skipped, and retried later.

A change log whose index changes cannot be built, or that the backend refuses for its data (`IndexRefused`, a
Postgres data error, an Elasticsearch item error that is not a capacity one), must not stop indexing: the embedded
worker (app.search.worker) records it in `search_index_failure` (migration 0008) in the same transaction that moves
its cursor past it, and goes on. The row keeps the change log itself (`payload`: retries do not depend on the
outbox's retention), the reason, the attempts, the first and last failure and the next retry, which backs off
exponentially: `search_failure_retry_min_s` * 2^(attempts-1), at most `search_failure_retry_max_s`.

A row leaves the table when a retry indexes it, or when a newer version of the same aspect is indexed (the older
change log no longer matters: apply is order-safe). Readers: the trace API (`searchStorage.writeStatus: ERROR` with
the reason, app.api.search), `/metrics` (`metaledger_indexer_failing_rows`) and `/ready`'s `indexing` check (both
through app.ops.sampler).

What is not a row's fault is never recorded: `is_transient` errors (the backend or the database unreachable,
overloaded, restarting; a schema that does not match the code) hold the worker's position and the batch is retried
whole, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from app.db import SessionRepository
from app.search.model import IndexUnavailable, SearchUnavailable

MAX_REASON_CHARS = 2_000  # a backend's message may quote the value; the table keeps the head of it

# asyncpg errors that are the server's or the deployment's state, not a row's: retry the batch, record nothing.
_TRANSIENT_PG = (
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InterfaceError,  # the connection was closed under us
    asyncpg.exceptions.OperatorInterventionError,  # shutdown, cannot connect now, statement cancelled
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full, out of memory
    asyncpg.exceptions.TransactionRollbackError,  # deadlock, serialization failure
    asyncpg.exceptions.SyntaxOrAccessError,  # a missing table or column: migrations behind the code, not the data
    asyncpg.exceptions.ObjectNotInPrerequisiteStateError,  # lock not available
)
# Elasticsearch statuses that say "not now" rather than "not this document".
_TRANSIENT_STATUSES = frozenset({401, 403, 404, 408, 429})


def is_transient(error: BaseException) -> bool:
    """Whether an indexing error is the backend's or the network's (retry the batch as it is) rather than the data's
    (record the change log that caused it, skip it)."""
    if isinstance(error, (IndexUnavailable, SearchUnavailable, OSError, TimeoutError, ConnectionError, *_TRANSIENT_PG)):
        return True
    try:
        from elasticsearch import ApiError, ConnectionTimeout
        from elasticsearch import ConnectionError as EsConnectionError

        if isinstance(error, (EsConnectionError, ConnectionTimeout)):
            return True
        if isinstance(error, ApiError):
            status = getattr(error.meta, "status", 500)
            return status >= 500 or status in _TRANSIENT_STATUSES
    except ImportError:  # pragma: no cover - the client is a dependency
        pass
    try:
        import sqlalchemy.exc

        if isinstance(
            error, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.TimeoutError, sqlalchemy.exc.InterfaceError)
        ):
            return True
    except ImportError:  # pragma: no cover
        pass
    return False


def describe(error: BaseException) -> str:
    """The reason recorded for a refused change log."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


# --- the table's SQL ------------------------------------------------------------------------------------------------

# Outbox rows ($1 ids, $2 reasons) become failures, copied from the outbox (the change log, its urn/aspect/version);
# a row recorded again (a batch replayed after a crash) counts one more attempt.
_RECORD = """
INSERT INTO search_index_failure AS f (outbox_id, feed_offset, topic, urn, aspect, version, payload, reason, attempts,
                                       first_failed_at, last_failed_at, next_retry_at)
SELECT o.id, o.feed_offset, o.topic, o.urn, o.aspect, o.version, o.payload, r.reason, 1, now(), now(),
       now() + make_interval(secs => $3)
FROM unnest($1::bigint[], $2::text[]) AS r(id, reason) JOIN change_log_outbox o ON o.id = r.id
ON CONFLICT (outbox_id) DO UPDATE
SET reason = EXCLUDED.reason, attempts = f.attempts + 1, last_failed_at = now(),
    next_retry_at = now() + make_interval(secs => least($4, $3 * power(2, least(f.attempts, 60))))
"""

_DUE = """
SELECT outbox_id, feed_offset, topic, urn, aspect, version, payload, attempts FROM search_index_failure
WHERE next_retry_at <= now()
ORDER BY next_retry_at LIMIT $1
FOR UPDATE SKIP LOCKED
"""

_RETRY_FAILED = """
UPDATE search_index_failure AS f
SET reason = r.reason, attempts = f.attempts + 1, last_failed_at = now(),
    next_retry_at = now() + make_interval(secs => least($4, $3 * power(2, least(f.attempts, 60))))
FROM unnest($1::bigint[], $2::text[]) AS r(id, reason)
WHERE f.outbox_id = r.id
"""

# A newer (or the same) version of an aspect is indexed: its older failures no longer matter. Versioned change logs
# only ($4: their topic): every timeseries point is its own document.
_SUPERSEDED = """
DELETE FROM search_index_failure f USING unnest($1::text[], $2::text[], $3::bigint[]) AS a(urn, aspect, version)
WHERE f.urn = a.urn AND f.aspect = a.aspect AND f.version <= a.version AND f.topic = $4
"""


class IndexFailures:
    """`search_index_failure`'s writes, on the worker's connection (inside its transaction)."""

    def __init__(self, retry_min_s: float, retry_max_s: float) -> None:
        self.retry_min_s = max(0.0, float(retry_min_s))
        self.retry_max_s = max(self.retry_min_s, float(retry_max_s))

    async def record(self, conn: asyncpg.Connection, failed: Sequence[tuple[int, str]]) -> None:
        """Record outbox rows (id, reason) as failed: first retry after `retry_min_s`."""
        if failed:
            await conn.execute(
                _RECORD, [i for i, _ in failed], [r for _, r in failed], self.retry_min_s, self.retry_max_s
            )

    async def due(self, conn: asyncpg.Connection, limit: int) -> list[asyncpg.Record]:
        """Failures whose retry is due, locked (`SKIP LOCKED`: another worker takes the others) until the caller's
        transaction ends; in feed order."""
        rows = await conn.fetch(_DUE, limit)
        return sorted(rows, key=lambda r: (r["feed_offset"] is None, r["feed_offset"] or 0, r["outbox_id"]))

    async def retried(
        self, conn: asyncpg.Connection, indexed: Sequence[int], failed: Sequence[tuple[int, str]]
    ) -> None:
        """After a retry: the rows indexed leave the table; the others count an attempt and back off."""
        if indexed:
            await conn.execute("DELETE FROM search_index_failure WHERE outbox_id = ANY($1::bigint[])", list(indexed))
        if failed:
            await conn.execute(
                _RETRY_FAILED, [i for i, _ in failed], [r for _, r in failed], self.retry_min_s, self.retry_max_s
            )

    async def superseded(self, conn: asyncpg.Connection, topic: str, applied: Sequence[tuple[str, str, int]]) -> int:
        """Drop the failures of aspects now indexed at a version at least theirs ((urn, aspect, version) applied)."""
        if not applied:
            return 0
        status = await conn.execute(
            _SUPERSEDED, [a[0] for a in applied], [a[1] for a in applied], [a[2] for a in applied], topic
        )
        return int(status.rsplit(" ", 1)[1])

    @staticmethod
    async def count(conn: asyncpg.Connection) -> int:
        return await conn.fetchval("SELECT count(*) FROM search_index_failure")


class FailureReader(SessionRepository):
    """The failures of one entity, for the trace API (on the request's session)."""

    async def of_urn(self, urn: str) -> dict[str, dict[str, Any]]:
        """aspect -> its newest failing version: version, reason, attempts, first/last failure and next retry."""
        conn = await self._conn()
        rows = await conn.fetch(
            """
            SELECT DISTINCT ON (aspect) aspect, version, reason, attempts, first_failed_at, last_failed_at, next_retry_at
            FROM search_index_failure WHERE urn = $1
            ORDER BY aspect, version DESC
            """,
            urn,
        )
        return {r["aspect"]: dict(r) for r in rows}
