"""Issue 13, point 6: a job's times come from one clock, the database's.

The worker's clock is frozen an hour ahead (freezegun, ticking, the event loop's own clock left
real): the rows' started_at and completed_at still fall between two readings of the database's
clock around the drain, in order after created_at, in every commit mode, and what is read from
them (the drain's end-to-end latency, ``cronlock_job_latency_seconds``) has no hour in it. A
retry's and a snooze's due time and the error history's times are the database's clock too:
the worker sends how long to wait, never when.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from freezegun import freeze_time
from jobsupport import job_rows
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from cronlock import App, Backoff, CommitMode, Database, JobSnooze
from cronlock.http import create_api

SKEW = timedelta(hours=1)


@asynccontextmanager
async def _app(database: Database) -> AsyncIterator[App]:
    app = App()

    @app.job("ok")
    async def ok(_session: AsyncSession, payload: Any) -> Any:
        return payload

    @app.job("fail", max_retries=0)
    async def fail(_session: AsyncSession, _payload: Any) -> None:
        raise ValueError("no")

    @app.job("again", max_retries=1, backoff=Backoff(base=10, jitter=0))
    async def again(_session: AsyncSession, _payload: Any) -> None:
        raise ValueError("not yet")

    @app.job("later")
    async def later(_session: AsyncSession, _payload: Any) -> JobSnooze:
        return JobSnooze(60)

    app.use_database(str(database.url))
    try:
        yield app
    finally:
        await app.aclose()


async def _db_now(database: Database) -> datetime:
    async with database.connect() as conn:
        moment: datetime = (await conn.execute(select(func.clock_timestamp()))).scalar_one()
    return moment


def _latency(text: str) -> tuple[float, float]:
    """cronlock_job_latency_seconds' count and sum for the default queue."""
    samples = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("queue") == "default"
    }
    return (
        samples["cronlock_job_latency_seconds_count"],
        samples["cronlock_job_latency_seconds_sum"],
    )


@pytest.mark.parametrize("mode", list(CommitMode))
async def test_started_and_completed_are_the_databases_clock_whatever_the_workers(
    database: Database, mode: CommitMode
) -> None:
    async with _app(database) as app:
        async with app.database.session() as session:
            await app.enqueue_many_tx(session, "ok", [{"n": n} for n in range(3)])
            await app.enqueue_tx(session, "fail", {})
            await app.enqueue_tx(session, "again", {})
            await app.enqueue_tx(session, "later", {})
            await session.commit()
        before = await _db_now(database)
        with freeze_time(before + SKEW, tick=True, real_asyncio=True):
            assert datetime.now(UTC) - before >= SKEW  # the worker's clock, an hour ahead
            result = await app.drain(commit_mode=mode, batch_size=10)
        after = await _db_now(database)
        transport = httpx.ASGITransport(app=create_api(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as http:
            scraped = await http.get("/metrics")

    stats = result.stats
    assert (stats["processed"], stats["failed"], stats["retried"], stats["snoozed"]) == (3, 1, 1, 1)
    rows = await job_rows(database)
    waiting = {r["job_type"]: r for r in rows if r["completed_at"] is None}
    rows = [r for r in rows if r["completed_at"] is not None]
    assert sorted(r["status"] for r in rows) == ["completed"] * 3 + ["failed"]
    # Due 10 s (the retry) and 60 s (the snooze) after the database's clock at the outcome.
    retrying, snoozed = waiting["again"], waiting["later"]
    assert (retrying["status"], snoozed["status"]) == ("retrying", "pending")
    for row, delay in ((retrying, 10), (snoozed, 60)):
        wait = timedelta(seconds=delay)
        assert before + wait <= row["run_at"] <= after + wait, row
        [entry] = row["error_history"]
        assert before <= datetime.fromisoformat(entry["at"]) <= after, entry
    assert retrying["next_retry_at"] == retrying["run_at"]
    assert datetime.fromisoformat(snoozed["error_history"][0]["until"]) == snoozed["run_at"]
    [failed] = [r for r in rows if r["status"] == "failed"]
    assert before <= datetime.fromisoformat(failed["error_history"][0]["at"]) <= after
    for row in rows:
        assert row["created_at"] <= row["started_at"] <= row["completed_at"], row
        assert before <= row["started_at"] and row["completed_at"] <= after, row
    if mode is CommitMode.BATCH:  # one claim, one transaction: its now() for every row
        assert len({r["started_at"] for r in rows}) == 1
    # Read from the rows or on one clock: no hour of skew in either (the longest a job of this
    # test can have waited is from the first enqueue to the drain's end).
    waited = (after - min(r["created_at"] for r in rows)).total_seconds()
    assert 0 < result.stats["end_to_end_latency_ms"]["max"] < waited * 1000 + 100
    count, total = _latency(scraped.text)
    assert count == 3 and 0 < total <= 3 * waited
