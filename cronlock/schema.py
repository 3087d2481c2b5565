"""cronlock's schema in a database: migrating it, and checking it before work starts.

The alembic scripts live in the repository's top-level ``migrations/`` and are shipped in the
wheel as ``cronlock/_migrations``; whichever exists is used. Migrations run on one connection
in one transaction, under an advisory lock, so ``cronlock migrate`` is idempotent and safe to
start from several hosts at once.

Checking the schema (``ensure_ready``, before every command's work) needs the scripts' head
revision and not alembic, which with mako and its pygments plugin takes about a quarter of a
second to import: ``head_revision`` reads each script's ``revision`` and ``down_revision``
itself, and alembic is imported only to migrate.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, ProgrammingError

from . import sql
from .database import Database
from .errors import DatabaseUnavailable

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "downgrade",
    "ensure_ready",
    "head_revision",
    "is_schema_missing",
    "migrations_directory",
    "oldest_code",
    "pending_revisions",
    "schema_missing",
    "sqlstate",
    "upgrade",
    "upgrade_sql",
]

# What PostgreSQL says when a statement names a table, column or function that is not there:
# cronlock's schema not installed, or older than this cronlock's statements.
_MISSING_OBJECT_STATES = frozenset({"42P01", "42703", "42883", "3F000"})

_PACKAGE = Path(__file__).resolve().parent


def migrations_directory() -> Path:
    for candidate in (_PACKAGE / "_migrations", _PACKAGE.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise DatabaseUnavailable("cronlock's migrations are missing from this installation")


def _config(database: Database | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_directory()))
    if database is not None:
        config.attributes["schema"] = database.schema
    return config


@functools.cache
def head_revision() -> str:
    """The one revision no script revises: alembic's head (tests/unit/test_startup.py
    holds the two to each other), read from the scripts without running them."""
    revisions: set[str] = set()
    revised: set[str] = set()
    for script in (migrations_directory() / "versions").glob("*.py"):
        assigned = {
            target.id: node.value
            for node in ast.parse(script.read_text()).body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        revisions.add(str(ast.literal_eval(assigned["revision"])))
        down = ast.literal_eval(assigned["down_revision"])  # None, one revision or a merge's
        revised.update([] if down is None else [down] if isinstance(down, str) else down)
    heads = revisions - revised
    assert len(heads) == 1, f"cronlock's migrations have {len(heads)} heads: {sorted(heads)}"
    return heads.pop()


async def _alembic(
    database: Database,
    action: str,
    revision: str,
    *,
    lock_timeout: float | None = None,
    retry_for: float | None = None,
    index_timeout: float | None = None,
) -> None:
    """Run alembic's ``action`` to ``revision``; a migration whose lock wait timed out is
    started again after a pause until ``retry_for`` has passed (``cronlock.online``, rule 1)."""
    import asyncio
    import logging
    import time

    from alembic import command

    from . import online

    config = _config(database)
    budget = online.RETRY_FOR if retry_for is None else retry_for
    timeout = online.LOCK_TIMEOUT if lock_timeout is None else lock_timeout
    config.attributes.update(
        lock_timeout=timeout,
        index_timeout=online.INDEX_TIMEOUT if index_timeout is None else index_timeout,
        deadline=time.monotonic() + budget,
    )

    def run(connection: Connection) -> None:
        config.attributes["connection"] = connection
        getattr(command, action)(config, revision)

    attempt = 0
    while True:
        try:
            async with database.engine.connect() as conn:
                try:
                    await conn.run_sync(run)
                finally:
                    # Its session settings (lock_timeout) and, after a cut, its advisory lock
                    # must not go back to the pool with it.
                    await conn.invalidate()
            return
        except DBAPIError as exc:
            if not online.is_lock_timeout(exc):
                raise
        attempt += 1
        async with database.connect() as conn:
            blocker = await conn.run_sync(online.oldest_transaction)
        at = await current_revision(database) or "base"
        if time.monotonic() >= config.attributes["deadline"]:
            raise DatabaseUnavailable(
                f"migrating from revision {at}: a lock wait kept timing out ({timeout:g} s "
                f"each, {attempt} tries in {budget:g} s; {blocker}): end that transaction or "
                "run `cronlock migrate` again"
            )
        pause = online.pause(attempt)
        logging.getLogger(__name__).warning(
            "migrating from revision %s: waited %g s for a lock (%s); retry %d in %.1f s",
            at,
            timeout,
            blocker,
            attempt,
            pause,
            extra={"action": "migrate_retry"},
        )
        await asyncio.sleep(pause)


async def upgrade(
    database: Database,
    revision: str = "head",
    *,
    lock_timeout: float | None = None,
    retry_for: float | None = None,
    index_timeout: float | None = None,
) -> None:
    """Migrate up to ``revision``; the timeouts are ``cronlock.online``'s (defaults there)."""
    await _alembic(
        database,
        "upgrade",
        revision,
        lock_timeout=lock_timeout,
        retry_for=retry_for,
        index_timeout=index_timeout,
    )


async def downgrade(database: Database, revision: str = "base") -> None:
    await _alembic(database, "downgrade", revision)


def pending_revisions(current: str | None) -> list[str] | None:
    """The revisions an upgrade from ``current`` (None: nothing installed) would apply, oldest
    first; None when ``current`` is not one of this cronlock's (a newer schema)."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(_config())
    if current is not None and current not in {s.revision for s in scripts.walk_revisions()}:
        return None
    pending = scripts.iterate_revisions(head_revision(), current or "base")
    return [script.revision for script in reversed(list(pending))]


def upgrade_sql(database: Database, current: str | None) -> str:
    """The statements an upgrade from ``current`` to head runs, for a DBA to apply by hand
    (alembic's offline mode: nothing is run, the database is not read)."""
    import io

    from alembic import command

    from . import online

    config = _config(database)
    config.output_buffer = io.StringIO()
    config.attributes["lock_timeout"] = online.LOCK_TIMEOUT
    command.upgrade(config, f"{current}:head" if current else "head", sql=True)
    return config.output_buffer.getvalue()


async def current_revision(database: Database) -> str | None:
    """The schema's revision, or None where cronlock's schema is not installed."""
    async with database.connect() as conn:
        try:
            return (await conn.execute(sql.SCHEMA_REVISION)).scalar_one_or_none()
        except ProgrammingError:  # the version table does not exist
            return None


async def ensure_ready(database: Database) -> None:
    """Fail with one clear line unless the database is reachable and migrated to head."""
    try:
        revision = await current_revision(database)
    except (OSError, DBAPIError, TimeoutError) as exc:
        raise DatabaseUnavailable(describe_connection_error(database, exc)) from None
    if revision is None:
        raise DatabaseUnavailable(
            f"cronlock's schema {database.schema!r} is not installed in "
            f"{database.display_url}: run `cronlock migrate`"
        )
    head = head_revision()
    if revision == head:
        return
    if pending_revisions(revision) is not None:
        raise DatabaseUnavailable(
            f"cronlock's schema is at revision {revision}, this cronlock needs {head}: "
            "run `cronlock migrate`"
        )
    # Newer than this code: it works on if the schema says code from this head on does
    # (cronlock.online, rule 6: code N works against schema N and N+1).
    oldest = await oldest_code(database)
    if oldest is None or pending_revisions(oldest) is None:
        raise DatabaseUnavailable(
            f"cronlock's schema is at revision {revision}, which needs cronlock code from "
            f"revision {oldest or '?'} on; this cronlock is at {head}: upgrade cronlock"
        )


async def oldest_code(database: Database) -> str | None:
    """The oldest code revision that works against the database's schema (None: not said)."""
    from .sql import migrations
    from .sql.tables import VERSION_TABLE

    async with database.connect() as conn:
        found: str | None = (
            await conn.execute(
                migrations.OLDEST_CODE, {"schema": database.schema, "table": VERSION_TABLE}
            )
        ).scalar_one_or_none()
    return found


def is_schema_missing(exc: BaseException) -> bool:
    """Whether ``exc``, an error of one of cronlock's own statements, says a table, column,
    function or schema it names is not there: cronlock's schema is missing or behind."""
    return sqlstate(exc) in _MISSING_OBJECT_STATES


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error (asyncpg, psycopg 3, psycopg2), wrapped by SQLAlchemy or
    Django or not."""
    original = getattr(exc, "orig", None) or exc
    found = (
        getattr(original, "sqlstate", None)
        or getattr(original, "pgcode", None)  # psycopg2
        or getattr(original.__cause__, "sqlstate", None)
        or getattr(original.__cause__, "pgcode", None)
    )
    return found if isinstance(found, str) else None


def schema_missing(database: Database | None, schema_name: str, exc: BaseException) -> str | None:
    """The one line for ``exc``, an error of one of cronlock's own statements, when it says
    cronlock's schema is missing or behind (a table, column or function that is not there),
    else None: what the Python API raises where a command would have checked before it
    started (``ensure_ready``), without a query of its own on the way."""
    if sqlstate(exc) not in _MISSING_OBJECT_STATES:
        return None
    original = getattr(exc, "orig", None) or exc
    detail = str(original).strip().splitlines()[0] if str(original).strip() else ""
    where = f" in {database.display_url}" if database is not None else ""
    return (
        f"cronlock's schema {schema_name!r} is not installed or not migrated to this "
        f"cronlock's revision{where} ({detail}): run `cronlock migrate`"
    )


def describe_connection_error(database: Database, exc: BaseException) -> str:
    original = getattr(exc, "orig", None) or exc
    detail = str(original).strip().splitlines()[0] if str(original).strip() else ""
    return f"cannot connect to {database.display_url}: {type(original).__name__}: {detail}"
