"""run.item(): a savepoint per item on the driver, with the ORM session kept consistent.

Each test registers a task on its own app and runs it by hand against its own database: what
the items committed is read back on another connection, what the session holds is checked in
the task itself (a later item of the same run).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from itemsupport import count
from sqlalchemy import Integer, func, insert, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import cronlock
from cronlock import App, Database, RunResult, RunStatus


class Base(DeclarativeBase):
    pass


class Row(Base):
    __tablename__ = "item_rows"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    n: Mapped[int] = mapped_column(Integer, default=0)


rows = Base.metadata.tables["item_rows"]


@asynccontextmanager
async def _app(database: Database) -> AsyncIterator[App]:
    async with database.engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    app = App()
    app.use_database(str(database.url))
    try:
        yield app
    finally:
        await app.aclose()


async def _run(database: Database, body: Callable[[cronlock.Run], Awaitable[None]]) -> RunResult:
    async with _app(database) as app:
        app.periodic("items", cron="* * * * *")(body)
        return await app.run("items", manual=True)


async def _ids(database: Database) -> list[tuple[int, int]]:
    async with database.connect() as conn:
        result = await conn.execute(select(rows.c.id, rows.c.n).order_by(rows.c.id))
        return [(i, n) for i, n in result]


class Bad(Exception):
    pass


async def test_an_object_changed_in_a_failed_item_shows_the_database_value_later(
    database: Database,
) -> None:
    seen: list[int] = []

    async def body(run: cronlock.Run) -> None:
        async with run.item("add"):
            run.session.add(Row(id=1, n=1))
        row = await run.session.get_one(Row, 1)
        async with run.item("unflushed change"):
            row.n = 2
            raise Bad("before any flush")
        async with run.item("flushed change"):
            row.n = 3
            await run.session.flush()
            raise Bad("after the flush")
        async with run.item("read"):
            # The same identity, reloaded: neither 2 nor 3 stayed in the session.
            again = await run.session.scalar(select(Row).where(Row.id == 1))
            assert again is row
            seen.append(again.n)
            again.n += 10

    result = await _run(database, body)

    assert result.status is RunStatus.PARTIAL
    assert (result.items_ok, result.items_failed) == (2, 2)
    assert seen == [1]
    assert await _ids(database) == [(1, 11)]


async def test_an_object_added_in_a_failed_item_is_not_written_later(database: Database) -> None:
    async def body(run: cronlock.Run) -> None:
        unflushed, flushed = Row(id=1), Row(id=2)
        async with run.item("unflushed"):
            run.session.add(unflushed)
            raise Bad("before any flush")
        async with run.item("flushed"):
            run.session.add(flushed)
            await run.session.flush()
            raise Bad("after the flush")
        assert unflushed not in run.session
        assert flushed not in run.session
        async with run.item("later"):
            run.session.add(Row(id=3))  # its flush would take the others along if pending

    result = await _run(database, body)

    assert (result.items_ok, result.items_failed) == (1, 2)
    assert await _ids(database) == [(3, 0)]


async def test_a_deletion_in_a_failed_item_is_undone(database: Database) -> None:
    async def body(run: cronlock.Run) -> None:
        async with run.item("add"):
            run.session.add(Row(id=1))
        row = await run.session.get_one(Row, 1)
        async with run.item("delete"):
            await run.session.delete(row)
            raise Bad("before any flush")
        async with run.item("later"):
            run.session.add(Row(id=2))
            await run.session.flush()
            assert (await run.session.get_one(Row, 1)).n == 0

    result = await _run(database, body)

    assert (result.items_ok, result.items_failed) == (2, 1)
    assert await _ids(database) == [(1, 0), (2, 0)]


async def test_a_failed_flush_rolls_back_its_item_only(database: Database) -> None:
    async def body(run: cronlock.Run) -> None:
        async with run.item("core"):
            await run.session.execute(insert(rows).values(id=9))
        for item in (1, 2, 9, 3):  # 9 is a duplicate key, caught at the item's flush
            async with run.item(item):
                run.session.add(Row(id=item, n=item))
        async with run.item("after"):
            (await run.session.get_one(Row, 3)).n = 30

    result = await _run(database, body)

    assert result.status is RunStatus.PARTIAL
    assert (result.items_ok, result.items_failed) == (5, 1)
    assert [(f.item, f.error_type) for f in result.failures] == [("9", "UniqueViolationError")]
    assert await _ids(database) == [(1, 1), (2, 2), (3, 30), (9, 0)]


async def test_core_statement_failure_rolls_back_its_item_only(database: Database) -> None:
    async def body(run: cronlock.Run) -> None:
        for item in range(1, 6):
            async with run.item(item):
                await run.session.execute(insert(rows).values(id=item))
                if item == 3:
                    await run.session.execute(text("SELECT 1/0"))

    result = await _run(database, body)

    assert (result.items_ok, result.items_failed) == (4, 1)
    assert result.failures[0].error_type == "DivisionByZeroError"
    assert await _ids(database) == [(1, 0), (2, 0), (4, 0), (5, 0)]


async def test_items_nest(database: Database) -> None:
    async def body(run: cronlock.Run) -> None:
        async with run.item("outer ok"):
            await run.session.execute(insert(rows).values(id=1))
            async with run.item("inner fails"):
                await run.session.execute(insert(rows).values(id=2))
                raise Bad("inner")
            async with run.item("inner ok"):
                await run.session.execute(insert(rows).values(id=3))
            await run.session.execute(insert(rows).values(id=4))
        async with run.item("outer fails"):
            async with run.item("inner ok, then its outer fails"):
                await run.session.execute(insert(rows).values(id=5))
                async with run.item("innermost ok"):
                    run.session.add(Row(id=6))
            raise Bad("outer")
        async with run.item("last"):
            await run.session.execute(insert(rows).values(id=7))

    result = await _run(database, body)

    assert result.status is RunStatus.PARTIAL
    # Every item counts once, also an inner one whose outer item then failed.
    assert (result.items_ok, result.items_failed) == (5, 2)
    assert [f.item for f in result.failures] == ["inner fails", "outer fails"]
    assert await _ids(database) == [(1, 0), (3, 0), (4, 0), (7, 0)]


async def test_the_task_may_open_savepoints_inside_an_item(database: Database) -> None:
    async def body(run: cronlock.Run) -> None:
        async with run.item("closes its own"):
            async with run.session.begin_nested():
                await run.session.execute(insert(rows).values(id=1))
            try:
                async with run.session.begin_nested():
                    run.session.add(Row(id=1))  # duplicate: its own savepoint rolls back
            except IntegrityError:
                pass
            run.session.add(Row(id=2))
        async with run.item("leaves one open, succeeds"):
            await run.session.begin_nested()
            run.session.add(Row(id=3))
        async with run.item("leaves one open, fails"):
            await run.session.begin_nested()
            run.session.add(Row(id=4))
            await run.session.flush()
            raise Bad("inside the task's savepoint")
        async with run.item("later"):
            assert run.session.in_nested_transaction()  # the run's own body savepoint
            run.session.add(Row(id=5))

    result = await _run(database, body)

    assert (result.items_ok, result.items_failed) == (3, 1)
    assert await _ids(database) == [(1, 0), (2, 0), (3, 0), (5, 0)]


async def test_items_inside_a_savepoint_of_the_task(database: Database) -> None:
    async def body(run: cronlock.Run) -> None:
        async with run.item(1):
            await run.session.execute(insert(rows).values(id=1))
        # The first item's RELEASE may still be held back: this savepoint opens after it.
        async with run.session.begin_nested():
            async with run.item(2):
                await run.session.execute(insert(rows).values(id=2))
            async with run.item(3):
                await run.session.execute(insert(rows).values(id=3))
                raise Bad("three")
        nested = await run.session.begin_nested()
        async with run.item(4):
            await run.session.execute(insert(rows).values(id=4))
        await nested.rollback()
        async with run.item(5):
            await run.session.execute(insert(rows).values(id=5))

    result = await _run(database, body)

    assert (result.items_ok, result.items_failed) == (4, 1)
    assert await _ids(database) == [(1, 0), (2, 0), (5, 0)]


async def test_many_items_commit_with_the_run(database: Database) -> None:
    async def body(run: cronlock.Run) -> None:
        for item in range(1, 201):
            async with run.item(item):
                await run.session.execute(insert(rows).values(id=item, n=item))
                if item % 50 == 0:
                    raise Bad(str(item))

    result = await _run(database, body)

    assert (result.items_ok, result.items_failed) == (196, 4)
    assert await count(database, rows) == 196
    async with database.connect() as conn:
        total = (await conn.execute(select(func.sum(rows.c.n)))).scalar_one()
    assert total == sum(range(1, 201)) - (50 + 100 + 150 + 200)


async def test_a_connection_lost_inside_an_item_fails_the_run(database: Database) -> None:
    async def body(run: cronlock.Run) -> None:
        async with run.item(1):
            await run.session.execute(insert(rows).values(id=1))
        async with run.item(2):
            await run.session.execute(insert(rows).values(id=2))
            await run.session.execute(select(func.pg_terminate_backend(func.pg_backend_pid())))
        async with run.item(3):  # never reached: the failed item's rollback raised
            await run.session.execute(insert(rows).values(id=3))

    result = await _run(database, body)

    assert result.status is RunStatus.FAILED
    assert result.items_ok == 0
    assert await count(database, rows) == 0
