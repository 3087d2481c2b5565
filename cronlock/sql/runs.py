"""Statements on ``runs``: recording a run, one run per slot, misfires, status and metrics.

Every run, skip and miss is a row. A slot is claimed by at most one row (the partial unique
index ``ux_runs_task_slot``); a success is a run that committed its work.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Integer,
    Select,
    String,
    Text,
    and_,
    bindparam,
    case,
    column,
    delete,
    exists,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    true,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ..outcome import RUN_CLAIMING_STATUSES, RUN_SUCCESS_STATUSES
from .histograms import buckets
from .tables import RUN_CLAIMING_PREDICATE, RUN_STATUSES, runs, tasks

__all__ = [
    "RUN_CHUNK_COMMIT",
    "RUN_FINISH",
    "RUN_GET",
    "RUN_INSERT",
    "RUN_INSERT_MISSED",
    "RUN_INTERRUPT",
    "RUN_INTERRUPT_DEAD",
    "RUN_LAST_REAL_PER_TASK",
    "RUN_LAST_SLOT",
    "RUN_LAST_SLOT_PER_TASK",
    "RUN_LATEST_PER_TASK",
    "RUN_OF_TASK_SINCE",
    "RUN_OUTCOMES_PER_TASK",
    "RUN_PRUNE",
    "RUN_PRUNE_COUNT",
    "RUN_RECENT",
    "RUN_RECENT_PER_TASK",
    "RUN_SLOTS_RECORDED",
    "RUN_TASK_NAMES",
    "RUN_TOTALS",
    "run_page",
]

# A success is a run that committed its work: completed, or partial (its bad items rolled
# back alone, the rest committed). Constants, as the planner sees them in a generic plan too.
_did_work = runs.c.status.in_([literal_column(repr(s.value)) for s in RUN_SUCCESS_STATUSES])

RUN_INSERT = insert(runs).returning(runs.c.id)

# A no_slot skip ran nothing and claimed nothing (a run by hand outside every slot, a cron
# line far too late): listed among a task's last runs, a handful of them hid its real ones.
_not_no_slot = or_(runs.c.skip_reason.is_(None), runs.c.skip_reason != literal_column("'no_slot'"))

# -- chunked runs -------------------------------------------------------------------------
# A chunked run (commit_every) inserts its row `running` with RUN_INSERT and commits it, then
# updates it in every chunk's transaction. Each update matches only a row that is still
# `running`: one another run marked interrupted (this run had lost its lock) matches none, so
# the chunk it would have committed is rolled back instead: the row is the fence.

_run_id = bindparam("run_id", type_=BigInteger)
_still_running = and_(runs.c.id == _run_id, runs.c.status == literal_column("'running'"))

# A chunk commits with its progress: counts, failures so far, chunks, the commit's time.
RUN_CHUNK_COMMIT = (
    update(runs)
    .where(_still_running)
    .values(
        items_ok=bindparam("new_items_ok", type_=Integer),
        items_failed=bindparam("new_items_failed", type_=Integer),
        failures=bindparam("new_failures", type_=JSONB),
        chunks=bindparam("new_chunks", type_=Integer),
        committed_at=func.now(),
    )
    .returning(runs.c.id)
)

# The run's outcome, in its last chunk's transaction (or, failed, in one of its own).
RUN_FINISH = (
    update(runs)
    .where(_still_running)
    .values(
        status=bindparam("new_status", type_=Text),
        finished_at=bindparam("new_finished_at", type_=DateTime(timezone=True)),
        items_ok=bindparam("new_items_ok", type_=Integer),
        items_failed=bindparam("new_items_failed", type_=Integer),
        items_parked=bindparam("new_items_parked", type_=Integer),
        failures=bindparam("new_failures", type_=JSONB),
        error=bindparam("new_error", type_=Text),
        chunks=bindparam("new_chunks", type_=Integer),
        # Now when this transaction commits the last chunk; kept when it records a failure.
        committed_at=case(
            (bindparam("commits_work", type_=Boolean), func.now()), else_=runs.c.committed_at
        ),
    )
    .returning(runs.c.id)
)

# A run that lost its lock marks its own row (if no other run did first).
RUN_INTERRUPT = (
    update(runs)
    .where(_still_running)
    .values(status="interrupted", error=bindparam("new_error", type_=Text), finished_at=func.now())
    .returning(runs.c.id)
)

# Under the task's lock, every `running` row of the task is a run that died: its process or
# its lock went before its end (the lock is held for the whole of a chunked run). Its row
# keeps what its last committed chunk said; it finished, as far as anyone knows, then.
RUN_INTERRUPT_DEAD = (
    update(runs)
    .where(
        runs.c.task == bindparam("run_task", type_=Text),
        runs.c.status == literal_column("'running'"),
    )
    .values(
        status="interrupted",
        error=bindparam("new_error", type_=Text),
        finished_at=func.coalesce(runs.c.committed_at, runs.c.started_at),
    )
    .returning(runs.c.id, runs.c.slot, runs.c.items_ok, runs.c.chunks)
)


# -- slots (one run per slot, misfires) -------------------------------------------------------

_task = bindparam("task", type_=String)
_slot = bindparam("slot", type_=DateTime(timezone=True))
# Constants, like _did_work: the planner proves a predicate implies ux_runs_task_slot's only
# against constants, and bound values would leave a generic plan scanning the task's rows.
_claiming = runs.c.status.in_([literal_column(repr(s.value)) for s in RUN_CLAIMING_STATUSES])

# A slot nobody ran. The unique index arbitrates between schedulers recording the same miss.
RUN_INSERT_MISSED = (
    pg_insert(runs)
    .on_conflict_do_nothing(
        index_elements=[runs.c.task, runs.c.slot], index_where=RUN_CLAIMING_PREDICATE
    )
    .returning(runs.c.id)
)

# The latest claimed slot (a run's outcome or a miss): where a task's backlog of slots nobody
# fired begins. An index-only scan of ux_runs_task_slot, backwards, one entry.
RUN_LAST_SLOT = select(func.max(runs.c.slot)).where(runs.c.task == _task, _claiming)

# Slots between two instants that already have a row of any kind (run, skip or miss). No row
# starts more than the task's `early` before its slot, so :since (the low slot minus it)
# bounds the scan of ix_runs_task_started_at to the rows since then.
RUN_SLOTS_RECORDED = (
    select(runs.c.slot)
    .distinct()
    .where(
        runs.c.task == _task,
        runs.c.started_at >= bindparam("since", type_=DateTime(timezone=True)),
        runs.c.slot >= bindparam("low", type_=DateTime(timezone=True)),
        runs.c.slot <= bindparam("high", type_=DateTime(timezone=True)),
    )
)

_names = (
    func.unnest(bindparam("tasks", type_=ARRAY(Text)))
    .table_valued(column("task", Text))
    .render_derived(name="names")
)

# Per task of :tasks: its latest claimed slot, and when its first row of any kind started (a
# task with no outcome yet is known to exist since then), and its row of ``tasks``: paused
# since when, else when it was last resumed. What overdue is computed from; two one-entry
# index scans per task (ux_runs_task_slot, ix_runs_task_started_at), never a scan of the
# table, and a probe of the tasks' primary key.
RUN_LAST_SLOT_PER_TASK = select(
    _names.c.task,
    select(func.max(runs.c.slot))
    .where(runs.c.task == _names.c.task, _claiming)
    .scalar_subquery()
    .label("last_slot"),
    select(func.min(runs.c.started_at))
    .where(runs.c.task == _names.c.task)
    .scalar_subquery()
    .label("first_started_at"),
    select(tasks.c.paused_at)
    .where(tasks.c.name == _names.c.task)
    .scalar_subquery()
    .label("paused_at"),
    select(tasks.c.updated_at)
    .where(tasks.c.name == _names.c.task, tasks.c.paused_at.is_(None))
    .scalar_subquery()
    .label("resumed_at"),
)

# Recent runs, newest first; :task NULL means every task.
RUN_RECENT = (
    select(runs)
    .where(
        or_(
            bindparam("task", type_=Text).is_(None),
            runs.c.task == bindparam("task", type_=Text),
        )
    )
    .order_by(runs.c.started_at.desc(), runs.c.id.desc())
    .limit(bindparam("limit", type_=Integer))
)


_run_duration = func.extract("epoch", runs.c.finished_at - runs.c.started_at)
_run_lateness = runs.c.lateness_ms / literal(1000.0)
_finished = runs.c.finished_at.is_not(None)
_slotted = runs.c.lateness_ms.is_not(None)  # runs of a slot; manual runs have none
_last_success = (
    select(runs.c.task, func.max(runs.c.started_at).label("at"))
    .where(_did_work)
    .group_by(runs.c.task)
    .subquery()
)

# Per task: runs by outcome, the last success, failures since it, and duration and lateness
# histograms, counted from the whole table: what the metrics' rollup (rollups.py,
# RUN_TOTALS_NOW) must add up to while nothing is pruned.
RUN_TOTALS = (
    select(
        runs.c.task,
        *[
            func.count().filter(runs.c.status == literal(status)).label(status)
            for status in RUN_STATUSES
        ],
        func.max(_last_success.c.at).label("last_success_at"),
        func.count()
        .filter(
            runs.c.status == literal_column("'failed'"),
            or_(_last_success.c.at.is_(None), runs.c.started_at > _last_success.c.at),
        )
        .label("consecutive_failures"),
        func.count().filter(_finished).label("duration_count"),
        func.coalesce(func.sum(_run_duration).filter(_finished), 0.0).label("duration_sum"),
        *[column.label(f"duration_{column.name}") for column in buckets(_run_duration, _finished)],
        func.count().filter(_slotted).label("lateness_count"),
        func.coalesce(func.sum(_run_lateness).filter(_slotted), 0.0).label("lateness_sum"),
        *[column.label(f"lateness_{column.name}") for column in buckets(_run_lateness, _slotted)],
    )
    .select_from(runs.outerjoin(_last_success, _last_success.c.task == runs.c.task))
    .group_by(runs.c.task)
    .order_by(runs.c.task)
)


# -- retention ----------------------------------------------------------------------------

_newer = runs.alias("newer")
_newer_claiming = _newer.c.status.in_(
    [literal_column(repr(s.value)) for s in RUN_CLAIMING_STATUSES]
)
_newer_success = _newer.c.status.in_([literal_column(repr(s.value)) for s in RUN_SUCCESS_STATUSES])
# A run retention may delete: any but a task's latest claimed slot (where its backlog of slots
# nobody fired begins, and what overdue counts from) and its latest success (status's "last
# success"), which stay however old they are. Each is one probe of an index of runs.
_deletable = and_(
    or_(
        ~_claiming,
        runs.c.slot.is_(None),
        exists().where(_newer.c.task == runs.c.task, _newer_claiming, _newer.c.slot > runs.c.slot),
    ),
    or_(
        ~_did_work,
        exists().where(
            _newer.c.task == runs.c.task, _newer_success, _newer.c.started_at > runs.c.started_at
        ),
    ),
)
_before = bindparam("before", type_=DateTime(timezone=True))
_run_doomed = (
    select(runs.c.id, runs.c.started_at)
    .where(
        runs.c.started_at < _before,
        tuple_(runs.c.started_at, runs.c.id)
        > tuple_(
            bindparam("after_started_at", type_=DateTime(timezone=True)),
            bindparam("after_id", type_=BigInteger),
        ),
        _deletable,
    )
    .order_by(runs.c.started_at, runs.c.id)
    .limit(bindparam("limit", type_=Integer))
    .cte("doomed")
    .prefix_with("MATERIALIZED")
)

# Retention: delete :limit runs that started before :before, oldest first from the keyset
# position of the batch before (ix_runs_started_at), sparing what _deletable spares. Returns
# each deleted run's position.
RUN_PRUNE = (
    delete(runs).where(runs.c.id == _run_doomed.c.id).returning(_run_doomed.c.started_at, runs.c.id)
)

# Retention's dry run: how many runs RUN_PRUNE would delete.
RUN_PRUNE_COUNT = select(func.count()).where(runs.c.started_at < _before, _deletable)


# -- the dashboard: per task, on ix_runs_task_started_at, whatever the table's size --------

_r = runs.alias("r")
_first_task = select(runs.c.task).order_by(runs.c.task).limit(1).cte("tasks", recursive=True)
_task_names = _first_task.union_all(
    select(
        select(_r.c.task)
        .where(_r.c.task > _first_task.c.task)
        .order_by(_r.c.task)
        .limit(1)
        .scalar_subquery()
    ).where(_first_task.c.task.is_not(None))
)

# Every task that has a row: a loose index scan of ix_runs_task_started_at, one probe per
# task (a recursive CTE; PostgreSQL has no skip scan), instead of a DISTINCT over the table.
RUN_TASK_NAMES = (
    select(_task_names.c.task).where(_task_names.c.task.is_not(None)).order_by(_task_names.c.task)
)

_of_tasks = (
    func.unnest(bindparam("tasks", type_=ARRAY(Text)))
    .table_valued(column("task", Text))
    .render_derived(name="of_tasks")
)
_newest_first = (runs.c.started_at.desc(), runs.c.id.desc())
_latest = (
    select(
        runs.c.id, runs.c.status, runs.c.slot, runs.c.started_at, runs.c.finished_at, runs.c.trigger
    )
    .where(runs.c.task == _of_tasks.c.task)
    .order_by(*_newest_first)
    .limit(1)
    .lateral("latest")
)

# Per task of :tasks: its latest row (a run, skip or miss) and its latest success, each the
# first entry of a backward walk of ix_runs_task_started_at (the success's walk is as long as
# the task's latest failures and skips).
RUN_LATEST_PER_TASK = select(
    _of_tasks.c.task,
    _latest.c.id,
    _latest.c.status,
    _latest.c.slot,
    _latest.c.started_at,
    _latest.c.finished_at,
    _latest.c.trigger,
    select(runs.c.finished_at)
    .where(runs.c.task == _of_tasks.c.task, _did_work)
    .order_by(*_newest_first)
    .limit(1)
    .scalar_subquery()
    .label("last_success"),
).select_from(_of_tasks.outerjoin(_latest, true()))

_outcomes = (
    select(runs.c.id, runs.c.status, runs.c.lateness_ms, runs.c.started_at)
    .where(runs.c.task == _of_tasks.c.task, _claiming)
    .order_by(*_newest_first)
    .limit(bindparam("limit", type_=Integer))
    .lateral("outcomes")
)

# Per task of :tasks: its last :limit outcomes that claimed a slot (skips left out), newest
# first: the streaks of failures and misses, and recent lateness, are read from these.
RUN_OUTCOMES_PER_TASK = (
    select(_of_tasks.c.task, _outcomes.c.status, _outcomes.c.lateness_ms)
    .select_from(_of_tasks.join(_outcomes, true()))
    .order_by(_of_tasks.c.task, _outcomes.c.started_at.desc(), _outcomes.c.id.desc())
)

_recent = (
    select(runs)
    .where(runs.c.task == _of_tasks.c.task, _not_no_slot)
    .order_by(*_newest_first)
    .limit(bindparam("limit", type_=Integer))
    .lateral("recent")
)

# Per task of :tasks, its last :limit rows newest first, no_slot skips left out (a run by hand
# outside every slot, a cron line far too late: a handful of them hid its real runs); a
# backward walk of ix_runs_task_started_at per task (``cronlock status``'s last runs).
RUN_RECENT_PER_TASK = (
    select(*[_recent.c[c.name] for c in runs.columns])
    .select_from(_of_tasks.join(_recent, true()))
    .order_by(_recent.c.task, _recent.c.started_at.desc(), _recent.c.id.desc())
)

_real = (
    select(runs)
    .where(
        runs.c.task == _of_tasks.c.task,
        runs.c.status.not_in([literal_column("'skipped'"), literal_column("'missed'")]),
    )
    .order_by(*_newest_first)
    .limit(1)
    .lateral("real")
)

# Per task of :tasks, its latest run that ran its body (not a skip, not a miss): what status
# shows when skips fill its last runs. A backward walk as long as its latest skips and misses.
RUN_LAST_REAL_PER_TASK = select(*[_real.c[c.name] for c in runs.columns]).select_from(
    _of_tasks.join(_real, true())
)

# A task's rows that started at or after :since, oldest first, :limit at most: the slot
# picture's window (no row starts more than the task's `early` before its slot, so :since is
# the window's first slot minus it). A range of ix_runs_task_started_at.
RUN_OF_TASK_SINCE = (
    select(runs)
    .where(
        runs.c.task == bindparam("task", type_=Text),
        runs.c.started_at >= bindparam("since", type_=DateTime(timezone=True)),
    )
    .order_by(runs.c.started_at, runs.c.id)
    .limit(bindparam("limit", type_=Integer))
)

RUN_GET = select(runs).where(runs.c.id == bindparam("id", type_=BigInteger))


def run_page(*, before: bool) -> Select[Any]:
    """A task's runs newest first, :limit of them; with ``before``, those before the keyset
    position (:before_started_at, :before_id) of a page. ix_runs_task_started_at, backwards."""
    query = select(runs).where(runs.c.task == bindparam("task", type_=Text))
    if before:
        position = tuple_(
            bindparam("before_started_at", type_=DateTime(timezone=True)),
            bindparam("before_id", type_=BigInteger),
        )
        query = query.where(tuple_(runs.c.started_at, runs.c.id) < position)
    return query.order_by(*_newest_first).limit(bindparam("limit", type_=Integer))
