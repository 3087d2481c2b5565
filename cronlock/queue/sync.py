"""Enqueueing from sync code, in the caller's own transaction.

A sync app (Django, Flask, a script on sync SQLAlchemy or psycopg) enqueues on the connection
it already writes with, so the jobs commit or roll back with its own work, exactly as
``App.enqueue_tx`` does for an asyncio app. The checks are ``enqueue.prepare``'s and the
statements ``enqueue.insert_plan``'s, the same for every client; only how a statement is sent
differs (``runner_for``):

- a SQLAlchemy ``Session`` or ``Connection`` (psycopg 3 or psycopg2 driver) executes the Core
  statement itself, in the session's transaction;
- a DB-API connection — psycopg 3's ``Connection``, psycopg2's ``connection``, or Django's
  connection (``django.db.connection``, the one ``transaction.atomic()`` wraps) — is sent the
  statement compiled once per schema with the ``%(name)s`` parameter style both drivers take.

Nothing here commits: outside a transaction (psycopg in autocommit, Django outside
``atomic()``) each statement commits on its own, as that client's own writes do.

``wait_blocking`` is ``App.wait`` for sync code: the one async engine's wait, in an event loop
of its own on a Database of its own (an app's pool belongs to the loop it was made in). With
the command line's, it is the one place cronlock starts an event loop: sync code's edge.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias, Unpack

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.sql import ClauseElement, Executable

from ..database import Database
from ..errors import ConfigurationError, InvalidJobOption
from ..pg import PyformatStatement, rows_of
from ..sql.tables import SCHEMA
from .enqueue import EnqueueOptions, NewJobs, insert_plan, prepare
from .jobs import Enqueued, JobDefaults
from .operate import JobInfo
from .waits import Waits

__all__ = ["SyncApi", "SyncClient", "enqueue_many", "runner_for", "wait_blocking"]

# psycopg.Connection, psycopg2's connection, Django's connection, or SQLAlchemy's sync
# Session or Connection: told apart at the call (runner_for), none of them imported here.
SyncClient: TypeAlias = Any
SyncRun: TypeAlias = Callable[[Executable, dict[str, Any]], Sequence[Sequence[Any]]]


def enqueue_many(
    client: SyncClient,
    handlers: Mapping[str, JobDefaults],
    job_type: str,
    payloads: Sequence[Any],
    *,
    schema: str = SCHEMA,
    trace_context: str | None = None,
    **options: Unpack[NewJobs],
) -> list[Enqueued]:
    """Enqueue one job per payload on ``client``, in its transaction; nothing is written on
    bad input (the checks of ``enqueue.prepare``, before the first statement)."""
    run = runner_for(client, schema)
    batch = prepare(handlers, job_type, payloads, trace_context, **options)
    if batch is None:
        return []
    plan = insert_plan(batch)
    try:
        step = next(plan)
        while True:
            step = plan.send(run(*step))
    except StopIteration as done:
        answers: list[Enqueued] = done.value
        return answers


def runner_for(client: SyncClient, schema: str) -> SyncRun:
    """How a statement is sent on ``client``; an ``InvalidJobOption`` in one line for a
    client that is none of the kinds above."""
    cls: type = type(client)
    kind = _kind(cls)
    if kind == "sqlalchemy":
        translate = {"schema_translate_map": {SCHEMA: schema}} if schema != SCHEMA else {}

        def run_core(statement: Executable, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
            result = client.execute(statement, params, execution_options=translate)
            return rows_of(result)

        return run_core
    if kind == "async":
        raise InvalidJobOption(
            f"{cls.__name__} is async: use `await app.enqueue_tx(...)`, "
            "app.sync is for sync clients"
        )
    if kind == "django":
        vendor = getattr(client, "vendor", None)
        if vendor != "postgresql":
            raise InvalidJobOption(
                f"Django's {client.alias!r} database is {vendor}: cronlock needs PostgreSQL"
            )
        return _run_dbapi(client.cursor, schema)
    if kind == "psycopg" and callable(getattr(client, "cursor", None)):
        # Its own adaptation (UUIDs, arrays in binary), unless its cursors bind client-side.
        native = _binds_on_server(getattr(client, "cursor_factory", None))
        return _run_dbapi(client.cursor, schema, native=native)
    if kind == "psycopg2" and callable(getattr(client, "cursor", None)):
        return _run_dbapi(client.cursor, schema)
    raise InvalidJobOption(
        f"cannot enqueue on a {cls.__module__}.{cls.__qualname__}: give a "
        "psycopg or psycopg2 connection, Django's connection, or a sync SQLAlchemy Session or "
        "Connection"
    )


@functools.lru_cache(maxsize=64)
def _kind(cls: type) -> str:
    """Which kind of client ``cls`` makes, looked at once per class (an enqueue asks at every
    call): ``async``, ``sqlalchemy``, ``django``, ``psycopg``, ``psycopg2`` or ``other``."""
    if issubclass(cls, AsyncSession | AsyncConnection):
        return "async"
    if issubclass(cls, Session | Connection):
        return "sqlalchemy"
    module = cls.__module__
    if module.startswith("django.db.backends."):
        return "django"
    driver = module.split(".")[0]
    return driver if driver in ("psycopg", "psycopg2") else "other"


@functools.lru_cache(maxsize=16)
def _binds_on_server(cursor_factory: type | None) -> bool:
    """Whether a psycopg 3 connection's cursors bind on the server (not ``ClientCursor``)."""
    from psycopg import ClientCursor  # the client's own driver: importable

    return cursor_factory is not None and not issubclass(cursor_factory, ClientCursor)


def _run_dbapi(cursor: Callable[[], Any], schema: str, *, native: bool = False) -> SyncRun:
    """``native``: a psycopg 3 cursor binding on the server, sent UUIDs as they are and the
    arrays in the binary format (``PyformatStatement.binary_sql``); else the values every
    driver takes."""

    def run(statement: Executable, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        assert isinstance(statement, ClauseElement)
        compiled = PyformatStatement.of(statement, schema)
        values = compiled.params(**params)
        if native:
            text = compiled.binary_sql
        else:
            text = compiled.sql
            for name in compiled.uuid_names:
                values[name] = _text(values[name])
        with cursor() as cur:
            cur.execute(text, values)
            if cur.description is None:
                return []
            rows: list[Sequence[Any]] = cur.fetchall()
        return rows

    return run


def _text(value: Any) -> Any:
    """A UUID (or a list of them) as text, which the statements cast (``::UUID``): psycopg2
    adapts no UUID of its own, and both drivers send text."""
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list):
        return [str(v) if isinstance(v, uuid.UUID) else v for v in value]
    return value


class SyncApi:
    """``app.sync``: an app's calls for sync code. Its enqueue is in the caller's transaction
    (see the module docstring), with the options, checks and errors of ``App.enqueue_tx``;
    its ``wait`` is ``App.wait``'s twin."""

    def __init__(
        self,
        enqueue: Callable[..., list[Enqueued]],
        wait: Callable[[uuid.UUID | str, float | None], Any],
    ) -> None:
        self._enqueue = enqueue
        self._wait = wait

    def wait(self, job_id: uuid.UUID | str, *, timeout: float | None = None) -> Any:
        """``App.wait`` from sync code (not in a running event loop): the job's result as soon
        as it completes; ``JobFailed``, ``JobNotFound`` or ``TimeoutError`` as ``wait``'s."""
        return self._wait(job_id, timeout)

    def enqueue_tx(
        self,
        client: SyncClient,
        job_type: str,
        payload: Any = None,
        *,
        dedup_key: str | None = None,
        concurrency_key: str | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Enqueued:
        """Add a job on ``client`` (psycopg 3 or psycopg2 connection, Django's connection, a
        sync SQLAlchemy ``Session`` or ``Connection``): it commits or rolls back with the
        caller's own work; the caller commits. The options are ``App.enqueue``'s."""
        [answer] = self._enqueue(
            client,
            job_type,
            [payload],
            dedup_keys=None if dedup_key is None else [dedup_key],
            concurrency_keys=None if concurrency_key is None else [concurrency_key],
            **options,
        )
        return answer

    def enqueue_many_tx(
        self,
        client: SyncClient,
        job_type: str,
        payloads: Sequence[Any],
        *,
        dedup_keys: Sequence[str | None] | None = None,
        concurrency_keys: Sequence[str | None] | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> list[Enqueued]:
        """One job per payload on ``client`` with one statement, in its transaction;
        ``dedup_keys`` and ``concurrency_keys`` give one key (or None) per payload."""
        return self._enqueue(
            client,
            job_type,
            payloads,
            dedup_keys=dedup_keys,
            concurrency_keys=concurrency_keys,
            **options,
        )


def wait_blocking(database: Database, job_id: uuid.UUID, timeout: float | None) -> JobInfo:
    """The job's row once it has ended, from sync code (see the module docstring); refused in
    one line inside a running event loop, where ``await app.wait`` is the way."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise ConfigurationError("app.sync.wait called in a running event loop: await app.wait")

    async def waited() -> JobInfo:
        own = Database(database.url, schema=database.schema, pgbouncer=database.pgbouncer)
        waits = Waits(own)
        try:
            return await waits.wait(job_id, timeout)
        finally:
            await waits.close()
            await own.dispose()

    return asyncio.run(waited())
