"""One run per slot (invariant 3): the slot is claimed durably, under the lock, with the work."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import Counter
from datetime import UTC, datetime, timedelta

from cli import invoke_async
from history import create_work_table, runs_of, work_slots
from testapps import sched

from cronlock import Database, RunStatus
from cronlock.outcome import RunTrigger
from cronlock.periodic import execute, resolve_slot
from cronlock.scheduler import Scheduler

SLOT = datetime(2026, 11, 29, 10, 15, tzinfo=UTC)


async def test_second_run_for_a_done_slot_is_skipped(database: Database) -> None:
    """A 1 ms task: the first run commits and releases the lock long before the second asks."""
    await create_work_table(database)
    task = sched.create_app().task("tick")

    first = await execute(database, task, now=SLOT + timedelta(seconds=0.3))
    second = await execute(database, task, now=SLOT + timedelta(seconds=1.3))

    assert first.status is RunStatus.COMPLETED
    assert second.status is RunStatus.SKIPPED
    assert second.skip_reason == "slot_done"
    assert first.slot == second.slot == SLOT
    assert await work_slots(database, "tick") == [SLOT]
    rows = await runs_of(database, "tick")
    assert [(r["status"], r["skip_reason"]) for r in rows] == [
        ("completed", None),
        ("skipped", "slot_done"),
    ]
    assert rows[0]["lateness_ms"] == 300.0
    assert rows[0]["trigger"] == "cron"


async def test_two_commands_one_after_the_other(database: Database, database_url: str) -> None:
    await create_work_table(database)

    first = await invoke_async(
        "--app", "testapps.sched", "run", "yearly", "--json", database_url=database_url
    )
    second = await invoke_async(
        "--app", "testapps.sched", "run", "yearly", "--json", database_url=database_url
    )

    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    one, two = json.loads(first.stdout), json.loads(second.stdout)
    assert one["status"] == "completed"
    assert (two["status"], two["skip_reason"]) == ("skipped", "slot_done")
    assert one["slot"] == two["slot"]
    assert len(await work_slots(database, "yearly")) == 1
    plain = await invoke_async(
        "--app", "testapps.sched", "run", "yearly", database_url=database_url
    )
    assert plain.stdout.startswith("yearly: skipped (slot_done: slot ")


async def test_early_and_late_invocations_map_to_their_slot() -> None:
    task = sched.create_app().task("hourly-skip")  # grace 60 s, early 5 s by default
    top = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    assert resolve_slot(task, top - timedelta(seconds=2)) == top  # a fast clock
    assert resolve_slot(task, top + timedelta(seconds=59)) == top  # a slow host
    assert resolve_slot(task, top + timedelta(seconds=61)) is None
    assert resolve_slot(task, top + timedelta(seconds=61), grace=timedelta(minutes=5)) == top
    assert resolve_slot(task, top - timedelta(seconds=6)) is None


async def test_outside_grace_nothing_runs_unless_manual(
    database: Database, database_url: str
) -> None:
    """`leap-day` fires on Feb 29 at midnight: now is outside its grace (barring that minute)."""
    await create_work_table(database)

    plain = await invoke_async(
        "--app", "testapps.sched", "run", "leap-day", database_url=database_url
    )
    manual = await invoke_async(
        "--app", "testapps.sched", "run", "leap-day", "--manual", "--json",
        database_url=database_url,
    )  # fmt: skip

    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.startswith("leap-day: skipped (no_slot: no slot within 60 s of ")
    assert "--manual" in plain.stdout
    assert manual.returncode == 0, manual.stderr
    result = json.loads(manual.stdout)
    assert (result["status"], result["trigger"], result["slot"]) == ("completed", "manual", None)
    rows = await runs_of(database, "leap-day")
    assert [(r["status"], r["skip_reason"], r["trigger"], r["slot"]) for r in rows] == [
        ("skipped", "no_slot", "cron", None),
        ("completed", None, "manual", None),
    ]
    assert await work_slots(database, "leap-day") == [None]
    status = await invoke_async("--app", "testapps.sched", "status", database_url=database_url)
    shown = status.stdout
    assert re.search(r" completed +manual +\d+ ms +1 ok, 0 failed\n", shown), shown
    assert "no_slot" not in shown  # it ran nothing: status leaves it out (issue 16, point 11)


async def test_manual_runs_claim_no_slot(database: Database) -> None:
    await create_work_table(database)
    task = sched.create_app().task("tick")
    manual = await execute(database, task, now=SLOT, manual=True)
    on_time = await execute(database, task, now=SLOT + timedelta(seconds=1))
    assert (manual.status, manual.slot, manual.trigger) == (
        RunStatus.COMPLETED,
        None,
        RunTrigger.MANUAL,
    )
    assert (on_time.status, on_time.slot) == (RunStatus.COMPLETED, SLOT)


async def test_a_failed_run_claims_its_slot_and_commits_nothing(database: Database) -> None:
    await create_work_table(database)
    task = sched.create_app().task("failing")

    failed = await execute(database, task, now=SLOT)
    again = await execute(database, task, now=SLOT + timedelta(seconds=1))

    assert failed.status is RunStatus.FAILED
    assert failed.error == "RuntimeError: after writing"
    assert (again.status, again.skip_reason) == (RunStatus.SKIPPED, "slot_done")
    assert await work_slots(database, "failing") == []
    rows = await runs_of(database, "failing")
    assert [(r["status"], r["slot"]) for r in rows] == [("failed", SLOT), ("skipped", SLOT)]


async def test_thousand_slots_two_schedulers_two_invokers_skewed(database: Database) -> None:
    """Every slot runs once; every other attempt is recorded skipped (lock_busy or slot_done).

    Two schedulers and two crontab-style invokers fire each of 1,000 consecutive minutes, each
    reading a clock off by up to ±2 s, concurrently, on connections of their own, in a random
    order; the next slot starts when all four attempts at this one are done.
    """
    await create_work_table(database)
    app = sched.create_app()
    task = app.task("tick")
    first = datetime(2026, 11, 29, 0, 0, tzinfo=UTC)
    slots = [first + timedelta(minutes=i) for i in range(1000)]
    randomness = random.Random(4)
    engines = [Database(database.url) for _ in range(4)]
    schedulers = [Scheduler(app, engines[i], tasks=["tick"]) for i in range(2)]

    def skew() -> timedelta:
        return timedelta(seconds=randomness.uniform(-2, 2))

    try:
        for slot in slots:
            attempts = [
                schedulers[0].wake(task, now=slot + skew()),
                schedulers[1].wake(task, now=slot + skew()),
                execute(engines[2], task, now=slot + skew()),
                execute(engines[3], task, now=slot + skew()),
            ]
            randomness.shuffle(attempts)
            await asyncio.gather(*attempts)
    finally:
        for engine in engines:
            await engine.dispose()

    assert await work_slots(database, "tick") == slots
    rows = await runs_of(database, "tick")
    per_slot = Counter(row["slot"] for row in rows)
    assert set(per_slot) == set(slots)
    assert set(per_slot.values()) == {4}
    done = Counter(row["slot"] for row in rows if row["status"] == "completed")
    assert set(done.values()) == {1} and len(done) == 1000
    skips = [row for row in rows if row["status"] != "completed"]
    assert len(skips) == 3000
    assert {row["status"] for row in skips} == {"skipped"}
    assert {row["skip_reason"] for row in skips} <= {"lock_busy", "slot_done"}
    assert {row["trigger"] for row in rows} == {"cron", "scheduler"}


async def test_a_run_whose_connection_dies_is_recorded_failed(database: Database) -> None:
    """The savepoint cannot be rolled back on a dead connection: the transaction is gone with
    its writes and lock, and the failure is recorded afresh."""
    await create_work_table(database)
    task = sched.create_app().task("connection-lost")

    failed = await execute(database, task, now=SLOT)

    assert failed.status is RunStatus.FAILED
    assert failed.error is not None
    assert await work_slots(database, "connection-lost") == []
    rows = await runs_of(database, "connection-lost")
    assert [(r["status"], r["slot"]) for r in rows] == [("failed", SLOT)]
