"""Enqueueing: in the caller's transaction, one or many, options, dedup keys, bad input."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from jobsupport import job_app, job_rows, scalar
from sqlalchemy import func, select, text

from cronlock import (
    Database,
    InvalidJobOption,
    InvalidPayload,
    UnknownJobType,
)
from cronlock.sql.tables import jobs


async def test_enqueue_commits_with_the_callers_transaction(database: Database) -> None:
    async with job_app(database) as app, database.session() as session:
        enqueued = await app.enqueue_tx(session, "echo", {"to": "a@example.com"}, priority=5)
        assert enqueued.created
        # Not visible to others before the caller commits.
        assert await job_rows(database) == []
        await session.commit()

    [row] = await job_rows(database)
    assert row["id"] == enqueued.id
    assert row["payload"] == {"to": "a@example.com"}
    assert (row["status"], row["priority"], row["queue"]) == ("pending", 5, "default")
    assert row["max_retries"] == 3  # the handler's default
    assert row["error_history"] == []


async def test_enqueue_rolled_back_with_the_caller_leaves_no_job(database: Database) -> None:
    async with job_app(database) as app:
        async with database.connect() as conn:
            await app.enqueue_tx(conn, "echo", {"n": 1})
            await conn.rollback()
        async with database.session() as session:
            await app.enqueue_tx(session, "echo", {"n": 2})
            with pytest.raises(Exception, match="division by zero"):
                await session.execute(text("SELECT 1/0"))
            await session.rollback()
    assert await job_rows(database) == []


async def test_enqueue_many_in_one_statement(database: Database) -> None:
    async with job_app(database) as app, database.session() as session:
        answers = await app.enqueue_many_tx(
            session, "noop", [{"n": i} for i in range(10_000)], queue="bulk", max_retries=1
        )
        await session.commit()
    assert len({a.id for a in answers}) == 10_000
    count = await scalar(
        database, select(func.count()).select_from(jobs).where(jobs.c.queue == "bulk")
    )
    assert count == 10_000


async def test_delay_and_run_at(database: Database) -> None:
    moment = datetime(2030, 1, 1, tzinfo=UTC)
    async with job_app(database) as app, database.session() as session:
        later = await app.enqueue_tx(session, "noop", None, delay=timedelta(hours=1))
        fixed = await app.enqueue_tx(session, "noop", None, run_at=moment)
        now = await app.enqueue_tx(session, "noop", None)
        await session.commit()
    rows = {row["id"]: row for row in await job_rows(database)}
    gap = rows[later.id]["run_at"] - rows[now.id]["run_at"]
    assert timedelta(minutes=59) < gap < timedelta(minutes=61)
    assert rows[fixed.id]["run_at"] == moment


async def test_dedup_key_returns_the_waiting_job(database: Database) -> None:
    async with job_app(database) as app, database.session() as session:
        first = await app.enqueue_tx(session, "noop", {"n": 1}, dedup_key="user-7")
        second = await app.enqueue_tx(session, "noop", {"n": 2}, dedup_key="user-7")
        many = await app.enqueue_many_tx(
            session, "noop", [{}, {}, {}], dedup_keys=["user-7", "user-8", "user-8"]
        )
        await session.commit()
    assert first.created and not second.created and second.id == first.id
    assert many[0].id == first.id and not many[0].created
    assert many[1].created and not many[2].created and many[2].id == many[1].id
    assert second.to_dict()["deduplicated"] is True
    assert len(await job_rows(database)) == 2

    # Once the job is no longer waiting, the key is free again.
    async with database.engine.begin() as conn:
        await conn.execute(jobs.update().where(jobs.c.id == first.id).values(status="completed"))
    async with job_app(database) as app, database.session() as session:
        third = await app.enqueue_tx(session, "noop", {"n": 3}, dedup_key="user-7")
        await session.commit()
    assert third.created and third.id != first.id


async def test_dedup_key_holds_under_concurrent_enqueues(database: Database) -> None:
    async with job_app(database) as app:
        start = asyncio.Event()

        async def enqueue_one() -> object:
            async with database.session() as session:
                await start.wait()
                answer = await app.enqueue_tx(session, "noop", {}, dedup_key="once")
                await session.commit()
                return answer

        tasks = [asyncio.create_task(enqueue_one()) for _ in range(8)]
        await asyncio.sleep(0)
        start.set()
        answers = await asyncio.gather(*tasks)

    rows = await job_rows(database)
    assert len(rows) == 1
    assert {a.id for a in answers} == {rows[0]["id"]}  # type: ignore[attr-defined]
    assert sum(a.created for a in answers) == 1  # type: ignore[attr-defined]


def _nested(depth: int) -> list[object]:
    outer: list[object] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    return outer


@pytest.mark.parametrize(
    ("job_type", "payload", "options", "error", "message"),
    [
        ("nope", {}, {}, UnknownJobType, "no handler registered for job type 'nope'"),
        ("noop", {"x": object()}, {}, InvalidPayload, "the payload is not JSON"),
        ("noop", {"x": float("nan")}, {}, InvalidPayload, "not JSON"),
        ("noop", ["a", "list"], {}, InvalidPayload, "must be a JSON object, not list"),
        ("noop", "text", {}, InvalidPayload, "must be a JSON object, not str"),
        ("noop", {"x": "a\x00b"}, {}, InvalidPayload, "NUL character"),
        ("noop", {"a\x00": 1}, {}, InvalidPayload, "NUL character"),
        ("noop", {"x": "\ud800"}, {}, InvalidPayload, "lone surrogate"),
        ("noop", {"x": _nested(5000)}, {}, InvalidPayload, "nested too deeply"),
        ("noop", {"x": b"bytes"}, {}, InvalidPayload, "bytes is not JSON serializable"),
        ("noop", {}, {"delay": 1e15}, InvalidJobOption, "delay must be at most"),
        ("noop", {}, {"delay": "5"}, InvalidJobOption, "delay must be a number"),
        ("noop", {}, {"run_at": "2030-01-01T00:00:00Z"}, InvalidJobOption, "must be a datetime"),
        ("noop", {}, {"dedup_key": "k" * 201}, InvalidJobOption, "1 to 200 characters"),
        ("noop", {}, {"dedup_key": ""}, InvalidJobOption, "1 to 200 characters"),
        ("noop", {}, {"delay": -1}, InvalidJobOption, "delay must not be negative"),
        ("noop", {}, {"max_retries": 10**6}, InvalidJobOption, "max_retries must be between"),
        ("noop", {}, {"max_retries": -1}, InvalidJobOption, "max_retries must be between"),
        ("noop", {}, {"priority": 2**40}, InvalidJobOption, "priority must be an integer"),
        ("noop", {}, {"queue": ""}, InvalidJobOption, "invalid queue name"),
        ("noop", {}, {"run_at": datetime(2030, 1, 1)}, InvalidJobOption, "timezone-aware"),
    ],
)
async def test_bad_input_is_a_clear_error_and_writes_nothing(
    database: Database,
    job_type: str,
    payload: object,
    options: dict[str, object],
    error: type[Exception],
    message: str,
) -> None:
    async with job_app(database) as app, database.session() as session:
        with pytest.raises(error, match=message):
            await app.enqueue_tx(session, job_type, payload, **options)  # type: ignore[arg-type]
        await session.commit()
    assert await job_rows(database) == []


async def test_plain_sql_insert_uses_server_defaults_and_notifies(database: Database) -> None:
    import asyncpg

    from cronlock.sql.tables import jobs_channel

    received: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(str(database.url.set(drivername="postgresql")))
    try:
        await listener.add_listener(
            jobs_channel("cronlock"), lambda *args: received.put_nowait(args[3])
        )
        async with database.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO cronlock.jobs (job_type, payload) "
                    "SELECT 'noop', jsonb_build_object('n', i) FROM generate_series(1, 50) i"
                )
            )
        assert await asyncio.wait_for(received.get(), 10) == "default"
        assert received.empty()  # one notification for the whole statement
    finally:
        await listener.close()
    rows = await job_rows(database)
    assert len(rows) == 50
    assert {(r["status"], r["queue"], r["priority"], r["retry_count"]) for r in rows} == {
        ("pending", "default", 0, 0)
    }
