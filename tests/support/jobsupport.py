"""Helpers for queue tests: a test app on a test database, rows of ``jobs`` as dicts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from testapps import jobs as testjobs

from cronlock import App, Database
from cronlock.sql.tables import jobs


@asynccontextmanager
async def job_app(database: Database) -> AsyncIterator[App]:
    """The test handlers' app on ``database``, with their scratch tables and counter row."""
    async with database.engine.begin() as conn:
        await conn.run_sync(testjobs.scratch.create_all)
        await conn.execute(insert(testjobs.counter).values(id=1, n=0).on_conflict_do_nothing())
    testjobs.attempts.clear()
    app = testjobs.app
    app.use_database(str(database.url))
    try:
        yield app
    finally:
        await app.aclose()


async def job_rows(database: Database, **where: Any) -> list[dict[str, Any]]:
    async with database.connect() as conn:
        query = select(jobs).order_by(jobs.c.created_at, jobs.c.id)
        for name, value in where.items():
            query = query.where(jobs.c[name] == value)
        return [dict(row) for row in (await conn.execute(query)).mappings()]


async def scalar(database: Database, statement: Any) -> Any:
    async with database.connect() as conn:
        return (await conn.execute(statement)).scalar_one()
