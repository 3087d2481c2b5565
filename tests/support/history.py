"""Reading a test database's history: the runs table and the scheduling test app's work log."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from testapps import sched

from cronlock import Database
from cronlock.sql.tables import runs


async def create_work_table(database: Database) -> None:
    async with database.engine.begin() as conn:
        await conn.run_sync(sched.scratch.create_all)


async def runs_of(database: Database, task: str) -> list[dict[str, Any]]:
    async with database.connect() as conn:
        rows = await conn.execute(select(runs).where(runs.c.task == task).order_by(runs.c.id))
        return [dict(row) for row in rows.mappings()]


async def work_slots(database: Database, task: str) -> list[datetime | None]:
    """The slot of every run of ``task`` that did its work, in the order they committed."""
    async with database.connect() as conn:
        rows = await conn.execute(
            select(sched.work.c.slot).where(sched.work.c.task == task).order_by(sched.work.c.id)
        )
        return list(rows.scalars())
