"""Per-key concurrency limits: a job may carry a concurrency key and the limit of its key.

``jobs.concurrency_key`` names what the job's runs must not overlap beyond a limit (an account,
a tenant, a remote API); ``jobs.concurrency_limit`` is how many jobs with that key may run at
once, across every drainer. Both are set or neither (the claim reads them:
``sql.jobs.JOB_CLAIM``).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from cronlock import online

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0006"

# Spelled here, not read from cronlock.sql.tables: a revision is frozen once released.
_CONCURRENCY = (
    "(concurrency_key IS NULL AND concurrency_limit IS NULL) OR "
    "(length(concurrency_key) BETWEEN 1 AND 200 AND concurrency_limit BETWEEN 1 AND 100)"
)


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    schema = _schema()
    op.add_column(
        "jobs",
        sa.Column("concurrency_key", sa.Text(), nullable=True),
        schema=schema,
        if_not_exists=True,
    )
    op.add_column(
        "jobs",
        sa.Column("concurrency_limit", sa.Integer(), nullable=True),
        schema=schema,
        if_not_exists=True,
    )
    online.add_check("ck_jobs_concurrency", "jobs", _CONCURRENCY)


def downgrade() -> None:
    schema = _schema()
    op.drop_constraint(op.f("ck_jobs_concurrency"), "jobs", type_="check", schema=schema)
    op.drop_column("jobs", "concurrency_limit", schema=schema)
    op.drop_column("jobs", "concurrency_key", schema=schema)
