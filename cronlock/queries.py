"""Every SQL statement cronlock issues, named, parameterised, in one place.

Statements are SQLAlchemy Core built from ``tables.py``; values are bound parameters and the
schema is applied by ``schema_translate_map``, so nothing from input is ever formatted into
SQL. Names put the noun first so related statements sort together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Integer,
    Interval,
    MetaData,
    String,
    Table,
    Text,
    Uuid,
    any_,
    bindparam,
    case,
    cast,
    column,
    delete,
    exists,
    func,
    insert,
    literal,
    literal_column,
    null,
    or_,
    select,
    table,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateSchema, CreateTable, DropSchema
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement, ColumnElement

from .tables import (
    RUN_CLAIMING_PREDICATE,
    RUN_CLAIMING_STATUSES,
    RUN_STATUSES,
    SCHEMA,
    VERSION_TABLE,
    jobs,
    runs,
    workers,
)

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
    "ITEM_RELEASE",
    "ITEM_RELEASE_AND_SAVEPOINT",
    "ITEM_ROLLBACK",
    "ITEM_SAVEPOINT",
    "JOB_BY_DEDUP_KEY",
    "JOB_CLAIM",
    "JOB_COMPLETE_MANY",
    "JOB_COMPLETE_ONE",
    "JOB_COUNTS",
    "JOB_FINISH_MANY",
    "JOB_INSERT_MANY",
    "JOB_NEXT_DUE",
    "JOB_OLDEST_DUE",
    "JOB_RATES",
    "JOB_RECENT_FAILURES",
    "KEEPALIVE_SETTINGS",
    "LOCK_HOLDERS",
    "LOCK_TRY_XACT",
    "LOCK_XACT",
    "NO_TIMEOUTS_LOCAL",
    "PING",
    "RUN_CLAIMING_RECENT_PER_TASK",
    "RUN_INSERT",
    "RUN_INSERT_MISSED",
    "RUN_LAST_SLOT",
    "RUN_LAST_SUCCESS_PER_TASK",
    "RUN_RECENT_PER_TASK",
    "RUN_SLOTS_RECORDED",
    "RUN_SLOT_CLAIMED",
    "SCHEMA_REVISION",
    "WORKER_DELETE",
    "WORKER_LIST",
    "WORKER_PRUNE",
    "WORKER_UPSERT",
    "AsyncpgStatement",
    "BenchVacuum",
    "bench_items",
    "bench_schema_create",
    "bench_schema_drop",
]

_ASYNCPG = PGDialect_asyncpg()  # type: ignore[no-untyped-call]

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
    column("database"),
    schema="pg_catalog",
)
_pg_database = table("pg_database", column("oid"), column("datname"), schema="pg_catalog")

# Backends holding a two-key advisory lock in this database (advisory locks are per database;
# pg_locks shows the whole cluster). The keys show as oids (unsigned), so the caller passes
# them as ``key & 0xFFFFFFFF``.
LOCK_HOLDERS = select(_pg_locks.c.pid).where(
    _pg_locks.c.locktype == "advisory",
    _pg_locks.c.database
    == select(_pg_database.c.oid)
    .where(_pg_database.c.datname == func.current_database())
    .scalar_subquery(),
    _pg_locks.c.objsubid == 2,
    _pg_locks.c.granted,
    cast(_pg_locks.c.classid, BigInteger) == bindparam("namespace_oid", type_=BigInteger),
    cast(_pg_locks.c.objid, BigInteger) == bindparam("key_oid", type_=BigInteger),
)

# -- items (a savepoint per item of a run) ---------------------------------------------------

# Core has no SAVEPOINT statement of its own to execute, and these go to the driver as text
# anyway: on the simple query protocol, so no prepare round trip, and two in one message when
# an item's RELEASE rides with the next item's SAVEPOINT. One fixed name: savepoints of the
# same name stack, RELEASE and ROLLBACK TO reach the innermost, so items nest.
ITEM_SAVEPOINT = "SAVEPOINT cronlock_item"
ITEM_RELEASE = "RELEASE SAVEPOINT cronlock_item"
ITEM_RELEASE_AND_SAVEPOINT = "RELEASE SAVEPOINT cronlock_item; SAVEPOINT cronlock_item"
# ROLLBACK TO keeps the savepoint (empty); the RELEASE closes it.
ITEM_ROLLBACK = "ROLLBACK TO SAVEPOINT cronlock_item; RELEASE SAVEPOINT cronlock_item"

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

# -- the job queue ----------------------------------------------------------------------------

# Waits (a standby's lock): returns the moment the holder's transaction ends, also when the
# holder's process dies and PostgreSQL aborts it.
LOCK_XACT = select(
    func.pg_advisory_xact_lock(
        bindparam("namespace", type_=Integer), bindparam("key", type_=Integer)
    )
)

# TCP keepalives for a drainer's connections, in one round trip: the server probes a silent
# client after :idle s and drops it after :count lost probes (or :user_timeout ms of
# unacknowledged data), so a dead host's locks go in seconds, not the kernel's two hours.
# :is_local scopes them to the transaction (the lock connection, which may sit behind
# PgBouncer in transaction mode) or to the session (a job lane's own connection).
KEEPALIVE_SETTINGS = select(
    func.set_config(
        "tcp_keepalives_idle", bindparam("idle", type_=Text), bindparam("is_local", type_=Boolean)
    ),
    func.set_config(
        "tcp_keepalives_interval",
        bindparam("interval", type_=Text),
        bindparam("is_local", type_=Boolean),
    ),
    func.set_config(
        "tcp_keepalives_count", bindparam("count", type_=Text), bindparam("is_local", type_=Boolean)
    ),
    func.set_config(
        "tcp_user_timeout",
        bindparam("user_timeout", type_=Text),
        bindparam("is_local", type_=Boolean),
    ),
)

# The lock transaction idles by design: no server-side timeout may end it (and so the lock).
NO_TIMEOUTS_LOCAL = select(
    func.set_config("idle_in_transaction_session_timeout", "0", True),
    func.set_config("statement_timeout", "0", True),
    func.set_config("lock_timeout", "0", True),
)

# The lock connection is alive (and so is the lock taken in its transaction). No parameters, so
# that it can go by the simple query protocol, which leaves no portal (and no snapshot) behind.
PING = select(literal_column("1", Integer))

# A literal predicate, not bound values: the planner can only use the partial indexes
# (ix_jobs_claim, uq_jobs_dedup_key) when it sees these constants in a generic plan too.
_WAITING = jobs.c.status.in_([literal_column("'pending'"), literal_column("'retrying'")])
_DEDUP_WHERE = text("dedup_key IS NOT NULL AND status IN ('pending', 'retrying')")

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

_worker_values = {
    "queue": bindparam("queue", type_=Text),
    "state": bindparam("state", type_=Text),
    "host": bindparam("host", type_=Text),
    "pid": bindparam("pid", type_=Integer),
    "processed": bindparam("processed", type_=BigInteger),
    "failed": bindparam("failed", type_=BigInteger),
    "retried": bindparam("retried", type_=BigInteger),
    "in_flight": bindparam("in_flight", type_=Integer),
}
_worker_insert = pg_insert(workers).values(id=bindparam("id", type_=Uuid), **_worker_values)

# A worker's heartbeat: its row, created on first beat.
WORKER_UPSERT = _worker_insert.on_conflict_do_update(
    index_elements=[workers.c.id],
    set_={
        **{name: _worker_insert.excluded[name] for name in _worker_values},
        "heartbeat_at": func.now(),
    },
)

WORKER_DELETE = delete(workers).where(workers.c.id == bindparam("id", type_=Uuid))

# Rows of workers that stopped beating long ago (killed, or their host died).
WORKER_PRUNE = delete(workers).where(
    workers.c.heartbeat_at < func.now() - bindparam("older_than", type_=Interval)
)

WORKER_LIST = select(workers, func.now().label("now")).order_by(
    workers.c.queue, workers.c.state, workers.c.started_at
)


@dataclass(frozen=True)
class AsyncpgStatement:
    """A Core statement compiled for a bare asyncpg connection: SQL text and argument order.

    For the few statements run outside SQLAlchemy (the lock connection): compiled once from
    the same Core statement, with the schema applied, so the SQL still lives only here.
    """

    sql: str
    compiled: SQLCompiler

    @classmethod
    def of(cls, statement: ClauseElement, schema: str) -> AsyncpgStatement:
        compiled = statement.compile(
            dialect=_ASYNCPG, schema_translate_map={SCHEMA: schema}, render_schema_translate=True
        )
        assert isinstance(compiled, SQLCompiler)
        return cls(str(compiled), compiled)

    def args(self, **params: Any) -> list[Any]:
        values = self.compiled.construct_params(params) or {}
        return [values[name] for name in self.compiled.positiontup or ()]


# -- the HTTP API and Prometheus metrics (cronlock.http, cronlock.prometheus) ---------------

JOB_GET = select(jobs).where(jobs.c.id == bindparam("id", type_=Uuid))

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

# Histogram buckets, in seconds, for job latency and run duration/lateness.
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)


def _buckets(seconds: ColumnElement[Any], where: ColumnElement[bool]) -> list[Any]:
    """count(*) of rows at or under each bucket bound (Prometheus' cumulative ``le``)."""
    return [
        func.count().filter(where, seconds <= literal(bound)).label(f"le_{index}")
        for index, bound in enumerate(LATENCY_BUCKETS)
    ]


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
        *_buckets(_job_latency, _completed),
    )
    .group_by(jobs.c.queue)
    .order_by(jobs.c.queue)
)

_run_duration = func.extract("epoch", runs.c.finished_at - runs.c.started_at)
_run_lateness = runs.c.lateness_ms / literal(1000.0)
_did_work = runs.c.status.in_([literal_column("'completed'"), literal_column("'partial'")])
_finished = runs.c.finished_at.is_not(None)
_slotted = runs.c.lateness_ms.is_not(None)  # runs of a slot; manual runs have none
_last_success = (
    select(runs.c.task, func.max(runs.c.started_at).label("at"))
    .where(_did_work)
    .group_by(runs.c.task)
    .subquery()
)

# Per task: runs by outcome, the last success, failures since it, and duration and lateness
# histograms.
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
        *[column.label(f"duration_{column.name}") for column in _buckets(_run_duration, _finished)],
        func.count().filter(_slotted).label("lateness_count"),
        func.coalesce(func.sum(_run_lateness).filter(_slotted), 0.0).label("lateness_sum"),
        *[column.label(f"lateness_{column.name}") for column in _buckets(_run_lateness, _slotted)],
    )
    .select_from(runs.outerjoin(_last_success, _last_success.c.task == runs.c.task))
    .group_by(runs.c.task)
    .order_by(runs.c.task)
)


# -- cronlock bench (cronlock.bench): its scratch schema, its items table, its readings -------

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
