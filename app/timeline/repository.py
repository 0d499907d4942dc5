"""The SQL of the Timeline: an entity's stored versions of some aspects over a time range, and the version floors
that tell a first version from one whose predecessors retention pruned."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from app.db import SessionRepository
from app.write.repository import _ROW_COLUMNS, StoredAspect, _to_stored


class TimelineRepository(SessionRepository):
    async def versions_in_range(
        self, urn: str, aspects: Sequence[str], start: datetime, end: datetime
    ) -> list[StoredAspect]:
        """Every kept version (history rows and row 0) of `aspects` written in [start, end], and for each aspect the
        newest version written before `start`: the value the first change in range is diffed against. Bounded by
        retention: at most RETENTION_MAX_VERSIONS + 1 rows per aspect."""
        if not aspects:
            return []
        conn = await self._conn()
        records = await conn.fetch(
            f"""
            SELECT {_ROW_COLUMNS} FROM (
                SELECT {_ROW_COLUMNS}, createdon < $3 AS before_range,
                       row_number() OVER (PARTITION BY aspect, createdon < $3
                                          ORDER BY version = 0 DESC, version DESC) AS newest
                FROM metadata_aspect_v2
                WHERE urn = $1 AND aspect = ANY($2::text[]) AND createdon <= $4
            ) r
            WHERE NOT before_range OR newest = 1
            """,
            urn,
            list(aspects),
            start,
            end,
        )
        return [_to_stored(r) for r in records]

    async def version_floors(self, urn: str, aspects: Sequence[str]) -> dict[str, int]:
        """The highest version each aspect reached before it was deleted (none: never deleted): its next first
        version is floor + 1, and has no predecessor to diff against."""
        if not aspects:
            return {}
        conn = await self._conn()
        records = await conn.fetch(
            "SELECT aspect, version FROM metadata_aspect_version_floor WHERE urn = $1 AND aspect = ANY($2::text[])",
            urn,
            list(aspects),
        )
        return {r["aspect"]: r["version"] for r in records}
