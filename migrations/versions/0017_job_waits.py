"""Waiting for a job's end: ``job_waits`` and the ``jobs_ended`` trigger that notifies waiters.

``app.wait``, ``GET /jobs/{id}?wait=S`` and ``cronlock jobs wait`` register a row in
``job_waits`` and LISTEN on ``<schema>.ended``; the statement-level trigger on ``jobs`` sends
one notification per awaited job a statement finished, at its commit. When nobody waits the
trigger's whole cost is one probe of the empty ``job_waits`` per UPDATE statement, and no
commit takes NOTIFY's database-wide commit lock. The table is new (creating it waits on
nothing); creating the trigger takes SHARE ROW EXCLUSIVE on ``jobs`` for a moment, under the
migration's short ``lock_timeout`` (``cronlock.online``, rule 1): behind a long transaction it
gives up and is retried, instead of making enqueues and completions queue behind it. Code of
0016 ignores both.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from cronlock.sql.tables import JOBS_ENDED_FUNCTION, JOBS_ENDED_TRIGGER

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6).
oldest_code = "0016"


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def upgrade() -> None:
    schema = _schema()
    op.create_table(
        "job_waits",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name="pk_job_waits"),
        schema=schema,
        if_not_exists=True,
    )
    op.create_index(
        "ix_job_waits_job_id", "job_waits", ["job_id"], schema=schema, if_not_exists=True
    )
    quoted = op.get_context().dialect.identifier_preparer.quote(schema)
    op.execute(sa.text(JOBS_ENDED_FUNCTION % {"schema": quoted}))
    op.execute(sa.text(JOBS_ENDED_TRIGGER % {"schema": quoted, "fullname": f"{quoted}.jobs"}))


def downgrade() -> None:
    schema = _schema()
    quoted = op.get_context().dialect.identifier_preparer.quote(schema)
    op.execute(sa.text(f"DROP TRIGGER IF EXISTS jobs_ended ON {quoted}.jobs"))
    op.execute(sa.text(f"DROP FUNCTION IF EXISTS {quoted}.jobs_ended()"))
    op.drop_table("job_waits", schema=schema)
