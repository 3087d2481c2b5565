"""Cooperative cancellation of running jobs, from Python, against PostgreSQL, with in-process
drainers: the handler's task is cancelled at its next await, its writes are rolled back, the
job ends ``cancelled`` (not retried) with a history entry, and the caller is told what
happened. The races run for real: a cancel racing the claim, a cancel racing completion.
Whatever wins, nothing is lost, nothing runs twice, nothing is left waiting or processing.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from jobsupport import job_app, job_rows, scalar
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from testapps import jobs as testjobs
from waiting import eventually

import cronlock
from cronlock import App, ChangeOutcome, Database, Drainer, JobStatus
from cronlock.sql.tables import cancel_requests


class Gates:
    """In-process handlers that block until the test lets them go: ``started`` holds the
    payloads' ``n`` whose handler is running, ``release`` lets them all finish."""

    def __init__(self) -> None:
        self.started: set[int] = set()
        self.release = asyncio.Event()
        self.saw_cancel: list[bool] = []

    def install(self, app: App) -> None:
        @app.job("blocker", max_retries=3)
        async def blocker(session: AsyncSession, payload: Any) -> dict[str, Any]:
            await session.execute(insert(testjobs.job_log).values(job=f"blocker:{payload['n']}"))
            self.started.add(payload["n"])
            await self.release.wait()
            return {"n": payload["n"]}

        @app.job("stubborn", max_retries=3)
        async def stubborn(session: AsyncSession, payload: Any) -> dict[str, Any]:
            """Catches the cancellation and finishes anyway."""
            await session.execute(insert(testjobs.job_log).values(job=f"stubborn:{payload['n']}"))
            self.started.add(payload["n"])
            while True:
                try:
                    await self.release.wait()
                    break
                except asyncio.CancelledError:
                    self.saw_cancel.append(cronlock.current_job().cancel_requested)
            return {"n": payload["n"]}


@asynccontextmanager
async def working(app: App, **options: Any) -> AsyncIterator[Drainer]:
    drainer = app.drainer(poll_interval=0.2, heartbeat_interval=0.2, **options)
    task = asyncio.create_task(drainer.work())
    try:
        yield drainer
    finally:
        drainer.stop()
        await task


async def _logged(database: Database) -> list[str]:
    async with database.connect() as conn:
        return [row[0] for row in await conn.execute(select(testjobs.job_log.c.job))]


async def _requests(database: Database) -> int:
    return int(await scalar(database, select(func.count()).select_from(cancel_requests)))


@pytest.mark.parametrize("commit_mode", ["strict", "batch", "lease"])
async def test_a_running_job_is_stopped_rolled_back_and_cancelled(
    database: Database, commit_mode: str
) -> None:
    gates = Gates()
    async with job_app(database) as app:
        gates.install(app)
        before = await app.enqueue("count", {"n": 1})
        target = await app.enqueue("blocker", {"n": 2})
        after = await app.enqueue("count", {"n": 3})
        async with working(app, commit_mode=commit_mode, batch_size=3) as drainer:
            await eventually(lambda: asyncio.sleep(0, 2 in gates.started))
            change = await app.cancel_job(target.id)
            assert (change.outcome, change.status, change.changed) == (
                ChangeOutcome.CANCELLED,
                JobStatus.CANCELLED,
                True,
            )
            await eventually(lambda: asyncio.sleep(0, drainer.stats.processed == 2), timeout=10)
        rows = {row["id"]: row for row in await job_rows(database)}
        assert rows[before.id]["status"] == rows[after.id]["status"] == "completed"
        stopped = rows[target.id]
        assert (stopped["status"], stopped["retry_count"]) == ("cancelled", 0)
        assert stopped["completed_at"] is not None and stopped["result"] is None
        [entry] = stopped["error_history"]
        assert (entry["attempt"], entry["outcome"]) == (1, "cancelled")
        assert stopped["error_message"] == entry["error"]
        assert "by an operator while running" in entry["error"]
        # Its write rolled back; the others' committed, in batch mode in the same commit.
        assert sorted(await _logged(database)) == ["1", "3"]
        assert drainer.stats.cancelled == 1 and drainer.stats.failed == 0
        assert await _requests(database) == 0  # settled, forgotten


async def test_a_cancel_that_cannot_wait_says_requested_and_the_request_stands(
    database: Database,
) -> None:
    gates = Gates()
    async with job_app(database) as app:
        gates.install(app)
        target = await app.enqueue("stubborn", {"n": 1})
        async with working(app):
            await eventually(lambda: asyncio.sleep(0, 1 in gates.started))
            change = await app.cancel_job(target.id, wait=0.3)
            assert (change.outcome, change.changed) == (ChangeOutcome.CANCEL_REQUESTED, False)
            assert change.status is JobStatus.PENDING  # as its locked row says
            assert "not stopped within 0.3 s" in change.detail
            assert gates.saw_cancel == [True]  # told, and it saw current_job() say so
            assert await _requests(database) == 1
            shown = await app.get_job(target.id)
            assert shown is not None and shown.cancel_requested_at is not None
            # It raised nothing: it completes. A second cancel now says so.
            gates.release.set()
            again = await app.cancel_job(target.id)
        # It completed before the second cancel looked, or while it waited: either way, said.
        assert again.outcome in (ChangeOutcome.COMPLETED, ChangeOutcome.WRONG_STATUS)
        assert again.status is JobStatus.COMPLETED and not again.changed
        [row] = await job_rows(database, id=target.id)
        assert (row["status"], row["result"]) == ("completed", {"n": 1})


async def test_a_cancel_racing_completion_is_told_which_won(database: Database) -> None:
    """The handler ends (its release) at the moment the cancel arrives, 30 times: each answer
    is the job's status, cancelled or completed, and the write is there exactly when it
    completed."""
    gates = Gates()
    rng = random.Random(14)
    answers: dict[uuid.UUID, ChangeOutcome] = {}
    async with job_app(database) as app:
        gates.install(app)
        async with working(app):
            for n in range(30):
                gates.release = asyncio.Event()
                job_id = (await app.enqueue("blocker", {"n": n})).id
                await eventually(lambda n=n: asyncio.sleep(0, n in gates.started))  # type: ignore[misc]
                loop = asyncio.get_running_loop()
                loop.call_later(rng.uniform(0, 0.004), gates.release.set)
                answers[job_id] = (await app.cancel_job(job_id)).outcome
        rows = {row["id"]: row for row in await job_rows(database)}
        logged = await _logged(database)
        for job_id, outcome in answers.items():
            row = rows[job_id]
            wrote = f"blocker:{row['payload']['n']}" in logged
            if outcome is ChangeOutcome.CANCELLED:
                assert (row["status"], wrote) == ("cancelled", False)
            else:
                # It completed before the cancel looked (wrong_status) or reached it.
                assert outcome in (ChangeOutcome.COMPLETED, ChangeOutcome.WRONG_STATUS), outcome
                assert (row["status"], wrote) == ("completed", True)
        assert len(logged) == len(set(logged))
        assert await _requests(database) == 0


@pytest.mark.parametrize("commit_mode", ["strict", "batch", "lease"])
async def test_cancels_racing_the_claim_lose_nothing_and_run_nothing_twice(
    database: Database, commit_mode: str
) -> None:
    """200 counting jobs drained by two lanes while each is cancelled by id as it comes: a
    job is cancelled before it runs, or stopped while it runs, or completed first, and the
    answer says which."""
    async with job_app(database) as app:
        ids = [
            answer.id for answer in await app.enqueue_many("count", [{"n": n} for n in range(200)])
        ]
        answers: dict[uuid.UUID, ChangeOutcome] = {}
        async with working(app, commit_mode=commit_mode, batch_size=10, concurrency=2):
            for job_id in ids:
                answers[job_id] = (await app.cancel_job(job_id)).outcome
        rows = {row["id"]: row for row in await job_rows(database)}
        assert {row["status"] for row in rows.values()} <= {"completed", "cancelled"}
        for job_id, outcome in answers.items():
            status = rows[job_id]["status"]
            if outcome is ChangeOutcome.CANCELLED:
                assert status == "cancelled", job_id
            else:
                assert outcome in (ChangeOutcome.COMPLETED, ChangeOutcome.WRONG_STATUS), outcome
                assert status == "completed", job_id
        logged = await _logged(database)
        completed = {
            str(row["payload"]["n"]) for row in rows.values() if row["status"] == "completed"
        }
        assert len(logged) == len(set(logged)) and set(logged) == completed
        counted = await scalar(database, select(testjobs.counter.c.n))
        assert counted == len(completed)
        assert await _requests(database) == 0


async def test_a_job_claimed_but_not_started_is_cancelled_before_it_runs(
    database: Database,
) -> None:
    """Batch mode: the second job of a batch is locked by the lane while the first runs; its
    cancel is remembered by the drainer, and its handler never starts."""
    gates = Gates()
    async with job_app(database) as app:
        gates.install(app)
        first = await app.enqueue("blocker", {"n": 1})
        second = await app.enqueue("blocker", {"n": 2})
        async with working(app, commit_mode="batch", batch_size=2) as drainer:
            await eventually(lambda: asyncio.sleep(0, 1 in gates.started))
            change = await app.cancel_job(second.id, wait=0)
            assert change.outcome is ChangeOutcome.CANCEL_REQUESTED
            # The notification reached the drainer (before the second job's attempt).
            cancels = drainer._attempts.cancels
            await eventually(lambda: asyncio.sleep(0, cancels.knows(second.id)))
            gates.release.set()
            await eventually(lambda: asyncio.sleep(0, drainer.stats.cancelled == 1))
        assert gates.started == {1}  # the second never started
        rows = {row["id"]: row for row in await job_rows(database)}
        assert rows[first.id]["status"] == "completed"
        assert rows[second.id]["status"] == "cancelled"
        assert "before its handler started" in rows[second.id]["error_message"]
        assert await _logged(database) == ["blocker:1"]


async def test_a_one_off_drain_stops_a_cancelled_job_by_its_poll(database: Database) -> None:
    """``drain`` listens to nothing: its poll of the requests finds the cancel within about
    a second."""
    gates = Gates()
    async with job_app(database) as app:
        gates.install(app)
        target = await app.enqueue("blocker", {"n": 1})
        drain = asyncio.create_task(app.drain())
        await eventually(lambda: asyncio.sleep(0, 1 in gates.started))
        change = await app.cancel_job(target.id)
        result = await drain
    assert change.outcome is ChangeOutcome.CANCELLED
    assert (result.status, result.stats["cancelled"]) == (cronlock.RunStatus.COMPLETED, 1)
    assert await _logged(database) == []


async def test_an_operators_retry_forgets_an_old_cancel_request(database: Database) -> None:
    async with job_app(database) as app:
        job_id = (await app.enqueue("always_fail", {}, max_retries=0)).id
        await app.drain()
        async with database.engine.begin() as conn:  # as a cancel that came too late leaves it
            await conn.execute(insert(cancel_requests).values(job_id=job_id))
        assert (await app.retry_job(job_id)).outcome is ChangeOutcome.RETRIED
        assert await _requests(database) == 0


async def test_cancel_checks_its_wait(database: Database) -> None:
    async with job_app(database) as app:
        job_id = (await app.enqueue("noop", {})).id
        for bad in (-1, 4000, True):
            with pytest.raises(cronlock.InvalidJobOption, match="wait must be"):
                await app.cancel_job(job_id, wait=bad)
        assert (await app.get_job(job_id)).status is JobStatus.PENDING  # type: ignore[union-attr]


async def test_a_cancel_by_filter_asks_the_drainer_to_stop_what_it_runs(
    database: Database,
) -> None:
    gates = Gates()
    async with job_app(database) as app:
        gates.install(app)
        running = await app.enqueue("blocker", {"n": 1})
        waiting = [a.id for a in await app.enqueue_many("noop", [{}, {}, {}])]
        async with working(app) as drainer:
            await eventually(lambda: asyncio.sleep(0, 1 in gates.started))
            done = await app.cancel_jobs()
            assert (done.matched, done.changed) == (4, 3)
            assert dict(done.unchanged) == {ChangeOutcome.CANCEL_REQUESTED: 1}
            await eventually(lambda: asyncio.sleep(0, drainer.stats.cancelled == 1))
        statuses = {row["id"]: row["status"] for row in await job_rows(database)}
        assert statuses == dict.fromkeys([running.id, *waiting], "cancelled")
        assert await _logged(database) == []
