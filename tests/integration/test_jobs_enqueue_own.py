"""Enqueueing on the app's Database instead of a caller's transaction: committed on its own."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg
import pytest
from jobsupport import job_app, job_rows
from pgbouncer import running_pgbouncer
from sqlalchemy import event, text
from testapps import jobs as testjobs
from waiting import eventually

from cronlock import Database, InvalidPayload, UnknownJobType, schema
from cronlock.sql.tables import jobs_channel


@contextmanager
def statements_sent(database: Database) -> Iterator[list[str]]:
    """Every statement asyncpg sends on the connections ``database``'s pool opens from now."""
    sent: list[str] = []

    def log(record: Any) -> None:
        sent.append(record.query.split()[0].rstrip(";").upper())

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(log)

    event.listen(database.engine.sync_engine, "connect", on_connect)
    try:
        yield sent
    finally:
        event.remove(database.engine.sync_engine, "connect", on_connect)


async def logged(sent: list[str], expected: list[str]) -> None:
    """asyncpg calls its query loggers soon after each query: wait for them, then compare."""

    async def enough() -> bool:
        return len(sent) >= len(expected)

    await eventually(enough)
    assert sent == expected
    sent.clear()


def _plain(url: Any) -> str:
    return str(url.set(drivername="postgresql"))


async def _idle_in_transaction(database: Database) -> int:
    async with database.connect() as conn:
        count: int = await conn.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND state LIKE 'idle in transaction%'"
            )
        )
        return count


async def test_enqueue_on_the_database_is_committed_when_it_returns(database: Database) -> None:
    received: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(_plain(database.url))
    try:
        await listener.add_listener(
            jobs_channel("cronlock"), lambda *args: received.put_nowait(args[3])
        )
        async with job_app(database) as app:
            answer = await app.enqueue("echo", {"to": "a@example.com"}, priority=2)
            # Visible to another connection the moment enqueue returns: nothing left to commit.
            [row] = await job_rows(database)
            assert await asyncio.wait_for(received.get(), 10) == "default"
            assert await _idle_in_transaction(app.database) == 0
    finally:
        await listener.close()
    assert answer.created and type(answer.id) is uuid.UUID
    assert row["id"] == answer.id
    assert row["payload"] == {"to": "a@example.com"}
    assert (row["priority"], row["status"]) == (2, "pending")


async def test_one_statement_per_job_and_a_transaction_for_dedup_keys(database: Database) -> None:
    async with job_app(database) as app:
        with statements_sent(app.database) as sent:
            await app.enqueue("noop", {"n": -1})
            # The first dedup-key enqueue on a connection also sends the driver's own queries
            # (asyncpg looks up the array types of that path's INSERT): once, before counting.
            await app.enqueue("noop", {"n": -2}, dedup_key="first")

            async def inserted() -> bool:
                return sent[-2:] == ["INSERT", "COMMIT"]

            await eventually(inserted)
            sent.clear()  # the dialect's first-connect queries, then those statements
            for n in range(3):
                await app.enqueue("noop", {"n": n})
            await logged(sent, ["INSERT"] * 3)
            await app.enqueue("noop", {}, dedup_key="k")
            await logged(sent, ["BEGIN", "INSERT", "COMMIT"])
    assert len(await job_rows(database)) == 6


async def test_enqueue_many_on_the_database_with_dedup_keys(database: Database) -> None:
    async with job_app(database) as app:
        held = await app.enqueue("noop", {"n": 0}, dedup_key="k1")
        answers = await app.enqueue_many(
            "noop", [{"n": 1}, {"n": 2}, {"n": 3}], dedup_keys=["k1", None, "k2"]
        )
    assert [a.created for a in answers] == [False, True, True]
    assert answers[0].id == held.id and type(answers[0].id) is uuid.UUID
    rows = await job_rows(database)
    assert sorted(row["payload"]["n"] for row in rows) == [0, 2, 3]


async def test_dedup_on_the_database_holds_under_concurrent_enqueues(database: Database) -> None:
    async with job_app(database) as app:
        answers = await asyncio.gather(
            *(app.enqueue("noop", {}, dedup_key="once") for _ in range(8))
        )
    [row] = await job_rows(database)
    assert {a.id for a in answers} == {row["id"]}
    assert sum(a.created for a in answers) == 1


async def test_bad_input_on_the_database_writes_nothing(database: Database) -> None:
    async with job_app(database) as app:
        with pytest.raises(UnknownJobType):
            await app.enqueue("nope", {})
        with pytest.raises(InvalidPayload):
            await app.enqueue_many("noop", [{}, {"x": float("nan")}])
    assert await job_rows(database) == []


async def test_a_cancelled_enqueue_writes_nothing_and_leaves_the_pool_usable(
    database: Database,
) -> None:
    blocker = await asyncpg.connect(_plain(database.url))
    try:
        async with job_app(database) as app:
            blocked = blocker.transaction()
            await blocked.start()
            await blocker.execute("LOCK TABLE cronlock.jobs IN EXCLUSIVE MODE")
            task = asyncio.create_task(app.enqueue("noop", {"n": 1}))

            async def waiting() -> bool:
                count = await blocker.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted "
                    "AND relation = 'cronlock.jobs'::regclass"
                )
                return bool(count)

            await eventually(waiting)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await blocked.rollback()
            await app.enqueue("noop", {"n": 2})
            assert await _idle_in_transaction(app.database) == 0
    finally:
        await blocker.close()
    assert [row["payload"] for row in await job_rows(database)] == [{"n": 2}]


async def test_enqueue_on_a_database_with_its_own_schema(empty_database: Database) -> None:
    migrated = Database(empty_database.url, schema="jobs_here")
    try:
        await schema.upgrade(migrated)
    finally:
        # Undisposed, its pooled connection would outlive the test and warn (ResourceWarning)
        # in whichever test runs when the garbage collector finds it.
        await migrated.dispose()
    app = testjobs.create_app()
    app.use_database(str(empty_database.url), schema="jobs_here")
    try:
        answer = await app.enqueue("noop", {"n": 1})
        again = await app.enqueue("noop", {}, dedup_key="k")
        assert (await app.enqueue("noop", {}, dedup_key="k")).id == again.id
    finally:
        await app.aclose()
    async with empty_database.connect() as conn:
        ids = (await conn.execute(text("SELECT id FROM jobs_here.jobs"))).scalars().all()
    assert set(ids) == {answer.id, again.id}


async def test_enqueue_on_the_database_through_pgbouncer(database: Database) -> None:
    with running_pgbouncer(database.url, pool_size=1) as bouncer:
        async with job_app(database) as app:
            app.use_database(bouncer.render_as_string(hide_password=False), pgbouncer=True)
            for n in range(20):
                await app.enqueue("noop", {"n": n})
            first = await app.enqueue("noop", {}, dedup_key="k")
            second = await app.enqueue("noop", {}, dedup_key="k")
    assert first.created and not second.created and second.id == first.id
    assert len(await job_rows(database)) == 21
