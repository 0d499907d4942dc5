"""The `idempotency_key` table (migration 0019): one row per (actor, key), shared by every worker and instance.

A row is a claim while `done` is false: the request that holds it (`holder`) is running, until `lease_until` (about
the write deadline: a claim whose process died frees its key then, unless its write committed). `committed` is set by
the write's own transaction (app.idempotency.commit). Once answered it holds the reply (`status`, `headers`, `body`;
no status: the write was applied but its reply is not known, or was over `MAX_STORED_REPLY_BYTES`) until
`expires_at` (METALEDGER_IDEMPOTENCY_WINDOW_S after the claim; a claim still running is kept past it until answered
or its lease lapses). Expired rows are purged a few at a time by the claims themselves (bounded work, no duty of its
own)."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

import asyncpg
import orjson
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

MAX_STORED_REPLY_BYTES = 1_048_576  # a write's reply is small (a result per proposal); past this it is not kept
_PURGE_PER_CLAIM = 20  # expired rows each claim deletes: bounded, and faster than keys are taken

_CLAIM = text(
    """
    INSERT INTO idempotency_key AS k (actor, key, digest, holder, done, committed, lease_until, expires_at)
    VALUES (:actor, :key, :digest, :holder, false, false, now() + make_interval(secs => :lease_s),
            now() + make_interval(secs => :window_s))
    ON CONFLICT (actor, key) DO UPDATE
       SET digest = EXCLUDED.digest, holder = EXCLUDED.holder, done = false, committed = false,
           lease_until = EXCLUDED.lease_until, expires_at = EXCLUDED.expires_at, status = NULL, headers = NULL,
           body = NULL
     WHERE (k.expires_at < now() AND (k.done OR k.lease_until < now()))
        OR (NOT k.done AND NOT k.committed AND k.lease_until < now() AND k.digest = EXCLUDED.digest)
    RETURNING k.holder
    """
)
_LOCK_TIMEOUT = text("SET LOCAL lock_timeout = 200")  # ms
_HELD = text(
    """
    SELECT digest, done OR (committed AND lease_until < now()) AS done, status, headers, body,
           extract(epoch FROM lease_until - now()) AS lease_left_s
      FROM idempotency_key WHERE actor = :actor AND key = :key
    """
)
_PURGE = text(
    """
    DELETE FROM idempotency_key WHERE (actor, key) IN (
        SELECT actor, key FROM idempotency_key WHERE expires_at < now() AND (done OR lease_until < now())
         ORDER BY expires_at LIMIT :n FOR UPDATE SKIP LOCKED)
    """
)
_ANSWER = text(
    """
    UPDATE idempotency_key SET done = true, lease_until = NULL, status = :status, headers = :headers, body = :body
     WHERE actor = :actor AND key = :key AND holder = :holder
    """
)
_RELEASE = text(
    "DELETE FROM idempotency_key WHERE actor = :actor AND key = :key AND holder = :holder AND NOT done AND NOT committed"
)
_APPLIED = text(
    "UPDATE idempotency_key SET done = true, lease_until = NULL "
    "WHERE actor = :actor AND key = :key AND holder = :holder AND NOT done AND committed"
)


@dataclass(frozen=True, slots=True)
class Reply:
    """A reply as sent: its status, its headers as the response carried them, its body."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass(frozen=True, slots=True)
class Claimed:
    """The key is this request's: run it, then `answer` or `release`."""

    holder: uuid.UUID


@dataclass(frozen=True, slots=True)
class Answered:
    """The same request was answered within the window: `reply`, or None when it was applied but its reply was over
    MAX_STORED_REPLY_BYTES."""

    reply: Reply | None


@dataclass(frozen=True, slots=True)
class InFlight:
    """The same request holds the key now (its lease has `lease_left_s` to run)."""

    lease_left_s: int


@dataclass(frozen=True, slots=True)
class OtherRequest:
    """The key was used with another request within the window."""


Claim = Claimed | Answered | InFlight | OtherRequest


class IdempotencyStore:
    def __init__(self, engine: AsyncEngine, window_s: float, lease_s: float) -> None:
        self.engine, self.window_s, self.lease_s = engine, window_s, lease_s

    async def claim(self, actor: str, key: str, digest: bytes) -> Claim:
        """Take the key for this request (new, expired, or a dead claim of the same request), or say who has it."""
        holder = uuid.uuid4()
        params = {
            "actor": actor,
            "key": key,
            "digest": digest,
            "holder": holder,
            "lease_s": self.lease_s,
            "window_s": self.window_s,
        }
        async with self.engine.begin() as conn:
            # the row is locked while the key's write transaction marks it (app.idempotency.commit): in flight
            await conn.execute(_LOCK_TIMEOUT)
            try:
                taken = (await conn.execute(_CLAIM, params)).first()
            except DBAPIError as error:
                if not _lock_not_available(error):
                    raise
                return InFlight(math.ceil(self.lease_s))
            await conn.execute(_PURGE, {"n": _PURGE_PER_CLAIM})
            if taken is not None:
                return Claimed(holder)
            # the upsert locked the row it did not take: what it holds is settled until this transaction ends
            row = (await conn.execute(_HELD, {"actor": actor, "key": key})).one()
        if bytes(row.digest) != digest:
            return OtherRequest()
        if not row.done:
            return InFlight(max(1, math.ceil(row.lease_left_s)))
        if row.status is None:
            return Answered(None)
        headers = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in orjson.loads(row.headers)]
        return Answered(Reply(row.status, headers, bytes(row.body)))

    async def answer(self, actor: str, key: str, holder: uuid.UUID, reply: Reply | None) -> None:
        """Keep `reply` for the key's window (None: applied, the reply over the cap and not kept)."""
        stored: dict[str, object] = {"status": None, "headers": None, "body": None}
        if reply is not None:
            headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in reply.headers]
            stored = {"status": reply.status, "headers": orjson.dumps(headers).decode(), "body": reply.body}
        async with self.engine.begin() as conn:
            await conn.execute(_ANSWER, {"actor": actor, "key": key, "holder": holder, **stored})

    async def release(self, actor: str, key: str, holder: uuid.UUID) -> None:
        """The request failed: free the key, a retry runs again; unless its write committed (the failure came after
        COMMIT, or during it), then the key answers that it was applied."""
        params = {"actor": actor, "key": key, "holder": holder}
        async with self.engine.begin() as conn:
            await conn.execute(_RELEASE, params)
            await conn.execute(_APPLIED, params)


def _lock_not_available(error: DBAPIError) -> bool:
    cause: BaseException | None = error.orig
    while cause is not None:
        if isinstance(cause, asyncpg.exceptions.LockNotAvailableError):
            return True
        cause = cause.__cause__
    return False
