"""Statements of the metrics' rollup: finished jobs folded into ``job_totals`` up to a mark.

A scrape must not read the whole history: ``job_totals`` holds, per queue, the counters and the
latency histogram of every finished job with ``completed_at`` at or before the jobs mark's
``through``; a scrape reads it, plus the jobs above the mark (a range of ix_jobs_finished),
plus the retries and snoozes of the jobs still open (ix_jobs_open), all in one statement, so
one snapshot (JOB_TOTALS_NOW). The scrape moves the mark itself (observe/prometheus.py):

1. METRIC_MARK_TAKE locks the mark row with SKIP LOCKED (a concurrent scrape folds nothing and
   reads what was there) and says whether its pending point is ready.
2. A pending point is chosen at one scrape: the database's clock minus a lag, and the
   transactions of this database that hold a transaction id then (pg_stat_activity's
   ``backend_xid``, visible to every role). It is ready once all of them have ended: a
   completion committed later than the point was chosen belongs to a transaction that took its
   id after it, and its completed_at is no earlier than that (every mode's completion writes
   the database's clock in its outcome statement, and in the strict and batch modes the claim
   took the id before the handler ran), give or take the lag: the instants between a
   statement's clock and its first write.
3. JOB_TOTALS_FOLD adds the jobs of (through, pending_through] to ``job_totals``, and
   METRIC_MARK_MOVE sets ``through``, in the same transaction.

A transaction that keeps a transaction id for long (an idle-in-transaction session that wrote)
holds the mark back: the scrape stays exact and reads more rows above the mark until it ends.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Double,
    Select,
    Text,
    bindparam,
    cast,
    column,
    exists,
    func,
    literal,
    literal_column,
    null,
    select,
    table,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement

from ..outcome import JOB_FINISHED_STATUSES, JobStatus
from .histograms import LATENCY_BUCKETS
from .jobs import _job_latency, _snoozed, _snoozes
from .tables import job_totals, jobs, metric_marks

__all__ = [
    "JOBS_MARK",
    "JOB_TOTALS_FOLD",
    "JOB_TOTALS_NOW",
    "METRIC_MARK_CREATE",
    "METRIC_MARK_GET",
    "METRIC_MARK_MOVE",
    "METRIC_MARK_TAKE",
]

# The name of the jobs rollup's row in metric_marks.
JOBS_MARK = "jobs"

_activity = table(
    "pg_stat_activity",
    column("pid"),
    column("datname"),
    column("backend_xid"),
    schema="pg_catalog",
)
# Every other session of this database that holds a transaction id now, as "pid:xid" (a pid
# alone could be a new session's, an xid alone wraps around; the pair is one transaction).
_holder = func.concat(cast(_activity.c.pid, Text), ":", cast(_activity.c.backend_xid, Text))
_holding = (
    _activity.c.datname == func.current_database(),
    _activity.c.backend_xid.is_not(None),
    _activity.c.pid != func.pg_backend_pid(),
)
_holders_now = (
    select(func.coalesce(func.array_agg(_holder), cast(literal_column("'{}'"), ARRAY(Text))))
    .where(*_holding)
    .scalar_subquery()
)
_pending_still_held = exists().where(*_holding, _holder == func.any(metric_marks.c.pending_xids))
_moment = metric_marks.c.through.type
_now = func.coalesce(bindparam("now", type_=_moment), func.statement_timestamp())
_lag = cast(bindparam("lag_seconds", type_=Double), Double) * literal_column("interval '1 second'")

# The mark of :name, locked, unless another scrape holds it (then no row: it folds, this one
# only reads). ``ready``: every transaction its pending point waits for has ended. ``candidate``
# and ``holders``: a new pending point, if one is to be chosen (the clock, or a test's :now,
# minus :lag_seconds; the transactions holding an id now). pg_stat_activity is read once per
# transaction, so this is the transaction's first statement.
METRIC_MARK_TAKE = (
    select(
        metric_marks.c.through,
        metric_marks.c.pending_through,
        (~_pending_still_held).label("ready"),
        (_now - _lag).label("candidate"),
        _holders_now.label("holders"),
    )
    .where(metric_marks.c.name == bindparam("mark", type_=Text))
    .with_for_update(skip_locked=True)
)

# A mark's row where there is none (its migration writes it; a TRUNCATE may have taken it).
METRIC_MARK_CREATE = (
    pg_insert(metric_marks)
    .values(name=bindparam("mark", type_=Text))
    .on_conflict_do_nothing(index_elements=[metric_marks.c.name])
)

METRIC_MARK_GET = select(metric_marks.c.through).where(
    metric_marks.c.name == bindparam("mark", type_=Text)
)

METRIC_MARK_MOVE = (
    update(metric_marks)
    .where(metric_marks.c.name == bindparam("mark", type_=Text))
    .values(
        through=bindparam("new_through", type_=metric_marks.c.through.type),
        pending_through=bindparam("new_pending_through", type_=metric_marks.c.through.type),
        pending_xids=bindparam("new_pending_xids", type_=ARRAY(Text)),
    )
)

_COMPLETED: ColumnElement[str] = literal_column(repr(JobStatus.COMPLETED.value))
_FINISHED = jobs.c.status.in_([literal_column(repr(s.value)) for s in JOB_FINISHED_STATUSES])
# Open jobs: not finished (no completed_at); their retries and snoozes count already. The
# status test lets the scan be one of ix_jobs_open (status <> 'completed'), reading in the
# heap only the jobs not failed or cancelled.
_OPEN = jobs.c.status.in_(
    [
        literal_column(repr(s.value))
        for s in (JobStatus.PENDING, JobStatus.RETRYING, JobStatus.PROCESSING)
    ]
)
_le_count = len(LATENCY_BUCKETS)
# How many bounds the latency is at or under: width_bucket over the negated bounds, ascending,
# counts the bounds b with -b <= -latency. One expression a row instead of one FILTER a bound;
# le_i is then the rows with at least (len - i) such bounds.
_negated_bounds = cast(
    literal_column("'{" + ",".join(repr(-float(b)) for b in reversed(LATENCY_BUCKETS)) + "}'"),
    ARRAY(Double),
)
_under = func.width_bucket(-cast(_job_latency, Double), _negated_bounds)


def _finished_totals(*where: ColumnElement[bool]) -> Select[Any]:
    """Per queue, the rollup's columns for the finished jobs that match ``where``."""
    grouped = (
        select(
            jobs.c.queue,
            jobs.c.status,
            _under.label("under"),
            func.count().label("n"),
            func.sum(jobs.c.retry_count).label("retries"),
            func.coalesce(func.sum(_snoozes).filter(_snoozed), 0).label("snoozes"),
            func.sum(cast(_job_latency, Double)).label("latency"),
        )
        .where(jobs.c.completed_at.is_not(None), _FINISHED, *where)
        .group_by(jobs.c.queue, jobs.c.status, literal_column("3"))
        .subquery("grouped")
    )
    done = grouped.c.status == _COMPLETED
    return select(
        grouped.c.queue,
        func.coalesce(func.sum(grouped.c.n).filter(done), 0).label("completed"),
        func.coalesce(
            func.sum(grouped.c.n).filter(grouped.c.status == literal_column("'failed'")), 0
        ).label("failed"),
        func.coalesce(
            func.sum(grouped.c.n).filter(grouped.c.status == literal_column("'cancelled'")), 0
        ).label("cancelled"),
        func.coalesce(func.sum(grouped.c.retries), 0).label("retries"),
        func.coalesce(func.sum(grouped.c.snoozes), 0).label("snoozes"),
        func.coalesce(func.sum(grouped.c.latency).filter(done), 0.0).label("latency_sum"),
        *[
            func.coalesce(
                func.sum(grouped.c.n).filter(done, grouped.c.under >= _le_count - index), 0
            ).label(f"le_{index}")
            for index in range(_le_count)
        ],
    ).group_by(grouped.c.queue)


_after = bindparam("after", type_=metric_marks.c.through.type)
_through = bindparam("through", type_=metric_marks.c.through.type)
_folded = _finished_totals(jobs.c.completed_at > _after, jobs.c.completed_at <= _through)
_counters = [c.name for c in job_totals.columns if c.name != "queue"]
_fold_insert = pg_insert(job_totals).from_select(["queue", *_counters], _folded)

# Add the finished jobs of (:after, :through] to the rollup: a range of ix_jobs_finished.
JOB_TOTALS_FOLD = _fold_insert.on_conflict_do_update(
    index_elements=[job_totals.c.queue],
    set_={name: job_totals.c[name] + _fold_insert.excluded[name] for name in _counters},
)

_mark_through = (
    select(metric_marks.c.through)
    .where(metric_marks.c.name == literal(JOBS_MARK, Text))
    .scalar_subquery()
)
_above = bindparam("through", type_=_moment)
# The mark as a bound value (:through, read just before): the planner then sees how few jobs
# lie above it and reads them from ix_jobs_finished (against a subquery's value it plans a
# scan of the whole table).
_live = _finished_totals(jobs.c.completed_at > _above).add_columns(null().label("mark"))
_open = (
    select(
        jobs.c.queue,
        *[literal(0).label(name) for name in ("completed", "failed", "cancelled")],
        func.coalesce(func.sum(jobs.c.retry_count), 0).label("retries"),
        func.coalesce(func.sum(_snoozes).filter(_snoozed), 0).label("snoozes"),
        literal(0.0).label("latency_sum"),
        *[literal(0).label(f"le_{index}") for index in range(_le_count)],
        null().label("mark"),
    )
    .where(jobs.c.status != _COMPLETED, _OPEN, jobs.c.completed_at.is_(None))
    .group_by(jobs.c.queue)
)
_rolled = select(
    job_totals.c.queue,
    *[job_totals.c[name] for name in _counters],
    _mark_through.label("mark"),
)

# Per queue, what /metrics reports of the jobs: rows to add up, one of the rollup, one of the
# jobs above :through, one of the open jobs. One statement, so one snapshot: the rollup's rows
# carry the mark they were folded to, and a caller whose :through is not that mark (a fold
# committed in between) reads again.
JOB_TOTALS_NOW = _rolled.union_all(_live, _open)
