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
    "schema_missing",
    "sqlstate",
    "upgrade",
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


async def _alembic(database: Database, action: str, revision: str) -> None:
    from alembic import command

    config = _config(database)

    def run(connection: Connection) -> None:
        config.attributes["connection"] = connection
        getattr(command, action)(config, revision)

    async with database.engine.begin() as conn:
        await conn.run_sync(run)


async def upgrade(database: Database, revision: str = "head") -> None:
    await _alembic(database, "upgrade", revision)


async def downgrade(database: Database, revision: str = "base") -> None:
    await _alembic(database, "downgrade", revision)


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
    if revision != head:
        raise DatabaseUnavailable(
            f"cronlock's schema is at revision {revision}, this cronlock needs {head}: "
            "run `cronlock migrate`"
        )


def is_schema_missing(exc: BaseException) -> bool:
    """Whether ``exc``, an error of one of cronlock's own statements, says a table, column,
    function or schema it names is not there: cronlock's schema is missing or behind."""
    return sqlstate(exc) in _MISSING_OBJECT_STATES


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error, wrapped by SQLAlchemy or not."""
    original = getattr(exc, "orig", None) or exc
    found = getattr(original, "sqlstate", None) or getattr(original.__cause__, "sqlstate", None)
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
