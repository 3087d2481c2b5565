"""Plain ``def`` handlers (cronlock/queue/threads.py), against PostgreSQL, in every commit mode.

A ``def`` handler runs in the drainer's thread pool with a sync ``Session`` on the job's own
transaction: its writes commit with its job and roll back with its failure; its outcomes are
an ``async def`` handler's; while it blocks, the loop (another lane's job, the heartbeat) goes
on; the pool's size bounds how many run at once; and a thread that outruns its timeout or an
operator's cancel cannot write anything after it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import pytest
from cli import invoke
from jobsupport import create_job_tables, job_rows
from sqlalchemy import insert, select
from sqlalchemy.exc import PendingRollbackError, ResourceClosedError
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session
from testapps.jobs import job_log
from testdb import on_database
from waiting import eventually

import cronlock
from cronlock import App, Backoff, Database, JobCancel, JobSnooze
from cronlock.queue.drainer import Drainer
from cronlock.queue.threads import AttemptOver
from cronlock.sql.tables import workers

MODES = ["strict", "batch", "lease"]
HELD = 30.0  # the most a test's handler waits for its gate: a failing test still ends


def _log(session: Session, line: str) -> None:
    session.execute(insert(job_log).values(job=line))


def writes(session: Session, payload: Any) -> dict[str, Any]:
    _log(session, f"ok:{payload['n']}")
    job = cronlock.current_job()  # the attempt's context, in the handler's thread
    return {"attempt": job.attempt, "in_a_thread": threading.current_thread().name}


def writes_then_fails(session: Session, payload: Any) -> None:
    _log(session, "failed")
    raise ValueError("no good")


def cancels(session: Session, payload: Any) -> JobCancel:
    _log(session, "cancelled")
    return JobCancel("not wanted")


def snoozes(session: Session, payload: Any) -> JobSnooze:
    _log(session, "snoozed")
    return JobSnooze(3600)


async def logs(session: AsyncSession, payload: Any) -> None:
    await session.execute(insert(job_log).values(job=f"async:{payload['n']}"))


@pytest.fixture
async def app(database: Database) -> AsyncIterator[App]:
    """An app of these handlers on the test database, with the scratch tables."""
    await create_job_tables(database)
    app = App()
    app.use_database(str(database.url))
    app.job("writes")(writes)
    app.job("writes_then_fails", max_retries=0)(writes_then_fails)
    app.job("cancels")(cancels)
    app.job("snoozes")(snoozes)
    app.job("logs")(logs)
    yield app
    await app.aclose()


@pytest.fixture
def release(app: App) -> Iterator[threading.Event]:
    """The gate a test's blocked handler waits on, opened at the end whatever happened (after
    the app fixture, so before its teardown)."""
    gate = threading.Event()
    yield gate
    gate.set()


async def _logged(database: Database) -> list[str]:
    async with database.connect() as conn:
        return sorted(row[0] for row in await conn.execute(select(job_log.c.job)))


@asynccontextmanager
async def working(
    app: App, release: threading.Event | None = None, **options: Any
) -> AsyncIterator[Drainer]:
    """A drainer at work; on the way out (a failed assertion too) ``release`` is set first,
    so that a blocked handler ends and the drainer can stop."""
    drainer = app.drainer(poll_interval=0.05, heartbeat_interval=0.05, **options)
    task = asyncio.create_task(drainer.work())
    try:
        yield drainer
    finally:
        if release is not None:
            release.set()
        drainer.stop()
        await task


@pytest.mark.parametrize("commit_mode", MODES)
async def test_writes_commit_with_the_job_and_roll_back_with_its_failure(
    app: App, database: Database, commit_mode: str
) -> None:
    done = await app.enqueue("writes", {"n": 1})
    failed = await app.enqueue("writes_then_fails", {})
    cancelled = await app.enqueue("cancels", {})
    snoozed = await app.enqueue("snoozes", {})
    result = await app.drain(commit_mode=commit_mode)
    assert (result.stats["processed"], result.stats["failed"]) == (1, 1)
    rows = {row["id"]: row for row in await job_rows(database)}
    assert rows[done.id]["status"] == "completed"
    assert rows[done.id]["result"]["attempt"] == 1
    assert rows[done.id]["result"]["in_a_thread"].startswith("cronlock-handler")
    assert rows[failed.id]["status"] == "failed"
    assert rows[failed.id]["error_message"] == "ValueError: no good"
    assert rows[cancelled.id]["status"] == "cancelled"
    assert rows[cancelled.id]["error_message"] == "cancelled by its handler: not wanted"
    assert (rows[snoozed.id]["status"], rows[snoozed.id]["retry_count"]) != ("completed", 0)
    assert rows[snoozed.id]["completed_at"] is None and rows[snoozed.id]["retry_count"] == 0
    assert rows[snoozed.id]["error_history"][0]["outcome"] == "snoozed"
    # The outcomes' writes committed with them; the failure's rolled back.
    assert await _logged(database) == ["cancelled", "ok:1", "snoozed"]


@pytest.mark.parametrize("commit_mode", MODES)
async def test_a_blocked_def_handler_leaves_the_loop_free(
    app: App, database: Database, release: threading.Event, commit_mode: str
) -> None:
    started = threading.Event()

    def blocks(session: Session, payload: Any) -> None:
        _log(session, "blocked")
        started.set()
        assert release.wait(HELD)
        _log(session, "released")

    app.job("blocks")(blocks)
    blocked = await app.enqueue("blocks", {})
    async with working(
        app, release, commit_mode=commit_mode, batch_size=1, concurrency=2
    ) as drainer:
        await eventually(lambda: asyncio.sleep(0, started.is_set()))
        beat = await _heartbeat(database, drainer)
        # Another lane runs an async job to the end, and the drainer keeps beating,
        # while the def handler is still blocked in its thread.
        other = await app.enqueue("logs", {"n": 2})
        await eventually(lambda: _status(database, other.id, "completed"))
        await eventually(lambda: _beaten_since(database, drainer, beat))
        assert not await _status(database, blocked.id, "completed")
        release.set()
        await eventually(lambda: _status(database, blocked.id, "completed"))
    assert await _logged(database) == ["async:2", "blocked", "released"]


async def _status(database: Database, job_id: Any, status: str) -> bool:
    [row] = await job_rows(database, id=job_id)
    return bool(row["status"] == status)


async def _heartbeat(database: Database, drainer: Drainer) -> datetime:
    async def beat() -> datetime | None:
        async with database.connect() as conn:
            query = select(workers.c.heartbeat_at).where(workers.c.id == drainer.worker_id)
            return (await conn.execute(query)).scalar_one_or_none()

    at = await eventually(beat)
    assert isinstance(at, datetime)
    return at


async def _beaten_since(database: Database, drainer: Drainer, since: datetime) -> bool:
    return await _heartbeat(database, drainer) > since


@pytest.mark.parametrize("threads", [1, None])
async def test_the_pool_size_bounds_how_many_def_handlers_run_at_once(
    app: App, database: Database, release: threading.Event, threads: int | None
) -> None:
    lock = threading.Lock()
    running: list[int] = [0, 0]  # now, the most at once

    def holds(session: Session, payload: Any) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
        try:
            assert release.wait(HELD)
        finally:
            with lock:
                running[0] -= 1

    app.job("holds")(holds)
    for n in range(3):
        await app.enqueue("holds", {"n": n})
    async with working(app, release, concurrency=3, threads=threads) as drainer:
        # Every lane has its job in an attempt; the pool lets `threads` of them run.
        await eventually(lambda: asyncio.sleep(0, drainer.in_flight == 3))
        expected = threads or 3
        await eventually(lambda: asyncio.sleep(0, running[0] == expected))
        assert running[1] == expected
        release.set()
        await eventually(lambda: asyncio.sleep(0, drainer.stats.processed == 3))
    assert running == [0, expected]


@pytest.mark.parametrize("commit_mode", MODES)
async def test_a_def_handler_past_its_timeout_fails_and_its_thread_writes_nothing(
    app: App, database: Database, release: threading.Event, commit_mode: str
) -> None:
    started = threading.Event()
    afterwards: list[BaseException | None] = []

    def stuck(session: Session, payload: Any) -> None:
        _log(session, "stuck")
        started.set()
        assert release.wait(HELD)  # a thread cannot be stopped: it ends when it ends
        try:
            _log(session, "too late")
            session.commit()
        except Exception as exc:
            afterwards.append(exc)
        else:
            afterwards.append(None)

    app.job("stuck", max_retries=0, timeout=0.3, backoff=Backoff(jitter=0))(stuck)
    job = await app.enqueue("stuck", {})
    other = await app.enqueue("logs", {"n": 1})
    began = time.monotonic()
    result = await app.drain(commit_mode=commit_mode)
    # The attempt ended at its deadline, its thread still blocked: the lane went on.
    assert started.is_set() and not afterwards and time.monotonic() - began < HELD / 2
    assert (result.stats["failed"], result.stats["processed"]) == (1, 1)
    [row] = await job_rows(database, id=job.id)
    assert row["status"] == "failed"
    assert row["error_message"] == (
        "TimeoutError: the handler ran longer than its timeout of 0.3 s"
    )
    assert await _status(database, other.id, "completed")
    release.set()
    await eventually(lambda: asyncio.sleep(0, bool(afterwards)))
    [refused] = afterwards
    assert _refused(refused)
    assert await _logged(database) == ["async:1"]


@pytest.mark.parametrize("commit_mode", MODES)
async def test_an_operators_cancel_stops_a_def_handler_that_looks(
    app: App, database: Database, commit_mode: str
) -> None:
    started = threading.Event()
    seen: list[bool] = []
    refused: list[Exception] = []

    def polite(session: Session, payload: Any) -> None:
        _log(session, "polite")
        started.set()
        deadline = time.monotonic() + HELD
        while not cronlock.current_job().cancel_requested and time.monotonic() < deadline:
            time.sleep(0.01)  # the handler's own blocking work, between looks
        try:
            _log(session, "after the cancel")
        except Exception as exc:
            refused.append(exc)
        seen.append(cronlock.current_job().cancel_requested)

    app.job("polite")(polite)
    job = await app.enqueue("polite", {})
    async with working(app, commit_mode=commit_mode) as drainer:
        await eventually(lambda: asyncio.sleep(0, started.is_set()))
        change = await app.cancel_job(job.id)
        assert change.status == cronlock.JobStatus.CANCELLED
        await eventually(lambda: asyncio.sleep(0, seen == [True]))
        assert len(refused) == 1 and _refused(refused[0])
        assert drainer.stats.failed == 0
    [row] = await job_rows(database, id=job.id)
    assert (row["status"], row["retry_count"]) == ("cancelled", 0)
    # The lane drops its connection (its thread still holds the session), so the cancel,
    # waiting on the row, may find the job waiting again and cancel it outright before
    # the lane records the cancelled attempt: cancelled either way, run once, no writes.
    assert row["error_message"] in (None, _STOPPED)
    assert await _logged(database) == []


def _refused(exc: BaseException | None) -> bool:
    """A statement of a thread that outran its attempt: its transaction is gone, so the bridge
    refuses it, or SQLAlchemy does (the lane invalidated, then closed, the connection it threw
    away); either way nothing it does lands."""
    return isinstance(exc, AttemptOver | PendingRollbackError | ResourceClosedError)


_STOPPED = "cancelled by an operator while running: its handler was stopped"


def test_registration_tells_async_and_plain_handlers_apart() -> None:
    app = App()
    app.job("plain")(writes)
    app.job("async")(logs)

    class Callable:
        async def __call__(self, session: AsyncSession, payload: Any) -> None:
            return None

    app.job("object")(Callable())
    assert [app.handlers[name].threaded for name in ("plain", "async", "object")] == [
        True,
        False,
        False,
    ]
    with pytest.raises(cronlock.ConfigurationError, match="must be callable"):
        app.job("nothing")(42)  # type: ignore[type-var]


@pytest.mark.parametrize("commit_every", [None, 2])
async def test_a_plain_def_task_body_runs_its_items_in_savepoints(
    app: App, database: Database, commit_every: int | None
) -> None:

    @app.periodic("plain", cron="* * * * *", commit_every=commit_every)
    def body(run: cronlock.Run) -> None:
        _log(run.sync_session, f"body in {threading.current_thread().name}")
        for n in range(4):
            with run.item(n) as session:
                _log(session, f"item:{n}")
                if n == 2:
                    raise ValueError("item 2 is bad")

    @app.periodic("raises", cron="* * * * *")
    def raises(run: cronlock.Run) -> None:
        _log(run.sync_session, "raised")
        raise RuntimeError("the body gave up")

    ran = await app.run("plain", manual=True)
    assert (ran.status.value, ran.items_ok, ran.items_failed) == ("partial", 3, 1)
    assert [f.message for f in ran.failures] == ["item 2 is bad"]
    failed = await app.run("raises", manual=True)
    assert failed.status.value == "failed" and failed.error == "RuntimeError: the body gave up"
    # The item that failed rolled back to its savepoint; the body that raised, entirely.
    logged = await _logged(database)
    assert logged == ["body in cronlock-handler_0", "item:0", "item:1", "item:3"]


async def test_a_blocked_def_task_body_leaves_the_loop_free(
    app: App, database: Database, release: threading.Event
) -> None:
    started = threading.Event()

    @app.periodic("blocks", cron="* * * * *")
    def body(run: cronlock.Run) -> None:
        with run.item("one") as session:
            _log(session, "blocked")
            started.set()
            assert release.wait(HELD)

    running = asyncio.create_task(app.run("blocks", manual=True))
    await eventually(lambda: asyncio.sleep(0, started.is_set()))
    # The loop serves others while the body blocks in its thread.
    job = await app.enqueue("logs", {"n": 1})
    assert await _status(database, job.id, "pending") and not running.done()
    release.set()
    assert (await running).status.value == "completed"
    assert await _logged(database) == ["blocked"]


def test_the_command_line_drains_def_handlers_with_its_threads_option(database_url: str) -> None:
    on_database(database_url, create_job_tables)
    app = ("--app", "testapps.jobs")
    assert invoke(*app, "enqueue", "plain", "{}", database_url=database_url).returncode == 0
    done = invoke(*app, "drain", "--threads", "1", "--json", database_url=database_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["processed"] == 1
    shown = invoke(*app, "jobs", "list", "--json", database_url=database_url)
    [row] = json.loads(shown.stdout)["jobs"]
    assert (row["job_type"], row["status"]) == ("plain", "completed")
    refused = invoke(*app, "drain", "--threads", "0", database_url=database_url)
    assert refused.returncode == 2 and "--threads" in refused.stderr
