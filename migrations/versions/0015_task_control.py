"""Control of periodic tasks: paused tasks, failing (and parked) items, a run's parked count.

``tasks`` holds the periodic tasks an operator paused or resumed (a run reads it under the
task's lock and records a paused task's slots skipped, reason ``paused``); ``failing_items``
the items of a task that failed in their latest runs, per (task, item key), parked after the
task's ``park_after`` consecutive failures; ``runs.items_parked`` how many parked items a run
left alone. The two tables are new and empty, so creating them (and their primary keys) waits
on nothing. The column has a constant default: PostgreSQL 11+ adds it to the catalog only,
without rewriting ``runs`` or any index of it; it takes ACCESS EXCLUSIVE on ``runs`` for that
moment only (no table of the queue: enqueue, claim and completion never wait on it).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0014"


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    schema = _schema()
    op.create_table(
        "tasks",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("paused_by", sa.Text(), nullable=True),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("length(name) BETWEEN 1 AND 200", name=op.f("ck_tasks_name")),
        sa.PrimaryKeyConstraint("name", name="pk_tasks"),
        schema=schema,
    )
    op.create_table(
        "failing_items",
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("item", sa.Text(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("first_failed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_failed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("parked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("task", "item", name="pk_failing_items"),
        schema=schema,
    )
    op.add_column(
        "runs",
        sa.Column("items_parked", sa.Integer(), server_default="0", nullable=False),
        schema=schema,
        if_not_exists=True,
    )


def downgrade() -> None:
    schema = _schema()
    op.drop_column("runs", "items_parked", schema=schema)
    op.drop_table("failing_items", schema=schema)
    op.drop_table("tasks", schema=schema)
