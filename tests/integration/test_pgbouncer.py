"""Behind PgBouncer in transaction mode: the lock never outlives its transaction.

Session-level advisory locks stay on the pooled server connection when the client "returns"
it (the reference's first trap); cronlock takes transaction-level locks only. The first test
shows the trap is real on this PgBouncer, the others that cronlock does not fall into it.
"""

from __future__ import annotations

import json

import asyncpg
from cli import start_cli
from itemsupport import count, create_scratch, items_app
from pgbouncer import running_pgbouncer
from sqlalchemy import select, text
from testapps import items
from testdb import libpq_url

from cronlock import Database, RunStatus
from cronlock.demo import lock_holders
from cronlock.sql.tables import runs


async def test_session_locks_leak_through_pgbouncer(database: Database) -> None:
    with running_pgbouncer(database.url, pool_size=1) as bouncer:
        client = await asyncpg.connect(libpq_url(bouncer), statement_cache_size=0)
        assert await client.fetchval("SELECT pg_try_advisory_lock(4242)")
        await client.close()  # the client is gone; its server connection is not
        async with database.connect() as direct:
            taken = await direct.scalar(text("SELECT pg_try_advisory_lock(4242)"))
        assert taken is False, "the session lock should still be held by the pooled connection"


async def test_runs_through_pgbouncer_leave_no_lock(database: Database) -> None:
    with running_pgbouncer(database.url, pool_size=1) as bouncer:
        through = bouncer.render_as_string(hide_password=False)
        async with items_app(database, through, pgbouncer=True) as app:
            first = await app.run("thousand", manual=True)
            second = await app.run("thousand", manual=True)
    assert first.status is RunStatus.PARTIAL
    # Not skipped: the first left no lock behind. It ran every item, and every one failed (the
    # first run committed them all; the bad ones fail again), so it is failed, not partial.
    assert (second.status, second.items_failed) == (RunStatus.FAILED, 1000)
    assert await lock_holders(database, items.create_app().task("thousand")) == []


async def test_overlapping_processes_through_pgbouncer(database: Database) -> None:
    await create_scratch(database)
    peers = 4
    with running_pgbouncer(database.url, pool_size=2) as bouncer:
        procs = [
            start_cli(
                "--pgbouncer",
                "--app",
                "testapps.items",
                "run",
                "slow",
                "--json",
                database_url=libpq_url(bouncer),
                OVERLAP_PEERS=str(peers - 1),
            )
            for _ in range(peers)
        ]
        outputs = [proc.communicate(timeout=120) for proc in procs]
    statuses = sorted(json.loads(out)["status"] for out, _ in outputs)
    assert statuses == ["completed"] + ["skipped"] * (peers - 1), [e for _, e in outputs]
    assert await count(database, runs) == peers


async def test_drains_through_pgbouncer_and_leave_no_lock(database: Database) -> None:
    from jobsupport import job_app
    from testapps import jobs as testjobs

    async with job_app(database) as app, database.session() as session:
        await app.enqueue_many_tx(session, "count", [{"n": i} for i in range(50)])
        await session.commit()
    with running_pgbouncer(database.url, pool_size=3) as bouncer:
        app = testjobs.create_app()
        app.use_database(bouncer.render_as_string(hide_password=False), pgbouncer=True)
        try:
            first = await app.drain(commit_mode="batch", batch_size=20)
            second = await app.drain()
            async with database.session() as session:
                await app.enqueue_many_tx(session, "count", [{"n": i} for i in range(50, 60)])
                await session.commit()
            # The lease mode's liveness lock is transaction-level too: it holds through
            # transaction pooling and is gone with its transaction.
            leased = await app.drain(commit_mode="lease", batch_size=4)
            after = await app.drain(commit_mode="lease")
        finally:
            await app.aclose()
    assert first.status is RunStatus.COMPLETED and first.stats["processed"] == 50
    assert second.status is RunStatus.COMPLETED  # not skipped: the first left no lock behind
    assert leased.status is RunStatus.COMPLETED and leased.stats["processed"] == 10
    assert after.status is RunStatus.COMPLETED
    async with database.connect() as conn:
        assert await conn.scalar(select(testjobs.counter.c.n)) == 60
