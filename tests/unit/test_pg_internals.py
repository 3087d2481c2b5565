"""Every internal of SQLAlchemy and asyncpg that the driver boundary (``cronlock/pg.py``) relies
on, pinned without a database: a release that renames or changes one fails here first.

Each test names what ``pg.py`` reads and checks it against the public behaviour it stands
for (``session.new``/``dirty``/``deleted``, ``construct_params``), so a change of meaning fails
too, not only a change of name.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import asyncpg
import pytest
import sqlalchemy
from sqlalchemy import Column, Integer, MetaData, Table, Text, make_url
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.engine.interfaces import PoolProxiedConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import Session, make_transient_to_detached, registry
from sqlalchemy.pool.base import _ConnectionFairy
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.util import greenlet_spawn

from cronlock import pg, sql
from cronlock.pg import AsyncpgStatement, DriverConnection, DriverTransaction, PyformatStatement

_things = Table("things", MetaData(), Column("id", Integer, primary_key=True), Column("name", Text))


class Thing:
    id: int
    name: str | None


registry().map_imperatively(Thing, _things)


def _persistent(session: Session, ident: int) -> Thing:
    """An object in the session's identity map, as if loaded (no database needed)."""
    thing = Thing()
    thing.id, thing.name = ident, "x"
    make_transient_to_detached(thing)
    session.add(thing)
    return thing


def _public_pending(session: Session) -> bool:
    return bool(session.new or session.deleted or session.dirty)


def test_sqlalchemy_is_a_release_this_was_tested_on() -> None:
    # pyproject caps SQLAlchemy below the next minor: a new one must pass this file first.
    major, minor = (int(part) for part in sqlalchemy.__version__.split(".")[:2])
    assert (2, 0) <= (major, minor) < (2, 2)


def test_the_session_keeps_new_and_deleted_objects_in_dicts() -> None:
    session = Session()
    assert session._new == {} and session._deleted == {}
    fresh = Thing()
    session.add(fresh)
    assert list(session._new.values()) == [fresh]
    loaded = _persistent(session, 1)
    session.delete(loaded)
    assert list(session._deleted.values()) == [loaded]


def test_the_identity_map_keeps_modified_states_in_a_set() -> None:
    session = Session()
    thing = _persistent(session, 1)
    assert session.identity_map._modified == set()
    thing.name = "y"
    assert {state.obj() for state in session.identity_map._modified} == {thing}


def test_session_has_pending_is_new_or_deleted_or_dirty() -> None:
    session = Session()
    states: list[bool] = []

    def check() -> None:
        states.append(pg.session_has_pending(session))
        assert pg.session_has_pending(session) == _public_pending(session)

    check()  # empty
    loaded = _persistent(session, 1)
    check()  # loaded, unchanged
    loaded.name = "changed"
    check()  # dirty
    session.expunge_all()
    session.add(Thing())
    check()  # new
    session.expunge_all()
    session.delete(_persistent(session, 2))
    check()  # deleted
    session.expunge_all()
    changed_then_deleted = _persistent(session, 3)
    changed_then_deleted.name = "gone"
    session.delete(changed_then_deleted)
    check()  # modified and deleted: deleted, not dirty
    assert states == [False, False, True, True, True, True]


def _transaction_of(session: Session) -> object:
    # Read through a function: mypy would narrow the attribute at the first assertion and
    # take the ones after begin() for unreachable.
    return session._transaction


def test_the_session_keeps_its_transaction_in_an_attribute() -> None:
    session = Session()
    assert _transaction_of(session) is None and not session.in_transaction()
    session.begin()
    assert _transaction_of(session) is not None and session.in_transaction()
    session.close()
    assert _transaction_of(session) is None


def test_session_untouched_is_what_a_new_session_looks_like() -> None:
    def public(session: Session) -> bool:
        return not (
            session.in_transaction()
            or session.identity_map
            or session.new
            or session.deleted
            or session.info
        )

    assert pg.session_untouched(Session()) and public(Session())
    for touch in (
        lambda s: s.add(Thing()),
        lambda s: _persistent(s, 1),
        lambda s: s.delete(_persistent(s, 1)),
        lambda s: s.info.update(left="behind"),
        lambda s: s.begin(),
    ):
        session = Session()
        touch(session)
        assert not pg.session_untouched(session)
        assert not public(session)
        session.close()


# The statements cronlock sends on a bare driver connection (lanes, lease, enqueue).
DRIVER_STATEMENTS = [
    "JOB_BY_DEDUP_KEY",
    "JOB_CLAIM",
    "JOB_COMPLETE_MANY",
    "JOB_COMPLETE_ONE",
    "JOB_FINISH_MANY",
    "JOB_INSERT_MANY",
    "JOB_INSERT_ONE",
    "JOB_NEXT_DUE",
    "KEEPALIVE_SETTINGS",
    "LOCK_SHARED_HOLDERS",
    "LOCK_TRY_XACT",
    "LOCK_TRY_XACT_SHARED",
    "LOCK_XACT",
    "NO_TIMEOUTS_LOCAL",
    "PING",
]


@pytest.mark.parametrize("name", DRIVER_STATEMENTS)
def test_the_compiled_order_is_positiontup_and_args_match_construct_params(name: str) -> None:
    statement = AsyncpgStatement.of(getattr(sql, name), "elsewhere")
    compiled = statement.compiled
    assert isinstance(compiled, SQLCompiler)
    assert "elsewhere." in statement.sql or "cronlock" not in statement.sql
    # asyncpg's $n are positiontup's names, in order.
    placeholders = {int(n) for n in re.findall(r"\$(\d+)", statement.sql)}
    assert placeholders == set(range(1, len(compiled.positiontup or ()) + 1))
    assert statement.names == tuple(compiled.positiontup or ())
    params = {
        bind.key: f"value of {bind.key}"
        for bind in compiled.binds.values()
        if isinstance(bind, BindParameter) and bind.required
    }
    reference = compiled.construct_params(params) or {}
    assert statement.args(**params) == [reference[n] for n in compiled.positiontup or ()]
    # What the fast path reads of each parameter, all of it there.
    for bind in compiled.binds.values():
        for attribute in ("key", "value", "callable", "required", "expanding", "literal_execute"):
            assert hasattr(bind, attribute)
    assert not compiled.escaped_bind_names


# The statements the sync enqueue sends on a DB-API connection (queue/sync.py).
PYFORMAT_STATEMENTS = [
    "JOB_BY_DEDUP_KEY",
    "JOB_INSERT_MANY",
    "JOB_INSERT_MANY_TRACED",
    "JOB_INSERT_ONE",
    "JOB_INSERT_ONE_TRACED",
]


@pytest.mark.parametrize("name", PYFORMAT_STATEMENTS)
def test_pyformat_params_match_construct_params_and_the_uuids_are_named(name: str) -> None:
    statement = PyformatStatement.of(getattr(sql, name), "elsewhere")
    compiled = statement.compiled
    assert "elsewhere." in statement.sql
    # Every %(name)s is a parameter the statement sends, and only those.
    assert set(re.findall(r"%\((\w+)\)s", statement.sql)) == set(statement.names)
    params = {
        bind.key: f"value of {bind.key}"
        for bind in compiled.binds.values()
        if isinstance(bind, BindParameter) and bind.required
    }
    assert statement.defaults is not None  # the fast way, not construct_params
    assert statement.params(**params, unused="left out") == compiled.construct_params(params)
    uuids = {"JOB_INSERT_ONE": ("id",), "JOB_INSERT_ONE_TRACED": ("id",)}
    assert statement.uuid_names == uuids.get(name, ("ids",) if "MANY" in name else ())
    # psycopg 3's text: the array parameters in the binary format, nothing else changed.
    arrays = {b.key for b in compiled.binds.values() if isinstance(b.type, sqlalchemy.ARRAY)}
    assert set(re.findall(r"%\((\w+)\)b", statement.binary_sql)) == arrays
    assert re.sub(r"%\((\w+)\)b", r"%(\1)s", statement.binary_sql) == statement.sql
    assert bool(arrays) == ("MANY" in name or "DEDUP" in name)


def test_a_statement_with_a_callable_default_goes_through_construct_params() -> None:
    counter = iter(range(100))
    statement = sqlalchemy.select(
        sqlalchemy.bindparam("n", callable_=lambda: next(counter), type_=Integer)
    )
    compiled = AsyncpgStatement.of(statement, "cronlock")
    assert compiled.defaults is None
    assert compiled.args() == [0] and compiled.args() == [1] and compiled.args(n=7) == [7]
    pyformat = PyformatStatement.of(statement, "cronlock")
    assert pyformat.defaults is None
    assert pyformat.params() == {"n": 2} and pyformat.params(n=7) == {"n": 7}


def test_the_asyncpg_dialect_builds_connect_arguments_from_a_url() -> None:
    url = make_url("postgresql+asyncpg://u:p@db.example:6543/app?ssl=require")
    args, options = PGDialect_asyncpg().create_connect_args(url)  # type: ignore[no-untyped-call]
    assert args == []
    assert options == {
        "host": "db.example",
        "port": 6543,
        "user": "u",
        "password": "p",
        "database": "app",
        "ssl": "require",
    }
    assert inspect.signature(asyncpg.connect).parameters.keys() >= {
        "host",
        "port",
        "user",
        "password",
        "database",
        "ssl",
        "server_settings",
        "statement_cache_size",
    }


def test_the_ways_to_the_driver_connection() -> None:
    assert inspect.iscoroutinefunction(greenlet_spawn)
    assert inspect.iscoroutinefunction(AsyncConnection.get_raw_connection)
    assert inspect.iscoroutinefunction(AsyncEngine.raw_connection)
    # PoolProxiedConnection declares them; the pool hands out its _ConnectionFairy.
    assert issubclass(_ConnectionFairy, PoolProxiedConnection)
    for name in ("driver_connection", "detach", "invalidate", "close"):
        assert hasattr(_ConnectionFairy, name), name


def _members(protocol: type) -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(protocol).items()
        if not name.startswith("_") or name in ("__aenter__", "__aexit__")
        if callable(value)
    }


@pytest.mark.parametrize(
    ("protocol", "implementation"),
    [
        (DriverConnection, asyncpg.connection.Connection),
        (DriverTransaction, asyncpg.transaction.Transaction),
    ],
)
def test_asyncpg_has_every_member_the_protocols_declare(
    protocol: type, implementation: type
) -> None:
    for name, declared in _members(protocol).items():
        actual = getattr(implementation, name, None)
        assert callable(actual), f"{implementation.__name__}.{name}"
        # asyncpg wraps some (a guard against a closed connection): the wrapped one decides.
        coroutine = inspect.iscoroutinefunction(inspect.unwrap(actual))
        assert coroutine == inspect.iscoroutinefunction(declared), name
        wanted = [p for p in inspect.signature(declared).parameters.values() if p.name != "self"]
        offered = inspect.signature(actual).parameters
        for parameter in wanted:
            if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
                assert any(p.kind is parameter.kind for p in offered.values()), name
            else:
                assert parameter.name in offered or parameter.kind.name.startswith("POSITIONAL"), (
                    f"{name}({parameter.name})"
                )


def test_the_driver_errors_are_exceptions() -> None:
    assert pg.ServerError is asyncpg.PostgresError
    assert pg.ClientError is asyncpg.InterfaceError
    # What the lease and the lanes catch: a constraint, and a connection cut mid-statement.
    assert issubclass(asyncpg.exceptions.UniqueViolationError, pg.ServerError)
    assert issubclass(asyncpg.exceptions.ConnectionDoesNotExistError, pg.ServerError)
    assert issubclass(pg.ClientError, Exception) and not issubclass(pg.ClientError, pg.ServerError)


def test_a_statement_is_compiled_once_per_schema() -> None:
    # The lanes and the lease ask for their statements on every run.
    assert AsyncpgStatement.of(sql.JOB_CLAIM, "a") is AsyncpgStatement.of(sql.JOB_CLAIM, "a")
    assert AsyncpgStatement.of(sql.JOB_CLAIM, "a") != AsyncpgStatement.of(sql.JOB_CLAIM, "b")
