"""Every SQL statement cronlock issues, named, parameterised, in one place.

Statements are SQLAlchemy Core built from ``tables.py``; values are bound parameters and the
schema is applied by ``schema_translate_map``, so nothing from input is ever formatted into
SQL. Names put the noun first so related statements sort together.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    cast,
    column,
    func,
    insert,
    select,
    table,
)

from .tables import SCHEMA, VERSION_TABLE, runs

__all__ = [
    "LOCK_HOLDERS",
    "LOCK_TRY_XACT",
    "RUN_INSERT",
    "RUN_RECENT_PER_TASK",
    "SCHEMA_REVISION",
]

# alembic owns this table; it is declared here only to read it.
_alembic_version = Table(
    VERSION_TABLE, MetaData(schema=SCHEMA), Column("version_num", String(32), primary_key=True)
)

# Never waits: a busy lock means another run is active, and this one is skipped. The lock is
# released with the transaction, also when the process dies.
LOCK_TRY_XACT = select(
    func.pg_try_advisory_xact_lock(
        bindparam("namespace", type_=Integer), bindparam("key", type_=Integer)
    )
)

_pg_locks = table(
    "pg_locks",
    column("locktype"),
    column("classid"),
    column("objid"),
    column("objsubid"),
    column("granted"),
    column("pid"),
    schema="pg_catalog",
)

# Backends holding a two-key advisory lock. pg_locks shows the keys as oids (unsigned), so the
# caller passes them as ``key & 0xFFFFFFFF``.
LOCK_HOLDERS = select(_pg_locks.c.pid).where(
    _pg_locks.c.locktype == "advisory",
    _pg_locks.c.objsubid == 2,
    _pg_locks.c.granted,
    cast(_pg_locks.c.classid, BigInteger) == bindparam("namespace_oid", type_=BigInteger),
    cast(_pg_locks.c.objid, BigInteger) == bindparam("key_oid", type_=BigInteger),
)

RUN_INSERT = insert(runs).returning(runs.c.id)

_ranked = select(
    runs,
    func.row_number()
    .over(partition_by=runs.c.task, order_by=(runs.c.started_at.desc(), runs.c.id.desc()))
    .label("rank"),
).subquery()

# The last :limit runs of every task, newest first.
RUN_RECENT_PER_TASK = (
    select(*[_ranked.c[c.name] for c in runs.columns])
    .where(_ranked.c.rank <= bindparam("limit", type_=Integer))
    .order_by(_ranked.c.task, _ranked.c.rank)
)

SCHEMA_REVISION = select(_alembic_version.c.version_num)
