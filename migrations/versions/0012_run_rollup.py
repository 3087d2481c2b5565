"""The metrics' rollup of finished runs: ``run_totals`` and the runs row of ``metric_marks``.

A scrape of /metrics read every run (runs by outcome, the last success, consecutive failures,
the duration and lateness histograms: hundreds of ms at 100,000 runs); it now reads the
rollup, folded forward by the scrapes themselves by runs.id, and the runs above its mark plus
the few that were still running when folded (cronlock/sql/rollups.py). The rollup starts
empty with its mark at id 0: the first scrapes after the upgrade read the whole history as
before, until one folds it in. Recording a run writes nothing new.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0011"

# One cumulative bucket column per bound of cronlock.sql.histograms.LATENCY_BUCKETS (16).
_BUCKETS = 16
# The run statuses a folded run can have (every one but ``running``), as of this revision.
_FINISHED = ("completed", "partial", "failed", "skipped", "missed", "interrupted")


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def _counter(name: str, kind: sa.types.TypeEngine[object] | None = None) -> sa.Column[object]:
    return sa.Column(name, kind or sa.BigInteger(), server_default="0", nullable=False)


def _histogram(measure: str) -> list[sa.Column[object]]:
    return [
        _counter(f"{measure}_count"),
        _counter(f"{measure}_sum", sa.Double()),
        *[_counter(f"{measure}_le_{index}") for index in range(_BUCKETS)],
    ]


def upgrade() -> None:
    schema = _schema()
    op.create_table(
        "run_totals",
        sa.Column("task", sa.Text(), nullable=False),
        *[_counter(status) for status in _FINISHED],
        sa.Column("last_success_at", sa.DateTime(timezone=True)),
        _counter("failures_since"),
        *_histogram("duration"),
        *_histogram("lateness"),
        sa.PrimaryKeyConstraint("task", name="pk_run_totals"),
        schema=schema,
    )
    op.add_column("metric_marks", _counter("through_id"), schema=schema)
    op.add_column(
        "metric_marks",
        sa.Column(
            "open_ids",
            postgresql.ARRAY(sa.BigInteger()),
            server_default=sa.text("'{}'::bigint[]"),
            nullable=False,
        ),
        schema=schema,
    )
    op.add_column("metric_marks", sa.Column("pending_id", sa.BigInteger()), schema=schema)
    op.add_column("metric_marks", sa.Column("noted_id", sa.BigInteger()), schema=schema)
    op.add_column("metric_marks", sa.Column("noted_at", sa.DateTime(timezone=True)), schema=schema)
    op.bulk_insert(_marks(schema), [{"name": "runs"}])


def _marks(schema: str) -> sa.TableClause:
    return sa.table("metric_marks", sa.column("name", sa.Text()), schema=schema)


def downgrade() -> None:
    schema = _schema()
    marks = _marks(schema)
    op.execute(marks.delete().where(marks.c.name == "runs"))
    for name in ("noted_at", "noted_id", "pending_id", "open_ids", "through_id"):
        op.drop_column("metric_marks", name, schema=schema)
    op.drop_table("run_totals", schema=schema)
