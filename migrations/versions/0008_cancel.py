"""Cooperative cancellation: the cancel requests of running jobs.

An operator's cancel of a job a drainer is running is a row of ``cancel_requests``, committed
with a notification: in the transactional commit modes the job's own row is locked by the
lane running it until its handler ends, so the request cannot be a column of ``jobs``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0007"


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    op.create_table(
        "cancel_requests",
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column(
            "requested_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("job_id", name="pk_cancel_requests"),
        schema=_schema(),
    )


def downgrade() -> None:
    # A request not yet carried out is dropped: its job runs to its end, as before.
    op.drop_table("cancel_requests", schema=_schema())
