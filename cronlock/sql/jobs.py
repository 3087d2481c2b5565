"""Statements on ``jobs``: enqueue, the claim, outcomes, and what status and metrics read.

The claim and the outcome writes are the drainer's hot path; each says why it is written the
way it is. The waiting predicate (``status IN ('pending', 'retrying')``) is derived from
``outcome.JOB_WAITING_STATUSES`` and spelled as constants, so the planner matches it against
the partial indexes in generic plans too.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Integer,
    Interval,
    Text,
    Uuid,
    any_,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    null,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement

from ..outcome import JOB_WAITING_STATUSES
from .histograms import buckets
from .tables import JOB_DEDUP_PREDICATE, jobs

__all__ = [
    "JOB_BY_DEDUP_KEY",
    "JOB_CLAIM",
    "JOB_COMPLETE_MANY",
    "JOB_COMPLETE_ONE",
    "JOB_COUNTS",
    "JOB_FINISH_MANY",
    "JOB_GET",
    "JOB_INSERT_MANY",
    "JOB_INSERT_ONE",
    "JOB_NEXT_DUE",
    "JOB_OLDEST_DUE",
    "JOB_RATES",
    "JOB_RECENT_FAILURES",
    "JOB_TOTALS",
]

# A literal predicate, not bound values: the planner can only use the partial indexes
# (ix_jobs_claim, uq_jobs_dedup_key) when it sees these constants in a generic plan too.
_WAITING = jobs.c.status.in_([literal_column(repr(s.value)) for s in JOB_WAITING_STATUSES])
_DEDUP_WHERE = text(JOB_DEDUP_PREDICATE)

_new_jobs = (
    func.unnest(
        bindparam("ids", type_=ARRAY(Uuid)),
        bindparam("payloads", type_=ARRAY(Text)),
        bindparam("dedup_keys", type_=ARRAY(Text)),
    )
    .table_valued("id", "payload", "dedup_key")
    .render_derived()
)

# Many jobs in one statement (one round trip for 10,000). Ids are chosen by the caller so the
# answer needs no ordering; a row whose dedup key is already waiting is not inserted and its
# id is not returned. Payloads arrive as JSON text and are parsed by PostgreSQL.
JOB_INSERT_MANY = (
    pg_insert(jobs)
    .from_select(
        ["id", "job_type", "payload", "queue", "priority", "run_at", "max_retries", "dedup_key"],
        select(
            cast(_new_jobs.c.id, Uuid),
            bindparam("job_type", type_=Text),
            cast(_new_jobs.c.payload, JSONB),
            bindparam("queue", type_=Text),
            bindparam("priority", type_=Integer),
            func.coalesce(
                bindparam("run_at", type_=DateTime(timezone=True)),
                func.now() + bindparam("delay", type_=Interval),
            ),
            bindparam("max_retries", type_=Integer),
            cast(_new_jobs.c.dedup_key, Text),
        ),
    )
    .on_conflict_do_nothing(index_elements=[jobs.c.dedup_key], index_where=_DEDUP_WHERE)
    .returning(jobs.c.id)
)

# One job without a dedup key, the one-at-a-time enqueue committed on its own: a VALUES row is
# less for the server to plan and run than unnesting arrays of one, and there is nothing to
# return (the id is the caller's; with no dedup key there is no conflict to skip). The same
# columns and server defaults as JOB_INSERT_MANY.
JOB_INSERT_ONE = pg_insert(jobs).values(
    id=bindparam("id", type_=Uuid),
    job_type=bindparam("job_type", type_=Text),
    payload=cast(bindparam("payload", type_=Text), JSONB),
    queue=bindparam("queue", type_=Text),
    priority=bindparam("priority", type_=Integer),
    run_at=func.coalesce(
        bindparam("run_at", type_=DateTime(timezone=True)),
        func.now() + bindparam("delay", type_=Interval),
    ),
    max_retries=bindparam("max_retries", type_=Integer),
)

# The waiting jobs that hold some dedup keys (their duplicates were not inserted).
JOB_BY_DEDUP_KEY = select(jobs.c.dedup_key, jobs.c.id).where(
    jobs.c.dedup_key == any_(bindparam("dedup_keys", type_=ARRAY(Text))), _DEDUP_WHERE
)

# The claim: due jobs of one queue, highest priority first, then the longest due. The row
# locks are the lease: they last as long as the transaction that runs the handlers and writes
# the outcome, so a dead worker's jobs are due again the moment PostgreSQL aborts it.
# :now is NULL except under a test clock; the database's clock is the one every host shares.
JOB_CLAIM = (
    select(
        jobs.c.id,
        jobs.c.job_type,
        # As text, which the drainer decodes itself (cheaper than the driver's jsonb codec).
        cast(jobs.c.payload, Text).label("payload"),
        jobs.c.retry_count,
        jobs.c.max_retries,
        jobs.c.created_at,
    )
    .where(
        jobs.c.queue == bindparam("queue", type_=Text),
        _WAITING,
        jobs.c.run_at <= func.coalesce(bindparam("now", type_=DateTime(timezone=True)), func.now()),
    )
    .order_by(jobs.c.priority.desc(), jobs.c.run_at)
    .limit(bindparam("limit", type_=Integer))
    .with_for_update(skip_locked=True)
)

_outcomes = (
    func.unnest(
        bindparam("ids", type_=ARRAY(Uuid)),
        bindparam("statuses", type_=ARRAY(Text)),
        bindparam("retry_counts", type_=ARRAY(Integer)),
        bindparam("run_ats", type_=ARRAY(DateTime(timezone=True))),
        bindparam("errors", type_=ARRAY(Text)),
        bindparam("error_entries", type_=ARRAY(Text)),
        bindparam("results", type_=ARRAY(Text)),
        bindparam("started_ats", type_=ARRAY(DateTime(timezone=True))),
        bindparam("completed_ats", type_=ARRAY(DateTime(timezone=True))),
    )
    .table_valued(
        "id",
        "status",
        "retry_count",
        "run_at",
        "error",
        "error_entry",
        "result",
        "started_at",
        "completed_at",
    )
    .render_derived()
)

# The outcomes of a batch of jobs in one statement: completed, retrying (due again at run_at)
# or failed. An error entry is appended to error_history; a success keeps the history.
JOB_FINISH_MANY = (
    update(jobs)
    # The status guard matters only when an outcome is written after its transaction was lost
    # (a handler timed out mid-query): it never overwrites what another worker did since.
    .where(jobs.c.id == cast(_outcomes.c.id, Uuid), _WAITING)
    .values(
        status=cast(_outcomes.c.status, Text),
        retry_count=cast(_outcomes.c.retry_count, Integer),
        run_at=func.coalesce(cast(_outcomes.c.run_at, DateTime(timezone=True)), jobs.c.run_at),
        next_retry_at=cast(_outcomes.c.run_at, DateTime(timezone=True)),
        error_message=func.coalesce(cast(_outcomes.c.error, Text), jobs.c.error_message),
        error_history=case(
            (_outcomes.c.error_entry.is_(None), jobs.c.error_history),
            else_=jobs.c.error_history.op("||")(
                func.jsonb_build_array(cast(_outcomes.c.error_entry, JSONB))
            ),
        ),
        result=cast(_outcomes.c.result, JSONB),
        started_at=cast(_outcomes.c.started_at, DateTime(timezone=True)),
        completed_at=cast(_outcomes.c.completed_at, DateTime(timezone=True)),
    )
)

# Successes, the common case, written with less than JOB_FINISH_MANY: a success changes only
# these columns (retry_count, run_at and the errors stay), so there are 4 arrays to send and
# unnest instead of 9 and no per-row CASE. Same status guard. The times are microseconds since
# the Unix epoch (bigint, converted exactly here): the driver encodes a datetime at several
# times the cost of an integer, and the drainer reads the clock as an integer anyway.
_successes = (
    func.unnest(
        bindparam("ids", type_=ARRAY(Uuid)),
        bindparam("results", type_=ARRAY(Text)),
        bindparam("started_ats", type_=ARRAY(BigInteger)),
        bindparam("completed_ats", type_=ARRAY(BigInteger)),
    )
    .table_valued("id", "result", "started_at", "completed_at")
    .render_derived()
)


def _from_micros(micros: ColumnElement[Any]) -> ColumnElement[Any]:
    """Microseconds since the Unix epoch as a timestamptz (exact: bigint * interval is
    computed in float8, which holds every integer below 2**53, i.e. until the year 2255)."""
    epoch = literal_column("timestamptz 'epoch'", DateTime(timezone=True))
    return epoch + cast(micros, BigInteger) * literal_column("interval '1 microsecond'", Interval)


JOB_COMPLETE_MANY = (
    update(jobs)
    .where(jobs.c.id == cast(_successes.c.id, Uuid), _WAITING)
    .values(
        status=literal_column("'completed'"),
        next_retry_at=null(),
        result=cast(_successes.c.result, JSONB),
        started_at=_from_micros(_successes.c.started_at),
        completed_at=_from_micros(_successes.c.completed_at),
    )
)

# One success (strict mode), with plain values instead of arrays: PostgreSQL plans an UPDATE …
# FROM unnest(…) afresh on every execution when the batch is one row (its custom plan, costed
# for one row, always beats the generic one, costed for ten), which cost more than the UPDATE
# itself; this statement's generic plan is cached after five executions.
JOB_COMPLETE_ONE = (
    update(jobs)
    .where(jobs.c.id == bindparam("id", type_=Uuid), _WAITING)
    .values(
        status=literal_column("'completed'"),
        next_retry_at=null(),
        result=cast(bindparam("result", type_=Text), JSONB),
        started_at=bindparam("started_at", type_=DateTime(timezone=True)),
        completed_at=bindparam("completed_at", type_=DateTime(timezone=True)),
    )
)

# Seconds until the next job of a queue is due (NULL: none waiting); an idle worker sleeps
# until then at most.
JOB_NEXT_DUE = select(
    func.extract(
        "epoch",
        func.min(jobs.c.run_at)
        - func.coalesce(bindparam("now", type_=DateTime(timezone=True)), func.now()),
    )
).where(jobs.c.queue == bindparam("queue", type_=Text), _WAITING)

JOB_COUNTS = (
    select(jobs.c.queue, jobs.c.status, func.count().label("count"))
    .group_by(jobs.c.queue, jobs.c.status)
    .order_by(jobs.c.queue, jobs.c.status)
)

# Per queue: how many jobs are due now and since when the oldest has been waiting.
JOB_OLDEST_DUE = (
    select(
        jobs.c.queue,
        func.count().label("due"),
        func.min(jobs.c.run_at).label("oldest_due_at"),
        func.now().label("now"),
    )
    .where(_WAITING, jobs.c.run_at <= func.now())
    .group_by(jobs.c.queue)
    .order_by(jobs.c.queue)
)

# When the job's last attempt failed: the "at" of the last error_history entry.
_last_error_at = jobs.c.error_history.op("->")(-1).op("->>")("at")

JOB_RECENT_FAILURES = (
    select(
        jobs.c.id,
        jobs.c.queue,
        jobs.c.job_type,
        jobs.c.status,
        jobs.c.retry_count,
        jobs.c.max_retries,
        jobs.c.error_message,
        _last_error_at.label("failed_at"),
        jobs.c.next_retry_at,
    )
    .where(jobs.c.status.in_(["failed", "retrying"]))
    .order_by(_last_error_at.desc().nulls_last())
    .limit(bindparam("limit", type_=Integer))
)


def _since(minutes: int) -> ColumnElement[bool]:
    return jobs.c.completed_at >= func.now() - func.make_interval(0, 0, 0, 0, 0, minutes)


# Jobs finished in the last 1, 5 and 15 minutes, by outcome (failed: given up for good).
JOB_RATES = select(
    *[
        func.count()
        .filter(jobs.c.status == status, _since(minutes))
        .label(status + "_" + str(minutes) + "m")  # a constant column label
        for status in ("completed", "failed")
        for minutes in (1, 5, 15)
    ]
).where(jobs.c.completed_at.is_not(None))


JOB_GET = select(jobs).where(jobs.c.id == bindparam("id", type_=Uuid))

_job_latency = func.extract("epoch", jobs.c.completed_at - jobs.c.created_at)
_completed = jobs.c.status == literal_column("'completed'")

# Per queue: jobs finished for good and retries made, and the created→completed latency of the
# completed ones as histogram buckets, all read from the table at scrape time.
JOB_TOTALS = (
    select(
        jobs.c.queue,
        func.count().filter(_completed).label("completed"),
        func.count().filter(jobs.c.status == literal_column("'failed'")).label("failed"),
        func.coalesce(func.sum(jobs.c.retry_count), 0).label("retries"),
        func.coalesce(func.sum(_job_latency).filter(_completed), 0.0).label("latency_sum"),
        *buckets(_job_latency, _completed),
    )
    .group_by(jobs.c.queue)
    .order_by(jobs.c.queue)
)
