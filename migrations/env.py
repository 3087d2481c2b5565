"""alembic environment for cronlock's own schema.

Run through ``cronlock migrate`` (``cronlock.schema``), which hands over a connection and the
schema name. Its version table is ``cronlock_alembic_version`` inside that schema, so it
coexists with the application's own alembic history.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import func, select
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateSchema

from cronlock.locks import lock_key, namespace_key
from cronlock.sql.tables import SCHEMA, VERSION_TABLE, metadata

config = context.config
schema: str = config.attributes.get("schema", SCHEMA)
connection: Connection | None = config.attributes.get("connection")

if connection is None:
    raise RuntimeError("run cronlock's migrations with `cronlock migrate`")

# Two hosts migrating at once take turns; the lock ends with the transaction.
connection.execute(
    select(func.pg_advisory_xact_lock(namespace_key("cronlock"), lock_key("migrate")))
)
connection.execute(CreateSchema(schema, if_not_exists=True))
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    version_table_schema=schema,
    include_schemas=True,
    transaction_per_migration=False,
)
with context.begin_transaction():
    context.run_migrations()
