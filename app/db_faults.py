"""What a database error means for the caller, decided by its cause, not by the class that happened to wrap it.

SQLAlchemy wraps asyncpg's errors (`DBAPIError.orig`, whose `__cause__` is asyncpg's), asyncpg raises its own on the
raw connections the write path uses, the socket layer raises `OSError`, and an error raised while cleaning up after
one (a rollback on a dead connection) carries the first as `__context__`. `classify` walks all of those links.
"""

from __future__ import annotations

import enum

import asyncpg
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.errors import ServiceUnavailable

# SQLSTATE classes of faults the caller did not cause and that pass: connection exceptions (08), transaction rollbacks
# past their retries (40: serialization failures, deadlocks), resources (53: too many connections, disk full), operator
# intervention (57: admin shutdown, "the database system is starting up / shutting down", cancellations), system
# errors (58), and a transaction that is read-only because the server is a standby after a failover (25006).
_UNAVAILABLE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_UNAVAILABLE_STATES = frozenset({"25006", "55P03"})  # read-only transaction (failover); lock not available
_NUL_ERRORS = (asyncpg.exceptions.CharacterNotInRepertoireError, asyncpg.exceptions.UntranslatableCharacterError)
_MAX_LINKS = 16


class DatabaseFault(enum.Enum):
    UNAVAILABLE = "unavailable"  # retryable: 503 with Retry-After
    NUL_TEXT = "nul_text"  # text Postgres cannot hold (\u0000): the request's fault, a 400


def classify(error: BaseException) -> DatabaseFault | None:
    """The fault behind `error`, or None when no database fault is (a bug: the caller's 500). Text Postgres cannot
    hold wins over a fault met while cleaning up after it."""
    found: DatabaseFault | None = None
    for link in _chain(error):
        if isinstance(link, _NUL_ERRORS):
            return DatabaseFault.NUL_TEXT
        if found is None and _is_unavailable(link):
            found = DatabaseFault.UNAVAILABLE
    return found


def database_unavailable(error: BaseException) -> ServiceUnavailable:
    """The retryable answer to a fault: names the error closest to the cause (asyncpg's rather than its wrapper)."""
    cause = next((link for link in reversed(_chain(error)) if _is_unavailable(link)), error)
    return ServiceUnavailable(f"the database is unavailable ({type(cause).__name__}: {str(cause)[:200]}); retry")


def _is_unavailable(error: BaseException) -> bool:
    if isinstance(error, (OSError, PoolTimeout, DisconnectionError)):  # OSError: refused, reset, connect timeout
        return True
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, asyncpg.PostgresError):
        state = getattr(error, "sqlstate", None) or ""
        return state[:2] in _UNAVAILABLE_CLASSES or state in _UNAVAILABLE_STATES
    # A pooled connection that received the server's FATAL ("terminating connection") while idle is left in the
    # protocol state 2 (PROTOCOL_ERROR_CONSUME) until the socket's end arrives: used in between, asyncpg says so.
    if isinstance(error, asyncpg.exceptions.InternalClientError):
        return "another operation (2) is in progress" in str(error)
    # asyncpg's own "connection is closed" (a statement on a connection the server dropped); its subclasses are
    # client-side mistakes, not faults
    return type(error) is asyncpg.InterfaceError and "closed" in str(error)


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and every error behind it (`orig`, `__cause__`, `__context__`, a group's members), each once."""
    seen: list[BaseException] = []
    todo = [error]
    while todo and len(seen) < _MAX_LINKS:
        link = todo.pop(0)
        if any(link is s for s in seen):
            continue
        seen.append(link)
        todo.extend(
            e for e in (getattr(link, "orig", None), link.__cause__, link.__context__) if isinstance(e, BaseException)
        )
        if isinstance(link, BaseExceptionGroup):
            todo.extend(link.exceptions)
    return seen
