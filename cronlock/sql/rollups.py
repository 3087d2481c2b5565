"""Statements of the metrics' rollup: finished jobs folded into ``job_totals`` up to a mark.

A scrape must not read the whole history: ``job_totals`` holds, per queue, the counters and the
latency histogram of every finished job with ``completed_at`` at or before the jobs mark's
``through``; a scrape reads it, plus the jobs above the mark (a range of ix_jobs_finished),
plus the retries and snoozes of the jobs still open (ix_jobs_retried, ix_jobs_snoozed), all
in one statement, so one snapshot (JOB_TOTALS_NOW). The scrape moves the mark itself
(observe/prometheus.py):

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
    BigInteger,
    Double,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    table,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement

from ..outcome import (
    JobStatus,
    RunStatus,
)
from .histograms import LATENCY_BUCKETS, buckets
from .jobs import (
    _FINISHED,
    _SECOND,
    _STATEMENT_CLOCK,
    _job_latency,
    _snoozed,
    _snoozes,
)
from .runs import _did_work
from .tables import RUN_STATUSES, job_totals, jobs, metric_marks, run_totals, runs

__all__ = [
    "JOBS_MARK",
    "JOB_TOTALS_FOLD",
    "JOB_TOTALS_NOW",
    "METRICS_FOLD_LOCAL",
    "METRICS_NO_JIT_LOCAL",
    "METRIC_MARK_CREATE",
    "METRIC_MARK_GET",
    "METRIC_MARK_MOVE",
    "METRIC_MARK_TAKE",
    "RUNS_MARK",
    "RUN_MARK_GET",
    "RUN_MARK_MOVE",
    "RUN_MARK_TAKE",
    "RUN_TOTALS_FOLD",
    "RUN_TOTALS_NOW",
]

# A scrape's statements read a few rows each, but some are estimated dear (a subplan per task,
# the rollup tables' default row estimates) and then JIT-compiled: over 100 ms of compiling
# for a statement that runs in one. For the rest of the scrape's or fold's transaction only.
METRICS_NO_JIT_LOCAL = select(func.set_config("jit", "off", True))

# The same for a fold's transaction, whose commit is not waited for either: a fold lost in a
# crash is lost whole, its rollup rows with its mark, and the next scrape folds it again. A
# scrape then costs no flush of the WAL to disk (about 2-5 ms on the development machine).
METRICS_FOLD_LOCAL = select(
    func.set_config("jit", "off", True), func.set_config("synchronous_commit", "off", True)
)

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
_now = _STATEMENT_CLOCK
_lag = cast(bindparam("lag_seconds", type_=Double), Double) * _SECOND

# The mark of :name, locked, unless another scrape holds it (then no row: it folds, this one
# only reads). ``ready``: every transaction its pending point waits for has ended. ``candidate``
# and ``holders``: a new pending point, if one is to be chosen (the clock, or a test's :now,
# minus :lag_seconds; the transactions holding an id now). pg_stat_activity is read once per
# transaction, so this is the transaction's first statement that reads it.
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


# Open jobs: not finished (no open status ever has a completed_at); their retries and snoozes
# count already. Only the open jobs that have retried or snoozed add anything, and each of the
# two is a small partial index (tables.py, migration 0013; constants, so the planner proves
# the predicates): the retries an index-only scan of ix_jobs_retried, the snoozes the rows of
# ix_jobs_snoozed. Reading every open job's row for them was most of a scrape (26 ms of 10,300
# open jobs on 5,150 pages at a million finished ones, against under 1 ms).
_open = jobs.c.completed_at.is_(None)


def _open_totals(
    retries: ColumnElement[Any], snoozes: ColumnElement[Any], where: ColumnElement[Any]
) -> Select[Any]:
    """Per queue, the ``retries`` and ``snoozes`` of the open jobs that match ``where``."""
    return (
        select(
            jobs.c.queue,
            *[literal(0).label(name) for name in ("completed", "failed", "cancelled")],
            retries.label("retries"),
            snoozes.label("snoozes"),
            literal(0.0).label("latency_sum"),
            *[literal(0).label(f"le_{index}") for index in range(_le_count)],
            null().label("mark"),
        )
        .where(_open, where)
        .group_by(jobs.c.queue)
    )


_open_retries = _open_totals(
    func.sum(jobs.c.retry_count), literal(0), jobs.c.retry_count > literal_column("0")
)
_open_snoozes = _open_totals(literal(0), func.sum(_snoozes), _snoozed)

_rolled = select(
    job_totals.c.queue,
    *[job_totals.c[name] for name in _counters],
    _mark_through.label("mark"),
)

# Per queue, what /metrics reports of the jobs: rows to add up, one of the rollup, one of the
# jobs above :through, two of the open jobs (retries, snoozes). One statement, so one
# snapshot: the rollup's rows carry the mark they were folded to, and a caller whose :through
# is not that mark (a fold committed in between) reads again.
JOB_TOTALS_NOW = _rolled.union_all(_live, _open_retries, _open_snoozes)


# -- runs ---------------------------------------------------------------------------------
# Runs are folded by id, not by a time: finished_at cannot be the key (a dead chunked run is
# marked interrupted with the time it stopped, long after) and started_at is the run's own
# host's clock. Ids are taken at insert and commit out of order, so the wait is the jobs' one,
# with one step more: the pending point is an id seen (``noted_id``, the newest visible run)
# at least the lag before the transactions holding an id are listed. A run with an id at or
# below it took its id before the listing by more than the lag, and an insert takes its
# transaction id in the same statement as the run's id; so it is committed by then, or held
# by a listed transaction: the point is ready once they have ended (METRIC_MARK_TAKE's
# ``ready``). A run still ``running`` (a chunked run's row) is not folded: its id goes to the
# mark's ``open_ids``, read live with the runs above the mark until a fold finds it finished.

RUNS_MARK = "runs"

_RUNNING: ColumnElement[str] = literal_column(repr(RunStatus.RUNNING.value))
_FAILED: ColumnElement[str] = literal_column(repr(RunStatus.FAILED.value))
_FOLDED_STATUSES = [s for s in RUN_STATUSES if s != RunStatus.RUNNING.value]
# The rollup's columns a fold sets rather than adds to.
_RUN_ABSOLUTE = ("last_success_at", "failures_since")
_run_counters = [c.name for c in run_totals.columns if c.name not in ("task", *_RUN_ABSOLUTE)]

_open_ids = bindparam("open_ids", type_=ARRAY(BigInteger))
_id_after = bindparam("after", type_=BigInteger)
_id_through = bindparam("through", type_=BigInteger)

# The mark of the runs, as METRIC_MARK_TAKE takes a mark, with its id columns, the clock (or
# a test's :now) and the newest run id visible now.
RUN_MARK_TAKE = METRIC_MARK_TAKE.add_columns(
    metric_marks.c.through_id,
    metric_marks.c.open_ids,
    metric_marks.c.pending_id,
    metric_marks.c.pending_xids,
    metric_marks.c.noted_id,
    metric_marks.c.noted_at,
    _now.label("clock"),
    select(func.max(runs.c.id)).scalar_subquery().label("newest"),
)

RUN_MARK_GET = select(metric_marks.c.through_id, metric_marks.c.open_ids).where(
    metric_marks.c.name == bindparam("mark", type_=Text)
)

RUN_MARK_MOVE = (
    update(metric_marks)
    .where(metric_marks.c.name == bindparam("mark", type_=Text))
    .values(
        through_id=bindparam("new_through_id", type_=BigInteger),
        open_ids=bindparam("new_open_ids", type_=ARRAY(BigInteger)),
        pending_id=bindparam("new_pending_id", type_=BigInteger),
        pending_xids=bindparam("new_pending_xids", type_=ARRAY(Text)),
        noted_id=bindparam("new_noted_id", type_=BigInteger),
        noted_at=bindparam("new_noted_at", type_=_moment),
    )
)


def _run_measures(source: Any) -> list[Any]:
    """Per group of ``source``'s runs (columns as in runs): the duration and lateness
    histograms, as RUN_TOTALS counts them."""
    duration = func.extract("epoch", source.c.finished_at - source.c.started_at)
    finished = source.c.finished_at.is_not(None)
    lateness = source.c.lateness_ms / literal(1000.0)
    slotted = source.c.lateness_ms.is_not(None)
    return [
        func.count().filter(finished).label("duration_count"),
        func.coalesce(func.sum(duration).filter(finished), 0.0).label("duration_sum"),
        *[column.label(f"duration_{column.name}") for column in buckets(duration, finished)],
        func.count().filter(slotted).label("lateness_count"),
        func.coalesce(func.sum(lateness).filter(slotted), 0.0).label("lateness_sum"),
        *[column.label(f"lateness_{column.name}") for column in buckets(lateness, slotted)],
    ]


def _runs_with_latest_success(*where: ColumnElement[bool]) -> Any:
    """The runs that match ``where``, each with the latest started_at of a success among them
    of its task (``latest``)."""
    return (
        select(
            runs.c.id,
            runs.c.task,
            runs.c.status,
            runs.c.started_at,
            runs.c.finished_at,
            runs.c.lateness_ms,
            func.max(runs.c.started_at)
            .filter(_did_work)
            .over(partition_by=runs.c.task)
            .label("latest"),
        )
        .where(*where)
        .subquery()
    )


def _failed_after(
    source: Any, task: ColumnElement[str], after: ColumnElement[Any], folded_through: Any
) -> Any:
    """How many runs of ``task`` folded before (id at or below ``folded_through``, not open)
    failed after ``after``: one range of ix_runs_task_started_at, the runs since then."""
    return (
        select(func.count())
        .where(
            runs.c.task == task,
            runs.c.started_at > after,
            runs.c.status == _FAILED,
            runs.c.id <= folded_through,
            runs.c.id != func.all(_open_ids),
        )
        .scalar_subquery()
    )


_batch = _runs_with_latest_success(
    or_(and_(runs.c.id > _id_after, runs.c.id <= _id_through), runs.c.id == func.any(_open_ids)),
    runs.c.status != _RUNNING,
)
_current = run_totals.alias("rolled")
_failed_batch = _batch.c.status == _FAILED
_fold_values = (
    select(
        _batch.c.task,
        *[func.count().filter(_batch.c.status == literal(s)).label(s) for s in _FOLDED_STATUSES],
        func.greatest(_current.c.last_success_at, _batch.c.latest).label("last_success_at"),
        # A success in the batch later than the rollup's: the failures since are the batch's
        # after it and the folded runs' after it (few: they started after a recent success).
        case(
            (
                or_(_batch.c.latest.is_(None), _batch.c.latest <= _current.c.last_success_at),
                func.coalesce(_current.c.failures_since, 0)
                + func.count().filter(
                    _failed_batch,
                    or_(
                        _current.c.last_success_at.is_(None),
                        _batch.c.started_at > _current.c.last_success_at,
                    ),
                ),
            ),
            else_=func.count().filter(_failed_batch, _batch.c.started_at > _batch.c.latest)
            + _failed_after(_batch, _batch.c.task, _batch.c.latest, _id_after),
        ).label("failures_since"),
        *_run_measures(_batch),
    )
    .select_from(_batch.outerjoin(_current, _current.c.task == _batch.c.task))
    .group_by(_batch.c.task, _batch.c.latest, _current.c.last_success_at, _current.c.failures_since)
)
_run_fold_insert = pg_insert(run_totals).from_select(
    [c.name for c in run_totals.columns], _fold_values
)
_run_folded = (
    _run_fold_insert.on_conflict_do_update(
        index_elements=[run_totals.c.task],
        set_={
            **{
                name: run_totals.c[name] + _run_fold_insert.excluded[name] for name in _run_counters
            },
            **{name: _run_fold_insert.excluded[name] for name in _RUN_ABSOLUTE},
        },
    )
    .returning(run_totals.c.task)
    .cte("folded")
)
# Fold the runs of (:after, :through] and the open runs :open_ids that are not running into
# run_totals; the ids of those still running (the mark's next open_ids) and how many tasks'
# rows were written. One statement, so one snapshot: a run that finishes meanwhile is either
# folded or still open, never neither.
RUN_TOTALS_FOLD = select(
    func.coalesce(
        select(func.array_agg(runs.c.id))
        .where(
            or_(
                and_(runs.c.id > _id_after, runs.c.id <= _id_through),
                runs.c.id == func.any(_open_ids),
            ),
            runs.c.status == _RUNNING,
        )
        .scalar_subquery(),
        cast(literal_column("'{}'"), ARRAY(BigInteger)),
    ).label("running"),
    select(func.count()).select_from(_run_folded).scalar_subquery().label("tasks"),
)

_tail = _runs_with_latest_success(or_(runs.c.id > _id_through, runs.c.id == func.any(_open_ids)))
_rolled_runs = run_totals.alias("rolled")
_latest_of_both = func.greatest(_rolled_runs.c.last_success_at, _tail.c.latest)
_tail_totals = (
    select(
        _tail.c.task,
        _tail.c.latest,
        *[func.count().filter(_tail.c.status == literal(s)).label(s) for s in RUN_STATUSES],
        func.count()
        .filter(
            _tail.c.status == _FAILED,
            or_(_latest_of_both.is_(None), _tail.c.started_at > _latest_of_both),
        )
        .label("failed_after"),
        *_run_measures(_tail),
    )
    .select_from(_tail.outerjoin(_rolled_runs, _rolled_runs.c.task == _tail.c.task))
    .group_by(_tail.c.task, _tail.c.latest, _rolled_runs.c.last_success_at)
    .subquery("tail_totals")
)
_measure_names = [
    c.name for c in run_totals.columns if c.name.startswith(("duration_", "lateness_"))
]


def _both(name: str) -> Any:
    return func.coalesce(run_totals.c[name], 0) + func.coalesce(_tail_totals.c[name], 0)


_runs_mark = (
    select(metric_marks.c.through_id)
    .where(metric_marks.c.name == literal(RUNS_MARK, Text))
    .scalar_subquery()
)

# Per task, what /metrics reports of its runs (the columns of sql.RUN_TOTALS, which counts
# them from the whole table): the rollup plus the runs above :through and the open runs
# :open_ids (the mark as bound values, read just before: a range of the primary key). The
# consecutive failures: the rollup's, or, when the latest success is a run not folded yet,
# the failures after it, folded or not. One statement, so one snapshot; ``mark`` is the mark
# the rollup was read at, and a caller whose :through is not that reads again.
RUN_TOTALS_NOW = (
    select(
        func.coalesce(run_totals.c.task, _tail_totals.c.task).label("task"),
        *[
            (
                func.coalesce(_tail_totals.c[s], 0) if s == RunStatus.RUNNING.value else _both(s)
            ).label(s)
            for s in RUN_STATUSES
        ],
        func.greatest(run_totals.c.last_success_at, _tail_totals.c.latest).label("last_success_at"),
        (
            func.coalesce(_tail_totals.c.failed_after, 0)
            + case(
                (
                    or_(
                        _tail_totals.c.latest.is_(None),
                        _tail_totals.c.latest <= run_totals.c.last_success_at,
                    ),
                    func.coalesce(run_totals.c.failures_since, 0),
                ),
                else_=_failed_after(
                    _tail_totals, _tail_totals.c.task, _tail_totals.c.latest, _id_through
                ),
            )
        ).label("consecutive_failures"),
        *[_both(name).label(name) for name in _measure_names],
        _runs_mark.label("mark"),
    )
    .select_from(
        run_totals.outerjoin(_tail_totals, _tail_totals.c.task == run_totals.c.task, full=True)
    )
    .order_by(literal_column("1"))
)
