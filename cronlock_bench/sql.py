"""``cronlock bench``'s statements: its scratch schema, its items table, and its readings.

The bench works in a scratch schema of its own; nothing here runs outside ``cronlock bench``.
This is the bench's one home for SQL, as ``cronlock/sql/`` is cronlock's (the same tests hold
it to the same rules: ``test_sql_in_one_place``, ``test_boundary``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ARRAY,
    Column,
    DateTime,
    Integer,
    MetaData,
    Table,
    Text,
    Uuid,
    any_,
    bindparam,
    delete,
    func,
    insert,
    literal,
    literal_column,
    select,
    update,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateSchema, CreateTable, DropSchema
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from cronlock.sql.tables import SCHEMA, jobs, workers

__all__ = [
    "BENCH_COMPLETED_AT",
    "BENCH_DRAIN_WINDOW",
    "BENCH_FIRST_COMPLETED_AFTER",
    "BENCH_ITEMS_CHECK",
    "BENCH_ITEMS_CREATE",
    "BENCH_ITEMS_DELETE",
    "BENCH_ITEMS_FILL",
    "BENCH_ITEMS_RESET",
    "BENCH_ITEMS_VACUUM",
    "BENCH_ITEM_UPDATE",
    "BENCH_JOBS_DELETE",
    "BENCH_JOBS_VACUUM",
    "BENCH_SERVER",
    "BENCH_WORKERS",
    "BenchVacuum",
    "bench_items",
    "bench_schema_create",
    "bench_schema_drop",
]

_completed = jobs.c.status == literal_column("'completed'")

# The periodic workload's table, in the bench's scratch schema (never in alembic's metadata).
bench_items = Table(
    "bench_items",
    MetaData(schema=SCHEMA),
    Column("id", Integer, primary_key=True),
    Column("n", Integer, nullable=False, server_default="0"),
)

# The server the bench measures: its version and the settings that bound a commit's cost.
BENCH_SERVER = select(
    func.current_setting(literal("server_version")).label("server_version"),
    func.current_setting(literal("fsync")).label("fsync"),
    func.current_setting(literal("synchronous_commit")).label("synchronous_commit"),
)

BENCH_ITEMS_CREATE = CreateTable(bench_items)

BENCH_ITEMS_FILL = insert(bench_items).from_select(
    ["id"], select(func.generate_series(1, bindparam("items", type_=Integer)))
)

# What a task author writes: one UPDATE per item, inside ``run.item()``'s savepoint.
BENCH_ITEM_UPDATE = (
    update(bench_items)
    .where(bench_items.c.id == bindparam("item", type_=Integer))
    .values(n=bench_items.c.n + 1)
)

BENCH_ITEMS_RESET = update(bench_items).values(n=0)

BENCH_ITEMS_DELETE = delete(bench_items)

# Items updated exactly once, and all items: the run must leave (items, items).
BENCH_ITEMS_CHECK = select(
    func.count().filter(bench_items.c.n == 1), func.count().label("total")
).select_from(bench_items)

# A drain's window in the database's timestamps: first started_at to last completed_at.
BENCH_DRAIN_WINDOW = select(
    func.min(jobs.c.started_at).label("first_started"),
    func.max(jobs.c.completed_at).label("last_completed"),
    func.count().label("completed"),
).where(jobs.c.queue == bindparam("queue", type_=Text), _completed)

BENCH_COMPLETED_AT = select(jobs.c.id, jobs.c.completed_at).where(
    jobs.c.id == any_(bindparam("ids", type_=ARRAY(Uuid))), _completed
)

# The first completion after a moment (the kill of the active worker).
BENCH_FIRST_COMPLETED_AFTER = select(func.min(jobs.c.completed_at)).where(
    jobs.c.queue == bindparam("queue", type_=Text),
    _completed,
    jobs.c.completed_at > bindparam("after", type_=DateTime(timezone=True)),
)

BENCH_JOBS_DELETE = delete(jobs).where(jobs.c.queue == bindparam("queue", type_=Text))

BENCH_WORKERS = select(workers.c.pid, workers.c.state).where(
    workers.c.queue == bindparam("queue", type_=Text)
)


class BenchVacuum(Executable, ClauseElement):
    """``VACUUM ANALYZE`` of one table: workloads start from a table without dead rows.

    The table's name is quoted by SQLAlchemy's identifier preparer, with the schema applied
    by ``schema_translate_map`` like every other statement; nothing comes from input.
    """

    inherit_cache = False

    def __init__(self, target: Table) -> None:
        self.target = target


@compiles(BenchVacuum)
def _compile_vacuum(element: BenchVacuum, compiler: SQLCompiler, **_: Any) -> str:
    return "VACUUM ANALYZE " + compiler.preparer.format_table(element.target)


BENCH_JOBS_VACUUM = BenchVacuum(jobs)
BENCH_ITEMS_VACUUM = BenchVacuum(bench_items)


def bench_schema_create(name: str) -> CreateSchema:
    """``CREATE SCHEMA`` for the bench's scratch schema (a name cronlock chose, quoted by
    SQLAlchemy); it fails if the schema exists, so the bench never adopts someone's schema."""
    return CreateSchema(name)


def bench_schema_drop(name: str) -> DropSchema:
    return DropSchema(name, cascade=True, if_exists=True)
