"""Online migrations: the rules every migration in ``migrations/versions`` follows so that it
never stalls the queue, and the helpers that make each rule one call.

A migration runs while workers claim and complete jobs and producers enqueue them, and maybe
while a strict-mode job holds a row of ``jobs`` in a transaction for minutes. The rules:

1. **Lock waits are short.** ``env.py`` sets ``lock_timeout`` (``LOCK_TIMEOUT``, 0.5 s;
   ``cronlock migrate --lock-timeout``) for every statement: one that would queue behind a
   long transaction gives up after a moment, instead of making every enqueue and claim queue
   behind it. Its migration's transaction rolls back and ``cronlock.schema.upgrade`` starts
   that migration again after a growing pause, logging what it waited for, until
   ``--retry-for`` (10 min) has passed; then it stops with one line. Each migration commits
   on its own, so a retry resumes at the migration that waited.
2. **Indexes on existing tables are built online**: ``create_index`` (``CREATE INDEX
   CONCURRENTLY`` in alembic's autocommit block; an invalid index an interrupted build left,
   ``pg_index.indisvalid``, is dropped and built again), ``replace_index`` (a new definition
   under the same name: built beside the old one, which is then dropped) and ``drop_index``.
   Their waits (for transactions older than the build) block nobody, so they wait up to
   ``INDEX_TIMEOUT`` and retry on their own. A table the migration creates may be given its
   indexes as usual.
3. **Check constraints on existing tables** are added by ``add_check``: ``NOT VALID`` (a
   moment under the table's lock), then validated without blocking writes.
4. **Columns are added without a rewrite**: nullable, or with a constant or stable default
   (``now()`` is evaluated once); never a volatile default (``gen_random_uuid()``,
   ``clock_timestamp()``), a type change, or ``SET NOT NULL`` on a column of a big table.
5. **A migration may run again from its start** (rule 1 restarts it; an online step commits
   what precedes it): every step is idempotent (``if_not_exists=True``, ``if_exists=True``;
   the helpers here are).
6. **Each migration declares ``oldest_code``**: the oldest head revision of cronlock whose
   code still works against the schema this migration leaves (usually the migration's
   ``down_revision``: code N runs against schema N and N+1). ``env.py`` records the floor in
   the database, where a process reads it before it starts (``cronlock.schema``).

``tests/integration/test_online_migrations.py`` runs every migration under a long transaction
and a steady enqueue and claim load, and fails one that breaks these rules.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import TypedDict, Unpack

import sqlalchemy as sa
from alembic import context, op
from alembic.runtime.migration import MigrationContext

from .sql import migrations as statements
from .sql.tables import RENAME_INDEX, SCHEMA, VALIDATE_CONSTRAINT

__all__ = [
    "INDEX_TIMEOUT",
    "LOCK_TIMEOUT",
    "RETRY_FOR",
    "IndexDefinition",
    "add_check",
    "create_index",
    "drop_index",
    "is_lock_timeout",
    "oldest_transaction",
    "pause",
    "replace_index",
]

log = logging.getLogger(__name__)

LOCK_TIMEOUT = 0.5
INDEX_TIMEOUT = 30.0
RETRY_FOR = 600.0
# lock_not_available: what a statement that waited lock_timeout for its lock raises.
_LOCK_TIMEOUT_STATE = "55P03"


def _setting(name: str, default: float) -> float:
    return float(context.config.attributes.get(name, default))


def _schema() -> str:
    schema: str = context.config.attributes.get("schema", SCHEMA)
    return schema


def is_lock_timeout(exc: BaseException) -> bool:
    original = getattr(exc, "orig", None) or exc
    found = getattr(original, "sqlstate", None) or getattr(original.__cause__, "sqlstate", None)
    return found == _LOCK_TIMEOUT_STATE


def pause(attempt: int) -> float:
    """The pause before retry ``attempt`` (1, 2, ...): 0.1 s doubling to 5 s, jittered so that
    two hosts do not retry in step."""
    return min(0.1 * 2.0 ** (attempt - 1), 5.0) * random.uniform(0.5, 1.0)


def oldest_transaction(connection: sa.Connection) -> str:
    """The oldest open transaction of the database, described in a few words (what a lock wait
    was most likely behind), or that there is none."""
    row = connection.execute(statements.OLDEST_TRANSACTION).first()
    if row is None:
        return "no other open transaction now"
    return (
        f"oldest open transaction: pid {row.pid}, {row.state} for {row.seconds:.0f} s: {row.query}"
    )


def _patiently(what: str, step: Callable[[], None]) -> None:
    """Run ``step`` (an online statement, in autocommit) under ``INDEX_TIMEOUT``, again after a
    pause each time its lock wait times out, until the migration's deadline."""
    ctx = op.get_context()
    if ctx.as_sql:
        step()
        return
    connection = ctx.connection
    assert connection is not None
    deadline = float(context.config.attributes.get("deadline", time.monotonic() + RETRY_FOR))
    lock_timeout = _setting("lock_timeout", LOCK_TIMEOUT)
    index_timeout = _setting("index_timeout", INDEX_TIMEOUT)
    connection.execute(statements.SET_LOCK_TIMEOUT, {"timeout": f"{index_timeout * 1000:.0f}ms"})
    try:
        attempt = 0
        while True:
            try:
                step()
                return
            except sa.exc.DBAPIError as exc:
                if not is_lock_timeout(exc) or time.monotonic() >= deadline:
                    raise
            attempt += 1
            wait = pause(attempt)
            log.warning(
                "%s waited %.1f s for a lock (%s); retry %d in %.1f s",
                what,
                index_timeout,
                oldest_transaction(connection),
                attempt,
                wait,
                extra={"action": "migrate_retry"},
            )
            time.sleep(wait)
    finally:
        connection.execute(statements.SET_LOCK_TIMEOUT, {"timeout": f"{lock_timeout * 1000:.0f}ms"})


def _is_valid(ctx: MigrationContext, name: str) -> bool | None:
    assert ctx.connection is not None
    valid: bool | None = ctx.connection.execute(
        statements.INDEX_VALID, {"schema": _schema(), "name": name}
    ).scalar_one_or_none()
    return valid


class IndexDefinition(TypedDict, total=False):
    """What an index is besides its name, table and columns."""

    unique: bool
    where: str
    include: Sequence[str]


def _build(
    name: str,
    table: str,
    columns: Sequence[str | sa.TextClause],
    definition: IndexDefinition,
) -> None:
    ctx = op.get_context()
    options: dict[str, object] = {"postgresql_concurrently": True}
    if "where" in definition:
        options["postgresql_where"] = sa.text(definition["where"])
    if definition.get("include"):
        options["postgresql_include"] = list(definition["include"])

    def step() -> None:
        if not ctx.as_sql and _is_valid(ctx, name) is False:
            log.warning("index %s is invalid (an interrupted build): building it again", name)
            _drop(name, table)
        op.create_index(
            name,
            table,
            list(columns),
            schema=_schema(),
            unique=definition.get("unique", False),
            if_not_exists=True,
            **options,
        )

    _patiently(f"building index {name}", step)


def _drop(name: str, table: str) -> None:
    op.drop_index(
        name, table_name=table, schema=_schema(), postgresql_concurrently=True, if_exists=True
    )


def create_index(
    name: str,
    table: str,
    columns: Sequence[str | sa.TextClause],
    **definition: Unpack[IndexDefinition],
) -> None:
    """Build an index on an existing table without blocking its writes (rule 2)."""
    with op.get_context().autocommit_block():
        _build(name, table, columns, definition)


def replace_index(
    name: str,
    table: str,
    columns: Sequence[str | sa.TextClause],
    **definition: Unpack[IndexDefinition],
) -> None:
    """Give index ``name`` a new definition without blocking writes: the new one is built
    beside it, the old one dropped and the new one renamed (an index is never missing)."""
    interim = f"{name}_next"
    quote = op.get_context().dialect.identifier_preparer.quote
    with op.get_context().autocommit_block():
        _build(interim, table, columns, definition)
        _patiently(f"dropping index {name}", lambda: _drop(name, table))
        rename = sa.text(
            RENAME_INDEX % {"schema": quote(_schema()), "old": quote(interim), "new": quote(name)}
        )
        _patiently(f"renaming index {interim}", lambda: op.execute(rename))


def drop_index(name: str, table: str) -> None:
    """Drop an index without blocking the table's reads and writes (rule 2)."""
    with op.get_context().autocommit_block():
        _patiently(f"dropping index {name}", lambda: _drop(name, table))


def add_check(name: str, table: str, condition: str) -> None:
    """Add (or replace) check constraint ``name`` of an existing table without a scan under
    its lock (rule 3): dropped if there and added ``NOT VALID`` in the migration's
    transaction, then validated outside it, reading the table while writes go on. What
    precedes it in the migration is committed with it."""
    op.drop_constraint(op.f(name), table, type_="check", schema=_schema(), if_exists=True)
    op.create_check_constraint(
        op.f(name), table, condition, schema=_schema(), postgresql_not_valid=True
    )
    quote = op.get_context().dialect.identifier_preparer.quote
    validate = sa.text(
        VALIDATE_CONSTRAINT
        % {"schema": quote(_schema()), "table": quote(table), "name": quote(name)}
    )
    with op.get_context().autocommit_block():
        _patiently(f"validating {name}", lambda: op.execute(validate))
