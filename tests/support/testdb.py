"""Test databases: copies of one migrated template, lent one per test and made pristine again.

River's model (a database per test from a pool, reset between tests), with procrastinate's
template: a copy costs a CREATE DATABASE (about 0.1 s) and its DROP, a reset about 10 ms.
Between two tests a database is reset exactly, at the teardown of the test that had it:

- connections: a backend still connected once the test's fixtures are torn down was left open
  by the test (a pool never disposed, a process never stopped). The test fails, naming it, and
  it is terminated, which ends its transactions, advisory locks and LISTEN channels with it.
- objects: every schema other than cronlock's and ``public`` is dropped, and everything in
  ``public`` (the scratch tables the test apps and tests create);
- rows: cronlock's tables are truncated, identities restarted; its alembic version table stays;
- then the database's shape (catalog, version row, sequences, planner statistics, advisory
  locks, prepared transactions, settings) is compared with the template's. One that differs
  (a test altered cronlock's schema, or ANALYZE ran on its tables) is dropped, not lent again.
- the database is renamed: a process that outlived its test cannot reach the next test's data.

Only the first step runs in the test's teardown; the others run while the next test does,
on the other of two copies that take turns (``DatabasePool``).

Everything runs on connections of its own, in an event loop of its own (``asyncio.run``): the
fixtures that use it are synchronous, for synchronous and asynchronous tests alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TypeVar

import asyncpg
from sqlalchemy import URL

from cronlock import Database
from cronlock.sql.tables import SCHEMA, VERSION_TABLE

T = TypeVar("T")

# Test-only administration: identifiers below are cronlock's constants or names made here.
_USER_SCHEMAS = "n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'"

RESET = f"""
DO $reset$
DECLARE
    r record;
    tables text;
BEGIN
    FOR r IN SELECT n.nspname FROM pg_namespace n
             WHERE {_USER_SCHEMAS} AND n.nspname NOT IN ('{SCHEMA}', 'public')
    LOOP
        EXECUTE format('DROP SCHEMA %I CASCADE', r.nspname);
    END LOOP;
    FOR r IN SELECT c.relname, c.relkind FROM pg_class c
             WHERE c.relnamespace = 'public'::regnamespace
               AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
    LOOP
        EXECUTE format(
            'DROP %s IF EXISTS public.%I CASCADE',
            CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                           WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,
            r.relname);
    END LOOP;
    FOR r IN SELECT c.relname FROM pg_class c
             WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'S'
    LOOP
        EXECUTE format('DROP SEQUENCE IF EXISTS public.%I CASCADE', r.relname);
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS signature, p.prokind FROM pg_proc p
             WHERE p.pronamespace = 'public'::regnamespace
    LOOP
        EXECUTE format(
            'DROP %s IF EXISTS %s CASCADE',
            CASE r.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE' ELSE 'FUNCTION' END,
            r.signature);
    END LOOP;
    FOR r IN SELECT t.typname, t.typtype FROM pg_type t
             WHERE t.typnamespace = 'public'::regnamespace AND t.typtype IN ('e', 'd', 'r')
    LOOP
        EXECUTE format(
            'DROP %s IF EXISTS public.%I CASCADE',
            CASE r.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END, r.typname);
    END LOOP;
    SELECT string_agg(format('%I.%I', schemaname, tablename), ', ') INTO tables
    FROM pg_tables WHERE schemaname = '{SCHEMA}' AND tablename <> '{VERSION_TABLE}';
    IF tables IS NOT NULL THEN
        EXECUTE 'TRUNCATE ' || tables || ' RESTART IDENTITY';
    END IF;
END
$reset$
"""


def _sorted(expression: str, source: str) -> str:
    """The rows' ``expression`` as one sorted JSON array (catalog order is not stable)."""
    return f"(SELECT json_agg(x ORDER BY x) FROM (SELECT {expression} AS x {source}) rows)"


_IN_USER_SCHEMAS = f"JOIN pg_namespace n ON n.oid = {{}} WHERE {_USER_SCHEMAS}"
SHAPE = f"""
SELECT json_build_object(
    'schemas', {
    _sorted(
        "concat_ws(' ', n.nspname, n.nspacl::text)", f"FROM pg_namespace n WHERE {_USER_SCHEMAS}"
    )
},
    'relations', {
    _sorted(
        "concat_ws(' ', n.nspname, c.relname, c.relkind, c.relpersistence, "
        "c.reloptions::text, c.relacl::text)",
        "FROM pg_class c " + _IN_USER_SCHEMAS.format("c.relnamespace"),
    )
},
    'columns', {
    _sorted(
        "concat_ws(' ', n.nspname, c.relname, a.attnum, a.attname, "
        "format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity, "
        "a.attgenerated, pg_get_expr(d.adbin, d.adrelid))",
        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        + _IN_USER_SCHEMAS.format("c.relnamespace")
        + " AND a.attnum > 0 AND NOT a.attisdropped",
    )
},
    'constraints', {
    _sorted(
        "concat_ws(' ', n.nspname, con.conname, pg_get_constraintdef(con.oid))",
        "FROM pg_constraint con " + _IN_USER_SCHEMAS.format("con.connamespace"),
    )
},
    'indexes', {
    _sorted(
        "pg_get_indexdef(c.oid)",
        "FROM pg_class c "
        + _IN_USER_SCHEMAS.format("c.relnamespace")
        + " AND c.relkind IN ('i', 'I')",
    )
},
    'triggers', {
    _sorted(
        "pg_get_triggerdef(t.oid)",
        "FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
        + _IN_USER_SCHEMAS.format("c.relnamespace")
        + " AND NOT t.tgisinternal",
    )
},
    'functions', {
    _sorted(
        "concat_ws(' ', p.oid::regprocedure::text, p.prokind, md5(p.prosrc))",
        "FROM pg_proc p " + _IN_USER_SCHEMAS.format("p.pronamespace"),
    )
},
    'types', {
    _sorted(
        "concat_ws(' ', n.nspname, t.typname, t.typtype)",
        "FROM pg_type t " + _IN_USER_SCHEMAS.format("t.typnamespace"),
    )
},
    'sequences', {
    _sorted(
        "concat_ws(' ', s.schemaname, s.sequencename, s.last_value)",
        "FROM pg_sequences s JOIN pg_namespace n ON n.nspname = s.schemaname "
        f"WHERE {_USER_SCHEMAS}",
    )
},
    'version', {_sorted("version_num", f"FROM {SCHEMA}.{VERSION_TABLE}")},
    'statistics', (SELECT count(*) FROM pg_stats
                   WHERE schemaname NOT LIKE 'pg\\_%' AND schemaname <> 'information_schema'),
    'advisory_locks', (SELECT count(*) FROM pg_locks
                       WHERE locktype = 'advisory' AND database = (
                           SELECT oid FROM pg_database WHERE datname = current_database())),
    'prepared', (SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()),
    'settings', {
    _sorted(
        "setconfig::text",
        "FROM pg_db_role_setting WHERE setdatabase = "
        "(SELECT oid FROM pg_database WHERE datname = current_database())",
    )
},
    'extensions', {_sorted("extname || ' ' || extversion", "FROM pg_extension")},
    'large_objects', (SELECT count(*) FROM pg_largeobject_metadata)
)::text
"""

# The client backends on a database other than the asking one's (autovacuum is not a leak).
_BACKENDS = """
SELECT pid, coalesce(nullif(application_name, ''), '?') AS application, state,
       left(query, 60) AS query
FROM pg_stat_activity
WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'
ORDER BY pid
"""
_TERMINATE = """
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = $1 AND pid <> pg_backend_pid()
"""

# How long connections closed at the end of a test (a process that just exited, a pool just
# disposed) may take to leave the server before they count as left open.
LINGER = 5.0


def libpq_url(url: URL) -> str:
    """A postgresql:// URL for asyncpg, psql and the cronlock command line."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def unique_name(kind: str) -> str:
    return f"cronlock_{kind}_{uuid.uuid4().hex[:12]}"


def on_database(url: str, work: Callable[[Database], Awaitable[T]]) -> T:
    """``work(database)`` from a synchronous test (one whose command needs the main thread): on
    a Database of its own, in an event loop of its own, disposed before this returns."""

    async def run() -> T:
        database = Database(url)
        try:
            return await work(database)
        finally:
            await database.dispose()

    return asyncio.run(run())


class ConnectionsLeftOpen(AssertionError):
    """A test left connections to its database open after its fixtures were torn down."""


async def _backends(admin: asyncpg.Connection, name: str) -> list[str]:
    return [
        f"pid {row['pid']} ({row['application']}, {row['state']}: {row['query']!r})"
        for row in await admin.fetch(_BACKENDS, name)
    ]


async def _until_gone(admin: asyncpg.Connection, name: str, timeout: float) -> list[str]:
    """Wait up to ``timeout`` s for the database's client backends to leave; those left."""
    deadline = time.monotonic() + timeout
    # The server's catalog is polled: there is no event to wait on.
    while (left := await _backends(admin, name)) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    return left


async def clear_connections(admin: asyncpg.Connection, name: str) -> list[str]:
    """Terminate what is still connected to database ``name`` once closed connections had
    time to go; what had to be terminated (a leak) is returned, described."""
    left = await _until_gone(admin, name, LINGER)
    if left:
        await admin.fetchval(_TERMINATE, name)
        if still := await _until_gone(admin, name, LINGER):
            raise RuntimeError(f"backends on {name} survive pg_terminate_backend: {still}")
    return left


def leak_message(name: str, left: list[str]) -> str:
    return (
        f"the test left {len(left)} connection(s) to its database {name} open after its "
        f"fixtures ended (terminated now): " + "; ".join(left)
    )


async def check_connections(server: URL, name: str) -> None:
    """Fail if anything is still connected to database ``name``; terminate it.

    Awaited in the test's own event loop (the ``database`` fixture's teardown), a connection
    of the test process that the server ends is seen closed by its owner while the polling
    lets that loop run, and so never warns as unclosed later, in another test."""
    admin = await asyncpg.connect(libpq_url(server))
    try:
        left = await clear_connections(admin, name)
    finally:
        await admin.close()
    if left:
        raise ConnectionsLeftOpen(leak_message(name, left))


class DatabasePool:
    """Copies of ``template`` on ``server``, lent with ``lease()``; see the module docstring.

    Two copies take turns: the one a test has just given back is reset in a thread of the
    pool's own while the next test runs on the other, so a test's teardown waits only for
    the check of its connections. The other steps cannot fail a test (nothing of it is left
    to blame): an error there is kept, and raised when the pool closes, at the session's end.
    """

    COPIES = 2

    def __init__(self, server: URL, template: str, strategy: str) -> None:
        self.server = server
        self.template = template
        self.strategy = strategy
        self._shape: str | None = None
        self._lock = threading.Lock()
        self._free: list[str] = []
        self._resets: list[Future[None]] = []
        self._copies = 0
        self._errors: list[str] = []
        self._resetter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="testdb-reset")

    def _url(self, name: str) -> str:
        return libpq_url(self.server.set(database=name))

    async def _shape_of(self, name: str, *, reset: bool = False) -> str | None:
        """The database's shape (see SHAPE), after resetting it if asked; None without a
        version table (cronlock's schema is gone)."""
        conn = await asyncpg.connect(self._url(name))
        try:
            if reset:
                await conn.execute(RESET)
            shape: str = await conn.fetchval(SHAPE)
            return shape
        except asyncpg.UndefinedTableError:
            return None
        finally:
            await conn.close()

    async def _admin(self, statement: str) -> None:
        admin = await asyncpg.connect(libpq_url(self.server))
        try:
            await admin.execute(statement)
        finally:
            await admin.close()

    def _acquire(self) -> str:
        if self._shape is None:
            self._shape = asyncio.run(self._shape_of(self.template))
        while True:
            with self._lock:
                if self._free:
                    return self._free.pop()
                resetting = [reset for reset in self._resets if not reset.done()]
                if not resetting or self._copies < self.COPIES:
                    self._copies += 1
                    break
            wait(resetting, return_when=FIRST_COMPLETED)
        name = unique_name("test")
        asyncio.run(
            self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"{self.strategy}')
        )
        return name

    async def _check(self, name: str) -> list[str]:
        admin = await asyncpg.connect(libpq_url(self.server))
        try:
            return await clear_connections(admin, name)
        finally:
            await admin.close()

    async def _reset(self, name: str) -> str | None:
        """Reset ``name``; its new name, or None if it had to be dropped."""
        admin = await asyncpg.connect(libpq_url(self.server))
        try:
            if await self._shape_of(name, reset=True) == self._shape:
                renamed = unique_name("test")
                # The reset's own backend exits just after its connection closed; RENAME would
                # wait for it in steps of 100 ms.
                await _until_gone(admin, name, LINGER)
                try:
                    await admin.execute(f'ALTER DATABASE "{name}" RENAME TO "{renamed}"')
                except asyncpg.ObjectInUseError:  # something connected again: not lent again
                    pass
                else:
                    return renamed
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return None
        finally:
            await admin.close()

    def _reset_in_background(self, name: str) -> None:
        renamed: str | None = None
        try:
            renamed = asyncio.run(self._reset(name))
        except Exception as exc:  # kept for close(): no test is there to fail
            self._errors.append(f"resetting {name}: {type(exc).__name__}: {exc}")
            with contextlib.suppress(Exception):
                asyncio.run(self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        with self._lock:
            if renamed is None:
                self._copies -= 1
            else:
                self._free.append(renamed)

    @contextmanager
    def lease(self) -> Iterator[str]:
        """The name of a pristine migrated database for the duration of the block; reset (or
        dropped) afterwards. Raises ``ConnectionsLeftOpen`` if the block left any open."""
        name = self._acquire()
        try:
            yield name
        finally:
            left = asyncio.run(self._check(name))
            with self._lock:
                self._resets = [reset for reset in self._resets if not reset.done()]
                self._resets.append(self._resetter.submit(self._reset_in_background, name))
            if left:
                raise ConnectionsLeftOpen(leak_message(name, left))

    def close(self) -> None:
        """Finish the resets under way, drop every copy; raise what went wrong in a reset."""
        self._resetter.shutdown(wait=True)

        async def drop_all() -> None:
            for name in self._free:
                await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        asyncio.run(drop_all())
        self._free.clear()
        if self._errors:
            raise RuntimeError("test database resets failed: " + "; ".join(self._errors))
