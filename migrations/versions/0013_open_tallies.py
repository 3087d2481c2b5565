"""The open jobs' retries and snoozes for /metrics: two small partial indexes.

A scrape counts the retries and snoozes of the jobs not finished yet live (the rollup holds the
finished ones, migration 0011). It read every open job's row for that: about 10,000 heap pages
at 1,000,000 finished jobs, most of a scrape's time. ``ix_jobs_retried`` holds the open jobs
that have retried (queue, retry_count), so their sum is an index-only scan; ``ix_jobs_snoozed``
the open jobs that have snoozed, whose count of snoozes is in their error history. A job with
neither, nearly every open job, is in neither index; a completion leaves both (its new row has
a completed_at). The upgrade builds both online (``cronlock.online``; 0.13 s and 0.08 s for
1,030,000 jobs here with a plain build), while enqueues and completions go on.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import context, op

from cronlock import online

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0012"

_RETRIED = "completed_at IS NULL AND retry_count > 0"
_SNOOZED = """completed_at IS NULL AND error_history @> '[{"outcome": "snoozed"}]'"""


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    online.create_index("ix_jobs_retried", "jobs", ["queue", "retry_count"], where=_RETRIED)
    online.create_index("ix_jobs_snoozed", "jobs", ["queue"], where=_SNOOZED)


def downgrade() -> None:
    schema = _schema()
    op.drop_index("ix_jobs_snoozed", table_name="jobs", schema=schema)
    op.drop_index("ix_jobs_retried", table_name="jobs", schema=schema)
