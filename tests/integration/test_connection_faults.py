"""Connections cut under the drainer by ``pg_terminate_backend``: an infrastructure fault, never
a job's failure (DESIGN.md invariant 9).

A lane's connection cut mid-job rolls its transaction back: the job runs again, as after a
SIGKILL, and no attempt is consumed (``max_retries=0`` here: one charged attempt would fail the
job). The handlers are the test's own, in process; the cut is a real one, on the server.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from jobsupport import job_rows
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from waiting import eventually

import cronlock
from cronlock import Database


async def terminate(database: Database, where: str, **params: Any) -> list[int]:
    """``pg_terminate_backend`` every other backend of the test database matching ``where``
    (pg_stat_activity's columns); the pids it cut."""
    query = text(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        f"AND pid <> pg_backend_pid() AND {where}"
    )
    async with database.connect() as conn:
        pids = list((await conn.execute(query, params)).scalars())
        for pid in pids:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        await conn.commit()
    return pids


def cut_app(
    database: Database, mode: str
) -> tuple[cronlock.App, Counter[int], asyncio.Event, asyncio.Event]:
    """An app whose handler, on its first attempt of job 0, waits to be cut: in a statement on
    its session (``sql``), or away from it (``idle``: it goes on once told the cut is done,
    and the cut shows at the commit)."""
    attempts: Counter[int] = Counter()
    cut_me, was_cut = asyncio.Event(), asyncio.Event()
    app = cronlock.App()

    @app.job("cut", max_retries=0)
    async def cut(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
        n = payload["n"]
        attempts[n] += 1
        if n == 0 and attempts[n] == 1:
            cut_me.set()
            if mode == "sql":
                await session.execute(text("SELECT pg_sleep(60)"))
            else:
                await session.execute(text("SELECT 1"))
                await asyncio.wait_for(was_cut.wait(), 60)
        return {"n": n}

    app.use_database(str(database.url))
    return app, attempts, cut_me, was_cut


@pytest.mark.parametrize("where", ["sql", "idle"])
@pytest.mark.parametrize("commit_mode", ["strict", "batch"])
async def test_a_cut_lane_connection_consumes_no_attempt(
    database: Database, where: str, commit_mode: str
) -> None:
    app, attempts, cut_me, was_cut = cut_app(database, where)
    try:
        await app.enqueue_many(app.database, "cut", [{"n": n} for n in range(5)])
        stop = asyncio.Event()
        drainer = app.drainer(commit_mode=commit_mode, batch_size=5, poll_interval=0.1)
        worker = asyncio.create_task(cronlock.serve_worker(drainer, stop=stop))
        await asyncio.wait_for(cut_me.wait(), 30)
        lane = "query LIKE '%pg_sleep(60)%'" if where == "sql" else "state = 'idle in transaction'"
        lanes = f"application_name = 'cronlock' AND {lane}"
        cut = await eventually(lambda: terminate(database, lanes))
        assert len(cut) == 1
        was_cut.set()
        await eventually(lambda: _all_completed(database, 5), timeout=30)
        stop.set()
        result = await asyncio.wait_for(worker, 30)
    finally:
        await app.aclose()

    rows = await job_rows(database)
    assert [(r["status"], r["retry_count"], r["error_history"]) for r in rows] == [
        ("completed", 0, [])
    ] * 5
    assert attempts[0] == 2  # cut once, then run again
    assert result.status is cronlock.RunStatus.COMPLETED, result.error
    assert result.stats["failed"] == result.stats["retried"] == 0
    assert result.stats["rolled_back"] >= 1


async def _all_completed(database: Database, count: int) -> bool:
    rows = await job_rows(database)
    return len(rows) == count and all(r["status"] == "completed" for r in rows)
