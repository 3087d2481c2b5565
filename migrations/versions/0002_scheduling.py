"""Scheduling: one run per slot, missed slots, who triggered a run and how late it started.

``runs`` gains ``trigger`` (cron, scheduler, catch_up, manual) and ``lateness_ms``; its status
may now be ``missed``; and a partial unique index lets at most one claiming row (completed,
partial, failed, missed) exist per (task, slot).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from cronlock import online

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
# The oldest code that works against this schema (cronlock.online, rule 6): code before it
# could record two outcomes for one slot, which the new unique index refuses.
oldest_code = "0002"

_CLAIMING = "status IN ('completed', 'partial', 'failed', 'missed')"


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    schema = _schema()
    # A constant default: no rewrite of the table (cronlock.online, rule 4).
    op.add_column(
        "runs",
        sa.Column("trigger", sa.Text(), server_default="cron", nullable=False),
        schema=schema,
        if_not_exists=True,
    )
    op.add_column(
        "runs",
        sa.Column("lateness_ms", sa.Double(), nullable=True),
        schema=schema,
        if_not_exists=True,
    )
    # Before this revision every run that got the lock did its work, so one slot may hold
    # several outcomes. The first keeps the slot; the later ones did not belong to it and
    # become what they would be now: manual runs, outside any slot.
    runs = sa.table(
        "runs",
        *(sa.column(name) for name in ("id", "task", "slot", "status", "trigger")),
        schema=schema,
    )
    earlier = runs.alias("earlier")
    claiming = ("completed", "partial", "failed", "missed")
    op.execute(
        runs.update()
        .where(
            runs.c.status.in_(claiming),
            sa.exists().where(
                earlier.c.task == runs.c.task,
                earlier.c.slot == runs.c.slot,
                earlier.c.id < runs.c.id,
                earlier.c.status.in_(claiming),
            ),
        )
        .values(slot=None, trigger="manual")
    )
    online.add_check(
        "ck_runs_trigger", "runs", "trigger IN ('cron', 'scheduler', 'catch_up', 'manual')"
    )
    online.add_check(
        "ck_runs_status",
        "runs",
        "status IN ('completed', 'partial', 'failed', 'skipped', 'missed')",
    )
    online.create_index("ux_runs_task_slot", "runs", ["task", "slot"], unique=True, where=_CLAIMING)


def downgrade() -> None:
    schema = _schema()
    op.drop_index("ux_runs_task_slot", table_name="runs", schema=schema)
    runs = sa.table("runs", sa.column("status"), schema=schema)
    op.execute(runs.delete().where(runs.c.status == "missed"))
    op.drop_constraint(op.f("ck_runs_status"), "runs", type_="check", schema=schema)
    op.create_check_constraint(
        op.f("ck_runs_status"),
        "runs",
        "status IN ('completed', 'partial', 'failed', 'skipped')",
        schema=schema,
    )
    op.drop_constraint(op.f("ck_runs_trigger"), "runs", type_="check", schema=schema)
    op.drop_column("runs", "lateness_ms", schema=schema)
    op.drop_column("runs", "trigger", schema=schema)
