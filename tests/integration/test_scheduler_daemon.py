"""`cronlock scheduler` as a process: APScheduler wiring, jitter, and a graceful SIGTERM."""

from __future__ import annotations

import asyncio
import re
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from cli import invoke, start_cli
from history import create_work_table, runs_of, work_slots
from testapps import sched
from waiting import eventually, wait_for

from cronlock import Database
from cronlock.outage import Reconnect
from cronlock.periodic import resolve_slot
from cronlock.scheduler import Scheduler
from cronlock.triggers import ScheduleTrigger, jitter_for


@pytest.fixture
async def gate(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection holding the advisory lock the `held` task waits for."""
    conn = await asyncpg.connect(database_url)
    await conn.execute("SELECT pg_advisory_lock($1, $2)", *sched.GATE)
    try:
        yield conn
    finally:
        await conn.close()


def _start_scheduler(database_url: str, marker: Path, *extra: str) -> object:
    return start_cli(
        "--app", "testapps.sched", "scheduler", "--task", "held", *extra,
        database_url=database_url,
        HELD_MARKER=str(marker),
    )  # fmt: skip


async def test_sigterm_lets_the_run_in_flight_commit(
    database: Database, database_url: str, gate: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_work_table(database)
    marker = tmp_path / "held"
    process = _start_scheduler(database_url, marker)
    try:
        wait_for(marker.exists, timeout=30)  # the run is inside its body, waiting at the gate
        process.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
        await gate.execute("SELECT pg_advisory_unlock($1, $2)", *sched.GATE)
        _, stderr = await asyncio.to_thread(process.communicate, timeout=30)  # type: ignore[attr-defined]
    finally:
        if process.poll() is None:  # type: ignore[attr-defined]
            process.kill()  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    assert len(await work_slots(database, "held")) == 5  # all of it
    statuses = [r["status"] for r in await runs_of(database, "held") if r["status"] != "skipped"]
    assert statuses == ["completed"]


async def test_sigterm_past_the_grace_rolls_the_run_back_whole(
    database: Database, database_url: str, gate: asyncpg.Connection, tmp_path: Path
) -> None:
    await create_work_table(database)
    marker = tmp_path / "held"
    process = _start_scheduler(database_url, marker, "--shutdown-grace", "0.2")
    try:
        wait_for(marker.exists, timeout=30)
        process.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
        _, stderr = await asyncio.to_thread(process.communicate, timeout=30)  # type: ignore[attr-defined]
    finally:
        if process.poll() is None:  # type: ignore[attr-defined]
            process.kill()  # type: ignore[attr-defined]
    assert process.returncode == 0, stderr  # type: ignore[attr-defined]
    assert "rolled back" in stderr
    assert await work_slots(database, "held") == []  # none of it
    assert [r for r in await runs_of(database, "held") if r["status"] != "skipped"] == []

    async def lock_is_free() -> bool:
        # The run's transaction is gone with its lock: the slot is still free to run.
        task = sched.create_app().task("held")
        async with database.connect() as conn:
            from cronlock import sql

            holders = await conn.execute(
                sql.LOCK_HOLDERS,
                {
                    "namespace_oid": task.lock_namespace & 0xFFFFFFFF,
                    "key_oid": task.lock_key & 0xFFFFFFFF,
                },
            )
            return not holders.scalars().all()

    await eventually(lock_is_free)


async def test_daemon_fires_the_current_slot_at_start_and_schedules_the_next(
    database: Database,
) -> None:
    await create_work_table(database)
    moment = datetime.now(UTC)
    app = sched.create_app()
    scheduler = Scheduler(app, database, tasks=["tick"], clock=lambda: moment)
    stop = asyncio.Event()
    serving = asyncio.create_task(scheduler.serve(stop))
    try:
        slot = resolve_slot(app.task("tick"), moment)
        await eventually(lambda: _has_work(database, slot))
        job = scheduler._apscheduler.get_job("tick")  # type: ignore[union-attr]
        upcoming = app.task("tick").schedule.fire_times(moment)
        # The next minute, or the one after if a minute turned while the test ran.
        assert job.next_run_time in (next(upcoming), next(upcoming))
    finally:
        stop.set()
        await serving


async def _has_work(database: Database, slot: datetime | None) -> bool:
    return await work_slots(database, "tick") == [slot]


async def test_with_drainer_drains_the_queue_beside_the_tasks(
    database: Database, database_url: str
) -> None:
    import signal

    from cli import start_cli
    from jobsupport import job_app, job_rows
    from waiting import eventually

    async with job_app(database) as app, database.session() as session:
        await app.enqueue_tx(session, "echo", {"n": 1})
        await session.commit()
    daemon = start_cli(
        "--app", "testapps.jobs", "scheduler", "--with-drainer", database_url=database_url
    )
    try:

        async def done() -> bool:
            return [r["status"] for r in await job_rows(database)] == ["completed"]

        await eventually(done, timeout=30)
        daemon.send_signal(signal.SIGTERM)
        _, stderr = daemon.communicate(timeout=30)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.communicate()
    assert daemon.returncode == 0, stderr


async def test_jitter_delays_firing_but_never_changes_the_slot(database: Database) -> None:
    await create_work_table(database)
    app = sched.create_app()
    task = app.task("jittery")  # */5, jitter up to 120 s
    trigger, other_host = ScheduleTrigger(task), ScheduleTrigger(task)
    start = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    slots = list(_take(task.schedule.fire_times(start - timedelta(microseconds=1)), 24))
    scheduler = Scheduler(app, database, tasks=["jittery"])
    previous = None
    delays = []
    for slot in slots:
        fire = trigger.get_next_fire_time(previous, start if previous is None else previous)
        assert fire is not None
        assert fire == other_host.get_next_fire_time(previous, fire - timedelta(seconds=1))
        assert slot <= fire <= slot + timedelta(seconds=120)
        assert fire - slot == jitter_for(task, slot)
        delays.append(fire - slot)
        await scheduler.wake(task, now=fire)
        previous = fire
    assert len(set(delays)) > 20  # spread, not one constant offset
    assert await work_slots(database, "jittery") == slots


def _take(iterator: object, count: int) -> list[datetime]:
    out = []
    for item in iterator:  # type: ignore[attr-defined]
        out.append(item)
        if len(out) == count:
            break
    return out


def test_list_shows_next_fire_times_in_the_zone_and_utc(database_url: str) -> None:
    import json

    shown = invoke(
        "--app", "testapps.sched", "list", "--json", "--count", "2", database_url=database_url
    )
    assert shown.returncode == 0, shown.stderr
    tasks = {t["name"]: t for t in json.loads(shown.stdout)["tasks"]}
    madrid = tasks["madrid-0230"]
    assert madrid["timezone"] == "Europe/Madrid"
    assert len(madrid["next_fire_times"]) == 2
    for fire in madrid["next_fire_times"]:
        local, utc = datetime.fromisoformat(fire["local"]), datetime.fromisoformat(fire["utc"])
        assert local == utc and local.strftime("%H:%M") in ("02:30", "03:30")
        assert utc.utcoffset() == timedelta(0)
    text = invoke("--app", "testapps.sched", "list", database_url=database_url)
    # Its zone's time, then UTC's beside it (a UTC task has only one).
    assert "Europe/Madrid" in text.stdout
    assert re.search(r" [0-9:-]+ [0-9]{2}:[0-9]{2} \+0[12]00 = [0-9]{2}:[0-9]{2}Z ", text.stdout)


def test_unknown_task_is_one_line_exit_2(database_url: str) -> None:
    result = invoke(
        "--app", "testapps.sched", "scheduler", "--task", "nope", database_url=database_url
    )
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "unknown task 'nope'" in line


async def test_a_wake_that_fails_is_logged_and_the_daemon_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With no policy to ride outages out, each wake fails and says so; the scheduler keeps
    serving."""
    unreachable = Database("postgresql://nobody@127.0.0.1:1/nowhere")
    scheduler = Scheduler(
        sched.create_app(), unreachable, tasks=["tick", "yearly"], shutdown_grace=5, reconnect=None
    )
    stop = asyncio.Event()
    with caplog.at_level("ERROR", logger="cronlock.scheduler"):
        serving = asyncio.create_task(scheduler.serve(stop))

        async def both_failed() -> bool:
            return "tick: wake failed" in caplog.text and "yearly: wake failed" in caplog.text

        try:
            await eventually(both_failed, timeout=30)
            assert not serving.done()
        finally:
            stop.set()
            await serving
    await unreachable.dispose()


async def test_wakes_that_find_no_database_wait_for_it_together(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The database is gone: the wakes leave their slots for later and wait for it, one wait
    (one line per try) for every task; the scheduler keeps serving until stopped."""
    unreachable = Database("postgresql://nobody@127.0.0.1:1/nowhere")
    scheduler = Scheduler(
        sched.create_app(),
        unreachable,
        tasks=["tick", "yearly"],
        shutdown_grace=5,
        reconnect=Reconnect(first_delay=0.01, max_delay=0.02),
    )
    stop = asyncio.Event()
    with caplog.at_level("INFO"):
        serving = asyncio.create_task(scheduler.serve(stop))

        async def tried(times: int) -> bool:
            return caplog.text.count("the database is still unreachable") >= times

        try:
            await eventually(lambda: tried(5), timeout=30)
            assert not serving.done()
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
    await unreachable.dispose()
    assert caplog.text.count("scheduler lost the database") == 1
    assert "wake failed" not in caplog.text
    assert scheduler.gave_up is None


async def test_the_scheduler_gives_up_after_its_policys_time() -> None:
    unreachable = Database("postgresql://nobody@127.0.0.1:1/nowhere")
    scheduler = Scheduler(
        sched.create_app(),
        unreachable,
        tasks=["tick"],
        reconnect=Reconnect(first_delay=0.01, max_delay=0.02, give_up_after=0.1),
    )
    await asyncio.wait_for(scheduler.serve(asyncio.Event()), 30)  # returns on its own
    await unreachable.dispose()
    assert scheduler.gave_up is not None
    assert scheduler.gave_up.startswith("scheduler: gave up after 0 s without the database")
