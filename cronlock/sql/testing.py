"""Statements of the testing kit (``cronlock.testing``): its test clock in the database, and the
administration of its test databases. Nothing here runs outside a test: the kit imports this
module itself, and ``cronlock.sql`` does not re-export it (no command needs it built).

The clock is a schema of its own, ``cronlock_testclock``: a one-row table holding the instant
the clock is frozen at (NULL: real time) and four functions that shadow PostgreSQL's
``now()``, ``transaction_timestamp()``, ``statement_timestamp()`` and ``clock_timestamp()``.
The test database's ``search_path`` names that schema first and ``pg_catalog`` explicitly
after it, so every unqualified call (cronlock's SQL renders ``func.now()`` as ``now()``) is
resolved to the clock's function at run time. A column default was bound to
``pg_catalog.now`` when its table was created, whatever the path: ``CLOCK_REBIND_DEFAULTS``
sets each such default again, to the clock's function (``CURRENT_TIMESTAMP``, a keyword no
path reaches, included). What stays on the real clock is listed in docs/how-to/testing.md.

Database names cannot be bound parameters: ``create_database`` and ``drop_database`` quote
the names, which the kit makes itself (or the user configured), as identifiers.
"""

from __future__ import annotations

from sqlalchemy.dialects import postgresql

__all__ = [
    "CLOCK_INSTALL",
    "CLOCK_NOW",
    "CLOCK_REBIND_DEFAULTS",
    "CLOCK_SCHEMA",
    "CLOCK_SEARCH_PATH",
    "CLOCK_SET",
    "DATABASE_BACKENDS",
    "SERVER_VERSION",
    "create_database",
    "drop_database",
]

CLOCK_SCHEMA = "cronlock_testclock"

# Each shadow reads the frozen instant, else its pg_catalog namesake. Qualified names only:
# the body is parsed with the caller's search_path, which finds the shadows first. STABLE
# like now() (VOLATILE for clock_timestamp()), so a claim's `run_at <= now()` stays an index
# condition.
CLOCK_INSTALL = """
CREATE SCHEMA cronlock_testclock;
CREATE TABLE cronlock_testclock.clock (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    frozen_at timestamptz
);
INSERT INTO cronlock_testclock.clock DEFAULT VALUES;
CREATE FUNCTION cronlock_testclock.now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT coalesce((SELECT frozen_at FROM cronlock_testclock.clock), pg_catalog.now()) $$;
CREATE FUNCTION cronlock_testclock.transaction_timestamp() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT coalesce((SELECT frozen_at FROM cronlock_testclock.clock),
                          pg_catalog.transaction_timestamp()) $$;
CREATE FUNCTION cronlock_testclock.statement_timestamp() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT coalesce((SELECT frozen_at FROM cronlock_testclock.clock),
                          pg_catalog.statement_timestamp()) $$;
CREATE FUNCTION cronlock_testclock.clock_timestamp() RETURNS timestamptz
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT coalesce((SELECT frozen_at FROM cronlock_testclock.clock),
                          pg_catalog.clock_timestamp()) $$
"""

# Every column default outside the system schemas that calls one of the four functions (or
# says CURRENT_TIMESTAMP) is set again to call the clock's. pg_get_expr prints pg_catalog's
# functions unqualified while the session's path does not hold the clock's schema: run it
# before CLOCK_SEARCH_PATH applies (that is, on any connection opened before it ran).
CLOCK_REBIND_DEFAULTS = r"""
DO $rebind$
DECLARE
    r record;
    rebound text;
BEGIN
    FOR r IN
        SELECT n.nspname, c.relname, a.attname, pg_get_expr(d.adbin, d.adrelid) AS expression
        FROM pg_attrdef d
        JOIN pg_class c ON c.oid = d.adrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
        WHERE n.nspname NOT LIKE 'pg\_%' AND n.nspname NOT IN
              ('information_schema', 'cronlock_testclock')
    LOOP
        rebound := regexp_replace(
            r.expression,
            '(^|[^.\w])(now|transaction_timestamp|statement_timestamp|clock_timestamp)\(\)',
            '\1cronlock_testclock.\2()', 'g');
        rebound := regexp_replace(
            rebound, '\mCURRENT_TIMESTAMP\M', 'cronlock_testclock.now()', 'gi');
        IF rebound <> r.expression THEN
            EXECUTE format('ALTER TABLE %I.%I ALTER COLUMN %I SET DEFAULT %s',
                           r.nspname, r.relname, r.attname, rebound);
        END IF;
    END LOOP;
END
$rebind$
"""

# The path of every later session in this database: the clock's schema first, pg_catalog
# named explicitly after the usual entries (unnamed, it would be searched first).
CLOCK_SEARCH_PATH = """
DO $path$
BEGIN
    EXECUTE format(
        'ALTER DATABASE %I SET search_path = cronlock_testclock, "$user", public, pg_catalog',
        current_database());
END
$path$
"""

CLOCK_SET = "UPDATE cronlock_testclock.clock SET frozen_at = $1"
# now() as the database's sessions see it: through the path, the clock's.
CLOCK_NOW = "SELECT now()"

SERVER_VERSION = "SELECT current_setting('server_version_num')::int"

# The client connections to database $1 other than the asking one (autovacuum is no leak).
DATABASE_BACKENDS = """
SELECT pid, coalesce(nullif(application_name, ''), '?') AS application, state,
       left(query, 60) AS query
FROM pg_stat_activity
WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'
ORDER BY pid
"""

_quote = postgresql.dialect().identifier_preparer.quote_identifier  # type: ignore[no-untyped-call]


def create_database(name: str, template: str | None = None, *, file_copy: bool = False) -> str:
    """``CREATE DATABASE name [TEMPLATE template] [STRATEGY FILE_COPY]`` (FILE_COPY, from
    PostgreSQL 15, clones a small template far faster than the default WAL_LOG)."""
    words = ["CREATE DATABASE", _quote(name)]
    if template is not None:
        words += ["TEMPLATE", _quote(template)]
    if file_copy:
        words.append("STRATEGY FILE_COPY")
    return " ".join(words)


def drop_database(name: str) -> str:
    """``DROP DATABASE IF EXISTS name WITH (FORCE)``: its connections are ended with it."""
    return " ".join(["DROP DATABASE IF EXISTS", _quote(name), "WITH (FORCE)"])
