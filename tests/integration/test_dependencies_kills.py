"""Dependencies under SIGKILL (issue 25, done-when): workers killed mid-job, again and again,
in every commit mode; no child runs before its parents, every job runs once, and none is left
blocked once its parents have all completed.

A chain (each job depends on the one before) and a fan-in (many parents, one child) of ``after``
jobs (tests/support/testapps/jobs.py), each of which logs its number in its own transaction and,
if a job its payload names as a parent has not completed as that transaction sees it, an
``early`` line too. A real ``cronlock worker`` runs them one at a time with a delay; each time
a job is running, the worker is SIGKILLed and a new one started. Nothing sleeps to
synchronise: the database is polled with a deadline.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from typing import Any

import pytest
from cli import finish, kill_all, start_cli
from jobsupport import job_app
from sqlalchemy import func, select, text
from testapps import jobs as testjobs
from waiting import eventually

from cronlock import Database
from cronlock.sql.tables import jobs

pytestmark = pytest.mark.faults

CHAIN = 25
FAN_IN = 30
KILLS = 8


async def _enqueue(database: Database) -> int:
    """The chain and the fan-in; how many jobs in all."""
    async with job_app(database) as app:
        previous: list[str] = []
        for n in range(CHAIN):
            job = await app.enqueue("after", {"n": n, "parents": previous}, depends_on=previous)
            previous = [str(job.id)]
        parents = await app.enqueue_many(
            "after", [{"n": 1000 + n, "parents": []} for n in range(FAN_IN)]
        )
        ids = [str(parent.id) for parent in parents]
        await app.enqueue("after", {"n": 2000, "parents": ids}, depends_on=ids)
    return CHAIN + FAN_IN + 1


async def _running(database: Database) -> bool:
    """A job's handler is running: committed ``processing`` (the lease mode), or, in the
    transactional modes, which never commit ``processing``, a worker's transaction that has
    written (its job's log line) and not committed yet."""
    async with database.connect() as conn:
        count = await conn.scalar(
            select(func.count()).select_from(jobs).where(jobs.c.status == "processing")
        )
        writing = await conn.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()"
            )
        )
    return bool(count or writing)


async def _statuses(database: Database) -> dict[str, int]:
    async with database.connect() as conn:
        rows = await conn.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status))
        return {status: count for status, count in rows}


async def _all_completed(database: Database, total: int) -> bool:
    return await _statuses(database) == {"completed": total}


async def _log(database: Database) -> Counter[str]:
    async with database.connect() as conn:
        return Counter((await conn.execute(select(testjobs.job_log.c.job))).scalars().all())


async def _started_before_a_parent_completed(database: Database) -> list[Any]:
    """Children whose last start came before one of their parents' completion."""
    async with database.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT c.payload->>'n' FROM cronlock.jobs AS c"
                " JOIN cronlock.jobs AS p"
                "   ON p.id::text IN (SELECT jsonb_array_elements_text(c.payload->'parents'))"
                " WHERE c.started_at < p.completed_at"
            )
        )
        return list(rows.scalars().all())


@pytest.mark.parametrize("mode", ["strict", "batch", "lease"])
async def test_killed_workers_never_run_a_child_early_nor_leave_one_blocked(
    database: Database, database_url: str, mode: str
) -> None:
    total = await _enqueue(database)
    args = ("--app", "testapps.jobs", "worker", "--json", "--commit-mode", mode)
    env = {"COUNT_DELAY": "0.05"}
    killed: list[subprocess.Popen[str]] = []
    worker = start_cli(*args, "--poll-interval", "0.2", database_url=database_url, **env)
    try:
        for _ in range(KILLS):
            await eventually(lambda: _running(database), timeout=60, interval=0.005)
            worker.kill()
            killed.append(worker)
            worker = start_cli(*args, "--poll-interval", "0.2", database_url=database_url, **env)
        await eventually(lambda: _all_completed(database, total), timeout=120)
        worker.terminate()
        code, _stdout, stderr = finish(worker)
        assert code == 0, stderr
    finally:
        kill_all(worker, *killed)

    log = await _log(database)
    assert not [line for line in log if line.startswith("early:")]
    assert sorted(log) == sorted(
        [f"after:{n}" for n in range(CHAIN)]
        + [f"after:{1000 + n}" for n in range(FAN_IN)]
        + ["after:2000"]
    )
    assert set(log.values()) == {1}  # each job's work committed once
    assert await _started_before_a_parent_completed(database) == []
