"""app.db_faults.classify on constructed exceptions, wrapped as SQLAlchemy, asyncpg and the socket layer wrap them."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.exc import DBAPIError, DisconnectionError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.db_faults import DatabaseFault, classify, database_unavailable

UNAVAILABLE = DatabaseFault.UNAVAILABLE


def wrapped(cause: BaseException, *, invalidated: bool = False) -> DBAPIError:
    """As SQLAlchemy's asyncpg dialect raises it: a DBAPIError whose `orig` is the adapted error, caused by asyncpg's."""
    adapted = Exception(f"<class '{type(cause).__name__}'>: {cause}")
    adapted.__cause__ = cause
    return DBAPIError("COMMIT", None, adapted, connection_invalidated=invalidated)


def raised_while_handling(first: BaseException, second: BaseException) -> BaseException:
    try:
        try:
            raise first
        except BaseException:
            raise second  # noqa: B904 - the implicit context (__context__) is what the faults are read through
    except BaseException as error:
        return error


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.exceptions.CannotConnectNowError("the database system is shutting down"),
        asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
        asyncpg.exceptions.ReadOnlySQLTransactionError("cannot execute INSERT in a read-only transaction"),
        asyncpg.exceptions.SerializationError("could not serialize access due to concurrent update"),
        asyncpg.exceptions.TooManyConnectionsError("sorry, too many clients already"),
        asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout"),
        asyncpg.InterfaceError("connection is closed"),
        asyncpg.exceptions.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
        ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 5432)"),
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError(),
        PoolTimeout("QueuePool limit of size 10 overflow 10 reached, connection timed out, timeout 5.00"),
        DisconnectionError("the server closed this pooled connection"),
        wrapped(asyncpg.exceptions.CannotConnectNowError("the database system is shutting down")),
        wrapped(asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation")),
        DBAPIError("SELECT 1", None, Exception("gone"), connection_invalidated=True),
        raised_while_handling(asyncpg.exceptions.AdminShutdownError("terminating connection"), RuntimeError("cleanup")),
        ExceptionGroup("tasks", [ValueError("unrelated"), ConnectionResetError(104, "reset")]),
    ],
    ids=lambda e: type(e).__name__,
)
def test_faults_of_the_database_are_unavailable(error: BaseException) -> None:
    assert classify(error) is UNAVAILABLE


@pytest.mark.parametrize(
    "error",
    [
        ValueError("a bug"),
        asyncpg.exceptions.UniqueViolationError("duplicate key value violates unique constraint"),
        asyncpg.exceptions.UndefinedTableError('relation "metadata_aspect_v2" does not exist'),
        asyncpg.InterfaceError("cannot perform operation: another operation is in progress"),
        asyncpg.exceptions.InternalClientError("cannot switch to state 15; another operation (12) is in progress"),
        asyncpg.exceptions.DataError("invalid input for query argument $1"),
        wrapped(asyncpg.exceptions.SyntaxOrAccessError("syntax error at or near")),
        IntegrityError("INSERT", None, Exception("not null")),
    ],
    ids=lambda e: type(e).__name__,
)
def test_other_errors_are_no_fault(error: BaseException) -> None:
    assert classify(error) is None


def test_text_postgres_cannot_hold_is_the_request_s_fault_even_behind_a_cleanup_fault() -> None:
    nul = wrapped(asyncpg.exceptions.CharacterNotInRepertoireError('invalid byte sequence for encoding "UTF8": 0x00'))
    assert classify(nul) is DatabaseFault.NUL_TEXT
    assert (
        classify(asyncpg.exceptions.UntranslatableCharacterError("\\u0000 cannot be converted"))
        is DatabaseFault.NUL_TEXT
    )
    assert classify(raised_while_handling(nul, ConnectionResetError(104, "reset"))) is DatabaseFault.NUL_TEXT


def test_a_cycle_of_causes_ends() -> None:
    first, second = ValueError("a"), KeyError("b")
    first.__context__, second.__context__ = second, first
    assert classify(first) is None


def test_the_answer_names_the_cause_not_its_wrapper() -> None:
    answer = database_unavailable(
        wrapped(asyncpg.exceptions.CannotConnectNowError("the database system is starting up"))
    )
    assert answer.status_code == 503
    assert answer.headers() == {"Retry-After": "1"}
    assert "CannotConnectNowError: the database system is starting up" in answer.message


def test_the_kafka_consumers_retry_a_batch_on_every_database_fault_and_on_nothing_else() -> None:
    # A batch applied while the database restarts is retried whole, never dead-lettered: the consumers ask the same
    # classification as the HTTP answers (a fault missing from a list of their own sent records to the FMCP topic).
    from app.errors import ServiceUnavailable, ValidationFailed
    from app.kafka.consumers import is_transient

    for fault in (
        wrapped(asyncpg.exceptions.ConnectionDoesNotExistError("closed in the middle of operation")),
        asyncpg.exceptions.InternalClientError("cannot switch to state 12; another operation (2) is in progress"),
        asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout"),
        ServiceUnavailable("the write may or may not be stored; retry"),
        ConnectionResetError(104, "reset"),
    ):
        assert is_transient(fault), fault
    for record_error in (
        ValidationFailed("bad aspect", []),
        asyncpg.exceptions.DataError("invalid input"),
        ValueError("a bug"),
    ):
        assert not is_transient(record_error), record_error
