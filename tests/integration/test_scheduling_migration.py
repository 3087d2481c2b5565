"""Upgrading a history written before slots were claimed: it never fails on old duplicates."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from cronlock import Database, schema
from cronlock.sql.tables import runs

SLOT = datetime(2026, 11, 29, 10, 15, tzinfo=UTC)
BEFORE_SCHEDULING = "0001"


async def test_old_duplicate_outcomes_become_manual_runs(empty_database: Database) -> None:
    await schema.upgrade(empty_database, BEFORE_SCHEDULING)
    async with empty_database.engine.begin() as conn:
        for status in ("completed", "partial", "skipped", "failed"):
            # Only 0001's columns: the declared table has more by now.
            await conn.execute(
                insert(runs).values(task="t", slot=SLOT, status=status),
            )
    await schema.upgrade(empty_database)

    async with empty_database.connect() as conn:
        rows = (
            await conn.execute(
                select(runs.c.status, runs.c.slot, runs.c.trigger).order_by(runs.c.id)
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        ("completed", SLOT, "cron"),  # the first keeps the slot
        ("partial", None, "manual"),
        ("skipped", SLOT, "cron"),  # skips never claimed a slot
        ("failed", None, "manual"),
    ]
    async with empty_database.engine.begin() as conn:
        with pytest.raises(IntegrityError, match="ux_runs_task_slot"):
            await conn.execute(runs.insert().values(task="t", slot=SLOT, status="missed"))
