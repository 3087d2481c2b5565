"""Every SQL statement cronlock issues, named, parameterised, in one place.

Statements are SQLAlchemy Core built from ``tables.py``; values are bound parameters and the
schema is applied by ``schema_translate_map``, so nothing from input is ever formatted into
SQL. Names put the noun first so related statements sort together.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    cast,
    column,
    exists,
    func,
    insert,
    select,
    table,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from .tables import (
    RUN_CLAIMING_PREDICATE,
    RUN_CLAIMING_STATUSES,
    SCHEMA,
    VERSION_TABLE,
    runs,
)

__all__ = [
    "LOCK_HOLDERS",
    "LOCK_TRY_XACT",
    "RUN_CLAIMING_RECENT_PER_TASK",
    "RUN_INSERT",
    "RUN_INSERT_MISSED",
    "RUN_LAST_SLOT",
    "RUN_LAST_SUCCESS_PER_TASK",
    "RUN_RECENT_PER_TASK",
    "RUN_SLOTS_RECORDED",
    "RUN_SLOT_CLAIMED",
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


# -- slots (one run per slot, misfires) -------------------------------------------------------

_task = bindparam("task", type_=String)
_slot = bindparam("slot", type_=DateTime(timezone=True))
_claiming = runs.c.status.in_(RUN_CLAIMING_STATUSES)

# Read under the task's advisory lock, so the run that committed last is visible: READ
# COMMITTED takes a fresh snapshot per statement, after the lock was granted.
RUN_SLOT_CLAIMED = select(exists().where(runs.c.task == _task, runs.c.slot == _slot, _claiming))

# A slot nobody ran. The unique index arbitrates between schedulers recording the same miss.
RUN_INSERT_MISSED = (
    pg_insert(runs)
    .on_conflict_do_nothing(
        index_elements=[runs.c.task, runs.c.slot], index_where=RUN_CLAIMING_PREDICATE
    )
    .returning(runs.c.id)
)

# The latest slot with any row: where a starting scheduler picks up a task's history.
RUN_LAST_SLOT = select(func.max(runs.c.slot)).where(runs.c.task == _task)

# Slots between two instants that already have a row of any kind (run, skip or miss).
RUN_SLOTS_RECORDED = (
    select(runs.c.slot)
    .distinct()
    .where(
        runs.c.task == _task,
        runs.c.slot >= bindparam("low", type_=DateTime(timezone=True)),
        runs.c.slot <= bindparam("high", type_=DateTime(timezone=True)),
    )
)

# -- status ---------------------------------------------------------------------------------

# A success is a run that committed its work: completed, or partial (its bad items rolled
# back alone, the rest committed).
RUN_LAST_SUCCESS_PER_TASK = (
    select(runs.c.task, func.max(runs.c.finished_at).label("last_success"))
    .where(runs.c.status.in_(("completed", "partial")))
    .group_by(runs.c.task)
)

_claimed_ranked = (
    select(
        runs.c.task,
        runs.c.slot,
        runs.c.status,
        runs.c.trigger,
        runs.c.lateness_ms,
        runs.c.started_at,
        func.row_number()
        .over(partition_by=runs.c.task, order_by=(runs.c.started_at.desc(), runs.c.id.desc()))
        .label("rank"),
    )
    .where(_claiming)
    .subquery()
)

# The last :limit outcomes per task that claimed a slot (skips are left out), newest first:
# consecutive failures and misses, and recent lateness, are read from these.
RUN_CLAIMING_RECENT_PER_TASK = (
    select(
        _claimed_ranked.c.task,
        _claimed_ranked.c.slot,
        _claimed_ranked.c.status,
        _claimed_ranked.c.trigger,
        _claimed_ranked.c.lateness_ms,
    )
    .where(_claimed_ranked.c.rank <= bindparam("limit", type_=Integer))
    .order_by(_claimed_ranked.c.task, _claimed_ranked.c.rank)
)
