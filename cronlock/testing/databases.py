"""Test databases: one template migrated once, then a database of each test's own copied from it.

procrastinate's model (a template migrated once per session, a copy per test): a copy costs a
``CREATE DATABASE`` (about 0.1 s with PostgreSQL 15's ``FILE_COPY``) and its drop. Tests see
real commits, advisory locks, ``SKIP LOCKED`` and savepoints: nothing is a rolled-back outer
transaction. The template holds cronlock's schema at head and the test clock
(``cronlock.testing.clock``, ``cronlock.sql.testing``), with every time default of its tables
bound to the clock; each copy gets the clock's ``search_path`` (a database's settings are not
copied with it).

The server is the first of ``CRONLOCK_TEST_DATABASE_URL``, the pytest ini option
``cronlock_database_url`` (``server_url``'s ``configured``), and ``CRONLOCK_DATABASE_URL``: a
maintenance database on a server where the account may create databases.

Everything runs on connections of its own, in an event loop of its own (``asyncio.run`` in a
thread of its own, so it works from inside a running loop too): the fixtures built on it are
synchronous, for synchronous and asynchronous tests alike.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import URL

from .. import pg, schema
from ..database import Database, normalize_url
from ..errors import ConfigurationError
from ..sql import testing as sql

__all__ = [
    "SERVER_ENV",
    "ConnectionsLeftOpen",
    "DatabasePool",
    "database_url",
    "prepare_template",
    "run_sync",
    "server_url",
]

T = TypeVar("T")

SERVER_ENV = "CRONLOCK_TEST_DATABASE_URL"
FALLBACK_ENV = "CRONLOCK_DATABASE_URL"
APPLICATION_NAME = "cronlock-testing"

# How long connections closed at the end of a test (a pool just disposed) may take to leave
# the server before they count as left open.
LINGER = 5.0

# What a template may be given after cronlock's migrations: the user's own (their tables,
# their migrations), on the template's URL.
TemplateSetup = Callable[[str], Awaitable[None]]


def server_url(configured: str | None = None) -> URL:
    """The test server: ``$CRONLOCK_TEST_DATABASE_URL``, else ``configured`` (the ini
    option), else ``$CRONLOCK_DATABASE_URL``; a ``ConfigurationError`` saying so if none."""
    url = os.environ.get(SERVER_ENV) or configured or os.environ.get(FALLBACK_ENV)
    if not url:
        raise ConfigurationError(
            f"cronlock.testing needs a PostgreSQL server for its test databases: set "
            f"{SERVER_ENV} (or the ini option cronlock_database_url, or {FALLBACK_ENV}) "
            f"to a database on a server where you may create databases"
        )
    return normalize_url(url)


def database_url(server: URL, name: str) -> str:
    """The URL of database ``name`` on ``server``, as a user writes it (postgresql://)."""
    return server.set(drivername="postgresql", database=name).render_as_string(hide_password=False)


def unique_name(kind: str) -> str:
    return f"cronlock_{kind}_{uuid.uuid4().hex[:12]}"


def run_sync(work: Coroutine[Any, Any, T]) -> T:
    """``work`` to its end in an event loop of its own, in a thread of its own: callable from
    synchronous code and from a coroutine alike (whose loop it blocks meanwhile)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="cronlock-testing") as thread:
        return thread.submit(asyncio.run, work).result()


async def _execute(url: str | URL, *statements: str) -> None:
    connection = await pg.connect(Database(url), APPLICATION_NAME)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


async def _file_copy(server: URL) -> bool:
    connection = await pg.connect(Database(server), APPLICATION_NAME)
    try:
        return int(await connection.fetchval(sql.SERVER_VERSION)) >= 150000
    finally:
        await connection.close()


async def prepare_template(server: URL, name: str, setup: TemplateSetup | None = None) -> None:
    """Create database ``name`` on ``server`` as a template: cronlock's schema at head,
    ``setup`` (if given) on its URL, then the clock installed and every time default bound
    to it."""
    await _execute(server, sql.create_database(name))
    url = database_url(server, name)
    database = Database(url)
    try:
        await schema.upgrade(database)
    finally:
        await database.dispose()
    if setup is not None:
        await setup(url)
    await _execute(url, sql.CLOCK_INSTALL, sql.CLOCK_REBIND_DEFAULTS, sql.CLOCK_SEARCH_PATH)


class ConnectionsLeftOpen(AssertionError):
    """A test left connections to its database open: an app whose database was never
    disposed, a process never stopped. They were ended when the database was dropped."""


async def _left_open(server: URL, name: str, linger: float) -> list[str]:
    """The connections to database ``name`` still there once closed ones had ``linger``
    seconds to leave, described."""
    connection = await pg.connect(Database(server), APPLICATION_NAME)
    try:
        deadline = time.monotonic() + linger
        while True:
            rows = await connection.fetch(sql.DATABASE_BACKENDS, name)
            if not rows or time.monotonic() >= deadline:
                return [
                    f"pid {pid} ({application}, {state}: {query!r})"
                    for pid, application, state, query in rows
                ]
            await asyncio.sleep(0.01)  # the server's catalog is polled: no event to wait on
    finally:
        await connection.close()


class DatabasePool:
    """Copies of ``template`` (made by ``prepare_template``) on ``server``, lent with
    ``lease()``. ``DatabasePool.create(server)`` makes the template too, and ``close()``
    drops it."""

    def __init__(
        self, server: URL, template: str, *, owns_template: bool = False, linger: float = LINGER
    ) -> None:
        self.server = server
        self.template = template
        self.linger = linger  # seconds a closed connection may take to leave (ConnectionsLeftOpen)
        self._owns_template = owns_template
        self._file_copy: bool | None = None
        self._lock = threading.Lock()

    @classmethod
    def create(cls, server: URL, setup: TemplateSetup | None = None) -> DatabasePool:
        """A pool with a template of its own, migrated now (``prepare_template``)."""
        name = unique_name("tpl")
        try:
            run_sync(prepare_template(server, name, setup))
        except BaseException:
            run_sync(_execute(server, sql.drop_database(name)))
            raise
        return cls(server, name, owns_template=True)

    def _create_copy(self) -> str:
        with self._lock:
            if self._file_copy is None:
                self._file_copy = run_sync(_file_copy(self.server))
        name = unique_name("test")
        create = sql.create_database(name, self.template, file_copy=self._file_copy)
        run_sync(_execute(self.server, create))
        run_sync(_execute(database_url(self.server, name), sql.CLOCK_SEARCH_PATH))
        return name

    @contextmanager
    def lease(self) -> Iterator[str]:
        """The name of a freshly migrated database of the block's own; dropped afterwards
        (``WITH (FORCE)``). A connection the block left open is ended with it and raised
        as ``ConnectionsLeftOpen``, naming it (a test's teardown fails, as it should: a
        leaked pool in one test is a warning, or a stuck process, in another)."""
        name = self._create_copy()
        left: list[str] = []
        try:
            yield name
        finally:
            try:
                left = run_sync(_left_open(self.server, name, self.linger))
            finally:
                run_sync(_execute(self.server, sql.drop_database(name)))
        if left:
            raise ConnectionsLeftOpen(
                f"the test left {len(left)} connection(s) to its database {name} open "
                f"(ended with it): " + "; ".join(left)
            )

    def url(self, name: str) -> str:
        """The URL of the leased database ``name``."""
        return database_url(self.server, name)

    def close(self) -> None:
        """Drop the template, if this pool made it."""
        if self._owns_template:
            run_sync(_execute(self.server, sql.drop_database(self.template)))
