"""The tables cronlock owns, declared once: alembic's target metadata and the queries' source.

Everything lives in one PostgreSQL schema, ``cronlock`` by default. Another name is applied at
execution time through SQLAlchemy's ``schema_translate_map`` (see ``database.py``), so no
identifier is ever formatted into SQL.

Every column of ``jobs`` but ``job_type`` and ``payload`` has a server-side default: a plain
``INSERT INTO cronlock.jobs (job_type, payload) VALUES (...)`` from a trigger or another
language enqueues a job.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    Uuid,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

__all__ = [
    "JOB_STATUSES",
    "RUN_STATUSES",
    "SCHEMA",
    "VERSION_TABLE",
    "jobs",
    "metadata",
    "runs",
]

SCHEMA = "cronlock"
VERSION_TABLE = "cronlock_alembic_version"

JOB_STATUSES = ("pending", "processing", "completed", "failed", "retrying")
RUN_STATUSES = ("completed", "partial", "failed", "skipped")

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
    Column("next_retry_at", DateTime(timezone=True)),
    Column("error_message", Text),
    Column("error_history", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("started_at", DateTime(timezone=True)),
    Column("completed_at", DateTime(timezone=True)),
    CheckConstraint(_in("status", JOB_STATUSES), name="status"),
    CheckConstraint("retry_count >= 0", name="retry_count"),
    CheckConstraint("max_retries >= 0", name="max_retries"),
    CheckConstraint("length(job_type) BETWEEN 1 AND 200", name="job_type"),
)

# The reference's "pickable" index: the rows a drainer may claim, oldest first.
Index(
    "ix_jobs_pickable",
    jobs.c.next_retry_at,
    jobs.c.created_at,
    postgresql_where=text("status IN ('pending', 'retrying')"),
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
    CheckConstraint(_in("status", RUN_STATUSES), name="status"),
)

Index("ix_runs_task_started_at", runs.c.task, runs.c.started_at.desc())
