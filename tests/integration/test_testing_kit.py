"""docs/how-to/testing.md's example: a user's own tests of their own app, written with nothing
but ``cronlock.testing`` (its pytest plugin's fixtures) and cronlock's public names.

The app signs users up (enqueueing a welcome mail), sends mails (the first attempt for a
flaky address fails and is retried ten minutes later) and writes a nightly report at 02:30
in Berlin, a time that does not exist on the night the clocks spring forward. Every test
moves the test clock, Python's and the database's ``now()`` together, instead of waiting.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from cronlock import App, Backoff, JobStatus, Run, RunStatus, Scheduler
from cronlock.testing import TestClock, assert_enqueued, drain_until_idle, eager, enqueued

# -- the user's app -------------------------------------------------------------------------

app = App()
attempts: dict[str, int] = {}


@app.job("send_welcome", max_retries=3, backoff=Backoff(base=600, jitter=0))
async def send_welcome(session: AsyncSession, payload: dict[str, Any]) -> None:
    attempts[payload["to"]] = attempts.get(payload["to"], 0) + 1
    if payload["to"].startswith("flaky") and attempts[payload["to"]] == 1:
        raise ConnectionError("the mail server hung up")
    await session.execute(text("INSERT INTO outbox (address) VALUES (:to)"), payload)


@app.periodic("nightly-report", cron="30 2 * * *", timezone="Europe/Berlin")
async def nightly_report(run: Run) -> None:
    await run.session.execute(text("INSERT INTO reports (slot) VALUES (:slot)"), {"slot": run.slot})


async def sign_up(address: str) -> None:
    await app.enqueue("send_welcome", {"to": address})


# -- the user's fixture ---------------------------------------------------------------------


@pytest.fixture
async def mail_app(cronlock_database_url: str) -> AsyncIterator[App]:
    """The app on this test's own database (cronlock_database_url), with the app's tables.
    ``written_at`` defaults to now(): the database's clock, which the test clock moves."""
    attempts.clear()
    database = app.use_database(cronlock_database_url)
    async with database.engine.begin() as conn:
        await conn.execute(
            text("CREATE TABLE outbox (address text, written_at timestamptz DEFAULT now())")
        )
        await conn.execute(
            text("CREATE TABLE reports (slot timestamptz, written_at timestamptz DEFAULT now())")
        )
    yield app
    await database.dispose()


async def rows(query: str) -> list[tuple[Any, ...]]:
    async with app.database.engine.connect() as conn:
        return [tuple(row) for row in await conn.execute(text(query))]


# -- a job ----------------------------------------------------------------------------------


async def test_signing_up_enqueues_a_welcome_mail(mail_app: App) -> None:
    await sign_up("ada@example.com")

    [job] = await assert_enqueued(mail_app, "send_welcome", to="ada@example.com")
    assert job.status is JobStatus.PENDING
    drained = await drain_until_idle(mail_app)

    assert drained.processed == 1
    assert await rows("SELECT address FROM outbox") == [("ada@example.com",)]
    [done] = await enqueued(mail_app, "send_welcome", status="completed")
    assert done.id == job.id


async def test_a_failed_mail_is_retried_when_its_backoff_has_passed(
    mail_app: App, cronlock_clock: TestClock
) -> None:
    started = time.perf_counter()
    cronlock_clock.set(datetime(2026, 3, 2, 9, 0, tzinfo=UTC))
    await sign_up("flaky@example.com")

    first = await drain_until_idle(mail_app)  # no clock: nothing moves it
    [job] = await enqueued(mail_app, "send_welcome")
    assert (first.retried, job.status) == (1, JobStatus.RETRYING)
    assert job.run_at == datetime(2026, 3, 2, 9, 10, tzinfo=UTC)  # the database's now() + 600 s

    cronlock_clock.advance(minutes=9)
    assert (await drain_until_idle(mail_app)).processed == 0  # not due yet
    cronlock_clock.advance(minutes=1)
    assert (await drain_until_idle(mail_app)).processed == 1

    assert await rows("SELECT address, written_at FROM outbox") == [
        ("flaky@example.com", datetime(2026, 3, 2, 9, 10, tzinfo=UTC))
    ]
    assert time.perf_counter() - started < 1.0  # ten minutes of backoff, no waiting


async def test_drain_until_idle_moves_the_clock_through_the_backoff(
    mail_app: App, cronlock_clock: TestClock
) -> None:
    cronlock_clock.set(datetime(2026, 3, 2, 9, 0, tzinfo=UTC))
    async with eager(mail_app, clock=cronlock_clock) as drained:
        await sign_up("flaky@example.com")
        await sign_up("grace@example.com")

    assert (drained.processed, drained.retried) == (2, 1)
    assert drained.clock_moves == [datetime(2026, 3, 2, 9, 10, tzinfo=UTC)]
    assert sorted(await rows("SELECT address FROM outbox")) == [
        ("flaky@example.com",),
        ("grace@example.com",),
    ]


async def test_assert_enqueued_says_what_was_enqueued(mail_app: App) -> None:
    await sign_up("ada@example.com")

    with pytest.raises(AssertionError) as failure:
        await assert_enqueued(mail_app, "send_welcome", to="bob@example.com")

    message = str(failure.value)
    assert "expected a job 'send_welcome' with payload matching {'to': 'bob@example.com'}" in (
        message
    )
    assert "send_welcome pending {'to': 'ada@example.com'}" in message


# -- a periodic task ------------------------------------------------------------------------


async def test_the_nightly_report_across_spring_forward_and_a_missed_night(
    mail_app: App, cronlock_clock: TestClock
) -> None:
    started = time.perf_counter()
    scheduler = Scheduler(mail_app, clock=cronlock_clock.now)
    report = mail_app.task("nightly-report")

    # Saturday 28 March 2026, 02:30 in Berlin (CET, UTC+1), five seconds late.
    cronlock_clock.set(datetime(2026, 3, 28, 1, 30, 5, tzinfo=UTC))
    [saturday] = await scheduler.wake(report)
    # Sunday: at 02:00 the clocks jump to 03:00; 02:30 never happens, so it runs at 03:00 CEST.
    cronlock_clock.set(datetime(2026, 3, 29, 1, 0, 5, tzinfo=UTC))
    [sunday] = await scheduler.wake(report)
    # Nobody fired Monday's 02:30 (the host was down); Tuesday's wake records it missed.
    cronlock_clock.set(datetime(2026, 3, 31, 0, 30, 5, tzinfo=UTC))
    [tuesday] = await scheduler.wake(report)

    assert [(r.status, r.slot) for r in (saturday, sunday, tuesday)] == [
        (RunStatus.COMPLETED, datetime(2026, 3, 28, 1, 30, tzinfo=UTC)),
        (RunStatus.COMPLETED, datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
        (RunStatus.COMPLETED, datetime(2026, 3, 31, 0, 30, tzinfo=UTC)),
    ]
    # Every slot has its row in the run history, the missed one too (cronlock status).
    [task] = (await mail_app.status(limit=10))["tasks"]
    assert sorted((run["slot"], run["status"]) for run in task["last_runs"]) == [
        ("2026-03-28T01:30:00+00:00", "completed"),
        ("2026-03-29T01:00:00+00:00", "completed"),
        ("2026-03-30T00:30:00+00:00", "missed"),
        ("2026-03-31T00:30:00+00:00", "completed"),
    ]
    # Each report was written on the database's clock: the moment the test clock said.
    assert await rows("SELECT slot, written_at FROM reports ORDER BY slot") == [
        (datetime(2026, 3, 28, 1, 30, tzinfo=UTC), datetime(2026, 3, 28, 1, 30, 5, tzinfo=UTC)),
        (datetime(2026, 3, 29, 1, 0, tzinfo=UTC), datetime(2026, 3, 29, 1, 0, 5, tzinfo=UTC)),
        (datetime(2026, 3, 31, 0, 30, tzinfo=UTC), datetime(2026, 3, 31, 0, 30, 5, tzinfo=UTC)),
    ]
    assert time.perf_counter() - started < 1.0  # four nights, no waiting


async def test_a_run_past_its_grace_belongs_to_no_slot(
    mail_app: App, cronlock_clock: TestClock
) -> None:
    cronlock_clock.set(datetime(2026, 3, 30, 0, 32, tzinfo=UTC))  # 02:32 CEST: 2 min late

    result = await mail_app.run("nightly-report", now=cronlock_clock.now())

    assert (result.status, result.skip_reason) == (RunStatus.SKIPPED, "no_slot")


async def test_code_that_reads_python_s_clock_is_frozen_with_it(
    mail_app: App, cronlock_clock: TestClock
) -> None:
    cronlock_clock.set(datetime(2026, 3, 29, 1, 0, 5, tzinfo=UTC))
    with cronlock_clock.python_frozen():
        result = await mail_app.run("nightly-report")  # no now=: it reads datetime.now()
        cronlock_clock.advance(days=1)
        tomorrow = datetime.now(UTC)

    assert (result.status, result.slot) == (
        RunStatus.COMPLETED,
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
    )
    assert tomorrow == datetime(2026, 3, 30, 1, 0, 5, tzinfo=UTC)
