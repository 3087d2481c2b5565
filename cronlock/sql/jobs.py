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
    Double,
    Integer,
    Interval,
    Select,
    Text,
    Uuid,
    and_,
    any_,
    bindparam,
    case,
    cast,
    column,
    delete,
    exists,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    text,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, BIT, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement, Grouping

from ..locks import namespace_key
from ..outcome import JOB_CANCELLABLE_STATUSES, JOB_FINISHED_STATUSES, JOB_WAITING_STATUSES
from .histograms import buckets
from .locks import fenced
from .queues import QUEUE_PAUSED_NOW
from .tables import (
    JOB_DEDUP_PREDICATE,
    JOB_DEDUP_STATUSES,
    SNOOZED_ENTRY,
    cancel_requests,
    job_dependencies,
    jobs,
)

__all__ = [
    "CONCURRENCY_NAMESPACE",
    "JOB_BY_DEDUP_KEY",
    "JOB_CANCEL",
    "JOB_CLAIM",
    "JOB_CLAIM_TRACED",
    "JOB_COMPLETED_CAPPED",
    "JOB_COMPLETE_MANY",
    "JOB_COMPLETE_MANY_FENCED",
    "JOB_COMPLETE_ONE",
    "JOB_COMPLETE_ONE_FENCED",
    "JOB_COUNTS",
    "JOB_COUNTS_CAPPED",
    "JOB_COUNTS_OPEN",
    "JOB_DELETE",
    "JOB_FINISH_CLAIMED",
    "JOB_FINISH_CLAIMED_FENCED",
    "JOB_FINISH_MANY",
    "JOB_GET",
    "JOB_GET_COLUMNS",
    "JOB_INSERT_DEPENDENT",
    "JOB_INSERT_DEPENDENT_TRACED",
    "JOB_INSERT_MANY",
    "JOB_INSERT_MANY_TRACED",
    "JOB_INSERT_ONE",
    "JOB_INSERT_ONE_TRACED",
    "JOB_KEY_SLOT_FREE",
    "JOB_LEASE_CANDIDATES",
    "JOB_LEASE_CLAIM",
    "JOB_LEASE_CLAIM_KEYED",
    "JOB_LEASE_CLAIM_KEYED_TRACED",
    "JOB_LEASE_CLAIM_TRACED",
    "JOB_LEASE_COMPLETE_MANY",
    "JOB_LEASE_FINISH_MANY",
    "JOB_LEASE_GIVE_UP",
    "JOB_LEASE_HAND_BACK",
    "JOB_LEASE_KEYS_LOCK",
    "JOB_LEASE_LOST_IDS",
    "JOB_LEASE_NEXT_DUE",
    "JOB_LEASE_RECORD_FENCED",
    "JOB_LEASE_RETURN_LOST",
    "JOB_LEASE_STATE",
    "JOB_LEASE_TRY_CLAIM",
    "JOB_NEXT_DUE",
    "JOB_OLDEST_DUE",
    "JOB_PRUNE",
    "JOB_PRUNE_COUNT",
    "JOB_RATES_BY_QUEUE",
    "JOB_RECENT_FAILURES",
    "JOB_RETRY",
    "JOB_STATES",
    "JOB_STATUS_SETTLED",
    "JOB_TASK_RESULT",
    "JOB_TOTALS",
    "job_candidates",
    "job_completed_page",
    "job_count",
    "job_list",
    "job_open_page",
    "job_where",
    "owner_lock_key",
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
        bindparam("concurrency_keys", type_=ARRAY(Text)),
        bindparam("concurrency_limits", type_=ARRAY(Integer)),
    )
    .table_valued("id", "payload", "dedup_key", "concurrency_key", "concurrency_limit")
    .render_derived()
)

# Many jobs in one statement (one round trip for 10,000). Ids are chosen by the caller so the
# answer needs no ordering; a row whose dedup key is already waiting is not inserted and its
# id is not returned. Payloads arrive as JSON text and are parsed by PostgreSQL.
_INSERT_COLUMNS = [
    "id",
    "job_type",
    "payload",
    "queue",
    "priority",
    "run_at",
    "max_retries",
    "dedup_key",
    "concurrency_key",
    "concurrency_limit",
    "timeout",
]


def _insert_many(*, traced: bool, dependent: bool = False) -> Any:
    values = [
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
        cast(_new_jobs.c.concurrency_key, Text),
        cast(_new_jobs.c.concurrency_limit, Integer),
        bindparam("timeout", type_=Double),
    ]
    columns = list(_INSERT_COLUMNS)
    if traced:  # one enqueue, one span: its context is the same for all its jobs
        columns.append("trace_context")
        values.append(bindparam("trace_context", type_=Text))
    if dependent:
        return _with_edges(columns, values)
    return (
        pg_insert(jobs)
        .from_select(columns, select(*values))
        .on_conflict_do_nothing(index_elements=[jobs.c.dedup_key], index_where=_DEDUP_WHERE)
        .returning(jobs.c.id)
    )


_open_parents = (
    func.unnest(bindparam("open_parents", type_=ARRAY(Uuid)))
    .table_valued(column("parent_id", Uuid))
    .render_derived(name="open_parents")
)


def _with_edges(columns: list[str], values: list[Any]) -> Any:
    """The jobs of an enqueue with depends_on, and one edge per job and parent that has not
    completed (job_dependencies), in one statement: ``blocked`` with :parents_left, or
    ``pending`` when every parent completed, or ``cancelled`` at once when one had failed or
    been cancelled (:error says which). No dedup keys (refused with depends_on)."""
    status = bindparam("status", type_=Text)
    extra = {
        "status": status,
        "parents_left": bindparam("parents_left", type_=Integer),
        "depends_on": bindparam("depends_on", type_=ARRAY(Uuid)),
        "completed_at": case((status == literal_column("'cancelled'"), func.now())),
        "error_message": bindparam("error", type_=Text),
    }
    new = (
        pg_insert(jobs)
        .from_select([*columns, *extra], select(*values, *extra.values()))
        .returning(jobs.c.id)
        .cte("new_jobs")
    )
    return insert(job_dependencies).from_select(
        ["parent_id", "child_id"],
        select(_open_parents.c.parent_id, new.c.id).select_from(new.join(_open_parents, true())),
    )


# Jobs with depends_on, and their edges (JOB_INSERT_MANY's columns, enqueue.insert_plan).
JOB_INSERT_DEPENDENT = _insert_many(traced=False, dependent=True)
JOB_INSERT_DEPENDENT_TRACED = _insert_many(traced=True, dependent=True)


JOB_INSERT_MANY = _insert_many(traced=False)
# The same, from a traced app (cronlock.tracing): the jobs carry the enqueuing span's context.
JOB_INSERT_MANY_TRACED = _insert_many(traced=True)

# One job without a dedup key, the one-at-a-time enqueue committed on its own: a VALUES row is
# less for the server to plan and run than unnesting arrays of one, and there is nothing to
# return (the id is the caller's; with no dedup key there is no conflict to skip). The same
# columns and server defaults as JOB_INSERT_MANY.
_ONE = {
    "id": bindparam("id", type_=Uuid),
    "job_type": bindparam("job_type", type_=Text),
    "payload": cast(bindparam("payload", type_=Text), JSONB),
    "queue": bindparam("queue", type_=Text),
    "priority": bindparam("priority", type_=Integer),
    "run_at": func.coalesce(
        bindparam("run_at", type_=DateTime(timezone=True)),
        func.now() + bindparam("delay", type_=Interval),
    ),
    "max_retries": bindparam("max_retries", type_=Integer),
    "concurrency_key": bindparam("concurrency_key", type_=Text),
    "concurrency_limit": bindparam("concurrency_limit", type_=Integer),
    "timeout": bindparam("timeout", type_=Double),
}
JOB_INSERT_ONE = pg_insert(jobs).values(**_ONE)
JOB_INSERT_ONE_TRACED = pg_insert(jobs).values(
    **_ONE, trace_context=bindparam("trace_context", type_=Text)
)

# The waiting jobs that hold some dedup keys (their duplicates were not inserted).
JOB_BY_DEDUP_KEY = select(jobs.c.dedup_key, jobs.c.id).where(
    jobs.c.dedup_key == any_(bindparam("dedup_keys", type_=ARRAY(Text))), _DEDUP_WHERE
)

# The advisory-lock namespace of the concurrency keys' slots (two-key locks, as every lock of
# cronlock's: the namespace and a key in it).
CONCURRENCY_NAMESPACE = namespace_key("cronlock-concurrency")

_slot = func.generate_series(
    literal_column("0"), jobs.c.concurrency_limit - literal_column("1")
).column_valued("slot")
# Slot n of a key is the lock (CONCURRENCY_NAMESPACE, the first 32 bits of md5(key/n)): a pure
# function of the key, the same in every session (invariant 1; md5, not hashtext, whose value
# PostgreSQL does not promise to keep).
_slot_key = cast(
    cast(
        literal_column("'x'").concat(
            func.left(
                func.md5(
                    jobs.c.concurrency_key.concat(literal_column("'/'")).concat(cast(_slot, Text))
                ),
                literal_column("8"),
            )
        ),
        BIT(32),
    ),
    Integer,
)

# A job with a concurrency key may start only in a free slot of its key: the claim takes one of
# the key's concurrency_limit slot locks, transaction-level, so the slot is the claiming
# transaction's until it commits. In strict and batch mode that transaction is the job's run,
# and a lane runs one job at a time: at most concurrency_limit lanes, on any drainers, run jobs
# of one key at once. A transaction re-takes a slot it holds, so a batch may claim several jobs
# of its key; they run one after another. The filter is evaluated before the row lock (LockRows
# sits above the scan), so a row that passes it but is skipped as locked keeps its slot taken
# until the claiming transaction ends: that lowers the key's concurrency for a moment, never
# raises it above the limit. A job without a key stops at the IS NULL (OR evaluates left to
# right and stops at the first true).
JOB_KEY_SLOT_FREE = or_(
    jobs.c.concurrency_key.is_(None),
    exists(
        select(literal_column("1")).where(
            func.pg_try_advisory_xact_lock(literal_column(str(CONCURRENCY_NAMESPACE)), _slot_key)
        )
    ),
)

# What makes a job claimable, for every commit mode's claim (JOB_CLAIM, JOB_LEASE_CLAIM): a
# predicate added here applies to all of them.
_CLAIMABLE: tuple[ColumnElement[bool], ...] = (
    jobs.c.queue == bindparam("queue", type_=Text),
    _WAITING,
    jobs.c.run_at <= func.coalesce(bindparam("now", type_=DateTime(timezone=True)), func.now()),
    ~QUEUE_PAUSED_NOW,
)
_CLAIM_ORDER = (jobs.c.priority.desc(), jobs.c.run_at)

# The database's clock, the one every host shares (a worker's may be off by any amount), for
# every time the drainer records in a job's row; :now replaces it only under a test clock.
# _CLAIM_CLOCK is now(): the start of the transaction that claims, the same value in every
# statement of it, so a transactional mode's outcome statement writes the claim's time as
# started_at without being told it. _DB_CLOCK is clock_timestamp(): the moment the statement
# that writes it runs, a completion's time (see JOB_COMPLETE_ONE for why not the commit's).
_CLAIM_CLOCK = func.coalesce(bindparam("now", type_=DateTime(timezone=True)), func.now())
_DB_CLOCK = func.coalesce(bindparam("now", type_=DateTime(timezone=True)), func.clock_timestamp())
# The outcome statement's start (statement_timestamp()): one value per statement, so that a
# retry's run_at and next_retry_at, and its error entry's times, agree to the microsecond.
_STATEMENT_CLOCK = func.coalesce(
    bindparam("now", type_=DateTime(timezone=True)), func.statement_timestamp()
)
_SECOND = literal_column("interval '1 second'", Interval)


def _due_after(delay: ColumnElement[Any]) -> ColumnElement[Any]:
    """:delays seconds from now on the database's clock: a retry's or a snooze's due time (the
    worker sends how long to wait, never when: its clock may be off by any skew)."""
    return _STATEMENT_CLOCK + cast(delay, Double) * _SECOND


def _iso(moment: ColumnElement[Any]) -> ColumnElement[Any]:
    """A time as the text Python's ``isoformat()`` gives in UTC (what the entries held when
    the worker wrote them): the same in every session, whatever its TimeZone, so the entries'
    times sort as text (JOB_RECENT_FAILURES)."""
    return func.to_char(
        func.timezone(literal_column("'UTC'"), moment),
        literal_column("""'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'"""),
    )


def _history_plus(entry: ColumnElement[Any], delay: ColumnElement[Any]) -> ColumnElement[Any]:
    """error_history with ``entry`` (JSON text) appended, its ``at`` (and a snooze's ``until``)
    stamped with the database's clock in place of the worker's, as every time of the row."""
    at = cast(entry, JSONB).op("||")(
        func.jsonb_build_object(literal_column("'at'"), _iso(_STATEMENT_CLOCK))
    )
    snoozed = cast(entry, JSONB).op("->>")(literal_column("'outcome'")) == literal_column(
        "'snoozed'"
    )
    until = func.jsonb_build_object(literal_column("'until'"), _iso(_due_after(delay)))
    stamped = case((snoozed, at.op("||")(until)), else_=at)
    return case(
        (entry.is_(None), jobs.c.error_history),
        else_=jobs.c.error_history.op("||")(func.jsonb_build_array(stamped)),
    )


# The claim: due jobs of one queue, highest priority first, then the longest due. The row
# locks are the lease: they last as long as the transaction that runs the handlers and writes
# the outcome, so a dead worker's jobs are due again the moment PostgreSQL aborts it.
# :now is NULL except under a test clock; the database's clock is the one every host shares.
# Each row comes back with the claim's time on that clock (claimed_at): the transaction's
# now(), which the outcome statements of the same transaction write as started_at.
# A paused queue claims nothing: the pause is a row of ``queues``, read by an uncorrelated
# EXISTS that PostgreSQL evaluates once per claim (an InitPlan: one primary-key probe) as a
# one-time filter over the same ix_jobs_claim scan, so the plan does not change. A job with a
# concurrency key must find a free slot of its key (JOB_KEY_SLOT_FREE).
_CLAIMED = (
    jobs.c.id,
    jobs.c.job_type,
    # As text, which the drainer decodes itself (cheaper than the driver's jsonb codec).
    cast(jobs.c.payload, Text).label("payload"),
    jobs.c.retry_count,
    jobs.c.max_retries,
    jobs.c.created_at,
    _CLAIM_CLOCK.label("claimed_at"),
    jobs.c.timeout,
)
JOB_CLAIM = (
    select(*_CLAIMED)
    .where(*_CLAIMABLE, JOB_KEY_SLOT_FREE)
    .order_by(*_CLAIM_ORDER)
    .limit(bindparam("limit", type_=Integer))
    .with_for_update(skip_locked=True, of=jobs)
)
# The same for a traced drainer (cronlock.tracing): with the context each job carries.
JOB_CLAIM_TRACED = (
    select(*_CLAIMED, jobs.c.trace_context)
    .where(*_CLAIMABLE, JOB_KEY_SLOT_FREE)
    .order_by(*_CLAIM_ORDER)
    .limit(bindparam("limit", type_=Integer))
    .with_for_update(skip_locked=True, of=jobs)
)

_outcomes = (
    func.unnest(
        bindparam("ids", type_=ARRAY(Uuid)),
        bindparam("statuses", type_=ARRAY(Text)),
        bindparam("retry_counts", type_=ARRAY(Integer)),
        bindparam("delays", type_=ARRAY(Double)),
        bindparam("errors", type_=ARRAY(Text)),
        bindparam("error_entries", type_=ARRAY(Text)),
        bindparam("results", type_=ARRAY(Text)),
        bindparam("started_ats", type_=ARRAY(DateTime(timezone=True))),
    )
    .table_valued(
        "id", "status", "retry_count", "delay", "error", "error_entry", "result", "started_at"
    )
    .render_derived()
)
# An outcome that ends its job for good; a retry or a snooze leaves completed_at NULL.
_finished_now = cast(_outcomes.c.status, Text).in_(
    [literal_column(repr(s.value)) for s in JOB_FINISHED_STATUSES]
)

# The outcomes of a batch of jobs in one statement: completed, retrying or snoozed (due again
# :delays seconds from now) or failed. An error entry is appended to error_history; a success
# keeps the history. The times are the database's: started_at is each job's claimed_at
# (JOB_CLAIM's, which is this transaction's now() too, and what a failure recorded on a fresh
# connection after its transaction was lost must still say); completed_at, the due time of a
# retry and the error entry's "at" are this statement's clock (_DB_CLOCK).
# JOB_FINISH_CLAIMED is for the claim's own transaction, which holds the rows (FOR UPDATE)
# since it claimed them: no status guard, so the statement is planned on the primary key alone
# (see JOB_COMPLETE_MANY for what the guard cost it under lagging statistics). JOB_FINISH_MANY,
# guarded, for an outcome written after its transaction was lost (a handler timed out
# mid-query) or after its batch rolled back: it never overwrites what another worker did since.
JOB_FINISH_CLAIMED = (
    update(jobs)
    .where(jobs.c.id == cast(_outcomes.c.id, Uuid))
    .values(
        status=cast(_outcomes.c.status, Text),
        retry_count=cast(_outcomes.c.retry_count, Integer),
        run_at=case(
            (_outcomes.c.delay.is_(None), jobs.c.run_at), else_=_due_after(_outcomes.c.delay)
        ),
        next_retry_at=case(
            (_outcomes.c.delay.is_(None), null()), else_=_due_after(_outcomes.c.delay)
        ),
        error_message=func.coalesce(cast(_outcomes.c.error, Text), jobs.c.error_message),
        error_history=_history_plus(_outcomes.c.error_entry, _outcomes.c.delay),
        result=cast(_outcomes.c.result, JSONB),
        started_at=cast(_outcomes.c.started_at, DateTime(timezone=True)),
        completed_at=case((_finished_now, _DB_CLOCK), else_=null()),
    )
)
JOB_FINISH_MANY = JOB_FINISH_CLAIMED.where(_WAITING)

# Successes, the common case, written with less than JOB_FINISH_MANY: a success changes only
# these columns (retry_count, run_at and the errors stay), so there is one array of ids to send,
# and the results (NULL when every handler returned None) read at each id's position, as
# JOB_LEASE_COMPLETE_MANY does. No status guard and no join: the rows are the claim's, locked
# by this transaction since (FOR UPDATE), and found by ``id = ANY(:ids)`` on the primary key.
# Joined to unnest(…) and guarded by the status, the statement was planned from the status's
# statistics, which lag a burst of new jobs until autovacuum's ANALYZE: the planner took the
# claim index for a few rows and read every waiting job of the table for each batch (9,000
# rows for 50 in the harness's drain of 10,000: 65 of the batch's 78 us of server CPU a job).
# No times are sent: started_at is the claim's (this transaction's now()), completed_at this
# statement's clock.
_batch_ids = bindparam("ids", type_=ARRAY(Uuid))
JOB_COMPLETE_MANY = (
    update(jobs)
    .where(jobs.c.id == any_(_batch_ids))
    .values(
        status=literal_column("'completed'"),
        next_retry_at=null(),
        result=cast(
            Grouping(bindparam("results", type_=ARRAY(Text)))[
                func.array_position(_batch_ids, jobs.c.id)
            ],
            JSONB,
        ),
        started_at=_CLAIM_CLOCK,
        completed_at=_DB_CLOCK,
    )
)

# One success (strict mode), with plain values instead of arrays: PostgreSQL plans an UPDATE …
# FROM unnest(…) afresh on every execution when the batch is one row (its custom plan, costed
# for one row, always beats the generic one, costed for ten), which cost more than the UPDATE
# itself; this statement's generic plan is cached after five executions.
# completed_at is clock_timestamp() in this statement, the last the transaction runs before
# its COMMIT (in batch mode after every handler of the batch; an exclusive drainer's fence
# check is in the same statement): the closest the database can record. A row cannot hold
# the time of the commit that makes it visible (the commit comes after the row's last write, and
# PostgreSQL's own commit timestamps need track_commit_timestamp, off by default, and are
# kept per transaction, not in the row); the worker's clock, which wrote it before, may be
# off by any skew.
JOB_COMPLETE_ONE = (
    update(jobs)
    .where(jobs.c.id == bindparam("id", type_=Uuid), _WAITING)
    .values(
        status=literal_column("'completed'"),
        next_retry_at=null(),
        result=cast(bindparam("result", type_=Text), JSONB),
        started_at=_CLAIM_CLOCK,
        completed_at=_DB_CLOCK,
    )
)

# The three statements of a claim's own transaction, each with the exclusive drainer's commit
# fence in the same statement (``locks.fenced``): strict mode's round trips a job are those of
# the raw loop (begin, claim, write, commit), not one more.
JOB_COMPLETE_ONE_FENCED = fenced(JOB_COMPLETE_ONE)
JOB_COMPLETE_MANY_FENCED = fenced(JOB_COMPLETE_MANY)
JOB_FINISH_CLAIMED_FENCED = fenced(JOB_FINISH_CLAIMED)

# Seconds until the next job of a queue comes due (NULL: none waiting, or the queue is paused,
# so an idle drainer of a paused queue waits for the resume's notification or its poll
# interval instead of spinning on due jobs it may not claim); an idle worker sleeps until
# then at most. Sent in the transaction of a claim that found nothing, whose now() it shares:
# a job already due then was there for the claim to take, so it is held by another lane (a
# shared queue's other drainers, this drainer's other lanes); counting it would make the lane
# spin on it until it finished. Its lane's commit, a notification or the poll interval bring
# the lane back.
JOB_NEXT_DUE = select(func.extract("epoch", func.min(jobs.c.run_at) - _CLAIM_CLOCK)).where(
    jobs.c.queue == bindparam("queue", type_=Text),
    _WAITING,
    jobs.c.run_at > _CLAIM_CLOCK,
    ~QUEUE_PAUSED_NOW,
)

# The lease mode's: its claim commits at once, so no due job stays held by another lane (but
# for the instant of another claim); a job with a concurrency key may be due and still wait
# for its key's slot (JOB_LEASE_CLAIM_KEYED), so it is left out, or the lane would spin on it.
JOB_LEASE_NEXT_DUE = select(func.extract("epoch", func.min(jobs.c.run_at) - _CLAIM_CLOCK)).where(
    jobs.c.queue == bindparam("queue", type_=Text),
    _WAITING,
    jobs.c.concurrency_key.is_(None),
    ~QUEUE_PAUSED_NOW,
)

# -- the lease commit mode ------------------------------------------------------------------
#
# The claim commits: a claimed job is ``processing``, ``owner`` is the worker holding it (alive
# exactly while it holds the advisory lock on ``owner_lock_key(owner)``, see queue/liveness.py)
# and ``attempt`` counts the claims made. Every later write of a running job names its owner
# and attempt (its fencing token): a worker that was paused while its job was returned and
# claimed again matches nothing. Times are the database's: clock_timestamp() when the claim
# and the completion run (COALESCE with :now, which only a test clock sets).

_PROCESSING = jobs.c.status == literal_column("'processing'")
_owner = bindparam("worker", type_=Uuid)

_lease_claimed = (
    select(jobs.c.id)
    # A job with a concurrency key is claimed apart (JOB_LEASE_CLAIM_KEYED): its committed
    # claim would end the slot lock JOB_KEY_SLOT_FREE takes while the job still runs.
    .where(*_CLAIMABLE, jobs.c.concurrency_key.is_(None))
    .order_by(*_CLAIM_ORDER)
    .limit(bindparam("limit", type_=Integer))
    .with_for_update(skip_locked=True, of=jobs)
    .cte("claimed")
    .prefix_with("MATERIALIZED")
)


# Claim due jobs of :queue for :worker and commit it (one statement, its own transaction). The
# CTE is MATERIALIZED so the LIMIT is applied once whatever the plan (the nested-loop trap Oban's
# comment describes). The UPDATE finds the claimed rows by ``id = ANY(ARRAY(SELECT id FROM
# claimed))``, an index condition on pk_jobs, not by a join with the CTE: the join's estimate
# grows with the LIMIT, and at a few hundred rows the planner hashed a sequential scan of the
# whole table for it (6.9 of a 500-row claim's 20.9 ms; BENCHMARKS.md, the lease drain). The
# rows come back in claim order (priority, then due time), sorted by the database: UPDATE …
# RETURNING keeps none. started_at is when the database handed the job out.
def _lease_claim(*, traced: bool, keyed: bool = False) -> Any:
    source = _lease_keyed if keyed else _lease_claimed
    taken = (
        update(jobs)
        .where(
            jobs.c.id == any_(func.array(select(source.c.id).scalar_subquery())),
            # The keyed claim reads without row locks (a window function takes none): a job
            # an operator changed since is re-checked here and left alone.
            *([_WAITING] if keyed else []),
        )
        .values(
            status=literal_column("'processing'"),
            owner=_owner,
            attempt=jobs.c.attempt + 1,
            started_at=_DB_CLOCK,
            completed_at=null(),
        )
        .returning(
            jobs.c.id,
            jobs.c.job_type,
            cast(jobs.c.payload, Text).label("payload"),
            jobs.c.retry_count,
            jobs.c.max_retries,
            jobs.c.created_at,
            jobs.c.attempt,
            jobs.c.started_at,  # the claim's time on the database's clock: Job.claimed_at
            jobs.c.timeout,
            jobs.c.priority,
            jobs.c.run_at,
            *([jobs.c.trace_context] if traced else []),
        )
        .cte("taken")
    )
    columns = [
        taken.c.id,
        taken.c.job_type,
        taken.c.payload,
        taken.c.retry_count,
        taken.c.max_retries,
        taken.c.created_at,
        taken.c.attempt,
        taken.c.started_at,
        taken.c.timeout,
    ]
    if traced:
        columns.append(taken.c.trace_context)
    return select(*columns).order_by(taken.c.priority.desc(), taken.c.run_at)


JOB_LEASE_CLAIM = _lease_claim(traced=False)
# The same for a traced drainer (cronlock.tracing): with the context each job carries.
JOB_LEASE_CLAIM_TRACED = _lease_claim(traced=True)

# The lease mode's claim of jobs with a concurrency key: a key's slots are its running rows.
# In one transaction, JOB_LEASE_KEYS_LOCK first takes the lock every lease-mode keyed claim
# takes (one, for all keys: no deadlock), blocking, and only if some keyed job is due; then
# JOB_LEASE_CLAIM_KEYED, a statement of its own so that its snapshot, taken after the lock,
# sees every keyed claim committed before, admits the first due job of a key (one per claim:
# a lane runs its batch's jobs one after another) while fewer than its concurrency_limit jobs
# of the key are processing. At most the limit run at once across every lease-mode drainer;
# a key's transactional runs (slot locks) are not counted here: run one key's jobs in one
# family of modes.
LEASE_KEYS_LOCK_KEY = 0  # in CONCURRENCY_NAMESPACE, where slot keys are md5 bits (0: ours)
_keyed_due = and_(*_CLAIMABLE, jobs.c.concurrency_key.is_not(None))
JOB_LEASE_KEYS_LOCK = select(
    func.pg_advisory_xact_lock(
        literal_column(str(CONCURRENCY_NAMESPACE)), literal_column(str(LEASE_KEYS_LOCK_KEY))
    )
).where(exists().where(_keyed_due))
_keyed_rank = (
    select(
        jobs.c.id,
        jobs.c.concurrency_key,
        jobs.c.concurrency_limit,
        jobs.c.priority,
        jobs.c.run_at,
        func.row_number()
        .over(partition_by=jobs.c.concurrency_key, order_by=_CLAIM_ORDER)
        .label("rank"),
    )
    .where(_keyed_due)
    .cte("keyed")
    .prefix_with("MATERIALIZED")
)
_running_of_key = jobs.alias("running")
_lease_keyed = (
    select(_keyed_rank.c.id)
    .where(
        # One job of a key per claim: a lane runs its batch one job after another, so two of
        # a key in one batch would hold two slots for one run at a time.
        _keyed_rank.c.rank == literal_column("1"),
        literal_column("1")
        + select(func.count())
        .where(
            _running_of_key.c.concurrency_key == _keyed_rank.c.concurrency_key,
            _running_of_key.c.status == literal_column("'processing'"),
        )
        .scalar_subquery()
        <= _keyed_rank.c.concurrency_limit,
    )
    .order_by(_keyed_rank.c.priority.desc(), _keyed_rank.c.run_at)
    .limit(bindparam("limit", type_=Integer))
    .cte("admitted")
    .prefix_with("MATERIALIZED")
)
JOB_LEASE_CLAIM_KEYED = _lease_claim(traced=False, keyed=True)
JOB_LEASE_CLAIM_KEYED_TRACED = _lease_claim(traced=True, keyed=True)

# After the database refused a lease claim: the jobs it would have claimed, in its order and
# unlocked, each then tried alone (JOB_LEASE_TRY_CLAIM, in a transaction rolled back).
JOB_LEASE_CANDIDATES = (
    select(jobs.c.id)
    .where(*_CLAIMABLE, jobs.c.concurrency_key.is_(None))
    .order_by(*_CLAIM_ORDER)
    .limit(bindparam("limit", type_=Integer))
)
JOB_LEASE_TRY_CLAIM = (
    update(jobs)
    .where(jobs.c.id == bindparam("job_id", type_=Uuid))
    .values(status=literal_column("'processing'"), owner=_owner, attempt=jobs.c.attempt + 1)
)

# The fencing guard: still running, still this owner's, still this claim.
_fenced_to = and_(_PROCESSING, jobs.c.owner == _owner)

_completed_ids = bindparam("ids", type_=ARRAY(Uuid))
# Where a row's id sits in :ids, and so its attempt in :attempts and its result in :results.
_position = func.array_position(_completed_ids, jobs.c.id)

# Successes of one worker (:worker) in one statement; returns the ids it completed (the others were
# fenced: their job was returned and claimed again since). No join: the rows are found by
# ``id = ANY(:ids)`` and each one's attempt and result read from the arrays at its id's position
# (array_position, a scan of :ids in C: about 1 ms at 500 ids). An UPDATE … FROM unnest(…)
# joined to the arrays instead, and its generic plan (a prepared statement's from its sixth
# run), which guesses 10 rows for the unnest and 1 for the owner's running jobs, rescanned the
# whole unnest once per job: 250,000 join-filter rows and 68 of a 75 ms completion of 500, the
# lease mode's slowdown at large batches (BENCHMARKS.md, the lease drain). :results NULL (the
# batch's handlers all returned None) writes NULL without the second lookup.
JOB_LEASE_COMPLETE_MANY = (
    update(jobs)
    .where(
        jobs.c.id == any_(_completed_ids),
        _fenced_to,
        jobs.c.attempt == Grouping(bindparam("attempts", type_=ARRAY(Integer)))[_position],
    )
    .values(
        status=literal_column("'completed'"),
        next_retry_at=null(),
        result=cast(Grouping(bindparam("results", type_=ARRAY(Text)))[_position], JSONB),
        completed_at=_DB_CLOCK,
    )
    .returning(jobs.c.id)
)

_lease_outcomes = (
    func.unnest(
        bindparam("ids", type_=ARRAY(Uuid)),
        bindparam("attempts", type_=ARRAY(Integer)),
        bindparam("statuses", type_=ARRAY(Text)),
        bindparam("retry_counts", type_=ARRAY(Integer)),
        bindparam("delays", type_=ARRAY(Double)),
        bindparam("errors", type_=ARRAY(Text)),
        bindparam("error_entries", type_=ARRAY(Text)),
        bindparam("results", type_=ARRAY(Text)),
    )
    .table_valued(
        "id", "attempt", "status", "retry_count", "delay", "error", "error_entry", "result"
    )
    .render_derived()
)
_lease_retry_at = _due_after(_lease_outcomes.c.delay)
_lease_done = cast(_lease_outcomes.c.status, Text).in_(
    [literal_column("'completed'"), literal_column("'failed'"), literal_column("'cancelled'")]
)

# Any mix of outcomes of one owner (completed, retrying or snoozed after :delays seconds,
# failed, cancelled), fenced
# like JOB_LEASE_COMPLETE_MANY; returns the ids it wrote.
JOB_LEASE_FINISH_MANY = (
    update(jobs)
    .where(
        jobs.c.id == cast(_lease_outcomes.c.id, Uuid),
        _fenced_to,
        jobs.c.attempt == cast(_lease_outcomes.c.attempt, Integer),
    )
    .values(
        status=cast(_lease_outcomes.c.status, Text),
        retry_count=cast(_lease_outcomes.c.retry_count, Integer),
        run_at=case((_lease_outcomes.c.delay.is_(None), jobs.c.run_at), else_=_lease_retry_at),
        next_retry_at=case((_lease_outcomes.c.delay.is_(None), null()), else_=_lease_retry_at),
        error_message=func.coalesce(cast(_lease_outcomes.c.error, Text), jobs.c.error_message),
        error_history=_history_plus(_lease_outcomes.c.error_entry, _lease_outcomes.c.delay),
        result=cast(_lease_outcomes.c.result, JSONB),
        completed_at=case((_lease_done, _DB_CLOCK), else_=null()),
    )
    .returning(jobs.c.id)
)

# A running job's owner, attempt and status: after a completion whose commit went unanswered
# (its connection was cut), the row says whether it committed.
JOB_LEASE_STATE = select(jobs.c.status, jobs.c.owner, jobs.c.attempt).where(
    jobs.c.id == bindparam("id", type_=Uuid)
)

# Record a completion that was fenced (not applied): an entry in the job's history, whatever
# the job's state now. The entry says who tried and with which attempt; its "at" is the
# database's clock.
JOB_LEASE_RECORD_FENCED = (
    update(jobs)
    .where(jobs.c.id == bindparam("job_id", type_=Uuid))
    .values(
        error_history=jobs.c.error_history.op("||")(
            func.jsonb_build_array(
                cast(bindparam("entry", type_=Text), JSONB).op("||")(
                    func.jsonb_build_object(literal_column("'at'"), _iso(func.now()))
                )
            )
        )
    )
)

_waiting_again = case(
    (jobs.c.retry_count > 0, literal_column("'retrying'")), else_=literal_column("'pending'")
)

# Hand back :ids that :worker claimed and did not start or could not finish (a stop, a cut
# connection): due again as they were, with nothing charged (the attempt counter stays: it is
# only a fencing token). With :ids NULL, every job :worker still holds (its drainer's end).
JOB_LEASE_HAND_BACK = (
    update(jobs)
    .where(
        _fenced_to,
        or_(
            bindparam("ids", type_=ARRAY(Uuid)).is_(None),
            jobs.c.id == any_(bindparam("ids", type_=ARRAY(Uuid))),
        ),
    )
    .values(status=_waiting_again, owner=null(), started_at=null())
    .returning(jobs.c.id)
)


def owner_lock_key(owner: ColumnElement[Any]) -> ColumnElement[Any]:
    """The bigint advisory lock key of a worker id (a uuid): its first 8 bytes, signed, the
    same as ``queue.liveness.owner_key`` computes in Python (tests pin both)."""
    hex16 = func.replace(func.left(cast(owner, Text), 18), "-", "")
    return cast(cast(literal_column("'x'", Text).op("||")(hex16), BIT(64)), BigInteger)


# The owners of this queue's running jobs whose liveness lock is free: pg_try_advisory_xact_lock
# succeeds only where no worker holds it, and an owner never takes its lock again once it lost
# it (a worker that lives on takes a new id). The locks taken here go with this transaction.
_owners = (
    select(jobs.c.owner)
    .distinct()
    .where(_PROCESSING, jobs.c.queue == bindparam("queue_name", type_=Text))
    .cte("owners")
    .prefix_with("MATERIALIZED")
)
_dead = (
    select(_owners.c.owner)
    .where(func.pg_try_advisory_xact_lock(owner_lock_key(_owners.c.owner)))
    .cte("dead")
    .prefix_with("MATERIALIZED")
)
_bounds = (
    func.unnest(
        bindparam("job_types", type_=ARRAY(Text)),
        bindparam("max_lost_runs", type_=ARRAY(Integer)),
    )
    .table_valued("job_type", "max_lost_runs")
    .render_derived(name="bounds")
)
_max_lost = func.coalesce(
    select(_bounds.c.max_lost_runs)
    .where(cast(_bounds.c.job_type, Text) == jobs.c.job_type)
    .scalar_subquery(),
    bindparam("default_max_lost_runs", type_=Integer),
)
_stopped = jobs.c.lost_runs + 1 >= _max_lost
_lost_entry = func.jsonb_build_object(
    "attempt",
    jobs.c.retry_count + 1,
    "error",
    func.concat("worker lost: ", cast(_dead.c.owner, Text), " ended while the job ran"),
    "at",
    _iso(func.now()),  # the same text as every entry's "at", whatever the session's TimeZone
    "lost_run",
    jobs.c.lost_runs + 1,
)

# Return the running jobs of dead owners in :queue_name (an UPDATE may not bind a parameter
# named like one of its columns where it filters them): due again (pending or retrying, as before
# the claim), with an error_history entry saying the worker was lost and lost_runs + 1. Not a
# failed attempt (retry_count stays); a job whose lost runs reach its bound (:max_lost_runs of
# its type, :default_max_lost_runs for the others) is failed instead, and says why.
_lost_ids = bindparam("ids", type_=ARRAY(Uuid))
JOB_LEASE_RETURN_LOST = (
    update(jobs)
    .where(
        jobs.c.owner == _dead.c.owner,
        _PROCESSING,
        jobs.c.queue == bindparam("queue_name"),
        or_(_lost_ids.is_(None), jobs.c.id == any_(_lost_ids)),
    )
    .values(
        status=case((_stopped, literal_column("'failed'")), else_=_waiting_again),
        owner=null(),
        lost_runs=jobs.c.lost_runs + 1,
        error_history=jobs.c.error_history.op("||")(func.jsonb_build_array(_lost_entry)),
        error_message=case(
            (
                _stopped,
                func.concat(
                    "stopped: its worker was lost ",
                    cast(jobs.c.lost_runs + 1, Text),
                    " times while it ran",
                ),
            ),
            else_=jobs.c.error_message,
        ),
        completed_at=case((_stopped, func.now()), else_=null()),
    )
    .returning(jobs.c.id, jobs.c.status, _dead.c.owner)
)

# The running jobs of dead owners in :queue_name, one by one: what a sweep whose statement
# the database refused (one job's row, a trigger) returns each on its own.
JOB_LEASE_LOST_IDS = select(jobs.c.id).where(
    jobs.c.owner == _dead.c.owner, _PROCESSING, jobs.c.queue == bindparam("queue_name")
)

# A job the database refuses to hand out or to return (a lease claim or sweep refused for it):
# failed, with :error (the refusal) as its message and in its history.
JOB_LEASE_GIVE_UP = (
    update(jobs)
    .where(jobs.c.id == bindparam("job_id", type_=Uuid), or_(_PROCESSING, _WAITING))
    .values(
        status=literal_column("'failed'"),
        owner=null(),
        error_message=bindparam("error", type_=Text),
        error_history=jobs.c.error_history.op("||")(
            func.jsonb_build_array(
                func.jsonb_build_object(
                    "attempt",
                    jobs.c.retry_count + 1,
                    "error",
                    bindparam("error", type_=Text),
                    "at",
                    _iso(func.now()),
                )
            )
        ),
        completed_at=func.now(),
    )
)

JOB_COUNTS = (
    select(jobs.c.queue, jobs.c.status, func.count().label("count"))
    .group_by(jobs.c.queue, jobs.c.status)
    .order_by(jobs.c.queue, jobs.c.status)
)

# The same for the jobs that did not complete only: an index-only scan of ix_jobs_open, so it
# reads the open jobs, not the history (the metrics count completed jobs from their rollup).
JOB_COUNTS_OPEN = JOB_COUNTS.where(jobs.c.status != literal_column("'completed'"))

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

_failure_columns = (
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
_limit = bindparam("limit", type_=Integer)
# The jobs that failed for good most recently (a backward range of ix_jobs_finished) and the
# newest retrying jobs (of ix_jobs_created), :limit of each; the latest :limit of them by their
# last failure. Each part reads :limit rows whatever the history: ordering every failed job by
# its history's last entry read them all (37 ms at 10,000 failed jobs).
_failures = union_all(
    select(*_failure_columns)
    .where(jobs.c.status == literal_column("'failed'"), jobs.c.completed_at.is_not(None))
    .order_by(jobs.c.completed_at.desc(), jobs.c.id.desc())
    .limit(_limit),
    select(*_failure_columns)
    .where(jobs.c.status == literal_column("'retrying'"))
    .order_by(jobs.c.created_at.desc(), jobs.c.id.desc())
    .limit(_limit),
).subquery("failures")

JOB_RECENT_FAILURES = (
    select(_failures).order_by(_failures.c.failed_at.desc().nulls_last()).limit(_limit)
)


def _since(minutes: int) -> ColumnElement[bool]:
    return jobs.c.completed_at >= func.now() - func.make_interval(0, 0, 0, 0, 0, minutes)


# When an operator asked to cancel the job while it ran, if the request is still open: a
# primary-key probe of cancel_requests per job shown.
_cancel_requested_at = (
    select(cancel_requests.c.requested_at)
    .where(cancel_requests.c.job_id == jobs.c.id)
    .scalar_subquery()
    .label("cancel_requested_at")
)

# A job's whole row, and an operator's open cancel request of it (JOB_GET, WAIT_JOBS).
JOB_GET_COLUMNS = (jobs, _cancel_requested_at)
JOB_GET = select(*JOB_GET_COLUMNS).where(jobs.c.id == bindparam("id", type_=Uuid))

# What a Django task's result is read from (cronlock.contrib.django, on Django's own
# connection): the JSON columns as text, which every sync driver returns alike (Django's
# psycopg connections hand jsonb back undecoded; a bare psycopg decodes it).
JOB_TASK_RESULT = select(
    jobs.c.id,
    jobs.c.job_type,
    jobs.c.queue,
    jobs.c.priority,
    jobs.c.status,
    cast(jobs.c.payload, Text).label("payload"),
    cast(jobs.c.result, Text).label("result"),
    cast(jobs.c.error_history, Text).label("error_history"),
    jobs.c.retry_count,
    jobs.c.created_at,
    jobs.c.run_at,
    jobs.c.started_at,
    jobs.c.completed_at,
).where(jobs.c.id == bindparam("id", type_=Uuid))

_job_latency = func.extract("epoch", jobs.c.completed_at - jobs.c.created_at)
_completed = jobs.c.status == literal_column("'completed'")

# The snoozes a job's handler asked for (JobSnooze): its history's entries with that outcome,
# counted only in the rows that have one (a containment test the scrape makes per row anyway;
# among the open jobs, the predicate of ix_jobs_snoozed).
_snoozed = jobs.c.error_history.op("@>")(cast(literal_column(repr(SNOOZED_ENTRY)), JSONB))
_snoozes = func.jsonb_array_length(
    func.jsonb_path_query_array(
        jobs.c.error_history, literal_column("""'$[*] ? (@.outcome == "snoozed")'::jsonpath""")
    )
)

# Per queue: jobs finished for good (completed, failed, cancelled), retries made, snoozes, and
# the created→completed latency of the completed ones as histogram buckets, counted from the
# whole table: what the metrics' rollup (rollups.py) must add up to while nothing is pruned.
# The scrape no longer reads it (it costs seconds at a million jobs); tests and the metrics
# benchmark compare with it.
JOB_TOTALS = (
    select(
        jobs.c.queue,
        func.count().filter(_completed).label("completed"),
        func.count().filter(jobs.c.status == literal_column("'failed'")).label("failed"),
        func.count().filter(jobs.c.status == literal_column("'cancelled'")).label("cancelled"),
        func.coalesce(func.sum(jobs.c.retry_count), 0).label("retries"),
        func.coalesce(func.sum(_snoozes).filter(_snoozed), 0).label("snoozes"),
        func.coalesce(func.sum(_job_latency).filter(_completed), 0.0).label("latency_sum"),
        *buckets(_job_latency, _completed),
    )
    .group_by(jobs.c.queue)
    .order_by(jobs.c.queue)
)


# -- operating the queue: find, retry, cancel, delete, prune -------------------------------
#
# An operator's verbs never wait on a drainer: each locks the rows it changes with FOR UPDATE
# SKIP LOCKED, in a MATERIALIZED CTE (so the LIMIT or the id list is applied exactly once,
# whatever plan the outer statement gets). In the transactional commit modes a job a lane is
# running is a waiting row locked by the lane's transaction: SKIP LOCKED leaves it alone, and
# the caller reports it as running instead of blocking until its handler ends (NOWAIT would
# raise and abort the whole statement, which a bulk change cannot afford). The claim skips
# the rows an operator's statement holds for the same reason, so the one that locks first
# wins and the other sees the outcome: a job is cancelled before it runs, or it runs.

_ids = bindparam("ids", type_=ARRAY(Uuid))
_FINISHED = jobs.c.status.in_([literal_column(repr(s.value)) for s in JOB_FINISHED_STATUSES])
_other = jobs.alias("other")
_other_holds = _other.c.status.in_([literal_column(repr(s.value)) for s in JOB_DEDUP_STATUSES])

# Another job holds this job's dedup key (uq_jobs_dedup_key allows one): retrying it
# would break that index, so it is reported instead.
_DEDUP_HELD = and_(
    jobs.c.dedup_key.is_not(None),
    exists().where(_other.c.dedup_key == jobs.c.dedup_key, _other_holds, _other.c.id != jobs.c.id),
)
# What a retry makes due now: a job that failed for good, or one waiting for a retry later.
_RETRYABLE = or_(
    jobs.c.status == literal_column("'failed'"),
    and_(jobs.c.status == literal_column("'retrying'"), jobs.c.run_at > func.now()),
)


def job_where(
    *,
    statuses: bool = False,
    finished: bool = False,
    queue: bool = False,
    job_type: bool = False,
    created_after: bool = False,
    created_before: bool = False,
) -> list[ColumnElement[bool]]:
    """The conditions of an operator's filter, one bound parameter each, for the parts given
    (a filter's shape picks the statement; its values are always bound). ``finished`` adds
    ``completed_at IS NOT NULL``, which lets a filter on finished statuses read
    ix_jobs_finished."""
    where: list[ColumnElement[bool]] = []
    if statuses:
        where.append(jobs.c.status == any_(bindparam("statuses", type_=ARRAY(Text))))
    if finished:
        where.append(jobs.c.completed_at.is_not(None))
    if queue:
        where.append(jobs.c.queue == bindparam("queue", type_=Text))
    if job_type:
        where.append(jobs.c.job_type == bindparam("job_type", type_=Text))
    if created_after:
        where.append(jobs.c.created_at >= bindparam("created_after", type_=DateTime(timezone=True)))
    if created_before:
        where.append(jobs.c.created_at < bindparam("created_before", type_=DateTime(timezone=True)))
    return where


def job_list(where: list[ColumnElement[bool]], *, after: bool) -> Select[Any]:
    """Jobs matching ``where``, newest first (created_at, then id), :limit of them; with
    ``after``, those after the keyset position (:after_created_at, :after_id) of a page."""
    query = select(jobs, _cancel_requested_at).where(*where)
    if after:
        position = tuple_(
            bindparam("after_created_at", type_=DateTime(timezone=True)),
            bindparam("after_id", type_=Uuid),
        )
        query = query.where(tuple_(jobs.c.created_at, jobs.c.id) < position)
    return query.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(
        bindparam("limit", type_=Integer)
    )


def job_count(where: list[ColumnElement[bool]]) -> Select[Any]:
    """How many jobs match ``where`` (what a bulk change asks to confirm)."""
    return select(func.count()).select_from(jobs).where(*where)


def job_candidates(where: list[ColumnElement[bool]]) -> Select[Any]:
    """The next :limit ids matching ``where`` after :after_id, in id order: a bulk change
    walks the table in bounded batches, each a short transaction of its own, and never sees
    a row twice (the rows it skipped, a running job, stay behind it)."""
    return (
        select(jobs.c.id)
        .where(*where, jobs.c.id > bindparam("after_id", type_=Uuid))
        .order_by(jobs.c.id)
        .limit(bindparam("limit", type_=Integer))
    )


def _locked(*where: ColumnElement[bool]) -> Any:
    return (
        select(jobs.c.id)
        .where(jobs.c.id == any_(_ids), *where)
        .with_for_update(skip_locked=True, of=jobs)
        .cte("locked")
        .prefix_with("MATERIALIZED")
    )


_retry_locked = _locked(_RETRYABLE, ~_DEDUP_HELD)
_was_failed = jobs.c.status == literal_column("'failed'")

# Retry :ids: each that failed for good or waits for a later retry becomes due now, keeping
# its error history. A failed job gets one more attempt: its operator's retry counts as a
# retry made (retry_count + 1, max_retries raised to it if need be), so the retry rule lets
# exactly one more attempt run and its error entry, if it fails, gets the next attempt number.
JOB_RETRY = (
    update(jobs)
    .where(jobs.c.id == _retry_locked.c.id)
    .values(
        status=literal_column("'retrying'"),
        retry_count=case((_was_failed, jobs.c.retry_count + 1), else_=jobs.c.retry_count),
        max_retries=case(
            (_was_failed, func.greatest(jobs.c.max_retries, jobs.c.retry_count + 1)),
            else_=jobs.c.max_retries,
        ),
        run_at=func.now(),
        next_retry_at=func.now(),
        completed_at=null(),
    )
    .returning(jobs.c.id)
)

_cancel_locked = _locked(
    jobs.c.status.in_([literal_column(repr(s.value)) for s in JOB_CANCELLABLE_STATUSES])
)

# Cancel :ids: each waiting job (or one blocked on its parents) that no drainer holds becomes
# cancelled and never runs; the jobs that depend on it are cancelled with it (jobs_released).
JOB_CANCEL = (
    update(jobs)
    .where(jobs.c.id == _cancel_locked.c.id)
    .values(status=literal_column("'cancelled'"), completed_at=func.now(), next_retry_at=null())
    .returning(jobs.c.id)
)

_delete_locked = _locked(_FINISHED, jobs.c.completed_at.is_not(None))

# Delete :ids: each finished job (completed, failed, cancelled). A waiting job is never deleted.
JOB_DELETE = delete(jobs).where(jobs.c.id == _delete_locked.c.id).returning(jobs.c.id)

# Why jobs of :ids were left unchanged: their status now, whether a retrying one is due
# already, and whether another waiting job holds their dedup key.
JOB_STATES = select(
    jobs.c.id,
    jobs.c.status,
    (jobs.c.run_at <= func.now()).label("due"),
    _DEDUP_HELD.label("dedup_held"),
).where(jobs.c.id == any_(_ids))

# A job's status once nobody holds its row: FOR SHARE waits (under the caller's lock_timeout)
# for the lane running it to commit, and reads the row that commit left. What an operator's
# cancel of a running job waits on.
JOB_STATUS_SETTLED = (
    select(jobs.c.status).where(jobs.c.id == bindparam("id", type_=Uuid)).with_for_update(read=True)
)

_prune_position = tuple_(
    bindparam("after_completed_at", type_=DateTime(timezone=True)),
    bindparam("after_id", type_=Uuid),
)
_prune_doomed = (
    select(jobs.c.id, jobs.c.completed_at)
    .where(
        jobs.c.status == bindparam("status", type_=Text),
        jobs.c.completed_at.is_not(None),
        jobs.c.completed_at < bindparam("before", type_=DateTime(timezone=True)),
        tuple_(jobs.c.completed_at, jobs.c.id) > _prune_position,
    )
    .order_by(jobs.c.completed_at, jobs.c.id)
    .limit(bindparam("limit", type_=Integer))
    .with_for_update(skip_locked=True, of=jobs)
    .cte("doomed")
    .prefix_with("MATERIALIZED")
)

# Retention: delete :limit finished jobs of one :status that finished before :before, oldest
# first from the keyset position (:after_completed_at, :after_id) of the batch before. An
# index range scan of ix_jobs_finished that starts where the last batch ended, so a batch
# costs the same at the millionth row as at the first, dead index entries of earlier batches
# (still visible to an older snapshot) included. Returns each deleted job's position.
JOB_PRUNE = (
    delete(jobs)
    .where(jobs.c.id == _prune_doomed.c.id)
    .returning(_prune_doomed.c.completed_at, jobs.c.id)
)

# Retention's dry run: how many finished jobs of :status finished before :before.
JOB_PRUNE_COUNT = select(func.count()).where(
    jobs.c.status == bindparam("status", type_=Text),
    jobs.c.completed_at.is_not(None),
    jobs.c.completed_at < bindparam("before", type_=DateTime(timezone=True)),
)


# -- the dashboard: what it reads, each on an index whatever the table's size ---------------
#
# A count of every job by queue and status reads the whole table (150 ms at 1,000,000 jobs on
# our 2 cores), and a page of jobs newest first sorts it; the dashboard reads these instead.
# Jobs that did not complete are in ix_jobs_open (queue, status, created_at, id); completed
# ones, nearly all of a table, in ix_jobs_finished (status, completed_at, id) INCLUDE (queue).

# The partial index's predicate, spelled with a constant so the planner matches it.
_OPEN = jobs.c.status != literal_column("'completed'")
_j = jobs.alias("j")
_pair_first = (
    select(jobs.c.queue, jobs.c.status)
    .where(_OPEN)
    .order_by(jobs.c.queue, jobs.c.status)
    .limit(1)
    .cte("pairs", recursive=True)
)


def _pair_after(name: str) -> Any:
    """The queue or status of the next (queue, status) pair in ix_jobs_open."""
    return (
        select(_j.c[name])
        .where(
            tuple_(_j.c.queue, _j.c.status) > tuple_(_pair_first.c.queue, _pair_first.c.status),
            _j.c.status != literal_column("'completed'"),
        )
        .order_by(_j.c.queue, _j.c.status)
        .limit(1)
        .scalar_subquery()
    )


# Every (queue, status) pair that has a job that did not complete: a loose index scan of
# ix_jobs_open, one probe per pair (a recursive CTE; PostgreSQL has no skip scan), so it reads a
# handful of index pages whatever the table holds.
_pairs = _pair_first.union_all(
    select(_pair_after("queue"), _pair_after("status")).where(_pair_first.c.queue.is_not(None))
)
_counted = jobs.alias("counted")
_capped = (
    select(literal_column("1"))
    .select_from(_counted)
    .where(
        _counted.c.queue == _pairs.c.queue,
        _counted.c.status == _pairs.c.status,
        _counted.c.status != literal_column("'completed'"),
    )
    .limit(bindparam("cap", type_=Integer))
    .correlate_except(_counted)
    .subquery("capped")
)

# Per (queue, status) of the jobs that did not complete, how many, counted up to :cap (an
# index-only scan of at most :cap entries each): a number at the cap is shown as "at least".
JOB_COUNTS_CAPPED = (
    select(
        _pairs.c.queue,
        _pairs.c.status,
        select(func.count()).select_from(_capped).scalar_subquery().label("count"),
    )
    .where(_pairs.c.queue.is_not(None))
    .order_by(_pairs.c.queue, _pairs.c.status)
)

_of_queues = (
    func.unnest(bindparam("queues", type_=ARRAY(Text)))
    .table_valued(column("queue", Text))
    .render_derived(name="of_queues")
)
_completed_capped = (
    select(literal_column("1"))
    .select_from(jobs)
    .where(_completed, jobs.c.completed_at.is_not(None), jobs.c.queue == _of_queues.c.queue)
    .limit(bindparam("cap", type_=Integer))
    .correlate_except(jobs)
    .subquery("completed")
)

# Per queue of :queues, its completed jobs counted up to :cap: an index-only scan of
# ix_jobs_finished's completed entries (the queue is in the index), which stops at the cap.
JOB_COMPLETED_CAPPED = select(
    _of_queues.c.queue,
    select(func.count()).select_from(_completed_capped).scalar_subquery().label("count"),
)

_recent = func.now() - func.make_interval(0, 0, 0, 0, 0, 15)

# Per queue, jobs finished for good in the last 1, 5 and 15 minutes, by outcome: a range scan
# of ix_jobs_finished (status, completed_at) for the last quarter of an hour only.
JOB_RATES_BY_QUEUE = (
    select(
        jobs.c.queue,
        *[
            func.count()
            .filter(jobs.c.status == status, _since(minutes))
            .label(status + "_" + str(minutes) + "m")  # a constant column label
            for status in ("completed", "failed")
            for minutes in (1, 5, 15)
        ],
    )
    .where(
        jobs.c.status.in_([literal_column("'completed'"), literal_column("'failed'")]),
        jobs.c.completed_at.is_not(None),
        jobs.c.completed_at >= _recent,
    )
    .group_by(jobs.c.queue)
    .order_by(jobs.c.queue)
)


def job_open_page(
    where: list[ColumnElement[bool]], *, queue: bool, status: bool, after: bool
) -> Select[Any]:
    """A page of the jobs that did not complete, newest first (created_at, then id), :limit
    of them, matching ``where`` (``job_where``'s type and time conditions), of :queue and
    :status when given, after the keyset position (:after_created_at, :after_id) with
    ``after``. Each (queue, status) pair is one backward range of ix_jobs_open, read up to
    :limit rows, and the pairs' rows are merged: a page costs the same at any table size."""
    conditions: list[ColumnElement[bool]] = [
        jobs.c.queue == _pairs.c.queue,
        jobs.c.status == _pairs.c.status,
        _OPEN,
        *where,
    ]
    if after:
        position = tuple_(
            bindparam("after_created_at", type_=DateTime(timezone=True)),
            bindparam("after_id", type_=Uuid),
        )
        conditions.append(tuple_(jobs.c.created_at, jobs.c.id) < position)
    per_pair = (
        select(jobs)
        .where(*conditions)
        .order_by(jobs.c.created_at.desc(), jobs.c.id.desc())
        .limit(bindparam("limit", type_=Integer))
        .lateral("page")
    )
    chosen: list[ColumnElement[bool]] = [_pairs.c.queue.is_not(None)]
    if queue:
        chosen.append(_pairs.c.queue == bindparam("queue", type_=Text))
    if status:
        chosen.append(_pairs.c.status == bindparam("status", type_=Text))
    return (
        select(*[per_pair.c[c.name] for c in jobs.columns])
        .select_from(_pairs.join(per_pair, true()))
        .where(*chosen)
        .order_by(per_pair.c.created_at.desc(), per_pair.c.id.desc())
        .limit(bindparam("limit", type_=Integer))
    )


def job_completed_page(
    where: list[ColumnElement[bool]], *, queue: bool, after: bool
) -> Select[Any]:
    """A page of completed jobs, most recently completed first (completed_at, then id),
    :limit of them, matching ``where``, of :queue when given, after the keyset position
    (:after_completed_at, :after_id) with ``after``: a backward range of ix_jobs_finished."""
    conditions: list[ColumnElement[bool]] = [_completed, jobs.c.completed_at.is_not(None), *where]
    if queue:
        conditions.append(jobs.c.queue == bindparam("queue", type_=Text))
    if after:
        position = tuple_(
            bindparam("after_completed_at", type_=DateTime(timezone=True)),
            bindparam("after_id", type_=Uuid),
        )
        conditions.append(tuple_(jobs.c.completed_at, jobs.c.id) < position)
    return (
        select(jobs)
        .where(*conditions)
        .order_by(jobs.c.completed_at.desc(), jobs.c.id.desc())
        .limit(bindparam("limit", type_=Integer))
    )
