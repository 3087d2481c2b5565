"""Retention: the built-in prune deletes what its App no longer keeps, in bounded batches, one
prune at a time; it spares a task's latest claimed slot and latest success."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from jobsupport import job_rows
from sqlalchemy import insert, select

from cronlock import App, ConfigurationError, Database, InvalidCron, Retention, RunStatus
from cronlock.locks import lock_key, namespace_key
from cronlock.retention import prune
from cronlock.scheduler import Scheduler
from cronlock.sql.tables import jobs, runs, workers
from cronlock.triggers import BuiltinTrigger

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def ago(**delta: float) -> datetime:
    return NOW - timedelta(**delta)


async def _jobs(database: Database, *rows: tuple[str, datetime | None]) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(
            insert(jobs),
            [
                {"job_type": "noop", "payload": {}, "status": status, "completed_at": at}
                for status, at in rows
            ],
        )


async def _runs(database: Database, *rows: dict[str, Any]) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(insert(runs), list(rows))


async def test_prune_keeps_what_retention_keeps(database: Database) -> None:
    await _jobs(
        database,
        ("completed", ago(days=8)),
        ("completed", ago(days=6)),
        ("failed", ago(days=31)),
        ("failed", ago(days=8)),
        ("cancelled", ago(days=31)),
        ("pending", None),
        ("retrying", None),
    )
    async with database.engine.begin() as conn:
        await conn.execute(insert(workers).values(id=_uuid(1), queue="q", state="active"))
        await conn.execute(
            workers.update().values(heartbeat_at=datetime.now(UTC) - timedelta(hours=2))
        )
        await conn.execute(insert(workers).values(id=_uuid(2), queue="q", state="active"))
    dry = await prune(database, Retention(), dry_run=True, now=NOW)
    assert (dry.completed_jobs, dry.failed_jobs, dry.cancelled_jobs, dry.workers) == (1, 1, 1, 1)
    assert len(await job_rows(database)) == 7
    done = await prune(database, Retention(), now=NOW)
    assert done.status is RunStatus.COMPLETED and not done.dry_run
    assert (done.completed_jobs, done.failed_jobs, done.cancelled_jobs, done.workers) == (
        1,
        1,
        1,
        1,
    )
    left = sorted(
        (r["status"], r["completed_at"] and r["completed_at"] >= ago(days=10))
        for r in await job_rows(database)
    )
    assert left == [
        ("completed", True),
        ("failed", True),
        ("pending", None),
        ("retrying", None),
    ]
    async with database.connect() as conn:
        assert [r[0] for r in await conn.execute(select(workers.c.id))] == [_uuid(2)]


def _uuid(n: int) -> Any:
    import uuid

    return uuid.UUID(int=n)


async def test_prune_walks_in_batches_past_rows_it_must_skip(database: Database) -> None:
    await _jobs(database, *[("completed", ago(days=9, seconds=n)) for n in range(35)])
    done = await prune(database, Retention(batch_size=10), now=NOW)
    assert done.completed_jobs == 35
    assert done.batches >= 4 + 3  # 4 of completed, then failed, cancelled, runs at least
    assert await job_rows(database) == []


async def test_runs_prune_spares_the_latest_slot_and_success(database: Database) -> None:
    def run(task: str, status: str, days: float, slot: bool = True) -> dict[str, Any]:
        at = ago(days=days)
        return {
            "task": task,
            "status": status,
            "started_at": at,
            "finished_at": at,
            "slot": at if slot else None,
        }

    await _runs(
        database,
        run("a", "completed", 60),
        run("a", "completed", 50),  # a's latest success: kept
        run("a", "failed", 40),  # a's latest claimed slot: kept
        run("a", "skipped", 45, slot=False),
        run("b", "completed", 90),
        run("b", "completed", 1),  # recent: kept
        run("c", "missed", 70),  # c's only row, its latest claimed slot: kept
    )
    dry = await prune(database, Retention(), dry_run=True, now=NOW)
    assert dry.runs == 3
    done = await prune(database, Retention(), now=NOW)
    assert done.runs == 3
    async with database.connect() as conn:
        kept = sorted(
            (row.task, row.status, round((NOW - row.started_at).days))
            for row in await conn.execute(select(runs))
        )
    assert kept == [
        ("a", "completed", 50),
        ("a", "failed", 40),
        ("b", "completed", 1),
        ("c", "missed", 70),
    ]


async def test_one_prune_at_a_time(database: Database) -> None:
    await _jobs(database, ("completed", ago(days=8)))
    holder = await asyncpg.connect(str(database.url).replace("+asyncpg", ""))
    try:
        async with holder.transaction():
            await holder.fetchval(
                "SELECT pg_advisory_xact_lock($1, $2)", namespace_key("cronlock"), lock_key("prune")
            )
            skipped = await prune(database, Retention(), now=NOW)
            assert skipped.status is RunStatus.SKIPPED and skipped.removed == 0
    finally:
        await holder.close()
    assert len(await job_rows(database)) == 1
    assert (await prune(database, Retention(), now=NOW)).completed_jobs == 1


async def test_retention_per_app_and_off(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    await _jobs(database, ("completed", ago(days=2)), ("completed", ago(days=4)))
    app = App(retention=Retention(completed=timedelta(days=3)))
    app.use_database(str(database.url))
    try:
        with caplog.at_level(logging.INFO, logger="cronlock.retention"):
            assert (await app.prune(now=NOW)).completed_jobs == 1
        assert any(r.__dict__.get("action") == "pruned" for r in caplog.records)
    finally:
        await app.aclose()
    off = App(retention=False)
    assert off.retention is None
    with pytest.raises(ConfigurationError, match="retention is off"):
        await off.prune()


def test_retention_is_checked_when_declared() -> None:
    assert Retention(completed=3600).completed == timedelta(hours=1)  # type: ignore[arg-type]
    for bad in ({"completed": 0}, {"failed": timedelta(days=-1)}, {"batch_size": 0}):
        with pytest.raises(ConfigurationError):
            Retention(**bad)
    with pytest.raises(InvalidCron):
        Retention(cron="every hour")


def test_the_scheduler_fires_prune_on_its_schedule() -> None:
    app = App()
    trigger = BuiltinTrigger(Retention(cron="17 * * * *").schedule)
    assert trigger.get_next_fire_time(None, NOW) == NOW.replace(minute=17)
    assert trigger.get_next_fire_time(NOW.replace(minute=17), NOW) == NOW.replace(
        hour=13, minute=17
    )
    scheduler = Scheduler(app, database=object())  # type: ignore[arg-type]
    assert scheduler.retention is app.retention
    assert Scheduler(App(retention=False), database=object()).retention is None  # type: ignore[arg-type]
