"""Core tables: the jobs queue (the reference's columns) and the history of runs.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
# The oldest code that works against this schema (cronlock.online, rule 6): the first schema.
oldest_code = "0001"


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Uuid(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("job_type", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("retry_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_retries", sa.Integer(), server_default="3", nullable=False),
        sa.Column("next_retry_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column(
            "error_history",
            postgresql.JSONB(),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'processing', 'completed', 'failed', 'retrying')",
            name=op.f("ck_jobs_status"),
        ),
        sa.CheckConstraint("retry_count >= 0", name=op.f("ck_jobs_retry_count")),
        sa.CheckConstraint("max_retries >= 0", name=op.f("ck_jobs_max_retries")),
        sa.CheckConstraint("length(job_type) BETWEEN 1 AND 200", name=op.f("ck_jobs_job_type")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        schema=_schema(),
    )
    op.create_index(
        "ix_jobs_pickable",
        "jobs",
        ["next_retry_at", "created_at"],
        schema=_schema(),
        postgresql_where=sa.text("status IN ('pending', 'retrying')"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("slot", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("items_ok", sa.Integer(), server_default="0", nullable=False),
        sa.Column("items_failed", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "failures", postgresql.JSONB(), server_default=sa.text("'[]'::jsonb"), nullable=False
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("skip_reason", sa.Text(), nullable=True),
        sa.Column("host", sa.Text(), server_default="", nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.CheckConstraint(
            "status IN ('completed', 'partial', 'failed', 'skipped')", name=op.f("ck_runs_status")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        schema=_schema(),
    )
    op.create_index(
        "ix_runs_task_started_at", "runs", ["task", sa.text("started_at DESC")], schema=_schema()
    )


def downgrade() -> None:
    op.drop_index("ix_runs_task_started_at", table_name="runs", schema=_schema())
    op.drop_table("runs", schema=_schema())
    op.drop_index("ix_jobs_pickable", table_name="jobs", schema=_schema())
    op.drop_table("jobs", schema=_schema())
