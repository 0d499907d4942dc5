"""The SQL of `/runs`. Every statement reaches a run's rows through `ix_metadata_aspect_v2_run` (migration 0011) and
the aspects' own rows through the primary key: none reads the aspect store beyond the run and the aspects it wrote."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from app.db import SessionRepository

RUN_OF = "metadata_run_id(systemmetadata)"  # the expression ix_metadata_aspect_v2_run indexes


@dataclass(frozen=True, slots=True)
class RunSummary:
    run_id: str
    first_seen: datetime
    rows: int


@dataclass(frozen=True, slots=True)
class RunInfo:
    first_seen: datetime
    first_change: datetime | None  # None: the run only re-observed values it found


class RunRepository(SessionRepository):
    @asynccontextmanager
    async def _in_run_order(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection whose statements read a run's rows by walking ix_metadata_aspect_v2_run in order. Left to
        its estimates (a run's share of the store is unknown until ANALYZE has seen it), the planner reads every row
        of the run in a bitmap scan, parsing each one's system metadata again to recheck it, and sorts them: per page,
        the cost of the whole run."""
        conn = await self._conn()
        async with conn.transaction(readonly=True):
            await conn.execute("SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off")
            yield conn

    async def run(self, run_id: str) -> RunInfo | None:
        conn = await self._conn()
        row = await conn.fetchrow("SELECT first_seen, first_change FROM ingestion_run WHERE run_id = $1", run_id)
        return RunInfo(row["first_seen"], row["first_change"]) if row else None

    async def list_runs(self, offset: int, limit: int, include_rolled_back: bool) -> list[RunSummary]:
        """A page of runs, newest first, each with its count of latest rows (the aspects whose current value or
        observation is the run's)."""
        async with self._in_run_order() as conn:
            records = await conn.fetch(
                """
                SELECT r.run_id, r.first_seen,
                       (SELECT count(*) FROM metadata_aspect_v2 m
                        -- in the index's collation (the run table's is "C"): else the index cannot answer it
                        WHERE metadata_run_id(m.systemmetadata) = r.run_id COLLATE "default" AND m.version = 0) AS rows
                FROM (SELECT run_id, first_seen FROM ingestion_run WHERE $3 OR rolled_back_at IS NULL
                      ORDER BY first_seen DESC, run_id OFFSET $1 LIMIT $2) r
                ORDER BY r.first_seen DESC, r.run_id
                """,
                offset,
                limit,
                include_rolled_back,
            )
        return [RunSummary(r["run_id"], r["first_seen"], r["rows"]) for r in records]

    async def describe(self, run_id: str, offset: int, limit: int, include_superseded: bool) -> list[asyncpg.Record]:
        """A page, in (urn, aspect) order, of the aspects whose latest row the run wrote; with `include_superseded`,
        of every aspect it wrote a row of (its latest row, or its earliest history row when a later write or a
        rollback superseded it)."""
        where = f"{RUN_OF} = $1" + ("" if include_superseded else " AND version = 0")
        async with self._in_run_order() as conn:
            return await conn.fetch(
                f"""
                SELECT DISTINCT ON (urn, aspect) urn, aspect, metadata, systemmetadata, createdon
                FROM metadata_aspect_v2 WHERE {where}
                ORDER BY urn, aspect, version OFFSET $2 LIMIT $3
                """,
                run_id,
                offset,
                limit,
            )

    async def written_after(self, run_id: str, after: tuple[str, str], limit: int) -> list[tuple[str, str]]:
        """The next `limit` (urn, aspect) the run wrote a row of, after `after` in (urn, aspect) order."""
        async with self._in_run_order() as conn:
            records = await conn.fetch(
                f"""
                SELECT DISTINCT ON (urn, aspect) urn, aspect FROM metadata_aspect_v2
                WHERE {RUN_OF} = $1 AND (urn, aspect) > ($2::text COLLATE "C", $3::text COLLATE "C")
                ORDER BY urn, aspect, version LIMIT $4
                """,
                run_id,
                after[0],
                after[1],
                limit,
            )
        return [(r["urn"], r["aspect"]) for r in records]

    async def aspect_states(
        self,
        run_id: str,
        rollback_run_id: str,
        first_change: datetime,
        keys: Sequence[tuple[str, str]],
    ) -> list[asyncpg.Record]:
        """For each (urn, aspect): its latest row (`cur_*`, NULL when gone) and the run it was written by; the
        newest history row older than the run's first change (`prev_*`: the value before the run); the aspect's
        oldest `createdon`; whether the run wrote a value of it (`run_wrote`); and whether a value written since the
        run's first change came from elsewhere than the run and its rollback (`foreign`: another writer changed it in
        between). One lookup of each aspect's rows by primary key."""
        conn = await self._conn()
        return await conn.fetch(
            """
            SELECT k.urn, k.aspect,
                   c.metadata AS cur_metadata, c.systemmetadata AS cur_sm, c.createdon AS cur_createdon,
                   metadata_run_id(c.systemmetadata) AS cur_run,
                   p.metadata AS prev_metadata, p.systemmetadata AS prev_sm,
                   a.oldest, a.run_wrote, a.foreign
            FROM unnest($4::text[], $5::text[]) AS k(urn, aspect)
            LEFT JOIN LATERAL (  -- a lookup per key whatever the statistics say (OFFSET 0: not flattened into a join)
                SELECT x.metadata, x.systemmetadata, x.createdon FROM metadata_aspect_v2 x
                WHERE x.urn = k.urn AND x.aspect = k.aspect AND x.version = 0 OFFSET 0
            ) c ON true
            LEFT JOIN LATERAL (
                SELECT h.metadata, h.systemmetadata FROM metadata_aspect_v2 h
                WHERE h.urn = k.urn AND h.aspect = k.aspect AND h.version > 0 AND h.createdon < $3
                ORDER BY h.version DESC LIMIT 1
            ) p ON true
            CROSS JOIN LATERAL (
                SELECT min(x.createdon) AS oldest,
                       coalesce(bool_or(x.createdon >= $3 AND metadata_run_id(x.systemmetadata) = $1), false) AS run_wrote,
                       coalesce(bool_or(x.version > 0 AND x.createdon >= $3
                                        AND metadata_run_id(x.systemmetadata) IS DISTINCT FROM $1
                                        AND metadata_run_id(x.systemmetadata) IS DISTINCT FROM $2), false) AS foreign
                FROM metadata_aspect_v2 x WHERE x.urn = k.urn AND x.aspect = k.aspect
            ) a
            ORDER BY k.urn, k.aspect
            """,
            run_id,
            rollback_run_id,
            first_change,
            [k[0] for k in keys],
            [k[1] for k in keys],
        )

    async def latest_of_entities(self, urns: Sequence[str]) -> list[asyncpg.Record]:
        """The latest row of every aspect of these entities: who wrote each (run, createdon), and the status value."""
        conn = await self._conn()
        return await conn.fetch(
            """
            SELECT urn, aspect, metadata_run_id(systemmetadata) AS run, createdon,
                   CASE WHEN aspect = 'status' THEN metadata END AS status_metadata,
                   CASE WHEN aspect = 'status' THEN systemmetadata END AS status_sm
            FROM metadata_aspect_v2 WHERE urn = ANY($1::text[]) AND version = 0
            ORDER BY urn, aspect
            """,
            list(urns),
        )

    async def mark_rolled_back(self, run_id: str) -> None:
        conn = await self._conn()
        await conn.execute("UPDATE ingestion_run SET rolled_back_at = now() WHERE run_id = $1", run_id)
