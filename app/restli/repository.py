"""SQL behind the Rest.li endpoints that the aspect store's repository does not already serve: row counts for
deletes, the interim timeseries store (the outbox's timeseries change logs) and the reference search.

Runs on the asyncpg connection under the request's session, like `app.write.repository.AspectRepository` (and on
the same connection, so these statements join a transaction opened with `AspectRepository.transaction()`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import asyncpg

from app.db import SessionRepository


class RestliRepository(SessionRepository):
    # --- the aspect store -----------------------------------------------------------------------------------------
    async def count_rows(self, urn: str, aspect: str | None = None) -> int:
        """Rows (every version) of an entity, or of one of its aspects."""
        conn = await self._conn()
        if aspect is None:
            return await conn.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", urn)
        return await conn.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = $2", urn, aspect)

    async def rows_mentioning(self, needle: str, exclude_urn: str, aspects: Sequence[str]) -> list[asyncpg.Record]:
        """Latest rows of other entities, among `aspects`, whose JSON contains `needle` (a JSON-escaped URN).
        A scan of the aspect store: there is no reverse index of references yet (the graph index will be one)."""
        conn = await self._conn()
        return await conn.fetch(
            """
            SELECT urn, aspect, metadata, systemmetadata FROM metadata_aspect_v2
            WHERE version = 0 AND urn <> $2 AND aspect = ANY($3::text[]) AND strpos(metadata, $1) > 0
            ORDER BY urn, aspect
            """,
            needle,
            exclude_urn,
            list(aspects),
        )

    # --- the interim timeseries store (the outbox's timeseries change logs) ---------------------------------------
    async def timeseries_pages(
        self, topic: str, urn: str, aspect: str, start: int | None, end: int | None, page: int = 1000
    ) -> AsyncIterator[list[asyncpg.Record]]:
        """(id, version = timestampMillis, payload = MCL JSON) of one aspect's points, newest timestamp first and,
        within one timestamp, newest write first; in pages (keyset on (version, id))."""
        conn = await self._conn()
        after: tuple[int, int] | None = None
        while True:
            records = await conn.fetch(
                """
                SELECT id, version, payload FROM change_log_outbox
                WHERE topic = $1 AND urn = $2 AND aspect = $3
                  AND ($4::bigint IS NULL OR version >= $4) AND ($5::bigint IS NULL OR version <= $5)
                  AND ($6::bigint IS NULL OR (version, id) < ($6, $7))
                ORDER BY version DESC, id DESC LIMIT $8
                """,
                topic, urn, aspect, start, end,
                after[0] if after else None, after[1] if after else None, page,
            )  # fmt: skip
            if records:
                yield records
            if len(records) < page:
                return
            after = (records[-1]["version"], records[-1]["id"])

    async def delete_timeseries(
        self, topic: str, urn: str, aspects: Sequence[str], start: int | None, end: int | None
    ) -> int:
        """Delete the points of an entity's timeseries aspects in [start, end] (either bound optional). Rows not yet
        published to Kafka are deleted too: a deleted point is never published."""
        if not aspects:
            return 0
        conn = await self._conn()
        status = await conn.execute(
            """
            DELETE FROM change_log_outbox
            WHERE topic = $1 AND urn = $2 AND aspect = ANY($3::text[])
              AND ($4::bigint IS NULL OR version >= $4) AND ($5::bigint IS NULL OR version <= $5)
            """,
            topic, urn, list(aspects), start, end,
        )  # fmt: skip
        return int(status.rsplit(" ", 1)[1])
