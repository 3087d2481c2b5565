"""The connection a Database keeps for one-job enqueues (``pg.QuickConnections``).

One connection, taken from the pool once, serves enqueue after enqueue; a caller that finds it
busy borrows a pooled one; one the server closed is never handed out; dispose closes it.
Which backend served a statement is read from the server (``pg_stat_activity``).
"""

from __future__ import annotations

from jobsupport import job_app, job_rows
from sqlalchemy import text
from waiting import eventually

from cronlock import Database
from cronlock.pg import QuickConnections

BACKENDS = text(
    "SELECT pid FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name = 'cronlock' "
    "AND pid <> pg_backend_pid() ORDER BY pid"
)


async def _backends(observer: Database) -> list[int]:
    async with observer.connect() as conn:
        return list((await conn.execute(BACKENDS)).scalars().all())


async def _kept_pid(quick: QuickConnections) -> int:
    driver, pooled = await quick.acquire()
    try:
        assert pooled is None  # the kept one, not a pooled one
        return driver.get_server_pid()
    finally:
        await quick.release(driver, pooled)


async def test_one_connection_serves_enqueue_after_enqueue(database: Database) -> None:
    async with job_app(database) as app:
        for n in range(5):
            await app.enqueue("noop", {"n": n})
        kept = await _kept_pid(app.database.quick)
        # Only the kept connection: the pool opened it once and has none of its own.
        assert await _backends(database) == [kept]
    assert len(await job_rows(database)) == 5


async def test_a_caller_that_finds_it_busy_borrows_from_the_pool(database: Database) -> None:
    async with job_app(database) as app:
        await app.enqueue("noop", {"n": 0})
        quick = app.database.quick
        held, pooled = await quick.acquire()
        try:
            assert pooled is None
            await app.enqueue("noop", {"n": 1})  # the kept one is busy
            borrowed = set(await _backends(database)) - {held.get_server_pid()}
            assert len(borrowed) == 1  # a pooled connection, back in the pool now
        finally:
            await quick.release(held, pooled)
        assert await _kept_pid(quick) == held.get_server_pid()
    assert len(await job_rows(database)) == 2


async def test_a_connection_the_server_closed_is_not_handed_out(database: Database) -> None:
    async with job_app(database) as app:
        await app.enqueue("noop", {"n": 0})
        quick = app.database.quick
        driver, pooled = await quick.acquire()
        await quick.release(driver, pooled)
        async with database.connect() as conn:
            await conn.execute(
                text("SELECT pg_terminate_backend(:pid)"), {"pid": driver.get_server_pid()}
            )

        async def noticed() -> bool:
            return driver.is_closed()

        await eventually(noticed)
        await app.enqueue("noop", {"n": 1})  # on another connection, no error
        assert await _kept_pid(quick) != driver.get_server_pid()
    assert len(await job_rows(database)) == 2


async def test_dispose_closes_the_kept_connection(database: Database) -> None:
    async with job_app(database) as app:
        await app.enqueue("noop", {})
        kept = await _kept_pid(app.database.quick)
    # app.aclose() disposed its Database.

    async def closed() -> bool:
        return kept not in await _backends(database)

    await eventually(closed)
