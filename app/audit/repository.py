"""All SQL of the audit log (table `audit_log`, chain state `audit_chain`; migration 0020).

- The write path's entries: a CTE of the write statement (`insert_cte`, `change_params`), one entry per aspect change
  whose change log carries an attribution (`OutboxRow.caller`), so an entry commits exactly when its change does.
- Other entries (`record`): on the connection, and so in the transaction, of what they record.
- The chain (`seal`): entries get their position and hash after commit, in the order their commits are seen, as the
  sequencer gives the outbox's rows their feed offsets after commit (app.changelog.outbox.sequence): a pass takes
  the committed entries without a position (those of a pass in id order) and chains them after the last one, one
  sealer at a time (`pg_advisory_xact_lock(CHAIN_LOCK)`). An entry whose transaction commits later gets a later
  position, whatever its id: nothing is ever chained before an entry already sealed, so the chain only grows at its
  end (unlike the feed's offsets, positions need not follow ids: no reader pages the log by id). Writers never wait
  for each other, nor for a sealer, on the chain: an insert touches the primary key and the partial index of
  unsealed entries only.
- `purge`: the oldest sealed entries past the retention, a prefix of the chain; the hash of the last one deleted
  becomes the chain's anchor, from which `verify` starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import asyncpg
import orjson
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.audit.model import (
    ASPECT_WRITE,
    ENTRY_COLUMNS,
    STORED_COLUMNS,
    AuditedChange,
    Entry,
    attribution,
    entry_hash,
)
from app.db import driver_connection

CHAIN_LOCK = 0x4D4C0030  # the class of metaledger's advisory locks ("ML" + n, see app.changelog.outbox)

# DataHub's system metadata keys a change log carries: the write's trace id (app.ingest.trace) and the surface an
# attributed gateway stamps (app.ingest.gateway.ORIGIN_KEY: an MCP tool, the web view)
_TRACE_KEY = "telemetryTraceId"
_ORIGIN_KEY = "metaledger.origin"

_COLUMNS = ", ".join(STORED_COLUMNS)


class Change(Protocol):
    """A change log as the write path inserts it (app.changelog.outbox.OutboxRow)."""

    urn: str
    aspect: str
    change_type: str
    audited: AuditedChange | None


# --- the write path's entries ------------------------------------------------------------------------------------

INSERT_PARAMS = 11


def insert_cte(first_param: int) -> str:
    """The body of a CTE inserting the entries of `change_params`, its parameters numbered from `$first_param`."""
    p = [f"${first_param + i}" for i in range(INSERT_PARAMS)]
    return f"""
                INSERT INTO audit_log ({", ".join(ENTRY_COLUMNS[:-1])})
                SELECT * FROM unnest({p[0]}::text[], {p[1]}::text[], {p[2]}::text[], {p[3]}::text[], {p[4]}::text[],
                                     {p[5]}::text[], {p[6]}::text[], {p[7]}::bigint[], {p[8]}::bigint[],
                                     {p[9]}::text[], {p[10]}::text[])
            """


def change_params(changes: Sequence[Change], actions: Mapping[str, str]) -> tuple[list, ...]:
    """The parameter arrays of `insert_cte`: an entry per attributed change log (`actions`: the action of a write of
    these aspects; any other is ASPECT_WRITE). The actor, run, trace and versions are those of the change log."""
    columns: tuple[list, ...] = tuple([] for _ in range(INSERT_PARAMS))
    for change in changes:
        audited = change.audited
        if audited is None:
            continue
        system_metadata = audited.system_metadata
        properties = _object(system_metadata.get("properties"))
        origin = _text(properties.get(_ORIGIN_KEY))
        values = (
            actions.get(change.aspect, ASPECT_WRITE),
            audited.actor,
            audited.caller.token_id,
            origin.partition(":")[0] if origin else audited.caller.surface,
            change.urn,
            change.aspect,
            change.change_type,
            _version(audited.previous_system_metadata or {}),
            None if change.change_type == "DELETE" else _version(system_metadata),
            _text(system_metadata.get("runId")),
            _text(properties.get(_TRACE_KEY)),
        )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    return columns


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _version(system_metadata: Mapping[str, Any]) -> int | None:
    raw = system_metadata.get("version")
    return int(raw) if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= 18 else None


# --- other entries -----------------------------------------------------------------------------------------------


async def record(conn: asyncpg.Connection, entry: Entry) -> None:
    """Insert one entry on `conn` (inside its transaction when one is open there). Its token and surface, when the
    entry does not name them, are the current request's."""
    by = attribution()
    await conn.execute(
        f"INSERT INTO audit_log ({', '.join(ENTRY_COLUMNS)}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        entry.action,
        entry.actor,
        entry.token_id if entry.token_id is not None else by.token_id,
        entry.surface if entry.surface is not None else by.surface,
        entry.urn,
        entry.aspect,
        entry.change_type,
        entry.version_before,
        entry.version_after,
        entry.run_id,
        entry.trace_id,
        orjson.dumps(entry.detail).decode() if entry.detail is not None else None,
    )


async def record_on(connection: AsyncConnection, entry: Entry) -> None:
    """`record` on a SQLAlchemy connection, in its transaction."""
    await record(driver_connection(await connection.get_raw_connection()), entry)


async def record_alone(engine: AsyncEngine, entry: Entry) -> None:
    """`record` in a transaction of its own (what it records committed in one this module cannot join)."""
    async with engine.begin() as connection:
        await record_on(connection, entry)


# --- the chain ---------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class ChainState:
    last_seq: int  # the last position given
    last_hash: str
    anchor_seq: int  # positions up to this one were purged
    anchor_hash: str  # the hash of the last entry purged (GENESIS: none)


async def chain_state(conn: asyncpg.Connection, *, for_update: bool = False) -> ChainState:
    row = await conn.fetchrow(
        "SELECT last_seq, last_hash, anchor_seq, anchor_hash FROM audit_chain WHERE id = 1"
        + (" FOR UPDATE" if for_update else "")
    )
    return ChainState(*row)


async def seal(conn: asyncpg.Connection, limit: int) -> int:
    """Give up to `limit` committed, unsealed entries their positions and hashes, in id order, after the chain's last
    (after any other sealer's pass: a reader that seals first then finds every entry committed before it sealed); the
    number sealed."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1::bigint)", CHAIN_LOCK)
        rows = await conn.fetch(
            f"""
            SELECT {_COLUMNS} FROM audit_log WHERE seq IS NULL ORDER BY id LIMIT $1
            """,
            limit,
        )
        if not rows:
            return 0
        state = await chain_state(conn, for_update=True)
        seqs, hashes = [], []
        previous = state.last_hash
        for offset, row in enumerate(rows, start=1):
            entry = dict(row)
            entry["seq"] = state.last_seq + offset
            previous = entry_hash(previous, entry)
            seqs.append(entry["seq"])
            hashes.append(previous)
        await conn.execute(
            """
            UPDATE audit_log a SET seq = s.seq, hash = s.hash
            FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS s(id, seq, hash) WHERE a.id = s.id
            """,
            [row["id"] for row in rows],
            seqs,
            hashes,
        )
        await conn.execute("UPDATE audit_chain SET last_seq = $1, last_hash = $2 WHERE id = 1", seqs[-1], previous)
        return len(rows)


async def sealed_between(conn: asyncpg.Connection, after: int, upto: int, limit: int) -> list[asyncpg.Record]:
    """Sealed entries at positions in (after, upto], in chain order (what `verify` walks)."""
    return await conn.fetch(
        f"SELECT {_COLUMNS} FROM audit_log WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3",
        after,
        upto,
        limit,
    )


@dataclass(slots=True)
class EntryQuery:
    """A page of sealed entries after position `after`, each filter exact (None: any)."""

    after: int = 0
    count: int = 100
    actor: str | None = None
    urn: str | None = None
    action: str | None = None
    since: datetime | None = None  # at or after
    until: datetime | None = None  # before


async def entries(conn: asyncpg.Connection, query: EntryQuery) -> list[asyncpg.Record]:
    conditions: list[str] = ["seq > $1"]
    params: list[object] = [query.after]
    for column, op, value in (
        ("actor", "=", query.actor),
        ("urn", "=", query.urn),
        ("action", "=", query.action),
        ("at", ">=", query.since),
        ("at", "<", query.until),
    ):
        if value is not None:
            params.append(value)
            conditions.append(f"{column} {op} ${len(params)}")
    params.append(query.count)
    return await conn.fetch(
        f"SELECT {_COLUMNS} FROM audit_log WHERE {' AND '.join(conditions)} ORDER BY seq LIMIT ${len(params)}",
        *params,
    )


async def purge(conn: asyncpg.Connection, retention_s: float, chunk: int = 5000) -> int:
    """Delete the chain's oldest entries written more than `retention_s` seconds ago — a prefix of the chain, up to
    the first younger one — and keep the hash of the last one deleted as the chain's anchor. Returns how many."""
    deleted = 0
    while True:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1::bigint)", CHAIN_LOCK)  # after a seal under way
            state = await chain_state(conn, for_update=True)
            rows = await conn.fetch(
                """
                SELECT seq, hash, at < now() - make_interval(secs => $2) AS old
                FROM audit_log WHERE seq > $1 ORDER BY seq LIMIT $3
                """,
                state.anchor_seq,
                retention_s,
                chunk,
            )
            doomed = []
            for row in rows:
                if not row["old"]:
                    break
                doomed.append(row)
            if not doomed:
                return deleted
            last = doomed[-1]
            await conn.execute("DELETE FROM audit_log WHERE seq > $1 AND seq <= $2", state.anchor_seq, last["seq"])
            await conn.execute(
                "UPDATE audit_chain SET anchor_seq = $1, anchor_hash = $2 WHERE id = 1", last["seq"], last["hash"]
            )
            deleted += len(doomed)
        if len(doomed) < chunk:
            return deleted
