"""Job handlers for tests: no-ops, flaky and failing ones, slow ones, a counter row, a log.

The counter handler increments one row and logs its job id in the job's transaction: if a
job's writes were ever applied twice, ``counter.n`` would exceed the number of jobs and
``job_log`` would hold a job id twice.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Integer, MetaData, Table, Text, func, insert, select, text, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import cronlock

scratch = MetaData()
counter = Table("counter", scratch, Column("id", Integer, primary_key=True), Column("n", Integer))
job_log = Table("job_log", scratch, Column("job", Text, nullable=False))
# How many ``gauged`` jobs of a gauge run at this moment, and the most that ever did.
gauge = Table(
    "gauge",
    scratch,
    Column("name", Text, primary_key=True),
    Column("running", Integer, nullable=False, server_default="0"),
    Column("peak", Integer, nullable=False, server_default="0"),
)
_gauge: dict[str, Any] = {}  # this process's connection to the gauge, and its lock


async def noop(session: AsyncSession, payload: Any) -> None:
    return None


async def echo(session: AsyncSession, payload: Any) -> Any:
    return {"echo": payload}


async def always_fail(session: AsyncSession, payload: Any) -> None:
    await session.execute(insert(job_log).values(job="always_fail"))  # rolled back each time
    raise ValueError("permanent error")


async def count(session: AsyncSession, payload: Any) -> None:
    """+1 on the counter row and a log line, both in the job's transaction."""
    await session.execute(update(counter).where(counter.c.id == 1).values(n=counter.c.n + 1))
    await session.execute(insert(job_log).values(job=str(payload["n"])))
    await _hold_or_delay(payload)


async def log(session: AsyncSession, payload: Any) -> None:
    """A log line in the job's transaction, and no shared row: jobs that run at once on many
    workers (a shared queue) do not wait for each other's row locks, as ``count``'s would."""
    await session.execute(insert(job_log).values(job=str(payload["n"])))
    await _hold_or_delay(payload)


async def gauged(session: AsyncSession, payload: Any) -> None:
    """Counts itself in ``gauge`` while it runs (``payload["ms"]`` milliseconds), on a
    connection of its own that commits at once: what every worker's jobs of one gauge do at
    the same moment is visible to all, and the peak is exact (one row, atomic updates)."""
    import asyncpg

    if "conn" not in _gauge:
        _gauge["conn"] = await asyncpg.connect(
            os.environ["CRONLOCK_DATABASE_URL"], server_settings={"application_name": "gauge"}
        )
        _gauge["lock"] = asyncio.Lock()
    conn, lock = _gauge["conn"], _gauge["lock"]
    name = payload["gauge"]
    async with lock:
        await conn.execute(
            "INSERT INTO gauge AS g (name, running, peak) VALUES ($1, 1, 1) ON CONFLICT (name) "
            "DO UPDATE SET running = g.running + 1, peak = greatest(g.peak, g.running + 1)",
            name,
        )
    await asyncio.sleep(payload["ms"] / 1000)
    async with lock:
        await conn.execute("UPDATE gauge SET running = running - 1 WHERE name = $1", name)
    await session.execute(insert(job_log).values(job=str(payload["n"])))


async def _hold_or_delay(payload: Any) -> None:
    hold = os.environ.get("HOLD_MARKER")
    if hold and payload["n"] == int(os.environ.get("HOLD_AT", "-1")):
        marker = Path(hold)
        if not marker.exists():  # the first worker to get here holds; a successor does not
            # Written whole, then renamed: a test polling for the file never reads it empty.
            partial = marker.with_name(f"{marker.name}.{os.getpid()}")
            partial.write_text(str(os.getpid()))
            os.replace(partial, marker)
            await asyncio.Event().wait()
    delay = float(os.environ.get("COUNT_DELAY", "0"))
    if delay:
        await asyncio.sleep(delay)


async def gated(session: AsyncSession, payload: Any) -> dict[str, Any]:
    """Tells the test it started (a marker file), then waits for the test's release file."""
    Path(os.environ["GATE_STARTED"]).write_text(str(payload["n"]))
    release = Path(os.environ["GATE_RELEASE"])
    for _ in range(6000):  # 60 s at most
        if release.exists():
            break
        await asyncio.sleep(0.01)
    await session.execute(insert(job_log).values(job=str(payload["n"])))
    return {"n": payload["n"]}


async def sleepy(session: AsyncSession, payload: Any) -> None:
    await session.execute(insert(job_log).values(job="sleepy"))
    await asyncio.sleep(30)


async def sql_sleepy(session: AsyncSession, payload: Any) -> None:
    await session.execute(insert(job_log).values(job="sql_sleepy"))
    await session.execute(text("SELECT pg_sleep(30)"))


async def bad_result(session: AsyncSession, payload: Any) -> Any:
    return {"not json": object()}


async def bad_sql(session: AsyncSession, payload: Any) -> None:
    await session.execute(insert(job_log).values(job="bad_sql"))
    await session.execute(text("SELECT * FROM no_such_table"))


async def commits_then_fails(session: AsyncSession, payload: Any) -> None:
    """Commits its session (its savepoint is released), then raises."""
    await session.execute(insert(job_log).values(job="commits_then_fails"))
    await session.commit()
    raise RuntimeError("failed after committing")


async def knows(session: AsyncSession, payload: Any) -> dict[str, Any]:
    """Returns what current_job() says, in the handler and in a task it started."""

    async def in_a_task() -> dict[str, Any]:
        return cronlock.current_job().to_dict()

    seen = cronlock.current_job().to_dict()
    assert await asyncio.create_task(in_a_task()) == seen
    if payload.get("fail_first") and cronlock.current_job().attempt == 1:
        raise ValueError("first attempt fails")
    return seen


async def gives_up(session: AsyncSession, payload: Any) -> cronlock.JobCancel:
    """Logs, then cancels its job: the log line commits with the cancellation."""
    await session.execute(insert(job_log).values(job="gives_up"))
    return cronlock.JobCancel(payload.get("reason", ""))


async def snoozy(session: AsyncSession, payload: Any) -> Any:
    """Logs each run; snoozes for ``delay`` seconds until it has run ``times`` times."""
    await session.execute(insert(job_log).values(job=f"snoozy:{payload['key']}"))
    ran = await session.scalar(
        select(func.count()).where(job_log.c.job == f"snoozy:{payload['key']}")
    )
    if (ran or 0) < payload["times"]:
        return cronlock.JobSnooze(payload.get("delay", 60))
    return {"runs": ran, "attempt": cronlock.current_job().attempt}


async def after(session: AsyncSession, payload: Any) -> None:
    """Logs ``after:N``, and ``early:N`` too if a job named in ``parents`` has not completed as
    this job's transaction sees it (a child that ran before its parents); then holds or
    delays as ``count`` does."""
    parents = payload.get("parents", [])
    if parents:
        left = await session.scalar(
            text(
                "SELECT count(*) FROM cronlock.jobs"
                " WHERE id = ANY(CAST(:ids AS uuid[])) AND status <> 'completed'"
            ),
            {"ids": parents},
        )
        if left:
            await session.execute(insert(job_log).values(job=f"early:{payload['n']}"))
    await session.execute(insert(job_log).values(job=f"after:{payload['n']}"))
    await _hold_or_delay(payload)


def plain(session: Session, payload: Any) -> dict[str, Any]:
    """A plain def handler: in the drainer's thread pool, on the job's transaction."""
    session.execute(insert(job_log).values(job="plain"))
    return {"attempt": cronlock.current_job().attempt}


def create_app(attempts: dict[str, int] | None = None) -> cronlock.App:
    """A new App with these handlers (each test builds its own). The flaky handler counts its
    attempts per payload key in ``attempts``, for the test that gave it to read."""
    tries = {} if attempts is None else attempts

    async def flaky(session: AsyncSession, payload: Any) -> dict[str, Any]:
        """Fails on its first two attempts, then succeeds (counted per payload key)."""
        key = str(payload["key"])
        tries[key] = tries.get(key, 0) + 1
        if tries[key] < 3:
            raise ValueError(f"temporary failure {tries[key]}")
        return {"ok": True, "attempts": tries[key]}

    app = cronlock.App()
    app.job("noop")(noop)
    app.job("echo")(echo)
    app.job("flaky", max_retries=5, backoff=cronlock.Backoff(jitter=0))(flaky)
    app.job("always_fail", max_retries=2, backoff=cronlock.Backoff(jitter=0))(always_fail)
    app.job("count")(count)
    app.job("after")(after)
    app.job("log")(log)
    app.job("gauged", concurrency_limit=2)(gauged)
    app.job("gated")(gated)
    app.job("sleepy", max_retries=0, timeout=0.2)(sleepy)
    app.job("sql_sleepy", max_retries=0, timeout=0.3)(sql_sleepy)
    app.job("bad_result")(bad_result)
    app.job("bad_sql", max_retries=0)(bad_sql)
    app.job("commits_then_fails", max_retries=0)(commits_then_fails)
    app.job("knows", max_retries=2, backoff=cronlock.Backoff(jitter=0))(knows)
    app.job("gives_up", max_retries=5)(gives_up)
    app.job("snoozy", max_retries=0)(snoozy)
    app.job("plain")(plain)
    return app


app = create_app()  # for `--app testapps.jobs` (and benchmarks/drain_noop.py)
