"""The job queue: queues, priorities, due times, dedup keys, results, workers, NOTIFY on insert.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

from cronlock import online
from cronlock.sql.tables import (
    JOB_DEDUP_PREDICATE,
    JOB_WAITING_PREDICATE,
    JOBS_NOTIFY_FUNCTION,
    JOBS_NOTIFY_TRIGGER,
)

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0002"


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def _quoted_schema() -> str:
    # DDL cannot bind an identifier: the schema name (validated by Database) is quoted by the
    # dialect's own preparer, never pasted as it came.
    return op.get_context().dialect.identifier_preparer.quote_schema(_schema())


def upgrade() -> None:
    schema = _schema()
    op.add_column(
        "jobs",
        sa.Column("queue", sa.Text(), server_default="default", nullable=False),
        schema=schema,
        if_not_exists=True,
    )
    op.add_column(
        "jobs",
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        schema=schema,
        if_not_exists=True,
    )
    op.add_column(
        "jobs",
        sa.Column(
            "run_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        schema=schema,
        if_not_exists=True,
    )
    op.add_column(
        "jobs", sa.Column("dedup_key", sa.Text(), nullable=True), schema=schema, if_not_exists=True
    )
    op.add_column(
        "jobs",
        sa.Column("result", postgresql.JSONB(), nullable=True),
        schema=schema,
        if_not_exists=True,
    )
    op.create_table(
        "workers",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), server_default="", nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "heartbeat_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("processed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("failed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("retried", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("in_flight", sa.Integer(), server_default="0", nullable=False),
        sa.CheckConstraint(
            "state IN ('active', 'standby', 'stopping')", name=op.f("ck_workers_state")
        ),
        sa.PrimaryKeyConstraint("id", name="pk_workers"),
        schema=schema,
        if_not_exists=True,
    )
    # The DDL the tables declare (sql/tables.py), with the schema quoted by the dialect.
    quoted = _quoted_schema()
    # Dropped first: a migration retried from its start runs these again (cronlock.online).
    op.execute(sa.text(f"DROP TRIGGER IF EXISTS jobs_notify ON {quoted}.jobs"))
    op.execute(sa.text(f"DROP FUNCTION IF EXISTS {quoted}.jobs_notify()"))
    op.execute(sa.text(JOBS_NOTIFY_FUNCTION % {"schema": quoted}))
    op.execute(sa.text(JOBS_NOTIFY_TRIGGER % {"schema": quoted, "fullname": f"{quoted}.jobs"}))
    # The online steps last (cronlock.online): each commits what precedes it.
    online.add_check("ck_jobs_queue", "jobs", "length(queue) BETWEEN 1 AND 200")
    # After the commit of the new columns: the update's scan holds no lock on the table.
    # A retrying job from before this revision is due when its retry was.
    op.execute(
        sa.text(
            f"UPDATE {_quoted_schema()}.jobs SET run_at = next_retry_at "  # noqa: S608
            "WHERE status = 'retrying' AND next_retry_at IS NOT NULL"
        )
    )
    online.drop_index("ix_jobs_pickable", "jobs")
    online.create_index(
        "ix_jobs_claim",
        "jobs",
        ["queue", sa.text("priority DESC"), "run_at"],
        where=JOB_WAITING_PREDICATE,
    )
    online.create_index(
        "uq_jobs_dedup_key", "jobs", ["dedup_key"], unique=True, where=JOB_DEDUP_PREDICATE
    )


def downgrade() -> None:
    schema = _schema()
    quoted = _quoted_schema()
    op.execute(sa.text(f"DROP TRIGGER jobs_notify ON {quoted}.jobs"))
    op.execute(sa.text(f"DROP FUNCTION {quoted}.jobs_notify()"))
    op.drop_table("workers", schema=schema)
    op.drop_index("uq_jobs_dedup_key", table_name="jobs", schema=schema)
    op.drop_index("ix_jobs_claim", table_name="jobs", schema=schema)
    op.create_index(
        "ix_jobs_pickable",
        "jobs",
        ["next_retry_at", "created_at"],
        schema=schema,
        postgresql_where=sa.text("status IN ('pending', 'retrying')"),
    )
    op.drop_constraint(op.f("ck_jobs_queue"), "jobs", schema=schema)
    for name in ("result", "dedup_key", "run_at", "priority", "queue"):
        op.drop_column("jobs", name, schema=schema)
