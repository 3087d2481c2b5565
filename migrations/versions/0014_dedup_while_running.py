"""A dedup key is held while its job runs in the lease mode too: ``uq_jobs_dedup_key`` covers
``processing``; and a job may carry a timeout of its own (``jobs.timeout``, seconds).

The transactional commit modes never commit ``processing``: a running job stays ``pending`` or
``retrying`` in the index. The lease mode commits it, and the index (``pending``/``retrying``
only) let a second job take the key while the first ran; the first one's retry then broke the
index and wedged every lease worker (issue 22). The index now holds the key through the run, as
the README always said. A database that already holds such a pair keeps the key on the waiting
job (its enqueuer was told it was created) and releases it from the running one, whose retry
then deduplicates nothing. The index is rebuilt online (``cronlock.online``): the new one
beside the old, then swapped, so a key is never unguarded and no enqueue waits for the build.

``ix_jobs_keyed_claim`` holds the waiting jobs with a concurrency key in claim order: the lease
mode now claims them too, and its keyed claim reads this index, never the unkeyed backlog.

``jobs.timeout`` is the enqueue's ``timeout``: a run longer than that many seconds is a failed
attempt, whatever the job type's own timeout (NULL: the type's). A nullable column without a
default: added without rewriting the table.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

from cronlock import online

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None
# The previous code works against this schema too (cronlock.online, rule 6): its lease-mode
# enqueue of a held key now deduplicates, and it reads no column it lacks.
oldest_code = "0013"

# Spelled here, not read from cronlock.sql.tables: a revision is frozen once released.
_BEFORE = "dedup_key IS NOT NULL AND status IN ('pending', 'retrying')"
_NOW = "dedup_key IS NOT NULL AND status IN ('pending', 'retrying', 'processing')"
_KEYED = "concurrency_key IS NOT NULL AND status IN ('pending', 'retrying')"


def _schema() -> str:
    # Given by `cronlock migrate`; read at run time (alembic also imports this file to list it).
    schema: str = context.config.attributes.get("schema", "cronlock")
    return schema


def _index(schema: str, where: str) -> None:
    op.drop_index("uq_jobs_dedup_key", table_name="jobs", schema=schema)
    op.create_index(
        "uq_jobs_dedup_key",
        "jobs",
        ["dedup_key"],
        unique=True,
        schema=schema,
        postgresql_where=sa.text(where),
    )


def upgrade() -> None:
    schema = _schema()
    # One holder per key: a waiting job before a running one, then the newest.
    jobs = sa.table(
        "jobs",
        sa.column("id"),
        sa.column("dedup_key"),
        sa.column("status"),
        sa.column("created_at"),
        schema=schema,
    )
    rank = sa.func.row_number().over(
        partition_by=jobs.c.dedup_key,
        order_by=(jobs.c.status == "processing", jobs.c.created_at.desc(), jobs.c.id),
    )
    held = sa.select(jobs.c.id, rank.label("n")).where(sa.text(_NOW)).subquery("held")
    others = sa.select(held.c.id).where(held.c.n > 1)
    op.add_column(
        "jobs", sa.Column("timeout", sa.Double(), nullable=True), schema=schema, if_not_exists=True
    )
    # A few rows at most (the pairs the old index let in), cleared before the unique build.
    op.execute(jobs.update().where(jobs.c.id.in_(others)).values(dedup_key=None))
    online.add_check("ck_jobs_timeout", "jobs", "timeout IS NULL OR timeout > 0")
    online.replace_index("uq_jobs_dedup_key", "jobs", ["dedup_key"], unique=True, where=_NOW)
    online.create_index(
        "ix_jobs_keyed_claim",
        "jobs",
        ["queue", sa.text("priority DESC"), "run_at"],
        where=_KEYED,
    )


def downgrade() -> None:
    schema = _schema()
    op.drop_constraint(op.f("ck_jobs_timeout"), "jobs", type_="check", schema=schema)
    op.drop_column("jobs", "timeout", schema=schema)
    op.drop_index("ix_jobs_keyed_claim", table_name="jobs", schema=schema)
    _index(schema, _BEFORE)
