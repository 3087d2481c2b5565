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

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from history import runs_of
from prometheus_client.parser import text_string_to_metric_families
from testapps import health

from cronlock import App, Database, RunStatus
from cronlock.observe.prometheus import render_metrics, scrape
from cronlock.observe.status import collect
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


async def overdue_at(app: App, task: str, now: datetime) -> dict[str, object] | None:
    """``status``'s overdue of ``task`` at ``now``."""
    report = await collect(app, app.database, now=now)
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
    import httpx

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
