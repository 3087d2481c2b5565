"""Helpers for periodic-task tests: the test tasks' app on a test database, and row counts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import func, select
from testapps import items

from cronlock import App, Database


async def create_scratch(database: Database) -> None:
    """The ``processed`` table the test tasks write to (for runs in a subprocess, too)."""
    async with database.engine.begin() as conn:
        await conn.run_sync(items.scratch.create_all)


@asynccontextmanager
async def items_app(
    database: Database, url: str | None = None, *, pgbouncer: bool = False
) -> AsyncIterator[App]:
    """A new app of the test tasks, with their scratch table in ``database``, talking to
    ``url`` (the database itself unless given, e.g. through a PgBouncer)."""
    await create_scratch(database)
    app = items.create_app()
    app.use_database(url or str(database.url), pgbouncer=pgbouncer)
    try:
        yield app
    finally:
        await app.aclose()


async def count(database: Database, table: Any, *where: Any) -> int:
    """``SELECT count(*) FROM table WHERE …`` in ``database``."""
    async with database.connect() as conn:
        statement = select(func.count()).select_from(table).where(*where)
        return int((await conn.execute(statement)).scalar_one())
