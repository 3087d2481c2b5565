"""The drainer in process: the reference's tests corrected, retries, timeouts, commit modes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from jobsupport import job_app, job_rows, scalar
from sqlalchemy import func, select, text
from testapps import jobs as testjobs
from waiting import eventually

from cronlock import CommitMode, Database, RunStatus
from cronlock.sql.tables import jobs


class Clock:
    """A test clock: backoff is tested by moving it, never by waiting."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


async def _enqueue(database: Database, job_type: str, payloads: list[object], **kw: object) -> None:
    async with job_app(database) as app, database.session() as session:
        await app.enqueue_many_tx(session, job_type, payloads, **kw)  # type: ignore[arg-type]
        await session.commit()


async def test_basic_processing_and_a_second_run_finds_nothing(database: Database) -> None:
    await _enqueue(database, "echo", [{"to": f"user-{i}@test.com"} for i in range(5)])
    async with job_app(database) as app:
        result = await app.drain()
        again = await app.drain()

    assert result.status is RunStatus.COMPLETED
    assert (result.stats["processed"], result.stats["failed"], result.stats["retried"]) == (5, 0, 0)
    rows = await job_rows(database)
    assert {r["status"] for r in rows} == {"completed"}
    assert all(r["started_at"] and r["completed_at"] for r in rows)
    assert rows[0]["result"] == {"echo": rows[0]["payload"]}
    assert again.status is RunStatus.COMPLETED
    assert again.stats["processed"] == 0


async def test_flaky_handler_succeeds_on_its_third_attempt(database: Database) -> None:
    await _enqueue(database, "flaky", [{"key": "a"}])
    clock = Clock()
    attempts: dict[str, int] = {}
    async with job_app(database, attempts=attempts) as app:
        first = await app.drain(clock=clock)
        assert first.status is RunStatus.PARTIAL and first.stats["retried"] == 1
        assert (await app.drain(clock=clock)).stats["processed"] == 0  # not due before 1 s
        clock.advance(1.01)
        assert (await app.drain(clock=clock)).stats["retried"] == 1
        clock.advance(1.5)
        assert (await app.drain(clock=clock)).stats["processed"] == 0  # the 2nd wait is 2 s
        clock.advance(0.6)
        last = await app.drain(clock=clock)

    assert last.status is RunStatus.COMPLETED and last.stats["processed"] == 1
    assert attempts["a"] == 3
    [row] = await job_rows(database)
    assert row["status"] == "completed"
    assert row["retry_count"] == 2
    assert [e["attempt"] for e in row["error_history"]] == [1, 2]
    assert row["result"] == {"ok": True, "attempts": 3}


async def test_always_failing_job_ends_failed_after_max_retries(database: Database) -> None:
    await _enqueue(database, "always_fail", [{}])
    clock = Clock()
    statuses = []
    async with job_app(database) as app:
        for _ in range(6):
            result = await app.drain(clock=clock)
            statuses.append(result.status)
            clock.advance(3600)

    [row] = await job_rows(database)
    assert row["status"] == "failed"
    assert row["max_retries"] == 2
    assert row["retry_count"] == 2  # = max_retries: two retries, three attempts
    assert [e["attempt"] for e in row["error_history"]] == [1, 2, 3]
    assert {e["error"] for e in row["error_history"]} == {"ValueError: permanent error"}
    assert row["error_message"] == "ValueError: permanent error"
    assert row["completed_at"] is not None
    assert statuses[:3] == [RunStatus.PARTIAL] * 3
    assert statuses[3:] == [RunStatus.COMPLETED] * 3  # nothing left to do
    # Each attempt's write was rolled back to its savepoint.
    assert await scalar(database, select(func.count()).select_from(testjobs.job_log)) == 0


async def test_backoff_doubles_from_one_second(database: Database) -> None:
    await _enqueue(database, "always_fail", [{}])
    clock = Clock()
    waits = []
    async with job_app(database) as app:
        for _ in range(2):
            await app.drain(clock=clock)
            [row] = await job_rows(database)
            waits.append((row["run_at"] - clock.now).total_seconds())
            assert row["next_retry_at"] == row["run_at"]
            clock.advance(3600)
    assert waits == [pytest.approx(1.0, abs=1e-3), pytest.approx(2.0, abs=1e-3)]


async def test_job_type_without_handler_fails_cleanly(database: Database) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO cronlock.jobs (job_type, payload, max_retries) "
                "VALUES ('ghost', '{}', 0)"
            )
        )
    async with job_app(database) as app:
        result = await app.drain()
    assert result.status is RunStatus.PARTIAL and result.stats["failed"] == 1
    [row] = await job_rows(database)
    assert row["status"] == "failed"
    assert row["error_message"] == "no handler registered for job type 'ghost'"


async def test_timeout_is_a_failed_attempt(database: Database) -> None:
    await _enqueue(database, "sleepy", [{}])
    await _enqueue(database, "sql_sleepy", [{}])
    async with job_app(database) as app:
        result = await app.drain()
    assert result.stats["failed"] == 2
    rows = {r["job_type"]: r for r in await job_rows(database)}
    assert rows["sleepy"]["status"] == "failed"
    assert "longer than its timeout of 0.2 s" in rows["sleepy"]["error_message"]
    assert rows["sql_sleepy"]["status"] == "failed"
    assert "timeout of 0.3 s" in rows["sql_sleepy"]["error_message"]
    assert await scalar(database, select(func.count()).select_from(testjobs.job_log)) == 0


async def test_bad_result_and_bad_sql_fail_alone(database: Database) -> None:
    await _enqueue(database, "bad_result", [{}], max_retries=0)
    await _enqueue(database, "bad_sql", [{}])
    await _enqueue(database, "count", [{"n": i} for i in range(3)])
    async with job_app(database) as app:
        result = await app.drain(commit_mode="batch")
    assert (result.stats["processed"], result.stats["failed"]) == (3, 2)
    rows = {r["job_type"]: r for r in await job_rows(database)}
    assert "the handler's result is not JSON" in rows["bad_result"]["error_message"]
    assert "no_such_table" in rows["bad_sql"]["error_message"]
    log = await scalar(database, select(func.count()).select_from(testjobs.job_log))
    assert log == 3  # the counter jobs' rows; bad_sql's insert rolled back to its savepoint


@pytest.mark.parametrize("mode", list(CommitMode))
async def test_commit_modes_and_concurrency_apply_every_job_once(
    database: Database, mode: CommitMode
) -> None:
    await _enqueue(database, "count", [{"n": i} for i in range(300)])
    async with job_app(database) as app:
        result = await app.drain(commit_mode=mode, concurrency=3, batch_size=20)
    assert result.stats["processed"] == 300
    assert await scalar(database, select(testjobs.counter.c.n)) == 300
    distinct = await scalar(database, select(func.count(func.distinct(testjobs.job_log.c.job))))
    assert distinct == 300
    assert {r["status"] for r in await job_rows(database)} == {"completed"}


async def test_two_drainers_together_one_active_every_job_once(database: Database) -> None:
    await _enqueue(database, "count", [{"n": i} for i in range(200)])
    async with job_app(database) as app:
        results = await asyncio.gather(app.drain(), app.drain())
    statuses = sorted(r.status.value for r in results)
    processed = sorted(r.stats["processed"] for r in results)
    assert statuses == ["completed", "skipped"]
    assert processed == [0, 200]
    assert await scalar(database, select(testjobs.counter.c.n)) == 200


async def test_priority_then_age(database: Database) -> None:
    async with job_app(database) as app, database.session() as session:
        low = await app.enqueue_tx(session, "echo", {"p": "low"})
        high = await app.enqueue_tx(session, "echo", {"p": "high"}, priority=10)
        await session.commit()
        await app.drain()
    rows = {r["id"]: r for r in await job_rows(database)}
    assert rows[high.id]["completed_at"] < rows[low.id]["completed_at"]


async def test_other_queues_are_left_alone(database: Database) -> None:
    await _enqueue(database, "noop", [{}], queue="emails")
    await _enqueue(database, "noop", [{}])
    async with job_app(database) as app:
        default = await app.drain()
        emails = await app.drain(queue="emails")
    assert default.stats["processed"] == emails.stats["processed"] == 1
    assert await scalar(database, select(func.count()).where(jobs.c.status == "completed")) == 2


async def test_another_schema_end_to_end(empty_database: Database) -> None:
    other = Database(empty_database.url, schema="queue_here")
    app = testjobs.create_app()
    try:
        from cronlock import schema

        await schema.upgrade(other)
        app.use_database(str(other.url), schema="queue_here")
        # The caller's own engine knows nothing of cronlock's schema name.
        async with empty_database.session() as session:
            await app.enqueue_tx(session, "echo", {"n": 1})
            await session.commit()
        result = await app.drain()
    finally:
        await app.aclose()
        await other.dispose()
    assert result.stats["processed"] == 1
    async with empty_database.connect() as conn:
        status = await conn.scalar(text("SELECT status FROM queue_here.jobs"))
    assert status == "completed"


async def test_max_seconds_stops_claiming_and_leaves_the_rest(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 200 jobs of 50 ms: 10 s of work, against a limit of 1.5 s that counts from the call and
    # so covers the start-up too (with 0.2 s, a loaded machine's start-up once took it all).
    monkeypatch.setenv("COUNT_DELAY", "0.05")
    await _enqueue(database, "count", [{"n": i} for i in range(200)])
    async with job_app(database) as app:
        result = await app.drain(max_seconds=1.5)
    processed = result.stats["processed"]
    assert 1 <= processed < 200
    assert result.status is RunStatus.COMPLETED
    assert await scalar(database, select(testjobs.counter.c.n)) == processed
    pending = await scalar(database, select(func.count()).where(jobs.c.status == "pending"))
    assert pending == 200 - processed


@pytest.mark.parametrize("mode", list(CommitMode))
async def test_a_handler_that_commits_then_fails_leaves_nothing(
    database: Database, mode: CommitMode
) -> None:
    await _enqueue(database, "count", [{"n": i} for i in range(5)])
    await _enqueue(database, "commits_then_fails", [{}])
    await _enqueue(database, "count", [{"n": i} for i in range(5, 10)])
    async with job_app(database) as app:
        result = await app.drain(commit_mode=mode)
    assert (result.stats["processed"], result.stats["failed"]) == (10, 1)
    rows = {r["job_type"]: r for r in await job_rows(database)}
    assert rows["commits_then_fails"]["status"] == "failed"
    assert rows["commits_then_fails"]["error_message"] == "RuntimeError: failed after committing"
    log = await scalar(database, select(func.count()).select_from(testjobs.job_log))
    assert log == 10  # the counter jobs' rows, once each; none of the failed job's
    assert await scalar(database, select(testjobs.counter.c.n)) == 10


async def test_a_worker_that_loses_its_lock_connection_stops(database: Database) -> None:
    async with job_app(database) as app:
        drainer = app.drainer(heartbeat_interval=0.05, poll_interval=0.05)
        working = asyncio.create_task(drainer.work())
        await eventually(lambda: _state_is(drainer, "active"), timeout=10)
        # What a server does to a connection whose peer vanished (keepalives) or an admin does.
        async with database.connect() as conn:
            killed = await conn.scalar(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = 'cronlock-drainer:default' "
                    "AND datname = current_database()"  # the server is shared: ours only
                )
            )
        assert killed == 1
        result = await asyncio.wait_for(working, 10)
    assert result.status is RunStatus.FAILED
    assert result.error is not None and result.error.startswith("lost the drainer lock")


async def _state_is(drainer: object, state: str) -> bool:
    return getattr(drainer, "state", None) == state
