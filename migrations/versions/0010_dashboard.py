"""The dashboard's indexes: jobs that did not complete by queue and status, and the queue in
the index of finished jobs.

``ix_jobs_open`` (queue, status, created_at, id), partial on ``status <> 'completed'``: the
dashboard finds the (queue, status) pairs with a loose index scan, counts each up to a cap and
lists a page of them newest first, whatever the table's size. A completion writes no entry in
it (its new row is completed), so the drainer's hot path is unchanged; an enqueue writes one.
``ix_jobs_finished`` is rebuilt with ``INCLUDE (queue)``, so one queue's completed jobs are
counted and listed from the index alone. Both are built online (``cronlock.online``): the
upgrade takes longer than a plain build (3.5 s for 1,000,000 jobs here, with 0005) but
enqueues and completions go on meanwhile.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from cronlock import online

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0009"

_FINISHED = sa.text("completed_at IS NOT NULL")


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    online.create_index(
        "ix_jobs_open",
        "jobs",
        ["queue", "status", "created_at", "id"],
        where="status <> 'completed'",
    )
    online.replace_index(
        "ix_jobs_finished",
        "jobs",
        ["status", "completed_at", "id"],
        where="completed_at IS NOT NULL",
        include=["queue"],
    )


def downgrade() -> None:
    schema = _schema()
    op.drop_index("ix_jobs_finished", table_name="jobs", schema=schema)
    op.create_index(
        "ix_jobs_finished",
        "jobs",
        ["status", "completed_at", "id"],
        schema=schema,
        postgresql_where=_FINISHED,
    )
    op.drop_index("ix_jobs_open", table_name="jobs", schema=schema)
