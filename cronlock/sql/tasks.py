"""Statements on ``tasks`` and ``failing_items``: pausing a periodic task, what a run reads
under its lock before its body, and the memory of items that keep failing.

A run takes its lock, then reads ``RUN_GATE`` in one round trip: whether its slot is claimed
already, whether the task is paused (by whom, since when), and the task's failing items with
their consecutive failures and whether they are parked. After its body it writes that memory
back with its outcome, in the same transaction: ``ITEMS_FAILED`` counts the items that failed
(parking those that reach the task's ``park_after``), ``ITEMS_SUCCEEDED`` forgets those that
now succeeded.
"""

from __future__ import annotations

from sqlalchemy import (
    DateTime,
    Integer,
    Text,
    bindparam,
    case,
    column,
    delete,
    exists,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert

from .runs import _claiming
from .tables import failing_items, runs, tasks

__all__ = [
    "ITEMS_FAILED",
    "ITEMS_FORGET",
    "ITEMS_FORGET_ALL",
    "ITEMS_OF_TASK",
    "ITEMS_PARKED",
    "ITEMS_PARKED_COUNTS",
    "ITEMS_SUCCEEDED",
    "ITEM_UNPARK",
    "RUN_GATE",
    "TASK_PAUSE",
    "TASK_RESUME",
    "TASK_STATES",
]

_task = bindparam("task", type_=Text)
_now = bindparam("now", type_=DateTime(timezone=True))

# Pause: a row is returned only when this call paused the task (not when it already was).
TASK_PAUSE = (
    pg_insert(tasks)
    .values(name=_task, paused_at=_now, paused_by=bindparam("by", type_=Text), updated_at=_now)
    .on_conflict_do_update(
        index_elements=[tasks.c.name],
        set_={
            "paused_at": _now,
            "paused_by": bindparam("by", type_=Text),
            "updated_at": _now,
        },
        where=tasks.c.paused_at.is_(None),
    )
    .returning(tasks.c.name)
)

# Resume: a row is returned only when the task was paused. updated_at is the resume's moment.
TASK_RESUME = (
    update(tasks)
    .where(tasks.c.name == _task, tasks.c.paused_at.is_not(None))
    .values(paused_at=None, paused_by=None, updated_at=_now)
    .returning(tasks.c.name)
)

# Every task an operator paused or resumed (a handful of rows).
TASK_STATES = select(tasks).order_by(tasks.c.name)

_memory = (
    select(
        func.jsonb_agg(
            func.jsonb_build_array(
                failing_items.c.item,
                failing_items.c.failures,
                failing_items.c.parked_at.is_not(None),
            )
        )
    )
    .where(failing_items.c.task == _task)
    .scalar_subquery()
)

# What a run reads under its lock, before its body, in one round trip: whether :slot (NULL for
# a manual run) is claimed, the task's pause, and its failing items as [[item, failures,
# parked], ...] (NULL: none). Read after the lock was granted, so the run that committed last
# is visible (READ COMMITTED takes a snapshot per statement).
RUN_GATE = select(
    exists()
    .where(
        runs.c.task == _task,
        runs.c.slot == bindparam("slot", type_=DateTime(timezone=True)),
        _claiming,
    )
    .label("claimed"),
    select(tasks.c.paused_at).where(tasks.c.name == _task).scalar_subquery().label("paused_at"),
    select(tasks.c.paused_by).where(tasks.c.name == _task).scalar_subquery().label("paused_by"),
    _memory.label("items"),
)

_failed = (
    func.unnest(bindparam("items", type_=ARRAY(Text)), bindparam("errors", type_=ARRAY(Text)))
    .table_valued(column("item", Text), column("error", Text))
    .render_derived(name="failed")
)
_park_after = bindparam("park_after", type_=Integer)
_insert_failed = pg_insert(failing_items).from_select(
    ["task", "item", "failures", "error", "first_failed_at", "last_failed_at", "parked_at"],
    select(
        _task,
        _failed.c.item,
        literal_column("1"),
        _failed.c.error,
        _now,
        _now,
        case((_park_after <= 1, _now)),
    ),
)
# The items of :items failed in a run (their errors in :errors, in the same order, each key
# once): one more consecutive failure each, parked when the count reaches :park_after (NULL:
# never). Returns each item's count and whether it is parked now.
ITEMS_FAILED = _insert_failed.on_conflict_do_update(
    index_elements=[failing_items.c.task, failing_items.c.item],
    set_={
        "failures": failing_items.c.failures + 1,
        "error": _insert_failed.excluded.error,
        "last_failed_at": _now,
        "parked_at": func.coalesce(
            failing_items.c.parked_at,
            case((failing_items.c.failures + 1 >= _park_after, _now)),
        ),
    },
).returning(failing_items.c.item, failing_items.c.failures, failing_items.c.parked_at)

_keys = bindparam("items", type_=ARRAY(Text))
# The items of :items succeeded: their consecutive failures start again from none.
ITEMS_SUCCEEDED = delete(failing_items).where(
    failing_items.c.task == _task, failing_items.c.item == func.any(_keys)
)

# A task's remembered items, parked first, most recent failure first.
ITEMS_OF_TASK = (
    select(failing_items)
    .where(failing_items.c.task == _task)
    .order_by(
        failing_items.c.parked_at.is_(None),
        failing_items.c.last_failed_at.desc(),
        failing_items.c.item,
    )
    .limit(bindparam("limit", type_=Integer))
)

# The parked items of every task, :limit at most per task, with their last error (status).
_parked_ranked = (
    select(
        failing_items,
        func.row_number()
        .over(partition_by=failing_items.c.task, order_by=failing_items.c.parked_at.desc())
        .label("rank"),
        func.count().over(partition_by=failing_items.c.task).label("parked_count"),
    )
    .where(failing_items.c.parked_at.is_not(None))
    .subquery()
)
ITEMS_PARKED = (
    select(_parked_ranked)
    .where(_parked_ranked.c.rank <= bindparam("limit", type_=Integer))
    .order_by(_parked_ranked.c.task, _parked_ranked.c.rank)
)

# Per task: its parked items (/metrics).
ITEMS_PARKED_COUNTS = (
    select(failing_items.c.task, func.count().label("parked"))
    .where(failing_items.c.parked_at.is_not(None))
    .group_by(failing_items.c.task)
)

_item = bindparam("item", type_=Text)
# Retry a parked item: the next run tries it again; one more failure parks it again (its count
# is kept).
ITEM_UNPARK = (
    update(failing_items)
    .where(
        # Not :task and :item: an UPDATE keeps its columns' names for its SET clause.
        failing_items.c.task == bindparam("of_task", type_=Text),
        failing_items.c.item == bindparam("of_item", type_=Text),
        failing_items.c.parked_at.is_not(None),
    )
    .values(parked_at=None)
    .returning(failing_items.c.item)
)

# Forget an item: it starts again from no failures.
ITEMS_FORGET = (
    delete(failing_items)
    .where(failing_items.c.task == _task, failing_items.c.item == _item)
    .returning(failing_items.c.item)
)
ITEMS_FORGET_ALL = (
    delete(failing_items).where(failing_items.c.task == _task).returning(failing_items.c.item)
)
