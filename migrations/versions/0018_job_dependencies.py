"""Job dependencies: ``jobs.depends_on``/``parents_left``, the ``blocked`` status, the
``job_dependencies`` edges and the ``jobs_released`` trigger that settles them.

``enqueue(..., depends_on=[a, c])`` writes the child ``blocked`` (outside the claim index,
whose predicate names ``pending`` and ``retrying`` only) with ``parents_left``, and one row of
``job_dependencies`` per parent that has not completed. The statement-level trigger on
``jobs`` counts a child down in the transaction of each parent's end and makes it ``pending``
at 0, or cancels it (and what depends on it) when a parent fails or is cancelled. The two
columns are nullable without a default and the table is new: nothing is rewritten. The
status CHECK constraint takes ``blocked`` online (``cronlock.online.add_check``: NOT VALID,
then validated while writes go on); the trigger takes SHARE ROW EXCLUSIVE on ``jobs`` for a
moment, under the migration's short ``lock_timeout`` as 0017's does.

Code of 0017 works against this schema: it never writes ``blocked``, its completions fire the
trigger like any UPDATE, and it reads no column it lacks.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from cronlock import online
from cronlock.sql.tables import JOBS_RELEASED_FUNCTION, JOBS_RELEASED_TRIGGER

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0017"

# Spelled here, not read from cronlock.sql.tables: a revision is frozen once released.
_STATUS_BEFORE = (
    "status IN ('pending', 'processing', 'completed', 'failed', 'retrying', 'cancelled')"
)
_STATUS_NOW = (
    "status IN ('pending', 'processing', 'completed', 'failed', 'retrying', 'cancelled', 'blocked')"
)


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    schema = _schema()
    op.add_column(
        "jobs",
        sa.Column("depends_on", sa.ARRAY(sa.Uuid()), nullable=True),
        schema=schema,
        if_not_exists=True,
    )
    op.add_column(
        "jobs",
        sa.Column("parents_left", sa.Integer(), nullable=True),
        schema=schema,
        if_not_exists=True,
    )
    op.create_table(
        "job_dependencies",
        sa.Column("parent_id", sa.Uuid(), nullable=False),
        sa.Column("child_id", sa.Uuid(), nullable=False),
        sa.PrimaryKeyConstraint("parent_id", "child_id", name="pk_job_dependencies"),
        schema=schema,
        if_not_exists=True,
    )
    quoted = op.get_context().dialect.identifier_preparer.quote(schema)
    op.execute(sa.text(JOBS_RELEASED_FUNCTION % {"schema": quoted}))
    op.execute(sa.text(JOBS_RELEASED_TRIGGER % {"schema": quoted, "fullname": f"{quoted}.jobs"}))
    # Last: add_check commits what precedes it with its NOT VALID step.
    online.add_check("ck_jobs_status", "jobs", _STATUS_NOW)


def downgrade() -> None:
    schema = _schema()
    quoted = op.get_context().dialect.identifier_preparer.quote(schema)
    op.execute(sa.text(f"DROP TRIGGER IF EXISTS jobs_released ON {quoted}.jobs"))
    op.execute(sa.text(f"DROP FUNCTION IF EXISTS {quoted}.jobs_released()"))
    op.drop_table("job_dependencies", schema=schema)
    op.drop_constraint(op.f("ck_jobs_status"), "jobs", type_="check", schema=schema)
    op.create_check_constraint(op.f("ck_jobs_status"), "jobs", _STATUS_BEFORE, schema=schema)
    op.drop_column("jobs", "parents_left", schema=schema)
    op.drop_column("jobs", "depends_on", schema=schema)
