"""All SQL of the aspect store. The change logs of a write go into the outbox in the same statement, through the
CTE that app.changelog.outbox provides (`insert_cte`, `insert_params`), and so do its audit entries (app.audit).

Bulk statements take parallel arrays (`unnest`) so a batch of any size costs one round trip per statement. They
run on the asyncpg connection under the request's SQLAlchemy session, inside the session's transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson

from app.audit import model as audit_model
from app.audit import repository as audit_log
from app.changelog import outbox as changelog_outbox
from app.changelog.outbox import OutboxRow
from app.db import SessionRepository
from app.registry.runtime import MODELS_ASPECT
from app.write.processors import PIPELINE_ASPECT

LATEST_VERSION = 0


class StaleVersionFloor(Exception):
    """A first insert computed its version from a version floor that a delete committed concurrently has since
    raised (the lock statement read the floor before the delete's commit): the transaction is retried."""


# Errors after which the whole transaction is retried: a first-insert race lost on the primary key, a deadlock,
# a serialization failure, a version floor raised under our feet.
RETRYABLE_DB_ERRORS = (
    asyncpg.exceptions.UniqueViolationError,
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
    StaleVersionFloor,
)


@dataclass(slots=True)
class StoredAspect:
    """One row of `metadata_aspect_v2` (row 0 = latest). `metadata` is the aspect JSON text as stored."""

    urn: str
    aspect: str
    metadata: str
    _system_metadata: dict[str, Any] | str | None
    created_on: datetime
    created_by: str
    created_for: str | None = None
    row_version: int = LATEST_VERSION
    _value: dict[str, Any] | None = field(default=None, repr=False)
    # the stored text of `_system_metadata` once it is parsed: a row copied to history is written back as it was read
    _system_metadata_text: str | None = field(default=None, repr=False)

    # Both JSON columns are parsed on first use: a batch locks rows (key aspects, for one) it never reads.
    @property
    def value(self) -> dict[str, Any]:
        if self._value is None:
            self._value = orjson.loads(self.metadata)
        return self._value

    @property
    def system_metadata(self) -> dict[str, Any]:
        if not isinstance(self._system_metadata, dict):
            if self._system_metadata:
                self._system_metadata_text = self._system_metadata
            self._system_metadata = orjson.loads(self._system_metadata) if self._system_metadata else {}
        return self._system_metadata

    @property
    def created_ms(self) -> int:
        """When this version was written, in epoch milliseconds (`createdon` is stored without a zone, in UTC)."""
        created_on = self.created_on if self.created_on.tzinfo else self.created_on.replace(tzinfo=UTC)
        return int(created_on.timestamp() * 1000)

    @property
    def version(self) -> int:
        """The logical version (`systemMetadata.version`); rows written before versioning count as 1."""
        raw = self.system_metadata.get("version")
        try:
            return int(raw) if raw is not None else max(1, self.row_version)
        except (TypeError, ValueError):
            return max(1, self.row_version)

    def system_metadata_json(self) -> str:
        if isinstance(self._system_metadata, str):
            return self._system_metadata
        if self._system_metadata_text is not None:
            return self._system_metadata_text
        return orjson.dumps(self.system_metadata).decode()

    def as_history(self) -> StoredAspect:
        """This row 0 as the history row it becomes when a new value supersedes it (its logical version's row)."""
        return StoredAspect(
            self.urn,
            self.aspect,
            self.metadata,
            self._system_metadata,
            self.created_on,
            self.created_by,
            self.created_for,
            self.version,
            self._value,
            self._system_metadata_text,
        )


_ROW_COLUMNS = "urn, aspect, version, metadata, systemmetadata, createdon, createdby, createdfor"
# An entity's latest rows, every aspect (the v3 entity GET's statement; bench/reads.py measures it bare)
ENTITY_LATEST = f"SELECT {_ROW_COLUMNS} FROM metadata_aspect_v2 WHERE urn = $1 AND version = 0 ORDER BY aspect"
_OUTBOX_CTE = changelog_outbox.insert_cte(19)  # parameters $19..$25 of write_changes
_OUTBOX_INSERT = changelog_outbox.insert_cte(1)  # a large write's first change logs, on their own
OUTBOX_ROWS_PER_STATEMENT = 500
INSERT_ROWS_PER_STATEMENT = 500  # rows of metadata_aspect_v2, likewise
_ROWS_INSERT = f"""
    INSERT INTO metadata_aspect_v2 ({_ROW_COLUMNS})
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[], $6::timestamp[], $7::text[], $8::text[])
"""
assert changelog_outbox.INSERT_PARAMS == 7, "write_changes numbers its later parameters from $26"
_AUDIT_CTE = audit_log.insert_cte(32)  # the audit entries of the changes, $32..$42 of write_changes
_AUDIT_INSERT = audit_log.insert_cte(1)
# the writes recorded in the audit log under an action of their own (the runtime model set, the processor pipeline)
_AUDITED_ACTIONS = {MODELS_ASPECT: audit_model.MODEL_APPLY, PIPELINE_ASPECT: audit_model.PROCESSOR_CHANGE}


def _to_stored(record: asyncpg.Record) -> StoredAspect:
    urn, aspect, version, metadata, system_metadata, created_on, created_by, created_for = record
    return StoredAspect(urn, aspect, metadata, system_metadata, created_on, created_by, created_for, version)


def _columns(rows: Sequence[StoredAspect], row_version: int | None = None) -> tuple[list, ...]:
    return (
        [r.urn for r in rows],
        [r.aspect for r in rows],
        [r.row_version if row_version is None else row_version for r in rows],
        [r.metadata for r in rows],
        [r.system_metadata_json() for r in rows],
        [r.created_on for r in rows],
        [r.created_by for r in rows],
        [r.created_for for r in rows],
    )


# Row 0 of each (urn, aspect) of the arrays $1 (URNs) and $2 (aspect names).
_ROW0_OF_PAIRS = f"""SELECT m.{_ROW_COLUMNS.replace(", ", ", m.")}
            FROM metadata_aspect_v2 m
            JOIN unnest($1::text[], $2::text[]) AS k(urn, aspect) ON m.urn = k.urn AND m.aspect = k.aspect
            WHERE m.version = 0"""


class AspectRepository(SessionRepository):
    # --- reads -------------------------------------------------------------------------------------------------
    async def latest(
        self,
        keys: Iterable[tuple[str, str]],
        *,
        for_update: bool = False,
        for_share: bool = False,
    ) -> dict[tuple[str, str], StoredAspect]:
        """Row 0 of each (urn, aspect). With `for_update` (`for_share`), the rows are locked (share-locked) in sorted
        key order (no deadlocks between batches that overlap)."""
        ordered = sorted(set(keys))
        if not ordered:
            return {}
        conn = await self._conn()
        records = await conn.fetch(
            f"""
            {_ROW0_OF_PAIRS}
            ORDER BY m.urn, m.aspect
            {"FOR UPDATE OF m" if for_update else "FOR SHARE OF m" if for_share else ""}
            """,
            [k[0] for k in ordered],
            [k[1] for k in ordered],
        )
        return {(r["urn"], r["aspect"]): _to_stored(r) for r in records}

    async def lock_latest(
        self, keys: Iterable[tuple[str, str]], entity_urns: Iterable[str] = ()
    ) -> tuple[dict[tuple[str, str], StoredAspect], dict[tuple[str, str], int]]:
        """The write transaction's lock step, one round trip: row 0 of each (urn, aspect) and of every aspect of
        `entity_urns` (entities the batch deletes), locked `FOR UPDATE` in sorted key order (no deadlocks between
        batches that overlap: the keys in order, each row looked up and locked in its turn; the LATERAL lookup is an
        index lookup whatever the statistics say, where a join was planned as a scan of every row 0 while a young
        table's statistics were stale); and, for the requested keys that have no row 0, their version floor (the highest
        version reached before a delete: a first insert continues from it). The floor is read from this
        statement's snapshot; `write_changes` re-checks it against the committed one."""
        ordered = sorted(set(keys))
        urns = sorted(set(entity_urns))
        if not ordered and not urns:
            return {}, {}
        conn = await self._conn()
        records = await conn.fetch(
            f"""
            WITH keys AS (
                SELECT * FROM unnest($1::text[], $2::text[]) AS k(urn, aspect)
                UNION
                SELECT x.urn, x.aspect FROM unnest($3::text[]) AS d(urn)
                CROSS JOIN LATERAL (
                    SELECT urn, aspect FROM metadata_aspect_v2 x WHERE x.urn = d.urn AND x.version = 0 OFFSET 0
                ) x
            ), locked AS (
                SELECT m.* FROM (SELECT urn, aspect FROM keys ORDER BY urn, aspect) k
                CROSS JOIN LATERAL (
                    SELECT {_ROW_COLUMNS} FROM metadata_aspect_v2 x
                    WHERE x.urn = k.urn AND x.aspect = k.aspect AND x.version = 0
                    FOR UPDATE
                ) m
            )
            SELECT l.*, NULL::bigint AS floor FROM locked l
            UNION ALL
            SELECT f.urn, f.aspect, NULL, NULL, NULL, NULL, NULL, NULL, f.version
            FROM metadata_aspect_version_floor f JOIN keys k ON f.urn = k.urn AND f.aspect = k.aspect
            WHERE f.urn = ANY($4::text[])  -- redundant: lets the planner look the floors up by URN
              AND NOT EXISTS (SELECT 1 FROM locked l WHERE l.urn = f.urn AND l.aspect = f.aspect)
            """,
            [k[0] for k in ordered],
            [k[1] for k in ordered],
            urns,
            sorted({k[0] for k in ordered}.union(urns)),
        )
        rows: dict[tuple[str, str], StoredAspect] = {}
        floors: dict[tuple[str, str], int] = {}
        for r in records:
            if r["floor"] is not None:
                floors[(r["urn"], r["aspect"])] = r["floor"]
            else:
                rows[(r["urn"], r["aspect"])] = _to_stored(r[:8])
        return rows, floors

    async def latest_of_type(self, entity_type: str, aspect: str) -> list[StoredAspect]:
        """Row 0 of `aspect` of every entity of `entity_type` (a few: the access policies), by URN. A range of the
        (version, urn, aspect) index: URNs are "C"-collated, and every URN of the type starts `urn:li:<type>:`."""
        conn = await self._conn()
        prefix = f"urn:li:{entity_type}:"
        records = await conn.fetch(
            f"SELECT {_ROW_COLUMNS} FROM metadata_aspect_v2 WHERE version = 0 AND urn >= $1 AND urn < $2 "
            "AND aspect = $3 ORDER BY urn",
            prefix,
            prefix[:-1] + chr(ord(":") + 1),
            aspect,
        )
        return [_to_stored(r) for r in records]

    async def entity_latest(self, urn: str, aspects: Sequence[str] | None = None) -> list[StoredAspect]:
        conn = await self._conn()
        if aspects:
            records = await conn.fetch(
                f"SELECT {_ROW_COLUMNS} FROM metadata_aspect_v2 WHERE urn = $1 AND version = 0 AND aspect = ANY($2::text[]) ORDER BY aspect",
                urn,
                list(aspects),
            )
        else:
            records = await conn.fetch(ENTITY_LATEST, urn)
        return [_to_stored(r) for r in records]

    async def entities_latest(
        self, wanted: Sequence[tuple[str, Sequence[str] | None]]
    ) -> dict[str, list[StoredAspect]]:
        """Row 0 of several entities in one round trip (batchGet): each (urn, aspects) asks for those aspects of the
        entity, or for all of them when `aspects` is None. URN → its rows, by aspect name."""
        pairs = sorted({(urn, aspect) for urn, aspects in wanted if aspects for aspect in aspects})
        whole = sorted({urn for urn, aspects in wanted if not aspects})
        if not pairs and not whole:
            return {}
        conn = await self._conn()
        records = await conn.fetch(
            f"""
            {_ROW0_OF_PAIRS}
            UNION ALL
            SELECT {_ROW_COLUMNS} FROM metadata_aspect_v2 WHERE urn = ANY($3::text[]) AND version = 0
            ORDER BY 1, 2
            """,
            [p[0] for p in pairs],
            [p[1] for p in pairs],
            whole,
        )
        out: dict[str, dict[str, StoredAspect]] = {}
        for record in records:
            row = _to_stored(record)
            out.setdefault(row.urn, {})[row.aspect] = row  # an aspect asked for both ways comes back twice
        return {urn: list(rows.values()) for urn, rows in out.items()}

    async def versioned(self, urn: str, aspect: str, version: int) -> StoredAspect | None:
        """The aspect at logical version `version`: a history row, or row 0 when it holds that version."""
        conn = await self._conn()
        record = await conn.fetchrow(
            f"""
            SELECT {_ROW_COLUMNS} FROM metadata_aspect_v2
            WHERE urn = $1 AND aspect = $2 AND (version = $3 OR (version = 0 AND CASE
                WHEN strpos(systemmetadata, '\\u0000') > 0 THEN false  -- jsonb refuses a NUL escape (a row written before it was refused)
                ELSE systemmetadata::jsonb ->> 'version' = $4 END))
            ORDER BY version DESC LIMIT 1
            """,
            urn,
            aspect,
            version,
            str(version),
        )
        return _to_stored(record) if record else None

    async def count_rows(self, urn: str, aspect: str | None = None) -> int:
        """Rows (every version) of an entity, or of one of its aspects."""
        conn = await self._conn()
        if aspect is None:
            return await conn.fetchval("SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1", urn)
        return await conn.fetchval(
            "SELECT count(*) FROM metadata_aspect_v2 WHERE urn = $1 AND aspect = $2", urn, aspect
        )

    async def rows_mentioning(self, needle: str, exclude_urn: str, aspects: Sequence[str]) -> list[asyncpg.Record]:
        """Latest rows of other entities, among `aspects`, whose JSON contains `needle` (a JSON-escaped URN).
        A scan of the aspect store: there is no reverse index of references in Postgres."""
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

    async def entity_exists(self, urn: str) -> bool:
        conn = await self._conn()
        return await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM metadata_aspect_v2 WHERE urn = $1 AND version = 0)", urn
        )

    # --- writes ------------------------------------------------------------------------------------------------
    async def write_changes(
        self,
        inserts: Sequence[StoredAspect],
        updates: Sequence[StoredAspect],
        prune: Sequence[tuple[str, str, int]],
        outbox: Sequence[OutboxRow],
        floors: Sequence[tuple[str, str, int]] = (),
    ) -> str | None:
        """One round trip for everything a batch writes: new rows (latest and history), updated latest rows,
        retention of history rows (never row 0), the change logs and the version floors of deleted aspects
        (GREATEST of the stored one). A write of more than OUTBOX_ROWS_PER_STATEMENT change logs inserts the first
        ones in statements of their own before it, in order, and so do more than INSERT_ROWS_PER_STATEMENT new rows: a
        statement's parameters are encoded in one stretch of the event loop (~50 ms for the 4,000 change logs of a
        1,000-dataset batch), and every other request of the process would wait that long. A concurrent first insert surfaces as a unique violation; a first insert whose
        version is not above the committed floor (a concurrent delete raised it after our lock step read it) as
        `StaleVersionFloor`; the caller answers both by retrying the transaction. Returns the transaction's id
        (`pg_current_xact_id()`, None when there was nothing to write): if COMMIT is interrupted, it says whether the
        write landed (app.db.transaction_status).

        The rows to update and prune are found by a LATERAL lookup per key (`OFFSET 0` keeps the planner from
        flattening it into a join) and then reached by ctid: index lookups whatever the table's statistics say. (A
        plain `UPDATE ... FROM unnest(...)` was planned as a scan of every row 0 while a young table's statistics were
        stale.) The row-0 ctids are stable: this transaction holds their locks."""
        if not (inserts or updates or prune or outbox or floors):
            return None
        conn = await self._conn()
        # the audit entries of the changes (app.audit), committed with them; a large write's first ones on their own
        audit = audit_log.change_params(outbox, _AUDITED_ACTIONS)
        while len(audit[0]) > OUTBOX_ROWS_PER_STATEMENT:
            await conn.execute(_AUDIT_INSERT, *(column[:OUTBOX_ROWS_PER_STATEMENT] for column in audit))
            audit = tuple(column[OUTBOX_ROWS_PER_STATEMENT:] for column in audit)
        while len(outbox) > OUTBOX_ROWS_PER_STATEMENT:
            await conn.execute(_OUTBOX_INSERT, *changelog_outbox.insert_params(outbox[:OUTBOX_ROWS_PER_STATEMENT]))
            outbox = outbox[OUTBOX_ROWS_PER_STATEMENT:]
        # the same for the rows (the floor check below covers every first insert, those inserted here too)
        firsts = [r for r in inserts if r.row_version == LATEST_VERSION]
        while len(inserts) > INSERT_ROWS_PER_STATEMENT:
            await conn.execute(_ROWS_INSERT, *_columns(inserts[:INSERT_ROWS_PER_STATEMENT]))
            inserts = inserts[INSERT_ROWS_PER_STATEMENT:]
        u_urn, u_aspect, _, u_metadata, u_sm, u_on, u_by, u_for = _columns(updates)
        stale, txid = await conn.fetchrow(
            f"""
            WITH inserted AS (
                INSERT INTO metadata_aspect_v2 ({_ROW_COLUMNS})
                SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::text[],
                                     $6::timestamp[], $7::text[], $8::text[])
            ), updated AS (
                UPDATE metadata_aspect_v2 m
                SET metadata = u.metadata, systemmetadata = u.sm, createdon = u.createdon,
                    createdby = u.createdby, createdfor = u.createdfor
                FROM unnest($9::text[], $10::text[], $11::text[], $12::text[], $13::timestamp[], $14::text[], $15::text[])
                     AS u(urn, aspect, metadata, sm, createdon, createdby, createdfor)
                CROSS JOIN LATERAL (
                    SELECT x.ctid AS row_id FROM metadata_aspect_v2 x
                    WHERE x.urn = u.urn AND x.aspect = u.aspect AND x.version = 0 OFFSET 0
                ) x
                WHERE m.ctid = x.row_id
            ), pruned AS (
                DELETE FROM metadata_aspect_v2 m
                USING unnest($16::text[], $17::text[], $18::bigint[]) AS r(urn, aspect, cutoff)
                CROSS JOIN LATERAL (
                    SELECT x.ctid AS row_id FROM metadata_aspect_v2 x
                    WHERE x.urn = r.urn AND x.aspect = r.aspect AND x.version > 0 AND x.version <= r.cutoff OFFSET 0
                ) x
                WHERE m.ctid = x.row_id
            ), outboxed AS ({_OUTBOX_CTE}), audited AS ({_AUDIT_CTE}), floored AS (
                INSERT INTO metadata_aspect_version_floor AS f (urn, aspect, version)
                SELECT * FROM unnest($26::text[], $27::text[], $28::bigint[])
                ON CONFLICT (urn, aspect) DO UPDATE SET version = GREATEST(f.version, EXCLUDED.version)
            )
            SELECT (SELECT count(*) FROM unnest($29::text[], $30::text[], $31::bigint[]) AS c(urn, aspect, version)
                    JOIN metadata_aspect_version_floor f ON f.urn = c.urn AND f.aspect = c.aspect
                    WHERE f.version >= c.version AND f.urn = ANY($29::text[])),
                   pg_current_xact_id()::text
            """,
            *_columns(inserts),
            u_urn, u_aspect, u_metadata, u_sm, u_on, u_by, u_for,
            [c[0] for c in prune], [c[1] for c in prune], [c[2] for c in prune],
            *changelog_outbox.insert_params(outbox),
            [f[0] for f in floors], [f[1] for f in floors], [f[2] for f in floors],
            [r.urn for r in firsts], [r.aspect for r in firsts], [r.version for r in firsts],
            *audit,
        )  # fmt: skip
        if stale:
            raise StaleVersionFloor(f"{stale} first inserts are not above their aspect's version floor")
        return txid

    async def delete_aspects(self, keys: Sequence[tuple[str, str]]) -> int:
        """Delete every version of each (urn, aspect)."""
        if not keys:
            return 0
        conn = await self._conn()
        status = await conn.execute(
            """
            DELETE FROM metadata_aspect_v2 m USING unnest($1::text[], $2::text[]) AS k(urn, aspect)
            WHERE m.urn = k.urn AND m.aspect = k.aspect
            """,
            [k[0] for k in keys],
            [k[1] for k in keys],
        )
        return int(status.rsplit(" ", 1)[1])

    async def delete_entities(self, urns: Sequence[str]) -> int:
        """Delete every aspect and version of each entity, raising each aspect's version floor to the latest
        version deleted (also for rows the caller did not lock: a first insert committed in between)."""
        if not urns:
            return 0
        conn = await self._conn()
        return await conn.fetchval(
            """
            WITH deleted AS (
                DELETE FROM metadata_aspect_v2 WHERE urn = ANY($1::text[])
                RETURNING urn, aspect, version, systemmetadata
            ), floored AS (
                INSERT INTO metadata_aspect_version_floor AS f (urn, aspect, version)
                SELECT urn, aspect, max(CASE WHEN version <> 0 THEN version
                                             -- jsonb refuses a NUL escape: such a row (written before it was refused) counts as 1
                                             WHEN strpos(systemmetadata, '\\u0000') > 0 THEN 1
                                             WHEN systemmetadata::jsonb ->> 'version' ~ '^[0-9]{1,18}$'
                                             THEN (systemmetadata::jsonb ->> 'version')::bigint
                                             ELSE 1 END)
                FROM deleted GROUP BY urn, aspect
                ON CONFLICT (urn, aspect) DO UPDATE SET version = GREATEST(f.version, EXCLUDED.version)
            )
            SELECT count(*) FROM deleted
            """,
            list(urns),
        )
