"""Operating the queue: a ``cancelled`` status, paused queues, and the indexes retention walks.

``jobs.status`` may now be ``cancelled`` (an operator cancelled the job before it ran); the
``queues`` table holds the queues an operator paused (the claim reads it); ``ix_jobs_finished``
and ``ix_runs_started_at`` let retention delete old rows oldest first in bounded batches.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from cronlock import online

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0003"

# Spelled here, not read from cronlock.outcome: a revision is frozen once released.
_STATUSES = "status IN ('pending', 'processing', 'completed', 'failed', 'retrying', 'cancelled')"
_STATUSES_BEFORE = "status IN ('pending', 'processing', 'completed', 'failed', 'retrying')"


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    schema = _schema()
    op.create_table(
        "queues",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("length(name) BETWEEN 1 AND 200", name=op.f("ck_queues_name")),
        sa.PrimaryKeyConstraint("name", name="pk_queues"),
        schema=schema,
        if_not_exists=True,
    )
    online.add_check("ck_jobs_status", "jobs", _STATUSES)
    online.create_index(
        "ix_jobs_finished",
        "jobs",
        ["status", "completed_at", "id"],
        where="completed_at IS NOT NULL",
    )
    online.create_index("ix_runs_started_at", "runs", ["started_at", "id"])


def downgrade() -> None:
    schema = _schema()
    op.drop_index("ix_runs_started_at", table_name="runs", schema=schema)
    op.drop_index("ix_jobs_finished", table_name="jobs", schema=schema)
    op.drop_table("queues", schema=schema)
    # A cancelled job never ran and never will: before this revision the nearest status is
    # failed, which no drainer claims either. Its error says what happened.
    jobs = sa.table("jobs", sa.column("status"), sa.column("error_message"), schema=schema)
    op.execute(
        jobs.update()
        .where(jobs.c.status == "cancelled")
        .values(status="failed", error_message=sa.func.coalesce(jobs.c.error_message, "cancelled"))
    )
    op.drop_constraint(op.f("ck_jobs_status"), "jobs", type_="check", schema=schema)
    op.create_check_constraint(op.f("ck_jobs_status"), "jobs", _STATUSES_BEFORE, schema=schema)
