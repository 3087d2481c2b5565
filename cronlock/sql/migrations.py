"""The statements of migrating: alembic's version table (alembic owns and writes it), the
migration's own lock and lock timeout, an index's validity and the transaction a lock wait
was most likely behind (``cronlock.online``)."""

from __future__ import annotations

from sqlalchemy import Column, MetaData, String, Table, Text, bindparam, func, select, text
from sqlalchemy.schema import SetTableComment

from .tables import SCHEMA, VERSION_TABLE

__all__ = [
    "INDEX_VALID",
    "MIGRATE_LOCK",
    "MIGRATE_UNLOCK",
    "OLDEST_CODE",
    "OLDEST_TRANSACTION",
    "SCHEMA_REVISION",
    "SET_LOCK_TIMEOUT",
    "record_oldest_code",
]

# alembic owns this table; it is declared here only to read it.
_alembic_version = Table(
    VERSION_TABLE, MetaData(schema=SCHEMA), Column("version_num", String(32), primary_key=True)
)

SCHEMA_REVISION = select(_alembic_version.c.version_num)

# Two hosts migrating at once take turns. A session lock, not a transaction's: each migration
# commits on its own and an index is built outside any transaction (CONCURRENTLY).
MIGRATE_LOCK = select(func.pg_advisory_lock(bindparam("namespace"), bindparam("key")))
MIGRATE_UNLOCK = select(func.pg_advisory_unlock(bindparam("namespace"), bindparam("key")))

# For the session, not a transaction: it must hold across alembic's per-migration commits.
SET_LOCK_TIMEOUT = select(func.set_config("lock_timeout", bindparam("timeout", type_=Text), False))

# NULL: no such index; false: an interrupted CREATE INDEX CONCURRENTLY left it invalid.
INDEX_VALID = text(
    "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = :schema AND c.relname = :name"
).bindparams(bindparam("schema", type_=Text), bindparam("name", type_=Text))

# Once a lock wait has timed out its blocker is no longer known (pg_blocking_pids needs the
# wait): the oldest open transaction of the database is what a migration usually waits for.
OLDEST_TRANSACTION = text(
    "SELECT pid, coalesce(state, '?') AS state, "
    "extract(epoch FROM now() - xact_start)::float8 AS seconds, "
    "left(regexp_replace(query, '\\s+', ' ', 'g'), 80) AS query "
    "FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND xact_start IS NOT NULL AND backend_type = 'client backend' "
    "ORDER BY xact_start LIMIT 1"
)

# The version window (cronlock.online, rule 6): the oldest code revision that works against
# the schema, kept as the comment of alembic's version table, where code of any age reads it
# (a table of its own would need a migration that older code knows nothing of).
OLDEST_CODE = text(
    "SELECT obj_description(to_regclass(format('%I.%I', :schema, :table)), 'pg_class')"
).bindparams(bindparam("schema", type_=Text), bindparam("table", type_=Text))


def record_oldest_code(schema: str, revision: str) -> SetTableComment:
    """``COMMENT ON TABLE`` of the version table: ``revision``, a literal the dialect quotes."""
    version = Table(
        VERSION_TABLE,
        MetaData(),
        Column("version_num", String(32)),
        schema=schema,
        comment=revision,
    )
    return SetTableComment(version)
