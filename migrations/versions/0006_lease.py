"""The lease commit mode: a claimed job's owner and attempt, its lost runs, and their index.

In the ``lease`` commit mode the claim commits: the job is ``processing``, ``owner`` is the
worker that holds it (its liveness is an advisory lock on that id) and ``attempt`` counts the
claims made, the fencing token a completion must match. ``lost_runs`` counts the runs whose
worker was lost (not failed attempts; a job is stopped after a bounded number of them).
``ix_jobs_processing`` is what a worker reads to find the owners of running jobs.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from cronlock import online

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0005"


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    schema = _schema()
    op.add_column(
        "jobs", sa.Column("owner", sa.Uuid(), nullable=True), schema=schema, if_not_exists=True
    )
    op.add_column(
        "jobs",
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        schema=schema,
        if_not_exists=True,
    )
    op.add_column(
        "jobs",
        sa.Column("lost_runs", sa.Integer(), server_default="0", nullable=False),
        schema=schema,
        if_not_exists=True,
    )
    online.create_index(
        "ix_jobs_processing", "jobs", ["queue", "owner"], where="status IN ('processing')"
    )


def downgrade() -> None:
    schema = _schema()
    # A processing job of the lease mode has no meaning before this revision (a transactional
    # mode never commits one): it is due again, as if its worker had been lost.
    jobs = sa.table("jobs", sa.column("status"), sa.column("retry_count"), schema=schema)
    op.execute(
        jobs.update()
        .where(jobs.c.status == "processing")
        .values(
            status=sa.case((jobs.c.retry_count > 0, "retrying"), else_="pending"),
        )
    )
    op.drop_index("ix_jobs_processing", table_name="jobs", schema=schema)
    op.drop_column("jobs", "lost_runs", schema=schema)
    op.drop_column("jobs", "attempt", schema=schema)
    op.drop_column("jobs", "owner", schema=schema)
