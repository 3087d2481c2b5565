"""Test databases against a real PostgreSQL, never mocked, never a rolled-back outer transaction.

The server is the one named by ``CRONLOCK_TEST_DATABASE_URL`` (CI: the machine's PostgreSQL);
without it an embedded PostgreSQL is started for the session, and if neither works the run
stops with one line saying why. cronlock's migrations run once into a template database; every
test gets a database of its own copied from it, so tests see real commits, locks and savepoints.
The copies are pooled: one is reset to the template's state between two tests
(tests/support/testdb.py).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import ModuleType

import asyncpg
import pytest
from sqlalchemy import URL

from cronlock import embedded, schema
from cronlock.database import Database, normalize_url
from cronlock.errors import CronlockError
from cronlock.testing import plugin as testing_plugin

SERVER_ENV = "CRONLOCK_TEST_DATABASE_URL"
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

# tests/support is on sys.path from here on.
from isolation import fresh_module  # noqa: E402
from testdb import DatabasePool, check_connections, libpq_url, unique_name  # noqa: E402

_shared_server = ExitStack()


def pytest_configure(config: pytest.Config) -> None:
    # The testing kit's fixtures (tests/integration/test_testing_kit.py uses them as a user
    # would): loaded by the pytest11 entry point once cronlock is installed with it, and here
    # when the installed metadata predates it (an editable install made before it existed).
    if not config.pluginmanager.is_registered(testing_plugin):
        config.pluginmanager.register(testing_plugin, "cronlock")
    # A suite started as a background job of a script (`pytest &`) inherits SIGINT ignored, and
    # so would every command a test starts: the tests that press Ctrl-C on one (SIGINT) would
    # then wait for nothing. A handled signal goes back to its default in a child, as a user's
    # terminal has it.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # With worker processes (pytest-xdist, -n 2) and no configured server, the controlling
    # process starts the one embedded server they share, before it starts them: they inherit
    # its URL as if configured, and a server that cannot be had stops the run here, in one line
    # (a worker that stopped the run would only be reported as crashed).
    workers = config.getoption("numprocesses", default=None)
    is_worker = hasattr(config, "workerinput")
    if workers and not is_worker and not os.environ.get(SERVER_ENV):
        os.environ[SERVER_ENV] = _shared_server.enter_context(_embedded_server())
        _shared_server.callback(os.environ.pop, SERVER_ENV, None)


def pytest_unconfigure(config: pytest.Config) -> None:
    _shared_server.close()


async def _admin(server: URL, *statements: str) -> None:
    conn = await asyncpg.connect(libpq_url(server))
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@contextmanager
def _embedded_server() -> Iterator[str]:
    """An embedded server in a directory of the session's own (which an embedded server run as
    another account under root can enter), removed afterwards; its URL. When none can be had
    the run stops with one line saying why: the same traceback for every test would say it a
    hundred times less clearly."""
    directory = Path(tempfile.mkdtemp(prefix="cronlock-test-pg-"))
    directory.chmod(0o755)
    pgdata = directory / "pgdata"
    try:
        server = embedded.start(pgdata)
    except Exception as exc:
        shutil.rmtree(directory, ignore_errors=True)
        reason = str(exc) if isinstance(exc, CronlockError) else f"{type(exc).__name__}: {exc}"
        pytest.exit(f"no PostgreSQL for the tests ({SERVER_ENV} is not set): {reason}")
    try:
        yield server.url
    finally:
        embedded.remove(pgdata)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[URL]:
    """The URL of a maintenance database on the test server.

    Without a configured server, an embedded one (``_embedded_server``), started at the first
    test that needs it.
    """
    configured = os.environ.get(SERVER_ENV)
    if configured:
        yield normalize_url(configured)
        return
    with _embedded_server() as url:
        yield normalize_url(url)


@pytest.fixture(scope="session")
def template_database(pg_server: URL) -> Iterator[str]:
    """A database migrated to head once per session, copied for every test."""
    name = unique_name("tpl")
    asyncio.run(_admin(pg_server, f'CREATE DATABASE "{name}"'))

    async def migrate() -> None:
        database = Database(pg_server.set(database=name))
        try:
            await schema.upgrade(database)
        finally:
            await database.dispose()

    asyncio.run(migrate())
    yield name
    asyncio.run(_admin(pg_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def copy_strategy(pg_server: URL) -> str:
    async def version() -> int:
        conn = await asyncpg.connect(libpq_url(pg_server))
        try:
            return int(await conn.fetchval("SHOW server_version_num"))
        finally:
            await conn.close()

    # FILE_COPY clones a small template far faster than 15's default WAL_LOG.
    return " STRATEGY FILE_COPY" if asyncio.run(version()) >= 150000 else ""


@pytest.fixture(scope="session")
def database_pool(
    pg_server: URL, template_database: str, copy_strategy: str
) -> Iterator[DatabasePool]:
    pool = DatabasePool(pg_server, template_database, copy_strategy)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def database_name(database_pool: DatabasePool) -> Iterator[str]:
    """A freshly migrated database of this test's own: nobody else's rows, tables, locks or
    connections in it (reset, and checked, after the previous test that had it)."""
    with database_pool.lease() as name:
        yield name


@pytest.fixture
async def _checked_database_name(pg_server: URL, database_name: str) -> AsyncIterator[str]:
    """``database_name``, whose connections are checked in the test's own event loop once
    every fixture that reaches it (through ``database`` or ``database_url``) is torn down.

    There, a connection the test process left open is seen closed by its owner when the
    check ends it, instead of warning (ResourceWarning) in whichever later test the garbage
    collector runs in."""
    yield database_name
    await check_connections(pg_server, database_name)


@pytest.fixture
async def database(pg_server: URL, _checked_database_name: str) -> AsyncIterator[Database]:
    """This test's database (see ``database_name``)."""
    db = Database(pg_server.set(database=_checked_database_name))
    try:
        yield db
    finally:
        await db.dispose()


@pytest.fixture
def database_url(pg_server: URL, _checked_database_name: str) -> str:
    """The test database's URL as a user writes it (for the command line)."""
    return libpq_url(pg_server.set(database=_checked_database_name))


@pytest.fixture
async def empty_database(pg_server: URL) -> AsyncIterator[Database]:
    """A database with nothing of cronlock's in it (for migration tests), made for the test."""
    name = unique_name("empty")
    await _admin(pg_server, f'CREATE DATABASE "{name}"')
    db = Database(pg_server.set(database=name))
    try:
        yield db
    finally:
        await db.dispose()
        try:
            await check_connections(pg_server, name)
        finally:
            await _admin(pg_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def examples() -> Iterator[ModuleType]:
    """A copy of the examples (tasks/) of this test's own: its ``app`` may be given this
    test's database while the ``tasks`` every other test imports stays untouched. (The models
    a test imports from ``tasks.models`` map the same tables.)"""
    with fresh_module("tasks") as module:
        yield module
