"""Stopping a waiting standby through PgBouncer (transaction mode) sends no cancel request.

A standby used to wait in ``pg_advisory_xact_lock`` and, told to stop, cancel it: a cancel
request through PgBouncer 1.18 followed by the socket's close could crash the pooler
(``disconnect_client(): bad client state``), taking every client's connection with it. It now
waits in slices with a ``lock_timeout`` and leaves between two of them (queue/lease.py). The
full 50 stops run in the fault suite (``-m faults``); the default run stops a few.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from jobsupport import job_app, job_rows
from pgbouncer import running_pgbouncer
from sqlalchemy import text
from testapps import jobs as testjobs
from testdb import libpq_url
from waiting import eventually

import cronlock
from cronlock import Database


async def _standbys(database: Database) -> int:
    async with database.connect() as conn:
        query = text("SELECT count(*) FROM cronlock.workers WHERE state = 'standby'")
        return int((await conn.execute(query)).scalar_one())


async def stop_standbys(database: Database, stops: int) -> None:
    async with job_app(database):
        pass  # the handlers' tables
    with running_pgbouncer(database.url, pool_size=4) as bouncer:
        through = bouncer.render_as_string(hide_password=False)
        app = testjobs.create_app()
        app.use_database(through, pgbouncer=True)
        stop_active = asyncio.Event()
        try:
            active = asyncio.create_task(
                cronlock.serve_worker(app.drainer(poll_interval=0.1), stop=stop_active)
            )
            for _ in range(stops):
                stop = asyncio.Event()
                standby = asyncio.create_task(
                    cronlock.serve_worker(app.drainer(poll_interval=0.1), stop=stop)
                )
                await eventually(lambda: _standbys(database), timeout=30)
                stop.set()
                result = await asyncio.wait_for(standby, 10)
                assert result.status is cronlock.RunStatus.COMPLETED, result.error
                assert not active.done()
            # PgBouncer is alive, and so is every client of it: the active drainer drains.
            client = await asyncpg.connect(libpq_url(bouncer), statement_cache_size=0)
            assert await client.fetchval("SELECT 1") == 1
            await client.close()
            await app.enqueue("noop", {})
            await eventually(lambda: _completed(database), timeout=30)
            stop_active.set()
            result = await asyncio.wait_for(active, 30)
            assert result.status is cronlock.RunStatus.COMPLETED, result.error
        finally:
            stop_active.set()
            await app.aclose()


async def _completed(database: Database) -> bool:
    return [r["status"] for r in await job_rows(database)] == ["completed"]


async def test_standbys_stopped_through_pgbouncer_leave_it_alive(database: Database) -> None:
    await stop_standbys(database, 3)


@pytest.mark.faults
async def test_fifty_standby_stops_through_pgbouncer(database: Database) -> None:
    await stop_standbys(database, 50)
