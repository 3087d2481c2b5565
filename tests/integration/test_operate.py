"""Operating the queue from Python: get, list, retry, cancel, delete, pause, against PostgreSQL.

The races are run for real: a retry racing a drain, a cancel racing the claim, a pause while a
batch is in flight. Whatever wins, nothing is lost, nothing runs twice, nothing is left
`processing`, and the counter handler's writes match the jobs that completed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from jobsupport import job_app, job_rows, scalar
from sqlalchemy import func, insert, select
from testapps import jobs as testjobs
from waiting import eventually

from cronlock import App, ChangeOutcome, Database, InvalidJobOption, JobFilter, JobStatus
from cronlock.sql.tables import jobs


async def _statuses(database: Database) -> dict[str, int]:
    found: dict[str, int] = {}
    for row in await job_rows(database):
        found[row["status"]] = found.get(row["status"], 0) + 1
    return found


async def _fail_for_good(app: App, job_type: str = "always_fail") -> uuid.UUID:
    """A job of ``job_type`` that failed every attempt (max_retries=2: three attempts)."""
    answer = await app.enqueue(job_type, {})
    later = datetime.now(UTC)
    for _ in range(3):
        later += timedelta(hours=2)

        def clock(moment: datetime = later) -> datetime:
            return moment

        await app.drainer(clock=clock).drain()
    return answer.id


async def _failed_rows(database: Database, job_type: str, count: int) -> None:
    """``count`` jobs of ``job_type`` that failed for good, written as the drainer leaves them."""
    async with database.engine.begin() as conn:
        await conn.execute(
            insert(jobs),
            [
                {
                    "job_type": job_type,
                    "payload": {"n": n},
                    "status": "failed",
                    "max_retries": 0,
                    "error_message": "ValueError: boom",
                    "error_history": [{"attempt": 1, "error": "ValueError: boom"}],
                    "completed_at": datetime.now(UTC),
                }
                for n in range(count)
            ],
        )


async def test_get_and_list_newest_first_with_filters_and_pages(database: Database) -> None:
    async with job_app(database) as app:
        ids = [(await app.enqueue("noop", {"n": n})).id for n in range(5)]
        other = await app.enqueue("echo", {}, queue="other")
        job = await app.get_job(ids[0])
        assert job is not None and job.status is JobStatus.PENDING and job.payload == {"n": 0}
        assert await app.get_job(uuid.uuid4()) is None

        seen: list[uuid.UUID] = []
        cursor = None
        while True:
            page = await app.list_jobs(limit=2, cursor=cursor)
            seen += [j.id for j in page.jobs]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == [other.id, *reversed(ids)]  # newest first, each once

        assert [j.id for j in (await app.list_jobs(JobFilter(queue="other"))).jobs] == [other.id]
        assert len((await app.list_jobs(JobFilter(job_type="noop"))).jobs) == 5
        assert (await app.list_jobs(JobFilter(status="completed"))).jobs == ()
        first = await app.get_job(ids[2])
        assert first is not None
        newer = await app.list_jobs(JobFilter(created_after=first.created_at, job_type="noop"))
        assert [j.id for j in newer.jobs] == [ids[4], ids[3], ids[2]]
        assert await app.count_jobs(JobFilter(status=["pending"])) == 6
        assert await app.count_jobs(verb="delete") == 0

        for bad in ({"status": "lost"}, {"created_after": datetime(2026, 1, 1)}):
            with pytest.raises(InvalidJobOption):
                JobFilter(**bad)  # checked when made
        for paging in ({"limit": 0}, {"cursor": "not-a-cursor"}):
            with pytest.raises(InvalidJobOption):
                await app.list_jobs(**paging)


async def test_retry_a_failed_job_gives_it_one_more_attempt_and_keeps_its_history(
    database: Database,
) -> None:
    async with job_app(database) as app:
        job_id = await _fail_for_good(app)
        change = await app.retry_job(job_id)
        assert (change.outcome, change.changed, change.status) == (
            ChangeOutcome.RETRIED,
            True,
            JobStatus.RETRYING,
        )
        [row] = await job_rows(database)
        assert (row["status"], row["retry_count"], row["max_retries"]) == ("retrying", 3, 3)
        assert row["completed_at"] is None and len(row["error_history"]) == 3
        # Due now: a drain without any clock jump runs it, once, and it fails for good again.
        result = await app.drain()
        assert result.stats["failed"] == 1
        [row] = await job_rows(database)
        assert row["status"] == "failed"
        assert [entry["attempt"] for entry in row["error_history"]] == [1, 2, 3, 4]

        again = await app.retry_job(uuid.uuid4())
        assert again.outcome is ChangeOutcome.NOT_FOUND and not again.changed
        done = await app.enqueue("noop", {})
        await app.drain()
        wrong = await app.retry_job(done.id)
        assert (wrong.outcome, wrong.status) == (ChangeOutcome.WRONG_STATUS, JobStatus.COMPLETED)


async def test_retry_makes_a_retrying_job_due_now(database: Database) -> None:
    async with job_app(database) as app:
        answer = await app.enqueue("flaky", {"key": "r"})
        await app.drain()  # attempt 1 fails: retrying, due in a second
        [row] = await job_rows(database)
        assert row["status"] == "retrying" and row["run_at"] > await scalar(database, func.now())
        assert (await app.retry_job(answer.id)).outcome is ChangeOutcome.RETRIED
        [row] = await job_rows(database)
        assert row["retry_count"] == 1  # the retry was counted when it was scheduled
        assert (await app.drain()).stats["retried"] == 1  # attempt 2 ran now (and failed)
        # Now retrying and due in a second; a second retry of a due job changes nothing.
        await app.retry_job(answer.id)
        due = await app.retry_job(answer.id)
        assert due.outcome is ChangeOutcome.WRONG_STATUS and "already due" in due.detail


async def test_retry_leaves_a_job_whose_dedup_key_is_held(database: Database) -> None:
    async with job_app(database) as app:
        async with database.engine.begin() as conn:
            for _ in range(2):
                await conn.execute(
                    insert(jobs).values(
                        job_type="noop",
                        payload={},
                        status="failed",
                        dedup_key="k",
                        completed_at=datetime.now(UTC),
                    )
                )
        bulk = await app.retry_jobs(JobFilter(status="failed"))
        assert (bulk.matched, bulk.changed) == (2, 1)
        assert bulk.unchanged == {ChangeOutcome.DEDUP_KEY_HELD: 1}
        [left] = await job_rows(database, status="failed")
        single = await app.retry_job(left["id"])
        assert single.outcome is ChangeOutcome.DEDUP_KEY_HELD
        assert await _statuses(database) == {"retrying": 1, "failed": 1}


async def test_cancel_a_waiting_job_and_it_never_runs(database: Database) -> None:
    async with job_app(database) as app:
        answer = await app.enqueue("count", {"n": 1})
        change = await app.cancel_job(answer.id)
        assert (change.outcome, change.status) == (ChangeOutcome.CANCELLED, JobStatus.CANCELLED)
        assert (await app.drain()).stats["processed"] == 0
        [row] = await job_rows(database)
        assert row["status"] == "cancelled" and row["completed_at"] is not None
        assert await scalar(database, select(testjobs.counter.c.n)) == 0
        again = await app.cancel_job(answer.id)
        assert again.outcome is ChangeOutcome.WRONG_STATUS
        # Cancelled is not retried; it is finished, so it may be deleted.
        assert (await app.retry_job(answer.id)).outcome is ChangeOutcome.WRONG_STATUS
        assert (await app.delete_job(answer.id)).outcome is ChangeOutcome.DELETED


async def test_delete_only_finished_jobs(database: Database) -> None:
    async with job_app(database) as app:
        waiting = await app.enqueue("noop", {})
        refused = await app.delete_job(waiting.id)
        assert refused.outcome is ChangeOutcome.WRONG_STATUS and "cancel it first" in refused.detail
        await app.drain()
        for n in range(3):
            await app.enqueue("echo", {"n": n}, queue="other")
        with pytest.raises(InvalidJobOption, match="delete acts on completed"):
            await app.delete_jobs(JobFilter(status="pending"))
        gone = await app.delete_jobs(JobFilter(queue="default"))
        assert (gone.matched, gone.changed) == (1, 1)
        assert await _statuses(database) == {"pending": 3}
        assert (await app.delete_job(waiting.id)).outcome is ChangeOutcome.NOT_FOUND


async def test_bulk_changes_walk_in_batches(database: Database) -> None:
    async with job_app(database) as app:
        await _failed_rows(database, "noop", 1203)
        changed = await app.retry_jobs(JobFilter(job_type="noop"))
        assert (changed.matched, changed.changed, dict(changed.unchanged)) == (1203, 1203, {})
        assert await _statuses(database) == {"retrying": 1203}
        cancelled = await app.cancel_jobs(JobFilter(status="retrying"))
        assert cancelled.changed == 1203
        deleted = await app.delete_jobs(JobFilter(status="cancelled"))
        assert deleted.changed == 1203 and await job_rows(database) == []


# -- concurrency ---------------------------------------------------------------------------


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    started, release = tmp_path / "started", tmp_path / "release"
    monkeypatch.setenv("GATE_STARTED", str(started))
    monkeypatch.setenv("GATE_RELEASE", str(release))
    return started, release


async def _work(app: App, **options: Any) -> tuple[Any, asyncio.Task[Any]]:
    drainer = app.drainer(poll_interval=0.2, heartbeat_interval=0.2, **options)
    return drainer, asyncio.create_task(drainer.work())


async def test_cancel_of_a_running_job_stops_it_and_the_drainer_goes_on(
    database: Database, gate: tuple[Path, Path]
) -> None:
    started, _ = gate
    async with job_app(database) as app:
        answer = await app.enqueue("gated", {"n": 1})
        drainer, working = await _work(app)
        try:
            await eventually(lambda: asyncio.sleep(0, started.exists()))
            change = await app.cancel_job(answer.id)
            assert (change.outcome, change.changed) == (ChangeOutcome.CANCELLED, True)
            assert change.status is JobStatus.CANCELLED
            assert "cancelled while running" in change.detail
            retry = await app.retry_job(answer.id)
            assert retry.outcome is ChangeOutcome.WRONG_STATUS  # cancelled, not failed
            after = await app.enqueue("count", {"n": 2})
            await eventually(lambda: _is(database, "completed", 1))
            assert (await app.get_job(after.id)).status is JobStatus.COMPLETED  # type: ignore[union-attr]
        finally:
            drainer.stop()
            await working
        assert drainer.stats.cancelled == 1 and drainer.stats.processed == 1
        [row] = await job_rows(database, id=answer.id)
        assert (row["status"], row["retry_count"]) == ("cancelled", 0)
        assert [e["outcome"] for e in row["error_history"]] == ["cancelled"]
        assert await _no_double_runs(database) == 1  # gated's write was rolled back


async def _is(database: Database, status: str, count: int) -> bool:
    return (await _statuses(database)).get(status, 0) == count


async def _no_double_runs(database: Database, gated: int = 0) -> int:
    """Each job's handler writes committed at most once; the number of count jobs that ran
    (``gated`` jobs log without counting)."""
    async with database.connect() as conn:
        logged = [row[0] for row in await conn.execute(select(testjobs.job_log.c.job))]
        counted = (await conn.execute(select(testjobs.counter.c.n))).scalar_one()
    assert len(logged) == len(set(logged)), "a job's writes were applied twice"
    assert counted + gated == len(logged)
    return int(counted)


@pytest.mark.parametrize("mode", ["strict", "batch"])
async def test_cancel_racing_the_claim(database: Database, mode: str) -> None:
    async with job_app(database) as app:
        await app.enqueue_many("count", [{"n": n} for n in range(300)])
        drainer, working = await _work(app, commit_mode=mode, batch_size=10)
        try:
            cancelled = requested = 0
            while True:  # cancel everything still waiting, as fast as possible, while it drains
                change = await app.cancel_jobs()
                cancelled += change.changed
                # A job a lane holds is asked to stop: cancelled, or completed first.
                requested += change.unchanged.get(ChangeOutcome.CANCEL_REQUESTED, 0)
                if change.matched == 0:
                    break
        finally:
            drainer.stop()
            await working
        statuses = await _statuses(database)
        assert set(statuses) <= {"completed", "cancelled"}, statuses
        assert cancelled <= statuses.get("cancelled", 0) <= cancelled + requested
        assert sum(statuses.values()) == 300
        assert await _no_double_runs(database) == statuses.get("completed", 0)
        logged = {int(row["payload"]["n"]) for row in await job_rows(database, status="completed")}
        assert len(logged) == statuses.get("completed", 0)


@pytest.mark.parametrize("mode", ["strict", "batch"])
async def test_retry_racing_a_drain(database: Database, mode: str) -> None:
    async with job_app(database) as app:
        await _failed_rows(database, "count", 300)
        drainer, working = await _work(app, commit_mode=mode, batch_size=10)
        try:
            retried = await app.retry_jobs(JobFilter(status="failed"))
            assert retried.changed == 300  # no failed job is ever locked by a drainer
            await eventually(lambda: _is(database, "completed", 300), timeout=30)
            again = await app.retry_jobs()  # nothing left to retry
            assert again.matched == 0
        finally:
            drainer.stop()
            await working
        assert await _statuses(database) == {"completed": 300}
        assert await _no_double_runs(database) == 300


async def test_pause_while_a_batch_is_in_flight(
    database: Database, gate: tuple[Path, Path]
) -> None:
    started, release = gate
    async with job_app(database) as app:
        await app.enqueue_many("gated", [{"n": n} for n in range(100, 103)])
        await app.enqueue_many("count", [{"n": n} for n in range(20)])
        drainer, working = await _work(app, commit_mode="batch", batch_size=3)
        try:
            await eventually(lambda: asyncio.sleep(0, started.exists()))
            state = await app.pause_queue("default")
            assert state.paused and state.changed
            assert not (await app.pause_queue("default")).changed
            release.write_text("go")
            # The batch it held finishes; then it claims nothing while paused.
            await eventually(lambda: _is(database, "completed", 3))
            queues = {q.name: q for q in await app.queues()}
            assert queues["default"].paused and not queues["default"].unserved
            # Three poll intervals of the paused drainer: still nothing claimed. (A wait for
            # something not to happen has nothing to poll for.)
            await asyncio.sleep(0.6)
            assert await _statuses(database) == {"completed": 3, "pending": 20}
            resumed = await app.resume_queue("default")
            assert resumed.changed and not resumed.paused
            await eventually(lambda: _is(database, "completed", 23), timeout=20)
        finally:
            drainer.stop()
            await working
        assert await _no_double_runs(database, gated=3) == 20
        assert await _statuses(database) == {"completed": 23}


async def test_a_paused_queue_wakes_on_resume_without_waiting_for_its_poll(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cronlock.drainer")
    async with job_app(database) as app:
        await app.pause_queue("default")
        await app.enqueue("noop", {})
        drainer = app.drainer(poll_interval=30, heartbeat_interval=0.2)
        working = asyncio.create_task(drainer.work())
        try:
            await eventually(lambda: _active(app))

            async def said() -> list[str]:
                return [
                    r.getMessage()
                    for r in caplog.records
                    if getattr(r, "action", "") == "drainer_active"
                ]

            [line] = await eventually(said)
            assert "active on queue default, paused: claims nothing" in line
            assert (await app.drain()).status.value == "skipped"  # the worker holds the lock
            await app.resume_queue("default")
            # The resume's NOTIFY wakes it: far sooner than its 30 s poll interval.
            await eventually(lambda: _is(database, "completed", 1), timeout=10)
        finally:
            drainer.stop()
            await working


async def _active(app: App) -> bool:
    return any(q.active_drainers for q in await app.queues())
