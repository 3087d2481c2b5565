"""Helpers for queue tests: a test app of its own on a test database, rows of ``jobs`` as dicts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from testapps import jobs as testjobs

from cronlock import App, Database
from cronlock.sql.tables import jobs


async def create_job_tables(database: Database) -> None:
    """The handlers' scratch tables and counter row (for a command's handlers, too)."""
    async with database.engine.begin() as conn:
        await conn.run_sync(testjobs.scratch.create_all)
        await conn.execute(insert(testjobs.counter).values(id=1, n=0).on_conflict_do_nothing())


@asynccontextmanager
async def job_app(
    database: Database, *, attempts: dict[str, int] | None = None
) -> AsyncIterator[App]:
    """A new app of the test handlers on ``database``, with their scratch tables and counter
    row; the flaky handler counts its attempts in ``attempts`` when given."""
    await create_job_tables(database)
    app = testjobs.create_app(attempts)
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
