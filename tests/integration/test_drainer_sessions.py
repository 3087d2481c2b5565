"""The drainer's hot path: sessions handed on between jobs, and the outcome statements
(JOB_COMPLETE_ONE, JOB_COMPLETE_MANY, JOB_FINISH_MANY for a batch that mixes outcomes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from jobsupport import job_rows, scalar
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from cronlock import App, CommitMode, Database, RunStatus


@asynccontextmanager
async def _app(database: Database) -> AsyncIterator[tuple[App, list[tuple[str, Any]]]]:
    """An app whose handlers record the session each job got, and whether it was clean."""
    async with database.engine.begin() as conn:
        await conn.execute(text("CREATE TABLE session_log (job text NOT NULL)"))
    seen: list[tuple[str, Any]] = []
    app = App()

    def clean(session: AsyncSession) -> bool:
        return not (session.in_transaction() or session.identity_map or session.new or session.info)

    @app.job("look")
    async def look(session: AsyncSession, payload: Any) -> None:
        assert clean(session)
        seen.append((payload["name"], session))

    @app.job("write")
    async def write(session: AsyncSession, payload: Any) -> None:
        assert clean(session)
        seen.append((payload["name"], session))
        await session.execute(text("INSERT INTO session_log VALUES (:job)"), {"job": "write"})

    @app.job("stash")
    async def stash(session: AsyncSession, payload: Any) -> None:
        assert clean(session)
        seen.append((payload["name"], session))
        session.info["left"] = "behind"

    @app.job("fail", max_retries=0)
    async def fail(session: AsyncSession, payload: Any) -> None:
        assert clean(session)
        seen.append((payload["name"], session))
        raise ValueError("no")

    @app.job("result")
    async def result(session: AsyncSession, payload: Any) -> Any:
        return {"n": payload["n"]}

    @app.job("once_then_ok", max_retries=1)
    async def once_then_ok(session: AsyncSession, payload: Any) -> Any:
        await session.execute(text("INSERT INTO session_log VALUES (:job)"), {"job": "once"})
        if not payload.get("ok"):
            raise RuntimeError("first attempt")
        return "ok"

    app.use_database(str(database.url))
    try:
        yield app, seen
    finally:
        await app.aclose()


async def _enqueue_in_order(app: App, jobs: list[tuple[str, dict[str, Any]]]) -> None:
    """One job each, claimed in this order (priority first)."""
    async with app.database.session() as session:
        for priority, (job_type, payload) in enumerate(reversed(jobs)):
            await app.enqueue_tx(session, job_type, payload, priority=priority)
        await session.commit()


@pytest.mark.parametrize("mode", list(CommitMode))
async def test_an_untouched_session_goes_to_the_next_job_and_a_used_one_never(
    database: Database, mode: CommitMode
) -> None:
    async with _app(database) as (app, seen):
        order = ["a", "b", "c", "d", "e", "f", "g", "h"]
        types = ["look", "look", "write", "look", "stash", "look", "fail", "look"]
        await _enqueue_in_order(app, [(t, {"name": n}) for t, n in zip(types, order, strict=True)])
        result = await app.drain(commit_mode=mode, batch_size=len(order))

    assert (result.stats["processed"], result.stats["failed"]) == (7, 1)
    assert [name for name, _ in seen] == order
    session = dict(seen)
    assert session["a"] is session["b"] is session["c"]  # untouched, then used by c
    assert session["d"] is not session["c"]  # c used it: d gets a fresh one
    assert session["e"] is session["d"]
    assert session["f"] is not session["e"]  # e left something in info
    assert session["g"] is session["f"]
    assert session["h"] is not session["g"]  # g failed: never handed on
    assert await scalar(database, select(func.count()).select_from(text("session_log"))) == 1


async def test_a_batch_mixing_outcomes_writes_each_row(database: Database) -> None:
    clock_now = datetime.now(UTC) + timedelta(minutes=1)  # the jobs are due

    def clock() -> datetime:
        return clock_now

    async with _app(database) as (app, _):
        await _enqueue_in_order(
            app,
            [
                ("result", {"n": 1}),
                ("once_then_ok", {}),
                ("fail", {"name": "x"}),
                ("result", {"n": 2}),
            ],
        )
        first = await app.drain(commit_mode="batch", clock=clock)
        rows = {(r["job_type"], r["payload"].get("n")): r for r in await job_rows(database)}

        assert first.status is RunStatus.PARTIAL
        assert (first.stats["processed"], first.stats["retried"], first.stats["failed"]) == (
            2,
            1,
            1,
        )
        for n in (1, 2):
            done = rows[("result", n)]
            assert done["status"] == "completed"
            assert done["result"] == {"n": n}
            assert done["started_at"] == done["completed_at"] == clock_now
            assert done["next_retry_at"] is None and done["error_message"] is None
        retrying = rows[("once_then_ok", None)]
        assert retrying["status"] == "retrying" and retrying["retry_count"] == 1
        assert retrying["error_message"] == "RuntimeError: first attempt"
        assert retrying["next_retry_at"] == retrying["run_at"] > clock_now
        assert retrying["completed_at"] is None
        failed = rows[("fail", None)]
        assert failed["status"] == "failed" and failed["error_message"] == "ValueError: no"
        assert failed["completed_at"] == clock_now
        # The failed attempt's insert rolled back to its savepoint.
        assert await scalar(database, select(func.count()).select_from(text("session_log"))) == 0

        # The retry succeeds in a batch of successes only (JOB_COMPLETE_MANY): the error
        # history and retry count stay, next_retry_at is cleared.
        async with database.engine.begin() as conn:
            await conn.execute(text("UPDATE cronlock.jobs SET payload = '{\"ok\": true}'"))
        clock_now += timedelta(hours=1)
        await _enqueue_in_order(app, [("result", {"n": 3})])
        second = await app.drain(commit_mode="batch", clock=clock)

    assert second.stats["processed"] == 2
    [retried] = await job_rows(database, job_type="once_then_ok")
    assert retried["status"] == "completed" and retried["result"] == "ok"
    assert retried["retry_count"] == 1 and len(retried["error_history"]) == 1
    assert retried["error_message"] == "RuntimeError: first attempt"
    assert retried["next_retry_at"] is None
    assert retried["completed_at"] == clock_now
    assert await scalar(database, select(func.count()).select_from(text("session_log"))) == 1


async def test_a_batch_of_successes_records_the_databases_times(database: Database) -> None:
    """JOB_COMPLETE_MANY is sent no times: each row's started_at is its batch's claim (one
    transaction's now(), the same for the batch) and its completed_at the outcome statement's
    clock, after every handler of the batch ran and before the drain returned."""
    ran: dict[int, datetime] = {}
    app = App()

    @app.job("stamp")
    async def stamp(_session: AsyncSession, payload: Any) -> None:
        ran[payload["n"]] = datetime.now(UTC)

    app.use_database(str(database.url))
    try:
        await _enqueue_in_order(app, [("stamp", {"n": n}) for n in range(20)])
        before = datetime.now(UTC)
        result = await app.drain(commit_mode="batch", batch_size=20)
        after = datetime.now(UTC)
    finally:
        await app.aclose()

    assert result.stats["processed"] == 20
    rows = sorted(await job_rows(database), key=lambda r: r["payload"]["n"])
    assert [r["status"] for r in rows] == ["completed"] * 20
    assert len({r["started_at"] for r in rows}) == 1  # one claim
    last_ran = max(ran.values())
    for row in rows:
        assert row["created_at"] <= row["started_at"]
        assert before <= row["started_at"] <= ran[row["payload"]["n"]]
        assert last_ran <= row["completed_at"] <= after


async def test_strict_mode_writes_one_success_with_its_own_statement(database: Database) -> None:
    async with _app(database) as (app, _):
        await _enqueue_in_order(app, [("result", {"n": n}) for n in range(7)])
        result = await app.drain()  # strict: JOB_COMPLETE_ONE, past its first 5 (custom) plans

    assert result.stats["processed"] == 7
    rows = await job_rows(database)
    assert sorted(r["result"]["n"] for r in rows) == list(range(7))
    assert all(r["status"] == "completed" and r["next_retry_at"] is None for r in rows)
    assert all(r["started_at"] <= r["completed_at"] for r in rows)


async def test_the_lock_transaction_idles_without_a_snapshot(database: Database) -> None:
    """The drainer's lock transaction idles for the whole drain: holding a snapshot there would
    pin the database's xmin horizon, so that no job completed meanwhile could be marked dead in
    the claim's index and every claim would visit all of them again."""
    seen: list[tuple[int, int]] = []
    async with _app(database) as (app, _):

        @app.job("lock_xmin")
        async def lock_xmin(session: AsyncSession, payload: Any) -> None:
            row = await session.execute(
                text(
                    "SELECT count(*) FILTER (WHERE backend_xmin IS NOT NULL), count(*) "
                    "FROM pg_stat_activity WHERE application_name = 'cronlock-drainer:default' "
                    "AND datname = current_database()"
                )
            )
            seen.append(tuple(row.one()))

        await _enqueue_in_order(app, [("lock_xmin", {})])
        result = await app.drain()

    assert result.stats["processed"] == 1
    assert seen == [(0, 1)]  # the lock connection is there, with no snapshot
