"""The tables cronlock owns, declared once: alembic's target metadata and the queries' source.

Everything lives in one PostgreSQL schema, ``cronlock`` by default. Another name is applied at
execution time through SQLAlchemy's ``schema_translate_map`` (see ``database.py``), so no
identifier is ever formatted into SQL.

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
from sqlalchemy.dialects.postgresql import JSONB

__all__ = [
    "JOB_STATUSES",
    "RUN_CLAIMING_PREDICATE",
    "RUN_CLAIMING_STATUSES",
    "RUN_STATUSES",
    "RUN_TRIGGERS",
    "SCHEMA",
    "VERSION_TABLE",
    "WORKER_STATES",
    "jobs",
    "jobs_channel",
    "metadata",
    "runs",
    "workers",
]

SCHEMA = "cronlock"
VERSION_TABLE = "cronlock_alembic_version"

JOB_STATUSES = ("pending", "processing", "completed", "failed", "retrying")
RUN_STATUSES = ("completed", "partial", "failed", "skipped", "missed")
# A slot is claimed by the row of the run that did (or tried and rolled back) its work, or by
# the row saying nobody did: at most one such row per (task, slot). Skips never claim.
RUN_CLAIMING_STATUSES = ("completed", "partial", "failed", "missed")
# Who started a run: a `cronlock run` (crontab), the scheduler on time, the scheduler catching
# up a missed slot, or a person asking for a run outside any slot.
RUN_TRIGGERS = ("cron", "scheduler", "catch_up", "manual")
WORKER_STATES = ("active", "standby", "stopping")

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


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


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
    Column("queue", Text, nullable=False, server_default="default"),
    Column("priority", Integer, nullable=False, server_default="0"),
    Column("run_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("dedup_key", Text),
    Column("result", JSONB),
    CheckConstraint(_in("status", JOB_STATUSES), name="status"),
    CheckConstraint("retry_count >= 0", name="retry_count"),
    CheckConstraint("max_retries >= 0", name="max_retries"),
    CheckConstraint("length(job_type) BETWEEN 1 AND 200", name="job_type"),
    CheckConstraint("length(queue) BETWEEN 1 AND 200", name="queue"),
)

# Serves the claim: the due rows of one queue in claim order (priority, then due time). A row
# leaves the index when its status does, so completed history does not slow the claim.
Index(
    "ix_jobs_claim",
    jobs.c.queue,
    jobs.c.priority.desc(),
    jobs.c.run_at,
    postgresql_where=text("status IN ('pending', 'retrying')"),
)

# At most one waiting job per dedup key; an index, so it holds under concurrent enqueues.
Index(
    "uq_jobs_dedup_key",
    jobs.c.dedup_key,
    unique=True,
    postgresql_where=text("dedup_key IS NOT NULL AND status IN ('pending', 'retrying')"),
)


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
    CheckConstraint(_in("state", WORKER_STATES), name="state"),
)

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
    CheckConstraint(_in("status", RUN_STATUSES), name="status"),
    CheckConstraint(_in("trigger", RUN_TRIGGERS), name="trigger"),
)

Index("ix_runs_task_started_at", runs.c.task, runs.c.started_at.desc())

# One run per slot (invariant 3): the advisory lock serialises runs, this makes the slot's
# outcome durable, so a run a second after another host's committed one sees it and skips.
Index(
    "ux_runs_task_slot",
    runs.c.task,
    runs.c.slot,
    unique=True,
    postgresql_where=text(_in("status", RUN_CLAIMING_STATUSES)),
)
# The index's predicate, for ON CONFLICT to name it: it must be spelled with constants, since
# PostgreSQL cannot prove that a predicate with bound parameters implies the index's.
RUN_CLAIMING_PREDICATE = text(_in("status", RUN_CLAIMING_STATUSES))
