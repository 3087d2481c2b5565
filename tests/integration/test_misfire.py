"""A 3-hour downtime under each misfire policy: exactly the documented runs, every slot recorded.

The scheduler last ran at 09:00 and comes back at 12:20 (one scheduler: what is recorded is
exact, lateness included; two at once: whichever wins each lock, every slot is claimed once, as
documented). README's "Scheduling" table:

=========  ====================================  ==========================================
policy     hourly (10:00, 11:00, 12:00 passed;   */5 (09:05 … 12:15 passed; 12:20 is on
           12:20 is past 12:00's grace)          time and runs as usual)
=========  ====================================  ==========================================
skip       3 missed, nothing runs                39 missed, 12:20 runs
once       12:00 runs (catch_up), 2 missed       39 missed, 12:20 runs (it is the catch-up)
each       10:00, 11:00, 12:00 run (catch_up)    the last 10 (11:30 … 12:15) run, 29 missed,
                                                 then 12:20
=========  ====================================  ==========================================
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest
from cli import invoke_async
from history import create_work_table, runs_of, work_slots
from sqlalchemy import text
from testapps import sched
from waiting import eventually

from cronlock import Database
from cronlock.scheduler import BACKLOG_LIMIT, Scheduler

BEFORE = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
RESTART = datetime(2026, 11, 29, 12, 20, tzinfo=UTC)


def at(hour: int, minute: int) -> datetime:
    return datetime(2026, 11, 29, hour, minute, tzinfo=UTC)


def every_five(first: datetime, last: datetime) -> list[datetime]:
    count = int((last - first) / timedelta(minutes=5)) + 1
    return [first + timedelta(minutes=5 * i) for i in range(count)]


HOURLY_PASSED = [at(10, 0), at(11, 0), at(12, 0)]
FIVE_PASSED = every_five(at(9, 5), at(12, 15))

# policy -> (hourly: caught up, missed), (*/5: caught up, missed, on time)
DOCUMENTED = {
    "skip": ((([], HOURLY_PASSED)), ([], FIVE_PASSED)),
    "once": (([at(12, 0)], HOURLY_PASSED[:2]), ([], FIVE_PASSED)),
    "each": ((HOURLY_PASSED, []), (FIVE_PASSED[-10:], FIVE_PASSED[:-10])),
}


async def _down_for_three_hours(
    database: Database, names: list[str], *, schedulers: int = 1
) -> None:
    """A scheduler runs the 09:00 slots, then none runs until ``schedulers`` restart at 12:20,
    all at once, each waking every task in ``names`` (each process with an app of its own)."""
    app = sched.create_app()
    before = Scheduler(app, database, tasks=names)
    for name in names:
        await before.wake(app.task(name), now=BEFORE)
    engines = [Database(database.url) for _ in range(schedulers)]
    try:
        restarted = [Scheduler(sched.create_app(), engine, tasks=names) for engine in engines]
        await asyncio.gather(
            *(
                scheduler.wake(scheduler.app.task(name), now=RESTART)
                for scheduler in restarted
                for name in names
            )
        )
        # A later firing of each process, one after the other. Alone, a scheduler leaves
        # nothing to it. Two that started together may each have met the other's lock on
        # their first catch-up (one recording the missed slots, the other running the on-time
        # slot) and left the backlog to the other: a wake leaves a slot it found locked to its
        # next wake, which catches it up.
        for scheduler in restarted:
            for name in names:
                await scheduler.wake(scheduler.app.task(name), now=RESTART + timedelta(seconds=1))
    finally:
        for engine in engines:
            await engine.dispose()


def _claims(rows: list[dict[str, object]]) -> dict[object, list[tuple[object, object]]]:
    claims: dict[object, list[tuple[object, object]]] = {}
    for row in rows:
        if row["status"] != "skipped":
            claims.setdefault(row["slot"], []).append((row["status"], row["trigger"]))
    return claims


@pytest.mark.parametrize("policy", ["skip", "once", "each"])
async def test_three_hour_downtime(database: Database, policy: str) -> None:
    await create_work_table(database)
    hourly, five = f"hourly-{policy}", f"five-{policy}"
    await _down_for_three_hours(database, [hourly, five])
    (hourly_run, hourly_missed), (five_run, five_missed) = DOCUMENTED[policy]

    # One scheduler catches up oldest first, then runs the on-time slot.
    assert await work_slots(database, hourly) == [BEFORE, *hourly_run]
    claims = _claims(await runs_of(database, hourly))
    assert claims == {
        BEFORE: [("completed", "scheduler")],
        **{slot: [("completed", "catch_up")] for slot in hourly_run},
        **{slot: [("missed", "scheduler")] for slot in hourly_missed},
    }

    assert await work_slots(database, five) == [BEFORE, *five_run, RESTART]
    claims = _claims(await runs_of(database, five))
    assert claims == {
        BEFORE: [("completed", "scheduler")],
        **{slot: [("completed", "catch_up")] for slot in five_run},
        **{slot: [("missed", "scheduler")] for slot in five_missed},
        RESTART: [("completed", "scheduler")],
    }
    # Every slot since 09:00 has its history row.
    assert set(claims) == {BEFORE, *every_five(at(9, 5), RESTART)}


@pytest.mark.parametrize("policy", ["skip", "once", "each"])
async def test_two_schedulers_restarting_together(database: Database, policy: str) -> None:
    """Whichever of the two wins each lock, every slot is claimed once, as documented."""
    await create_work_table(database)
    hourly, five = f"hourly-{policy}", f"five-{policy}"
    await _down_for_three_hours(database, [hourly, five], schedulers=2)
    (hourly_run, hourly_missed), (five_run, five_missed) = DOCUMENTED[policy]

    # Sorted: two schedulers share the catch-up, so commits need not come in slot order; the
    # same length still means no slot ran twice. (Scheduled runs all have a slot: sorted()
    # would raise on a None.)
    assert sorted(cast(list[datetime], await work_slots(database, hourly))) == [
        BEFORE,
        *hourly_run,
    ]
    claims = _claims(await runs_of(database, hourly))
    assert claims == {
        BEFORE: [("completed", "scheduler")],
        **{slot: [("completed", "catch_up")] for slot in hourly_run},
        **{slot: [("missed", "scheduler")] for slot in hourly_missed},
    }

    assert sorted(cast(list[datetime], await work_slots(database, five))) == [
        BEFORE,
        *five_run,
        RESTART,
    ]
    claims = _claims(await runs_of(database, five))
    assert claims == {
        BEFORE: [("completed", "scheduler")],
        **{slot: [("completed", "catch_up")] for slot in five_run},
        **{slot: [("missed", "scheduler")] for slot in five_missed},
        RESTART: [("completed", "scheduler")],
    }
    assert set(claims) == {BEFORE, *every_five(at(9, 5), RESTART)}


async def test_lateness_is_recorded(database: Database) -> None:
    await create_work_table(database)
    await _down_for_three_hours(database, ["hourly-each"])
    rows = {
        r["slot"]: r for r in await runs_of(database, "hourly-each") if r["status"] != "skipped"
    }
    assert rows[at(10, 0)]["lateness_ms"] == (RESTART - at(10, 0)).total_seconds() * 1000
    assert rows[BEFORE]["lateness_ms"] == 0


async def test_a_slot_past_max_lateness_is_missed_not_run(database: Database) -> None:
    """`hourly-once-fresh` catches up once, but never more than 10 minutes late."""
    await create_work_table(database)
    await _down_for_three_hours(database, ["hourly-once-fresh"])
    assert await work_slots(database, "hourly-once-fresh") == [BEFORE]
    missed = [
        r["slot"] for r in await runs_of(database, "hourly-once-fresh") if r["status"] == "missed"
    ]
    assert missed == HOURLY_PASSED


async def test_status_shows_misses_lateness_and_last_success(
    database: Database, database_url: str
) -> None:
    await create_work_table(database)
    await _down_for_three_hours(database, ["hourly-skip", "five-each"])

    shown = await invoke_async(
        "--app", "testapps.sched", "status", "--json", database_url=database_url
    )
    assert shown.returncode == 0, shown.stderr
    report = {entry["task"]: entry for entry in json.loads(shown.stdout)["tasks"]}
    hourly = report["hourly-skip"]
    assert hourly["consecutive_misses"] == 3
    assert hourly["consecutive_failures"] == 0
    assert hourly["last_success"] is not None
    assert hourly["recent_lateness_ms"]["last"] == 0
    five = report["five-each"]
    assert five["consecutive_misses"] == 0  # 12:20 ran after the misses
    # The last 10 runs: 12:20 on time and the catch-ups 11:35 … 12:15.
    assert five["recent_lateness_ms"]["runs"] == 10
    assert five["recent_lateness_ms"]["max"] == (RESTART - at(11, 35)).total_seconds() * 1000
    text = await invoke_async("--app", "testapps.sched", "status", database_url=database_url)
    assert "0 failures and 3 missed slots in a row" in text.stdout


async def test_a_long_backlog_is_bounded_and_said(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A minutely task last seen 30 days ago: the latest 1,000 slots are recorded, not 43,200."""
    await create_work_table(database)
    app = sched.create_app()
    task = app.task("tick")
    long_ago = RESTART - timedelta(days=30)
    await Scheduler(app, database, tasks=["tick"]).wake(task, now=long_ago)

    with caplog.at_level("WARNING", logger="cronlock.scheduler"):
        await Scheduler(app, database, tasks=["tick"]).wake(task, now=RESTART)

    history = await runs_of(database, "tick")
    missed = [r["slot"] for r in history if r["status"] == "missed"]
    assert len(missed) == BACKLOG_LIMIT
    assert missed[-1] == RESTART - timedelta(minutes=1)
    assert missed[0] == RESTART - timedelta(minutes=BACKLOG_LIMIT)
    assert await work_slots(database, "tick") == [long_ago, RESTART]
    assert "more than 1000 slots passed since" in caplog.text


async def test_a_catch_up_that_met_the_lock_tries_again_soon(database: Database) -> None:
    """The daemon's catch-up found the task's lock held (here by another session; in life the
    on-time slot's run or a crontab `cronlock run`): it tries again shortly instead of at the
    next fire time, so the missed slots still run, as late as they really are."""
    await create_work_table(database)
    app = sched.create_app()
    task = app.task("hourly-each")
    await Scheduler(app, database, tasks=[task.name]).wake(task, now=BEFORE)

    holder = await database.engine.connect()
    try:
        await holder.execute(
            text("SELECT pg_advisory_lock(:ns, :key)"),
            {"ns": task.lock_namespace, "key": task.lock_key},
        )
        await holder.commit()
        daemon = Scheduler(
            app, database, tasks=[task.name], clock=lambda: RESTART, catch_up_retry=0.05
        )
        daemon.start()
        try:
            # The first catch-up met the lock and left its slots open for a retry.
            await eventually(lambda: _true(task.name in daemon._retrying))
            assert await work_slots(database, task.name) == [BEFORE]
            await holder.execute(
                text("SELECT pg_advisory_unlock(:ns, :key)"),
                {"ns": task.lock_namespace, "key": task.lock_key},
            )
            await holder.commit()

            async def caught_up() -> bool:
                return await work_slots(database, task.name) == [BEFORE, *HOURLY_PASSED]

            await eventually(caught_up)
        finally:
            await daemon.stop()
    finally:
        await holder.close()
    rows = {row["slot"]: row for row in await runs_of(database, task.name)}
    assert [rows[slot]["trigger"] for slot in HOURLY_PASSED] == ["catch_up"] * 3
    assert rows[at(10, 0)]["lateness_ms"] == (RESTART - at(10, 0)).total_seconds() * 1000


async def _true(value: bool) -> bool:
    return value
