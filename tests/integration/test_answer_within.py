"""``pg.answer_within``: a statement that does not answer in time gets its connection cut,
never a cancel request (which, through PgBouncer 1.18, can kill the pooler: issue 11, point 5).

The proof is on the server: a cancelled ``pg_sleep`` ends at once, while one whose client went
away sleeps on (PostgreSQL notices the lost socket only when it next writes to it).
"""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from cronlock import Database, pg


async def _state(database: Database, pid: int) -> str | None:
    async with database.connect() as conn:
        state: str | None = await conn.scalar(
            text("SELECT state FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        )
        return state


async def test_a_statement_past_its_time_is_cut_not_cancelled(database: Database) -> None:
    driver = await pg.connect(database, "cronlock test answer_within")
    pid = driver.get_server_pid()
    try:
        with pytest.raises(TimeoutError, match="connection was cut"):
            await pg.answer_within(driver, driver.execute("SELECT pg_sleep(30)"), 0.2)
        assert driver.is_closed()
        assert await _state(database, pid) == "active"  # still asleep: no cancel came
    finally:
        driver.terminate()
        async with database.connect() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})


async def test_a_cancelled_wait_lets_a_short_statement_finish(database: Database) -> None:
    driver = await pg.connect(database, "cronlock test answer_within")
    try:
        waiting = asyncio.ensure_future(
            pg.answer_within(driver, driver.execute("SELECT pg_sleep(0.2)"), 5)
        )
        await asyncio.sleep(0)  # the statement is sent
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # Not cut, nothing left in progress: the connection takes the next statement.
        assert await driver.fetchval("SELECT 1") == 1
    finally:
        await driver.close()


async def test_an_answer_in_time_is_returned(database: Database) -> None:
    driver = await pg.connect(database, "cronlock test answer_within")
    try:
        assert await pg.answer_within(driver, driver.fetchval("SELECT 41 + 1"), 5) == 42
    finally:
        await driver.close()
