"""What the testing kit's clock covers in the database, and what it does not (docs/how-to/testing.md
lists both): the four time functions called unqualified, every time default of cronlock's
tables, the defaults of a table a test creates, a plpgsql function's calls, and the queue's
claim and backoff in every commit and queue mode. ``CURRENT_TIMESTAMP`` in a table a test
creates stays on the real clock (a keyword, not a name any search_path reaches)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import URL, text
from sqlalchemy.ext.asyncio import AsyncSession

from cronlock import App, Backoff, Database, JobStatus
from cronlock.testing import (
    ConnectionsLeftOpen,
    DatabasePool,
    TestClock,
    drain_until_idle,
    enqueued,
)

FROZEN = datetime(2026, 10, 25, 0, 59, 59, tzinfo=UTC)


@pytest.fixture
async def db(cronlock_database_url: str) -> AsyncIterator[Database]:
    database = Database(cronlock_database_url)
    yield database
    await database.dispose()


async def scalars(database: Database, query: str) -> list[Any]:
    async with database.engine.begin() as conn:
        return list((await conn.execute(text(query))).scalars())


async def execute(database: Database, statement: str) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(text(statement))


async def test_the_time_functions_read_the_frozen_clock(
    db: Database, cronlock_clock: TestClock
) -> None:
    cronlock_clock.set(FROZEN)
    functions = "now(), transaction_timestamp(), statement_timestamp(), clock_timestamp()"
    async with db.engine.connect() as conn:
        row = (await conn.execute(text(f"SELECT {functions}"))).one()
    assert tuple(row) == (FROZEN,) * 4
    assert cronlock_clock.database_now() == FROZEN == cronlock_clock.now()

    cronlock_clock.release()
    real = cronlock_clock.database_now()
    assert abs(real - datetime.now(UTC)) < timedelta(seconds=30)


async def test_every_time_default_of_cronlock_tables_calls_the_clock(db: Database) -> None:
    # With only pg_catalog on the path, a default calling the clock's function prints it
    # qualified, one calling pg_catalog's prints it bare.
    async with db.engine.begin() as conn:
        await conn.execute(text("SET LOCAL search_path = pg_catalog"))
        defaults = (
            await conn.execute(
                text(
                    "SELECT c.relname || '.' || a.attname, pg_get_expr(d.adbin, d.adrelid) "
                    "FROM pg_attrdef d JOIN pg_class c ON c.oid = d.adrelid "
                    "JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum "
                    "WHERE c.relnamespace = 'cronlock'::regnamespace"
                )
            )
        ).all()
    timed = {
        column: expression
        for column, expression in defaults
        if "now()" in expression or "_timestamp()" in expression
    }
    assert timed and set(timed.values()) == {"cronlock_testclock.now()"}, timed
    assert "jobs.run_at" in timed and "jobs.created_at" in timed


async def test_a_table_the_test_creates_follows_the_clock_but_not_current_timestamp(
    db: Database, cronlock_clock: TestClock
) -> None:
    cronlock_clock.set(FROZEN)
    await execute(
        db,
        "CREATE TABLE stamped (id int, by_now timestamptz DEFAULT now(), "
        "by_keyword timestamptz DEFAULT CURRENT_TIMESTAMP)",
    )
    await execute(
        db,
        "CREATE FUNCTION stamp_now() RETURNS timestamptz LANGUAGE plpgsql "
        "AS $$ BEGIN RETURN now(); END $$",
    )
    await execute(db, "INSERT INTO stamped (id) VALUES (1)")

    [(by_now, by_keyword)] = [
        tuple(row) for row in await _rows(db, "SELECT by_now, by_keyword FROM stamped")
    ]
    assert by_now == FROZEN
    assert by_keyword != FROZEN  # documented: CURRENT_TIMESTAMP is the real clock's
    assert await scalars(db, "SELECT stamp_now()") == [FROZEN]


async def _rows(database: Database, query: str) -> list[Any]:
    async with database.engine.connect() as conn:
        return list(await conn.execute(text(query)))


retry_app = App()
attempts: list[datetime] = []


@retry_app.job("flaky", max_retries=2, backoff=Backoff(base=3600, factor=2, cap=86400, jitter=0))
async def flaky(session: AsyncSession, payload: dict[str, Any]) -> None:
    now = (await session.execute(text("SELECT now()"))).scalar_one()
    attempts.append(now)
    if len(attempts) < 3:
        raise RuntimeError(f"attempt {len(attempts)} fails")


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
@pytest.mark.parametrize("commit_mode", ["strict", "batch", "lease"])
async def test_a_retried_job_runs_when_the_clock_reaches_its_backoff(
    cronlock_database_url: str, cronlock_clock: TestClock, commit_mode: str, shared: bool
) -> None:
    attempts.clear()
    cronlock_clock.set(FROZEN)
    database = retry_app.use_database(cronlock_database_url)
    try:
        await retry_app.enqueue("flaky", {})
        drained = await drain_until_idle(
            retry_app, clock=cronlock_clock, commit_mode=commit_mode, shared=shared
        )
        [job] = await enqueued(retry_app, "flaky")
    finally:
        await database.dispose()

    # One hour, then two: the database's now() + the backoff, reached by moving the clock.
    hour = timedelta(hours=1)
    assert attempts == [FROZEN, FROZEN + hour, FROZEN + 3 * hour]
    assert drained.clock_moves == [FROZEN + hour, FROZEN + 3 * hour]
    assert (drained.retried, drained.processed) == (2, 1)
    assert (job.status, job.retry_count, job.completed_at) == (
        JobStatus.COMPLETED,
        2,
        FROZEN + 3 * hour,
    )


def test_a_leased_database_is_dropped_after_its_lease(
    cronlock_database_pool: DatabasePool,
) -> None:
    with cronlock_database_pool.lease() as name:
        url = cronlock_database_pool.url(name)
        assert name in url

    async def names() -> list[Any]:
        server = Database(cronlock_database_pool.server)
        try:
            return await scalars(server, "SELECT datname FROM pg_database")
        finally:
            await server.dispose()

    assert name not in asyncio.run(names())


def test_a_template_setup_gets_its_time_defaults_rebound(cronlock_server: URL) -> None:
    async def setup(url: str) -> None:
        database = Database(url)
        try:
            await execute(
                database,
                "CREATE TABLE public.mine (by_keyword timestamptz DEFAULT CURRENT_TIMESTAMP, "
                "qualified timestamptz DEFAULT pg_catalog.clock_timestamp(), "
                "today date DEFAULT CURRENT_DATE)",
            )
        finally:
            await database.dispose()

    async def defaults(url: str) -> list[Any]:
        database = Database(url)
        try:
            async with database.engine.begin() as conn:
                await conn.execute(text("SET LOCAL search_path = pg_catalog"))
                found = await conn.execute(
                    text(
                        "SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef "
                        "WHERE adrelid = 'public.mine'::regclass ORDER BY adnum"
                    )
                )
                return list(found.scalars())
        finally:
            await database.dispose()

    pool = DatabasePool.create(cronlock_server, setup)
    try:
        with pool.lease() as name:
            found = asyncio.run(defaults(pool.url(name)))
    finally:
        pool.close()
    # CURRENT_DATE is a keyword left as it is (documented).
    assert found == [
        "cronlock_testclock.now()",
        "cronlock_testclock.clock_timestamp()",
        "CURRENT_DATE",
    ]


def test_a_connection_left_open_fails_the_lease_naming_it(
    cronlock_database_pool: DatabasePool,
) -> None:
    pool = DatabasePool(cronlock_database_pool.server, cronlock_database_pool.template, linger=0.2)
    with (
        pytest.raises(ConnectionsLeftOpen, match=r"left 1 connection\(s\).*leaky"),
        pool.lease() as name,
    ):
        leaky = subprocess.Popen(
            ["psql", "-qAtc", "SELECT pg_sleep(60)", pool.url(name)],
            env={**os.environ, "PGAPPNAME": "leaky"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not asyncio.run(_sleeping(pool, name)) and time.monotonic() < deadline:
            time.sleep(0.02)  # polled: psql's query reaching the server is no event to wait on
    assert leaky.wait(timeout=10) != 0  # ended with the database


async def _sleeping(pool: DatabasePool, name: str) -> bool:
    server = Database(pool.server)
    try:
        found = await scalars(
            server,
            f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{name}' "
            "AND query LIKE 'SELECT pg_sleep%'",
        )
        return bool(found[0])
    finally:
        await server.dispose()
