"""Chunked periodic runs: ``running`` and ``interrupted`` runs, and where a run got to.

A task declared with ``commit_every`` commits its items in chunks: its row is committed
``running`` when it starts (it claims the slot from then on) and updated with every chunk
(``chunks``, ``committed_at``); a run whose process or lock was lost is ``interrupted``. Both
statuses claim the slot, so the partial unique index ``ux_runs_task_slot`` is rebuilt with
them in its predicate; ``ix_runs_running`` finds the runs in progress.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from cronlock import online

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0004"

# Spelled here, not read from cronlock.outcome: a revision is frozen once released.
_STATUSES = (
    "status IN ('completed', 'partial', 'failed', 'skipped', 'missed', 'running', 'interrupted')"
)
_STATUSES_BEFORE = "status IN ('completed', 'partial', 'failed', 'skipped', 'missed')"
_CLAIMING = "status IN ('completed', 'partial', 'failed', 'missed', 'running', 'interrupted')"
_CLAIMING_BEFORE = "status IN ('completed', 'partial', 'failed', 'missed')"


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def _slot_index(schema: str, predicate: str) -> None:
    op.drop_index("ux_runs_task_slot", table_name="runs", schema=schema)
    op.create_index(
        "ux_runs_task_slot",
        "runs",
        ["task", "slot"],
        unique=True,
        schema=schema,
        postgresql_where=sa.text(predicate),
    )


def upgrade() -> None:
    schema = _schema()
    op.add_column(
        "runs", sa.Column("chunks", sa.Integer(), nullable=True), schema=schema, if_not_exists=True
    )
    op.add_column(
        "runs",
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=True),
        schema=schema,
        if_not_exists=True,
    )
    online.add_check("ck_runs_status", "runs", _STATUSES)
    online.replace_index(
        "ux_runs_task_slot", "runs", ["task", "slot"], unique=True, where=_CLAIMING
    )
    online.create_index("ix_runs_running", "runs", ["task"], where="status = 'running'")


def downgrade() -> None:
    schema = _schema()
    op.drop_index("ix_runs_running", table_name="runs", schema=schema)
    # Before this revision a run that did not finish left no row. A chunked run's row stays,
    # as the nearest status then (failed: not a success), since its committed chunks stay too;
    # its error says what it was.
    runs = sa.table("runs", sa.column("status"), sa.column("error"), schema=schema)
    for status in ("running", "interrupted"):
        op.execute(
            runs.update()
            .where(runs.c.status == status)
            .values(
                status="failed",
                error=sa.func.coalesce(runs.c.error, f"{status} (chunked run, downgraded)"),
            )
        )
    _slot_index(schema, _CLAIMING_BEFORE)
    op.drop_constraint(op.f("ck_runs_status"), "runs", type_="check", schema=schema)
    op.create_check_constraint(op.f("ck_runs_status"), "runs", _STATUSES_BEFORE, schema=schema)
    op.drop_column("runs", "committed_at", schema=schema)
    op.drop_column("runs", "chunks", schema=schema)
