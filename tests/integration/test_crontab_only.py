"""A crontab-only deployment (issue 12, part 4): no scheduler, and still no silent gap.

Every ``cronlock run`` of a slot records ``missed`` the slots since the task's latest claimed
slot that have no row, under the task's lock, whatever its misfire policy (catching up is the
scheduler's). ``status`` and ``/metrics`` show a task *overdue* when the first slot after its
latest claimed one is past its grace with no outcome, computed from the schedule when they
read, so it shows while nothing runs at all. Clocks are injected (``App.run(now=…)``,
``collect(now=…)``, ``scrape(now=…)``), and the story is told once more through the real
command line, at the real time.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from cli import invoke_async
from history import runs_of
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, insert, select
from testapps import health

from cronlock import App, Database, RunStatus
from cronlock.http import create_api
from cronlock.observe.prometheus import render_metrics, scrape
from cronlock.observe.status import collect
from cronlock.periodic.backlog import BACKLOG_LIMIT
from cronlock.scheduler import Scheduler

SLOT = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


def minute(n: int, seconds: float = 0.5) -> datetime:
    """``n`` minutes after SLOT, ``seconds`` into that minute."""
    return SLOT + timedelta(minutes=n, seconds=seconds)


@pytest.fixture
async def app(database: Database) -> AsyncIterator[App]:
    async with database.engine.begin() as conn:
        await conn.run_sync(health.scratch.create_all)
    app = health.create_app()
    app.use_database(str(database.url))
    try:
        yield app
    finally:
        await app.aclose()


async def switch_on(database: Database, name: str) -> None:
    async with database.session() as session:
        await session.execute(insert(health.switch).values(name=name))
        await session.commit()


async def work_of(database: Database, task: str) -> list[datetime | None]:
    """The slots of ``task``'s committed items, in commit order."""
    async with database.connect() as conn:
        rows = await conn.execute(
            select(health.done.c.slot).where(health.done.c.task == task).order_by(health.done.c.id)
        )
        return list(rows.scalars())


async def overdue_at(app: App, task: str, now: datetime) -> dict[str, object] | None:
    """``status``'s overdue of ``task`` at ``now``."""
    report = await collect(app.tasks, app.database, now=now)
    [entry] = [t for t in report["tasks"] if t["task"] == task]
    result: dict[str, object] | None = entry["overdue"]
    return result


async def overdue_metric(app: App, now: datetime) -> dict[str, float]:
    text = render_metrics(await scrape(app.database, app.tasks.values(), now=now)).decode()
    return {
        sample.labels["task"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "cronlock_task_overdue_seconds"
    }


async def test_overdue_while_nothing_runs_and_it_keeps_growing(app: App) -> None:
    """The host ran 10:00 and 10:01, then died: 10:02 was due by 10:03:00 (grace 60 s)."""
    for n in (0, 1):
        assert (await app.run("minutely", now=minute(n))).status is RunStatus.COMPLETED

    assert await overdue_at(app, "minutely", minute(3, 0)) is None  # 10:03:00: just due
    assert await overdue_at(app, "minutely", minute(3, 20)) == {
        "slot": minute(2, 0).isoformat(),
        "due_by": minute(3, 0).isoformat(),
        "seconds": 20.0,
    }
    # An hour later it counts from the same deadline, not from the latest slot's.
    late = await overdue_at(app, "minutely", minute(63, 0))
    assert late is not None and late["seconds"] == 3600.0
    metric = await overdue_metric(app, minute(63, 0))
    assert metric["minutely"] == 3600.0
    # Every registered task has the gauge; one that never had a row is not overdue (nothing
    # says since when it should have run).
    assert set(metric) == set(app.tasks)
    assert metric["monthly"] == 0.0 and await overdue_at(app, "monthly", minute(63)) is None


async def test_a_task_with_only_skips_is_overdue_from_its_first_row(app: App) -> None:
    """A crontab line whose every invocation lands outside its slots leaves only no_slot skips:
    the task exists since its first row, and owes the first slot after it."""
    monthly = app.task("monthly")  # 0 0 1 * *: mid-month nothing is within grace
    skipped = await app.run("monthly", now=datetime(2026, 11, 15, 12, 0, tzinfo=UTC))
    assert (skipped.status, skipped.skip_reason) == (RunStatus.SKIPPED, "no_slot")

    december = datetime(2026, 12, 1, tzinfo=UTC)
    assert await overdue_at(app, "monthly", december + timedelta(seconds=59)) is None
    late = await overdue_at(app, "monthly", december + timedelta(minutes=5))
    assert late == {
        "slot": december.isoformat(),
        "due_by": (december + monthly.policy.grace).isoformat(),
        "seconds": 240.0,
    }


async def test_a_missed_slot_is_an_outcome_not_overdue(app: App) -> None:
    """A scheduler that woke after 11:00's grace recorded it missed: someone saw it pass, and
    the task owes 12:00 next."""
    hourly = app.task("hourly")
    await app.run("hourly", now=minute(0))
    await Scheduler(app, app.database, tasks=["hourly"]).wake(hourly, now=minute(65))
    history = [(r["slot"], r["status"]) for r in await runs_of(app.database, "hourly")]
    assert history == [(SLOT, "completed"), (SLOT + timedelta(hours=1), "missed")]

    assert await overdue_at(app, "hourly", minute(90)) is None
    assert await overdue_at(app, "hourly", minute(121, 30)) == {
        "slot": (SLOT + timedelta(hours=2)).isoformat(),
        "due_by": minute(121, 0).isoformat(),
        "seconds": 30.0,
    }


async def test_a_workers_metrics_endpoint_has_the_gauge_too(app: App) -> None:
    """``cronlock worker --metrics-port`` serves the app's tasks' overdue gauge as well."""
    from cronlock.observe.prometheus import serve_metrics

    server = await serve_metrics(app.database, "127.0.0.1", 0, app.tasks.values())
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            answer = await http.get("/metrics")
    finally:
        server.close()
        await server.wait_closed()
    assert answer.status_code == 200
    for task in app.tasks:  # none has a row: none is overdue
        assert f'cronlock_task_overdue_seconds{{task="{task}"}} 0.0' in answer.text


# -- cronlock run records the slots nobody fired ----------------------------------------------


async def test_one_skipped_minute_is_missed_and_overdue_until_the_next_run(app: App) -> None:
    """The issue's story: 10:02 never ran. Overdue from 10:03:00 while nothing runs; the run
    at 10:03 records 10:02 missed, and the task is on schedule again."""
    for n in (0, 1):
        await app.run("minutely", now=minute(n))
    late = await overdue_at(app, "minutely", minute(3, 20))
    assert late is not None and late["slot"] == minute(2, 0).isoformat()
    assert (await overdue_metric(app, minute(3, 20)))["minutely"] == 20.0

    # cron fires 10:03 late, on a host just back (within its 60 s grace).
    result = await app.run("minutely", now=minute(3, 30))

    assert (result.status, result.slot) == (RunStatus.COMPLETED, minute(3, 0))
    history = await runs_of(app.database, "minutely")
    assert [(r["slot"], r["status"], r["trigger"]) for r in history] == [
        (minute(0, 0), "completed", "cron"),
        (minute(1, 0), "completed", "cron"),
        (minute(2, 0), "missed", "cron"),
        (minute(3, 0), "completed", "cron"),
    ]
    missed = history[2]
    assert missed["lateness_ms"] == 90_000.0  # recorded at 10:03:30
    assert missed["started_at"] == missed["finished_at"] == minute(3, 30)
    assert await work_of(app.database, "minutely") == [minute(n, 0) for n in (0, 1, 3)]
    assert await overdue_at(app, "minutely", minute(3, 40)) is None
    assert (await overdue_metric(app, minute(3, 40)))["minutely"] == 0.0
    report = await collect(app.tasks, app.database, now=minute(3, 40))
    [entry] = [t for t in report["tasks"] if t["task"] == "minutely"]
    assert entry["consecutive_misses"] == 0  # 10:03 ran after the miss
    assert [r["status"] for r in entry["last_runs"]] == [
        "completed",
        "missed",
        "completed",
        "completed",
    ]


async def test_a_crontab_run_only_records_misses_whatever_the_misfire_policy(app: App) -> None:
    """misfire='each' is the scheduler's catch-up; a crontab run records the gap missed."""
    await app.run("minutely-each", now=minute(0))
    result = await app.run("minutely-each", now=minute(4))
    assert (result.status, result.trigger.value) == (RunStatus.COMPLETED, "cron")
    history = await runs_of(app.database, "minutely-each")
    assert [(r["slot"], r["status"]) for r in history] == [
        (minute(0, 0), "completed"),
        *[(minute(n, 0), "missed") for n in (1, 2, 3)],
        (minute(4, 0), "completed"),
    ]
    assert await work_of(app.database, "minutely-each") == [minute(0, 0), minute(4, 0)]


async def test_misses_are_recorded_under_the_lock(app: App, database: Database) -> None:
    """While another run holds the lock, a crontab run records nothing but its own skip; a
    slot whose only row is such a skip was fired (the task was busy), so it is not missed."""
    await app.run("minutely", now=minute(1))
    task = app.task("minutely")
    async with database.connect() as holder:
        await holder.execute(select(func.pg_advisory_xact_lock(task.lock_namespace, task.lock_key)))
        busy = await app.run("minutely", now=minute(3, 30))
        assert (busy.status, busy.skip_reason) == (RunStatus.SKIPPED, "lock_busy")
        assert [r["status"] for r in await runs_of(database, "minutely")] == [
            "completed",
            "skipped",
        ]
        await holder.rollback()

    await app.run("minutely", now=minute(4, 10))

    history = await runs_of(database, "minutely")
    assert [(r["slot"], r["status"], r["skip_reason"]) for r in history] == [
        (minute(1, 0), "completed", None),
        (minute(3, 0), "skipped", "lock_busy"),
        (minute(2, 0), "missed", None),
        (minute(4, 0), "completed", None),
    ]


async def test_misses_stand_when_the_run_then_loses_its_connection(
    app: App, database: Database
) -> None:
    """The misses commit before the body runs: a run whose connection dies keeps them."""
    await app.run("doomed", now=minute(0))
    await switch_on(database, "doomed")

    result = await app.run("doomed", now=minute(2))

    assert result.status is RunStatus.FAILED
    history = await runs_of(database, "doomed")
    assert [(r["slot"], r["status"]) for r in history] == [
        (minute(0, 0), "completed"),
        (minute(1, 0), "missed"),
        (minute(2, 0), "failed"),
    ]


async def test_a_long_gap_is_bounded_and_said(
    app: App, database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """Last run 30 days ago: the latest 1,000 minutes are recorded missed, not 43,200."""
    restart = minute(0)
    await app.run("minutely", now=restart - timedelta(days=30))

    with caplog.at_level("WARNING", logger="cronlock.periodic"):
        result = await app.run("minutely", now=restart)

    assert result.status is RunStatus.COMPLETED
    missed = [r["slot"] for r in await runs_of(database, "minutely") if r["status"] == "missed"]
    assert len(missed) == BACKLOG_LIMIT
    assert missed[0] == SLOT - timedelta(minutes=BACKLOG_LIMIT)
    assert missed[-1] == SLOT - timedelta(minutes=1)
    assert "more than 1000 slots passed since" in caplog.text


async def test_the_story_through_the_command_line(
    app: App, database: Database, database_url: str
) -> None:
    """At the real time, with the real commands: a run two and a half minutes ago, then
    nothing: status shows the task overdue; `cronlock run` records the minutes between missed.
    """
    seeded = await app.run("minutely", now=datetime.now(UTC) - timedelta(seconds=150))
    assert seeded.slot is not None
    owed = seeded.slot + timedelta(minutes=1)

    shown = await invoke_async(
        "--app", "testapps.health", "status", "--json", database_url=database_url
    )
    assert shown.returncode == 0, shown.stderr
    [entry] = [t for t in json.loads(shown.stdout)["tasks"] if t["task"] == "minutely"]
    assert entry["overdue"]["slot"] == owed.isoformat()
    assert entry["overdue"]["seconds"] > 0
    text = await invoke_async("--app", "testapps.health", "status", database_url=database_url)
    assert "OVERDUE " in text.stdout and "has no outcome" in text.stdout
    assert owed.astimezone(UTC).strftime("%H:%M:%SZ") in text.stdout
    transport = httpx.ASGITransport(app=create_api(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
        metrics = (await http.get("/metrics")).text
    [value] = [
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "cronlock_task_overdue_seconds" and sample.labels["task"] == "minutely"
    ]
    assert value > 0

    done = await invoke_async(
        "--app", "testapps.health", "run", "minutely", "--json", database_url=database_url
    )

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "completed"
    slot = datetime.fromisoformat(result["slot"])
    between = [
        owed + timedelta(minutes=n) for n in range(int((slot - owed) / timedelta(minutes=1)))
    ]
    assert between  # at least the minute after the seeded run
    history = await runs_of(database, "minutely")
    assert [(r["slot"], r["status"], r["trigger"]) for r in history] == [
        (seeded.slot, "completed", "cron"),
        *[(each, "missed", "cron") for each in between],
        (slot, "completed", "cron"),
    ]
    again = await invoke_async(
        "--app", "testapps.health", "status", "--json", database_url=database_url
    )
    [entry] = [t for t in json.loads(again.stdout)["tasks"] if t["task"] == "minutely"]
    assert entry["overdue"] is None
