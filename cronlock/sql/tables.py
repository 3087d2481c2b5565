"""The tables cronlock owns, declared once: alembic's target metadata and the queries' source.

Everything lives in one PostgreSQL schema, ``cronlock`` by default. Another name is applied at
execution time through SQLAlchemy's ``schema_translate_map`` (see ``database.py``), so no
identifier is ever formatted into SQL. The status sets in the CHECK constraints and the
partial indexes' predicates are derived from the enums of ``outcome.py``, and the migrations
use the same constants, so each is spelled once.

Every column of ``jobs`` but ``job_type`` and ``payload`` has a server-side default: a plain
``INSERT INTO cronlock.jobs (job_type, payload) VALUES (...)`` from a trigger or another
language enqueues a job, and a statement-level trigger wakes the drainers listening on the
schema's channel (``jobs_channel``).
"""

from __future__ import annotations

from sqlalchemy import (
    DDL,
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Double,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    Uuid,
    event,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.elements import TextClause

from ..locks import namespace_key
from ..outcome import (
    JOB_WAITING_STATUSES,
    RUN_CLAIMING_STATUSES,
    JobStatus,
    RunStatus,
    RunTrigger,
    WorkerState,
)
from .histograms import LATENCY_BUCKETS

__all__ = [
    "DEFAULT_QUEUE",
    "DEPENDENCY_BUCKETS",
    "DEPENDENCY_NAMESPACE",
    "JOBS_ENDED_FUNCTION",
    "JOBS_ENDED_TRIGGER",
    "JOBS_NOTIFY_FUNCTION",
    "JOBS_NOTIFY_TRIGGER",
    "JOBS_RELEASED_FUNCTION",
    "JOBS_RELEASED_TRIGGER",
    "JOB_DEDUP_PREDICATE",
    "JOB_DEDUP_STATUSES",
    "JOB_FINISHED_PREDICATE",
    "JOB_OPEN_PREDICATE",
    "JOB_PROCESSING_PREDICATE",
    "JOB_RETRIED_PREDICATE",
    "JOB_SNOOZED_PREDICATE",
    "JOB_STATUSES",
    "JOB_WAITING_PREDICATE",
    "RENAME_INDEX",
    "RUN_CLAIMING_PREDICATE",
    "RUN_STATUSES",
    "RUN_TRIGGERS",
    "SCHEMA",
    "SNOOZED_ENTRY",
    "VALIDATE_CONSTRAINT",
    "VERSION_TABLE",
    "WORKER_STATES",
    "cancel_channel",
    "cancel_requests",
    "ended_channel",
    "failing_items",
    "in_list",
    "job_dependencies",
    "job_totals",
    "job_waits",
    "jobs",
    "jobs_channel",
    "metadata",
    "metric_marks",
    "queues",
    "run_totals",
    "runs",
    "tasks",
    "workers",
]

SCHEMA = "cronlock"
VERSION_TABLE = "cronlock_alembic_version"

# The queue a job goes to when its handler names none (a server default of ``jobs.queue``).
DEFAULT_QUEUE = "default"

JOB_STATUSES = tuple(status.value for status in JobStatus)
RUN_STATUSES = tuple(status.value for status in RunStatus)
RUN_TRIGGERS = tuple(trigger.value for trigger in RunTrigger)
WORKER_STATES = tuple(state.value for state in WorkerState)

metadata = MetaData(
    schema=SCHEMA,
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    },
)


def in_list(column: str, values: tuple[str, ...]) -> str:
    """``column IN ('a', 'b')`` spelled with constants: for CHECK constraints and for the
    predicates of partial indexes, which the planner matches only against constants. The
    values are cronlock's own enum values, never input."""
    return f"{column} IN ({', '.join(repr(str(v)) for v in values)})"


# The claim's predicate (and the dedup index's): a job that is due to run once run_at comes.
JOB_WAITING_PREDICATE = in_list("status", JOB_WAITING_STATUSES)
# A job the lease mode claimed: committed as running, owned by a live worker (or returned).
JOB_PROCESSING_PREDICATE = in_list("status", (JobStatus.PROCESSING,))
# The jobs that hold their dedup key: waiting, and running in the lease mode (migration 0014;
# the transactional modes' running jobs are still waiting in their row).
JOB_DEDUP_STATUSES = (*JOB_WAITING_STATUSES, JobStatus.PROCESSING)
JOB_DEDUP_PREDICATE = "dedup_key IS NOT NULL AND " + in_list("status", JOB_DEDUP_STATUSES)
JOB_KEYED_WAITING_PREDICATE = "concurrency_key IS NOT NULL AND " + JOB_WAITING_PREDICATE
# A finished job (completed, failed, cancelled) is one with a completion time.
JOB_FINISHED_PREDICATE = "completed_at IS NOT NULL"
# Every job but a completed one: what the dashboard's ix_jobs_open holds.
JOB_OPEN_PREDICATE = "status <> 'completed'"
# A job's error history holds an entry of a snooze (a handler's JobSnooze) when it contains
# this: the test the metrics make, and the predicate of ix_jobs_snoozed.
SNOOZED_ENTRY = '[{"outcome": "snoozed"}]'
# Jobs not finished yet that have retried, and that have snoozed: what the metrics count live
# (the rollup holds the finished ones), from ix_jobs_retried and ix_jobs_snoozed.
JOB_RETRIED_PREDICATE = "completed_at IS NULL AND retry_count > 0"
JOB_SNOOZED_PREDICATE = f"completed_at IS NULL AND error_history @> '{SNOOZED_ENTRY}'"


def _where(predicate: str) -> TextClause:
    return text(predicate)


jobs = Table(
    "jobs",
    metadata,
    Column("id", Uuid, primary_key=True, server_default=func.gen_random_uuid()),
    Column("job_type", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("status", Text, nullable=False, server_default="pending"),
    Column("retry_count", Integer, nullable=False, server_default="0"),
    Column("max_retries", Integer, nullable=False, server_default="3"),
    # The reference's column, kept as information: the claim reads ``run_at``, which a retry
    # moves to the same moment.
    Column("next_retry_at", DateTime(timezone=True)),
    Column("error_message", Text),
    Column("error_history", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("started_at", DateTime(timezone=True)),
    Column("completed_at", DateTime(timezone=True)),
    # -- the queue (migration 0003) --
    Column("queue", Text, nullable=False, server_default=DEFAULT_QUEUE),
    Column("priority", Integer, nullable=False, server_default="0"),
    Column("run_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("dedup_key", Text),
    Column("result", JSONB),
    # -- the lease commit mode (migration 0006) --
    # The worker holding a committed claim (its liveness is an advisory lock on this id, see
    # queue/liveness.py), the number of claims made (the fencing token a completion must
    # match), and the runs whose worker was lost (not failed attempts; they are bounded).
    Column("owner", Uuid),
    Column("attempt", Integer, nullable=False, server_default="0"),
    Column("lost_runs", Integer, nullable=False, server_default="0"),
    # -- per-key concurrency limits (migration 0007): at most concurrency_limit jobs with one
    # concurrency_key run at once, across every drainer (the claim's JOB_KEY_SLOT_FREE) --
    Column("concurrency_key", Text),
    Column("concurrency_limit", Integer),
    # -- tracing (migration 0009) --
    # The enqueuing span's W3C trace context, written only by a traced app (cronlock.tracing).
    Column("trace_context", Text),
    # -- a job's own timeout in seconds (migration 0014; NULL: its type's) --
    Column("timeout", Double),
    # -- dependencies (migration 0018; NULL for a job enqueued without depends_on) --
    # The jobs it was enqueued to follow, as given (kept for the operator: the edges that are
    # still open are job_dependencies' rows), and how many of them have not completed yet:
    # the jobs_released trigger counts it down and releases the job at 0.
    Column("depends_on", ARRAY(Uuid)),
    Column("parents_left", Integer),
    CheckConstraint(in_list("status", JOB_STATUSES), name="status"),
    CheckConstraint("retry_count >= 0", name="retry_count"),
    CheckConstraint("max_retries >= 0", name="max_retries"),
    CheckConstraint("length(job_type) BETWEEN 1 AND 200", name="job_type"),
    CheckConstraint("length(queue) BETWEEN 1 AND 200", name="queue"),
    CheckConstraint(
        "(concurrency_key IS NULL AND concurrency_limit IS NULL) OR "
        "(length(concurrency_key) BETWEEN 1 AND 200 AND concurrency_limit BETWEEN 1 AND 100)",
        name="concurrency",
    ),
    CheckConstraint("timeout IS NULL OR timeout > 0", name="timeout"),
)

# Serves the claim: the due rows of one queue in claim order (priority, then due time). A row
# leaves the index when its status does, so completed history does not slow the claim.
Index(
    "ix_jobs_claim",
    jobs.c.queue,
    jobs.c.priority.desc(),
    jobs.c.run_at,
    postgresql_where=_where(JOB_WAITING_PREDICATE),
)

# The waiting jobs with a concurrency key, in claim order (migration 0014): what the lease
# mode's keyed claim reads (sql.JOB_LEASE_KEYS_LOCK, JOB_LEASE_CLAIM_KEYED) without walking the
# unkeyed backlog; a job without a key is never in it.
Index(
    "ix_jobs_keyed_claim",
    jobs.c.queue,
    jobs.c.priority.desc(),
    jobs.c.run_at,
    postgresql_where=_where(JOB_KEYED_WAITING_PREDICATE),
)

# At most one job per dedup key waiting or running (JOB_DEDUP_STATUSES); an index, so it holds
# under concurrent enqueues.
Index(
    "uq_jobs_dedup_key",
    jobs.c.dedup_key,
    unique=True,
    postgresql_where=_where(JOB_DEDUP_PREDICATE),
)

# The running jobs of the lease mode by queue and owner (migration 0006): what a worker reads
# to find owners whose liveness lock is gone. Only ``processing`` rows, a handful.
Index(
    "ix_jobs_processing",
    jobs.c.queue,
    jobs.c.owner,
    postgresql_where=_where(JOB_PROCESSING_PREDICATE),
)

# Finished jobs by status and age (migration 0004): retention walks it oldest first, in
# bounded batches from where the last one stopped (so no batch revisits the dead entries of
# the one before), and an operator's list of the failed or cancelled jobs reads it. Waiting
# jobs have no completed_at, so the drainer's claim never meets it.
Index(
    "ix_jobs_finished",
    jobs.c.status,
    jobs.c.completed_at,
    jobs.c.id,
    postgresql_where=_where(JOB_FINISHED_PREDICATE),
    # The queue rides along (migration 0010): the dashboard counts and lists one queue's
    # completed jobs from the index alone; the entry a completion writes anyway is a little
    # wider, and no other index gets one.
    postgresql_include=["queue"],
)


# Jobs that did not complete, by queue and status, newest first (migration 0010): the
# dashboard finds the (queue, status) pairs with a loose index scan, counts each up to a cap
# and lists a page of them newest first. Completed jobs, nearly all of the table, are left
# out, so a job's completion (the drainer's hot path) writes no entry here.
Index(
    "ix_jobs_open",
    jobs.c.queue,
    jobs.c.status,
    jobs.c.created_at,
    jobs.c.id,
    postgresql_where=_where(JOB_OPEN_PREDICATE),
)

# The open jobs' retries and snoozes (migration 0013): /metrics adds them up from these two
# instead of reading every open job's row. A job that never failed or snoozed, nearly every
# open one, is in neither, and a completion leaves both.
Index(
    "ix_jobs_retried",
    jobs.c.queue,
    jobs.c.retry_count,
    postgresql_where=_where(JOB_RETRIED_PREDICATE),
)
Index("ix_jobs_snoozed", jobs.c.queue, postgresql_where=_where(JOB_SNOOZED_PREDICATE))


# The two online steps of cronlock.online that SQLAlchemy has no construct for; the identifiers
# are quoted by the dialect's preparer before they are filled in. A rename takes a moment's
# SHARE UPDATE EXCLUSIVE lock on the index alone; a validation reads the table while writes go on.
RENAME_INDEX = "ALTER INDEX IF EXISTS %(schema)s.%(old)s RENAME TO %(new)s"
VALIDATE_CONSTRAINT = "ALTER TABLE %(schema)s.%(table)s VALIDATE CONSTRAINT %(name)s"
# Every job by creation time (migration 0016): the operator's list (GET /jobs, jobs list),
# newest first with a keyset cursor on (created_at, id), is a backward range of it, whatever
# the table holds; its filters are checked on the rows the walk meets.
Index("ix_jobs_created", jobs.c.created_at, jobs.c.id)


def jobs_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of a schema's jobs (PostgreSQL cuts channels at 63 bytes)."""
    return f"{schema}.jobs"[:63]


# A statement-level trigger: one notification per queue per INSERT statement (10,000 rows
# inserted at once notify once), delivered at commit, none for a rolled-back enqueue. The
# payload is the queue name. The function reads its schema from TG_TABLE_SCHEMA, so its body
# does not depend on the schema's name.
JOBS_NOTIFY_FUNCTION = """\
CREATE FUNCTION %(schema)s.jobs_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(left(TG_TABLE_SCHEMA || '.jobs', 63), q.queue)
    FROM (SELECT DISTINCT queue FROM new_jobs) AS q;
    RETURN NULL;
END
$$"""
JOBS_NOTIFY_TRIGGER = """\
CREATE TRIGGER jobs_notify AFTER INSERT ON %(fullname)s
REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION %(schema)s.jobs_notify()"""
event.listen(jobs, "after_create", DDL(JOBS_NOTIFY_FUNCTION))  # type: ignore[no-untyped-call]
event.listen(jobs, "after_create", DDL(JOBS_NOTIFY_TRIGGER))  # type: ignore[no-untyped-call]

# One row per running drainer process: who is active for a queue and who stands by, with a
# heartbeat. Advisory locks decide; this table only makes the decision visible (status).
workers = Table(
    "workers",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("queue", Text, nullable=False),
    Column("state", Text, nullable=False),
    Column("host", Text, nullable=False, server_default=""),
    Column("pid", Integer),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("processed", BigInteger, nullable=False, server_default="0"),
    Column("failed", BigInteger, nullable=False, server_default="0"),
    Column("retried", BigInteger, nullable=False, server_default="0"),
    Column("in_flight", Integer, nullable=False, server_default="0"),
    CheckConstraint(in_list("state", WORKER_STATES), name="state"),
)

# One row per queue an operator paused or resumed (migration 0004): the claim reads it, so a
# paused queue's drainers, on every host, claim nothing once the pause commits (they finish
# what they hold). Resuming keeps the row, with paused_at NULL.
queues = Table(
    "queues",
    metadata,
    Column("name", Text, primary_key=True),
    Column("paused_at", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("length(name) BETWEEN 1 AND 200", name="name"),
)

# One row per running job an operator asked to cancel (migration 0008), written while the job's
# own row is locked by the lane running it (in the transactional commit modes nothing can
# update that row until the handler ends): the drainers read it for their running jobs, the
# notification on ``cancel_channel`` tells them at once. No foreign key: checking one would
# wait on that same row lock. The row goes when the cancel is settled, or with retention.
cancel_requests = Table(
    "cancel_requests",
    metadata,
    Column("job_id", Uuid, primary_key=True),
    Column("requested_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)


def cancel_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of a schema's cancel requests (the payload is the job id)."""
    return f"{schema}.cancel"[:63]


# One row per wait for a job's end (app.wait, GET /jobs/{id}?wait=, `cronlock jobs wait`;
# migration 0017), removed when the wait ends; one a dead waiter left behind goes with
# retention. Its only reader is the jobs_ended trigger below: a completion notifies only the
# jobs somebody waits for, so no commit of a job nobody awaits takes NOTIFY's commit lock.
job_waits = Table(
    "job_waits",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("job_id", Uuid, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_job_waits_job_id", "job_id"),
)


def ended_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of a schema's awaited job ends (the payload is the job id)."""
    return f"{schema}.ended"[:63]


# A statement-level trigger on every UPDATE of jobs (transition tables take no column list):
# when somebody waits (job_waits is not empty: one probe per statement, the whole cost when
# nobody does), one notification per awaited job the statement finished, delivered at commit.
JOBS_ENDED_FUNCTION = """\
CREATE OR REPLACE FUNCTION %(schema)s.jobs_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM %(schema)s.job_waits) THEN
        PERFORM pg_notify(left(TG_TABLE_SCHEMA || '.ended', 63), CAST(e.id AS text))
        FROM ended_jobs AS e
        WHERE e.status IN ('completed', 'failed', 'cancelled')
          AND EXISTS (SELECT FROM %(schema)s.job_waits AS w WHERE w.job_id = e.id);
    END IF;
    RETURN NULL;
END
$$"""
JOBS_ENDED_TRIGGER = """\
CREATE OR REPLACE TRIGGER jobs_ended AFTER UPDATE ON %(fullname)s
REFERENCING NEW TABLE AS ended_jobs FOR EACH STATEMENT EXECUTE FUNCTION %(schema)s.jobs_ended()"""
# On jobs' creation, as jobs_notify is (plpgsql resolves job_waits when the trigger first runs).
event.listen(jobs, "after_create", DDL(JOBS_ENDED_FUNCTION))  # type: ignore[no-untyped-call]
event.listen(jobs, "after_create", DDL(JOBS_ENDED_TRIGGER))  # type: ignore[no-untyped-call]


# One row per dependency not settled yet (migration 0018): child_id waits for parent_id. A row
# goes when its parent ends (the jobs_released trigger, in the parent's transaction), so the
# table holds the open edges only and the trigger's probe of it is a few pages at most. No
# foreign keys: checking one would take a share lock on the parent's row, which in the
# transactional modes a running job's lane holds for the whole run.
job_dependencies = Table(
    "job_dependencies",
    metadata,
    Column("parent_id", Uuid, primary_key=True),
    Column("child_id", Uuid, primary_key=True),
)

# An enqueue with depends_on and a parent's end meet on an advisory lock of the parent: the
# enqueue takes (DEPENDENCY_NAMESPACE, bucket of the parent) exclusively, then reads the
# parents' statuses and writes its edges; the trigger takes the same lock shared for every job
# a statement ended, then reads the edges. Whichever is first, the other sees what it did
# committed: no child misses its last parent's end, and none counts a parent twice. The
# parents are hashed into DEPENDENCY_BUCKETS + 1 buckets (both sides compute it in the same
# server), so a statement that ends 10,000 jobs holds at most that many locks. 64: the locks
# live in the server's shared lock table (max_locks_per_transaction x max_connections, 6,400
# by default) until the commit; with 1,024 buckets a lane's batch of 500 held about 400 of
# them, and sixteen such lanes at once would have filled it ("out of shared memory"). The
# price is an enqueue sharing its parent's bucket with more unrelated jobs (1 in 64), whose
# ends wait for that enqueue's commit (docs/how-to/dependencies.md: keep it short).
DEPENDENCY_NAMESPACE = namespace_key("cronlock-dependencies")
DEPENDENCY_BUCKETS = 63  # a mask: 64 buckets

# A statement-level trigger on every UPDATE of jobs: for the jobs the statement ended, the
# children waiting on them are counted down (and become pending at 0: claimable at the commit
# of the last parent's transaction, the drainers notified) or, when a parent failed or was
# cancelled, cancelled with every job that depends on them in turn. The children's rows are
# locked in id order before they are changed: two parents of one child ending in two
# transactions count it down one after the other (the second reads the first's count once
# it committed), and two such transactions never wait on each other in a cycle. When no job
# has dependencies, its cost is the locks and one probe of the empty job_dependencies.
_RELEASED = """\
CREATE OR REPLACE FUNCTION %(schema)s.jobs_released() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    children uuid[];
    counts bigint[];
    doomed uuid[];
    queues text[];
BEGIN
    PERFORM pg_advisory_xact_lock_shared(NAMESPACE, k.bucket)
    FROM (SELECT DISTINCT hashtext(CAST(e.id AS text)) & BUCKETS AS bucket
          FROM ended_parents AS e WHERE e.status IN ('completed', 'failed', 'cancelled')
          ORDER BY bucket) AS k;
    IF NOT FOUND OR NOT EXISTS (SELECT FROM %(schema)s.job_dependencies) THEN
        RETURN NULL;
    END IF;
    WITH gone AS (
        DELETE FROM %(schema)s.job_dependencies AS d USING ended_parents AS e
        WHERE d.parent_id = e.id AND e.status IN ('completed', 'failed', 'cancelled')
        RETURNING d.child_id, e.status = 'completed' AS ok
    ), per_child AS (
        SELECT child_id, count(*) AS n, bool_and(ok) AS ok FROM gone GROUP BY child_id
    )
    SELECT array_agg(child_id ORDER BY child_id) FILTER (WHERE ok),
           array_agg(n ORDER BY child_id) FILTER (WHERE ok),
           array_agg(child_id) FILTER (WHERE NOT ok)
    INTO children, counts, doomed FROM per_child;
    IF doomed IS NOT NULL THEN
        WITH RECURSIVE below(id) AS (
            SELECT unnest(doomed)
            UNION
            SELECT d.child_id FROM %(schema)s.job_dependencies AS d
            JOIN below ON d.parent_id = below.id
        )
        SELECT array_agg(id) INTO doomed FROM below;
    END IF;
    IF children IS NULL AND doomed IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM FROM %(schema)s.jobs
    WHERE (id = ANY(children) OR id = ANY(doomed)) AND status = 'blocked'
    ORDER BY id FOR NO KEY UPDATE;
    UPDATE %(schema)s.jobs
    SET status = 'cancelled', completed_at = now(), next_retry_at = NULL,
        error_message = 'cancelled: a job it depends on failed or was cancelled'
    WHERE id = ANY(doomed) AND status = 'blocked';
    WITH released AS (
        UPDATE %(schema)s.jobs AS j
        SET parents_left = j.parents_left - c.n,
            status = CASE WHEN j.parents_left - c.n <= 0 THEN 'pending' ELSE j.status END
        FROM unnest(children, counts) AS c(id, n)
        WHERE j.id = c.id AND j.status = 'blocked'
        RETURNING j.queue, j.status
    )
    SELECT array_agg(DISTINCT queue) FILTER (WHERE status = 'pending') INTO queues FROM released;
    PERFORM pg_notify(left(TG_TABLE_SCHEMA || '.jobs', 63), q) FROM unnest(queues) AS q;
    RETURN NULL;
END
$$"""
JOBS_RELEASED_FUNCTION = _RELEASED.replace("NAMESPACE", str(DEPENDENCY_NAMESPACE)).replace(
    "BUCKETS", str(DEPENDENCY_BUCKETS)
)
JOBS_RELEASED_TRIGGER = """\
CREATE OR REPLACE TRIGGER jobs_released AFTER UPDATE ON %(fullname)s
REFERENCING NEW TABLE AS ended_parents FOR EACH STATEMENT
EXECUTE FUNCTION %(schema)s.jobs_released()"""
event.listen(jobs, "after_create", DDL(JOBS_RELEASED_FUNCTION))  # type: ignore[no-untyped-call]
event.listen(jobs, "after_create", DDL(JOBS_RELEASED_TRIGGER))  # type: ignore[no-untyped-call]


runs = Table(
    "runs",
    metadata,
    Column("id", BigInteger, Identity(always=True), primary_key=True),
    Column("task", Text, nullable=False),
    Column("slot", DateTime(timezone=True)),
    Column("status", Text, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finished_at", DateTime(timezone=True)),
    Column("items_ok", Integer, nullable=False, server_default="0"),
    Column("items_failed", Integer, nullable=False, server_default="0"),
    Column("failures", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("error", Text),
    Column("skip_reason", Text),
    Column("host", Text, nullable=False, server_default=""),
    Column("pid", Integer),
    Column("trigger", Text, nullable=False, server_default="cron"),
    # How long after its slot the run started (NULL for a manual run, which has no slot).
    Column("lateness_ms", Double),
    # A chunked run's progress (migration 0005; NULL for a run that is one transaction): the
    # chunks committed so far and when the last one committed (the server's clock). A run
    # that died says here where it stopped.
    Column("chunks", Integer),
    Column("committed_at", DateTime(timezone=True)),
    # Items the run left alone because they are parked (migration 0015, failing_items).
    Column("items_parked", Integer, nullable=False, server_default="0"),
    CheckConstraint(in_list("status", RUN_STATUSES), name="status"),
    CheckConstraint(in_list("trigger", RUN_TRIGGERS), name="trigger"),
)

Index("ix_runs_task_started_at", runs.c.task, runs.c.started_at.desc())
# Runs by age (migration 0004): retention walks it oldest first, in bounded batches.
Index("ix_runs_started_at", runs.c.started_at, runs.c.id)

# Chunked runs in progress (migration 0005): under its lock a chunked run marks the task's dead
# ones interrupted, one probe of an index that is empty but while a chunked run works.
Index("ix_runs_running", runs.c.task, postgresql_where=text("status = 'running'"))

# One run per slot (invariant 3): the advisory lock serialises runs, this makes the slot's
# outcome durable, so a run a second after another host's committed one sees it and skips.
Index(
    "ux_runs_task_slot",
    runs.c.task,
    runs.c.slot,
    unique=True,
    postgresql_where=text(in_list("status", RUN_CLAIMING_STATUSES)),
)
# The index's predicate, for ON CONFLICT to name it: it must be spelled with constants, since
# PostgreSQL cannot prove that a predicate with bound parameters implies the index's.
RUN_CLAIMING_PREDICATE = text(in_list("status", RUN_CLAIMING_STATUSES))


# One row per periodic task an operator paused or resumed (migration 0015), the twin of
# ``queues``: a run reads it under the task's lock, so from the commit on every slot of a
# paused task, fired by any scheduler or crontab line, is recorded skipped (paused). Resuming
# keeps the row, with paused_at NULL and updated_at the moment of the resume (overdue counts
# from it, not from the last slot before the pause).
tasks = Table(
    "tasks",
    metadata,
    Column("name", Text, primary_key=True),
    Column("paused_at", DateTime(timezone=True)),
    Column("paused_by", Text),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("length(name) BETWEEN 1 AND 200", name="name"),
)

# The items of a task that failed in their latest attempts (migration 0015): one row per
# (task, item key) with its consecutive failures and last error, written with the run's
# outcome. At the task's park_after failures the item is parked (parked_at): later runs skip
# it (``run.skip_parked``) and its failures no longer fail a run. An item that succeeds loses
# its row. Small: only items that are failing now have one.
failing_items = Table(
    "failing_items",
    metadata,
    Column("task", Text, primary_key=True),
    Column("item", Text, primary_key=True),
    Column("failures", Integer, nullable=False),
    Column("error", Text, nullable=False),
    Column("first_failed_at", DateTime(timezone=True), nullable=False),
    Column("last_failed_at", DateTime(timezone=True), nullable=False),
    Column("parked_at", DateTime(timezone=True)),
)


# The metrics' rollup of finished jobs (migration 0011): per queue, what /metrics reports for
# the finished jobs whose completed_at is at or before the jobs mark's ``through``, folded in
# by the scrapes themselves (observe/prometheus.py); a scrape adds the jobs above the mark,
# read from ix_jobs_finished, so it reads a few rows whatever the history. Counters, never
# lowered: pruning or deleting a job counted here leaves it counted. One le_N column per bound
# of LATENCY_BUCKETS (cumulative counts, as Prometheus has them); the migration names 16.
job_totals = Table(
    "job_totals",
    metadata,
    Column("queue", Text, primary_key=True),
    Column("completed", BigInteger, nullable=False, server_default="0"),
    Column("failed", BigInteger, nullable=False, server_default="0"),
    Column("cancelled", BigInteger, nullable=False, server_default="0"),
    Column("retries", BigInteger, nullable=False, server_default="0"),
    Column("snoozes", BigInteger, nullable=False, server_default="0"),
    Column("latency_sum", Double, nullable=False, server_default="0"),
    *[
        Column(f"le_{index}", BigInteger, nullable=False, server_default="0")
        for index in range(len(LATENCY_BUCKETS))
    ],
)

# The metrics' rollup of finished runs (migration 0012): per task, what /metrics reports for
# the runs folded in, keyed by runs.id (finished_at cannot be the key: a dead chunked run is
# marked interrupted with the time it stopped, long after). Every run with id at or below the
# runs mark's ``through_id`` is in it, but the ids in its ``open_ids`` (running when folded,
# read live until they finish). ``last_success_at``: the latest started_at of a folded success;
# ``failures_since``: the folded failures that started after it (the consecutive failures, so
# far as the folded runs go). Counters, never lowered: pruning leaves a run counted.
run_totals = Table(
    "run_totals",
    metadata,
    Column("task", Text, primary_key=True),
    *[
        Column(status, BigInteger, nullable=False, server_default="0")
        for status in RUN_STATUSES
        if status != RunStatus.RUNNING.value
    ],
    Column("last_success_at", DateTime(timezone=True)),
    Column("failures_since", BigInteger, nullable=False, server_default="0"),
    *[
        column
        for measure in ("duration", "lateness")
        for column in (
            Column(f"{measure}_count", BigInteger, nullable=False, server_default="0"),
            Column(f"{measure}_sum", Double, nullable=False, server_default="0"),
            *[
                Column(f"{measure}_le_{index}", BigInteger, nullable=False, server_default="0")
                for index in range(len(LATENCY_BUCKETS))
            ],
        )
    ],
)

# How far each rollup has folded (migration 0011): one row per rollup (``jobs``, ``runs``).
# ``through``: every finished job with completed_at at or before it is in the rollup.
# ``pending_through`` is the next point the fold may move to, once every transaction of this
# database that held a transaction id when it was chosen (``pending_xids``, "pid:xid" of
# pg_stat_activity) has ended: a completion still uncommitted then may carry an earlier
# completed_at. The runs' rollup (migration 0012) counts by id instead: ``through_id``,
# ``open_ids`` (see run_totals), ``pending_id`` (waiting on ``pending_xids`` as the jobs' point
# does) and ``noted_id``, the newest run id seen at ``noted_at``, which becomes the pending
# point once the lag has passed (rollups.py says why).
metric_marks = Table(
    "metric_marks",
    metadata,
    Column("name", Text, primary_key=True),
    Column(
        "through",
        DateTime(timezone=True),
        nullable=False,
        server_default=text("'1970-01-01 00:00:00+00'"),
    ),
    Column("pending_through", DateTime(timezone=True)),
    Column("pending_xids", ARRAY(Text)),
    Column("through_id", BigInteger, nullable=False, server_default="0"),
    Column("open_ids", ARRAY(BigInteger), nullable=False, server_default=text("'{}'::bigint[]")),
    Column("pending_id", BigInteger),
    Column("noted_id", BigInteger),
    Column("noted_at", DateTime(timezone=True)),
)
