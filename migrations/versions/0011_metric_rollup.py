"""The metrics' rollup of finished jobs: ``job_totals`` and its mark, ``metric_marks``.

A scrape of /metrics read every finished job (seconds at a million); it now reads the rollup,
folded forward by the scrapes themselves, and the jobs above its mark (cronlock/sql/rollups.py).
The rollup starts empty with its mark at 1970 (before any job): the first two scrapes after the
upgrade read the whole history once more, the second folds it in (about as long as one scrape
took before).
A completion writes nothing new: the drainer's hot path is unchanged.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0010"

# One cumulative bucket column per bound of cronlock.sql.histograms.LATENCY_BUCKETS (16).
_BUCKETS = 16


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def _counter(name: str, kind: sa.types.TypeEngine[object] | None = None) -> sa.Column[object]:
    return sa.Column(name, kind or sa.BigInteger(), server_default="0", nullable=False)


def upgrade() -> None:
    schema = _schema()
    op.create_table(
        "job_totals",
        sa.Column("queue", sa.Text(), nullable=False),
        _counter("completed"),
        _counter("failed"),
        _counter("cancelled"),
        _counter("retries"),
        _counter("snoozes"),
        _counter("latency_sum", sa.Double()),
        *[_counter(f"le_{index}") for index in range(_BUCKETS)],
        sa.PrimaryKeyConstraint("queue", name="pk_job_totals"),
        schema=schema,
    )
    marks = op.create_table(
        "metric_marks",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column(
            "through",
            sa.DateTime(timezone=True),
            server_default=sa.text("'1970-01-01 00:00:00+00'"),
            nullable=False,
        ),
        sa.Column("pending_through", sa.DateTime(timezone=True)),
        sa.Column("pending_xids", postgresql.ARRAY(sa.Text())),
        sa.PrimaryKeyConstraint("name", name="pk_metric_marks"),
        schema=schema,
    )
    op.bulk_insert(marks, [{"name": "jobs"}])


def downgrade() -> None:
    schema = _schema()
    op.drop_table("metric_marks", schema=schema)
    op.drop_table("job_totals", schema=schema)
