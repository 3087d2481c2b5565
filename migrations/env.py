"""alembic environment for cronlock's own schema.

Run through ``cronlock migrate`` (``cronlock.schema``), which hands over a connection and the
schema name, or, for ``cronlock migrate --sql``, offline: the statements are printed, not run.
Its version table is ``cronlock_alembic_version`` inside that schema, so it coexists with the
application's own alembic history.

Every migration commits on its own (an online index build cannot run in a transaction) under a
short ``lock_timeout``; the rules the migrations follow are ``cronlock.online``'s.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateSchema

from cronlock.locks import lock_key, namespace_key
from cronlock.online import LOCK_TIMEOUT
from cronlock.sql import migrations as statements
from cronlock.sql.tables import SCHEMA, VERSION_TABLE, metadata

config = context.config
schema: str = config.attributes.get("schema", SCHEMA)
connection: Connection | None = config.attributes.get("connection")
_LOCK = {"namespace": namespace_key("cronlock"), "key": lock_key("migrate")}
_OPTIONS = {
    "target_metadata": metadata,
    "version_table": VERSION_TABLE,
    "version_table_schema": schema,
    "include_schemas": True,
    "transaction_per_migration": True,
}


def _floor(revision: str) -> str:
    """The oldest code revision that works against the schema at ``revision``: the latest
    ``oldest_code`` the migrations up to it declare (revisions are numbered). One that declares
    none (the test requires it) counts as its ``down_revision``, the window's usual edge."""
    return max(
        getattr(script.module, "oldest_code", None) or script.down_revision or script.revision
        for script in context.script.iterate_revisions(revision, "base")
    )


if context.is_offline_mode():
    context.configure(dialect_name="postgresql", literal_binds=True, **_OPTIONS)
    lock_timeout = float(config.attributes.get("lock_timeout", LOCK_TIMEOUT))
    context.execute(statements.SET_LOCK_TIMEOUT.params(timeout=f"{lock_timeout * 1000:.0f}ms"))
    context.execute(CreateSchema(schema, if_not_exists=True))
    context.run_migrations()
    # Offline the current revision is the range's end (a downgrade is not printed).
    ending = context.get_revision_argument()
    last = context.script.get_revision(ending if isinstance(ending, str) else None)
    if last is not None:
        context.execute(statements.record_oldest_code(schema, _floor(last.revision)))
elif connection is None:
    raise RuntimeError("run cronlock's migrations with `cronlock migrate`")
else:
    # Waited for without a timeout: a host waiting for another's migration blocks nobody.
    connection.execute(statements.MIGRATE_LOCK, _LOCK)
    lock_timeout = float(config.attributes.get("lock_timeout", LOCK_TIMEOUT))
    connection.execute(statements.SET_LOCK_TIMEOUT, {"timeout": f"{lock_timeout * 1000:.0f}ms"})
    try:
        connection.execute(CreateSchema(schema, if_not_exists=True))
        connection.commit()
        context.configure(connection=connection, **_OPTIONS)
        with context.begin_transaction():
            context.run_migrations()
        current = context.get_context().get_current_revision()
        if current is not None:
            connection.execute(statements.record_oldest_code(schema, _floor(current)))
            connection.commit()
    finally:
        connection.rollback()
        connection.execute(statements.MIGRATE_UNLOCK, _LOCK)
        connection.commit()
