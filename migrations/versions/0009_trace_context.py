"""The trace context a job carries from the request that enqueued it to each of its attempts.

``trace_context`` holds the W3C ``traceparent`` (and ``tracestate``) of the span that
enqueued the job, written only when the app is traced (``cronlock.tracing``, the 'otel'
extra); each attempt's span is that span's child, so one trace crosses the queue. NULL
otherwise, and nothing reads it then.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0008"


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    op.add_column("jobs", sa.Column("trace_context", sa.Text(), nullable=True), schema=_schema())


def downgrade() -> None:
    op.drop_column("jobs", "trace_context", schema=_schema())
