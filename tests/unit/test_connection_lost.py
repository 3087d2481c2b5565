"""``pg.connection_lost``: the one rule for a lost connection (an infrastructure fault) versus an
error (a job's failure), on the exceptions asyncpg and SQLAlchemy raise when a connection goes."""

from __future__ import annotations

import asyncpg
import pytest
from sqlalchemy.exc import DBAPIError, OperationalError

from cronlock import pg


def _caused(error: BaseException, by: BaseException) -> BaseException:
    error.__cause__ = by
    return error


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        asyncpg.CrashShutdownError("terminating connection because of crash of another server"),
        asyncpg.InterfaceError(
            "cannot call Transaction.commit(): the underlying connection is closed"
        ),
        asyncpg.InternalClientError(
            "cannot switch to state 15; another operation (2) is in progress"
        ),
        ConnectionResetError(104, "Connection reset by peer"),
        ConnectionRefusedError(111, "Connection refused"),
        OSError(101, "Network is unreachable"),
        # SQLAlchemy's wrapper, the driver's error behind it.
        OperationalError("SELECT 1", {}, asyncpg.AdminShutdownError("terminating connection")),
        DBAPIError("SELECT 1", {}, ValueError("x"), connection_invalidated=True),
        # What a handler made of it: its own exception raised from the driver's.
        _caused(RuntimeError("payment failed"), asyncpg.ConnectionDoesNotExistError("closed")),
    ],
    ids=lambda e: type(e).__name__,
)
def test_lost(error: BaseException) -> None:
    assert pg.connection_lost(error)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("permanent error"),
        TimeoutError(),  # a handler's timeout as often as the network's
        asyncpg.QueryCanceledError("canceling statement due to statement timeout"),
        asyncpg.UndefinedTableError('relation "no_such_table" does not exist'),
        asyncpg.InterfaceError("cannot perform operation: another operation is in progress"),
        asyncpg.DataError("invalid input for query argument $1"),
        # The handler ran past idle_in_transaction_session_timeout: its doing, not a fault.
        asyncpg.IdleInTransactionSessionTimeoutError(
            "terminating connection due to idle-in-transaction timeout"
        ),
        OperationalError("SELECT 1", {}, asyncpg.SerializationError("could not serialize")),
    ],
    ids=lambda e: type(e).__name__,
)
def test_not_lost(error: BaseException) -> None:
    assert not pg.connection_lost(error)
