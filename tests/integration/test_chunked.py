"""Chunked runs (``commit_every``): chunks commit as the run goes, under a lock held by a guard
connection with no transaction id and no snapshot; one run per slot; what a crash leaves.

Each test runs its task in this process (``asyncio`` tasks) or, where the process is the point
(SIGKILL), in a ``cronlock run`` of its own; what the run committed is read on other
connections while it runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cli import invoke_async, start_cli
from itemsupport import count, create_scratch
from pgbouncer import running_pgbouncer
from sqlalchemy import select, text
from testapps import chunked, items
from waiting import eventually, wait_for

import cronlock
from cronlock import App, ConfigurationError, Database, RunStatus, SkipReason
from cronlock.demo import lock_holders
from cronlock.sql.tables import runs

SLOT = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)

# One row per item, with the id of the (top-level) transaction that committed it: the rows
# per transaction are the writing item savepoints each transaction held, counted by the
# server (an item's write takes a subtransaction id, inside the transaction whose id
# pg_current_xact_id() returns).
CHUNK_ROWS = """
CREATE TABLE chunk_rows (
    item integer PRIMARY KEY,
    xact bigint NOT NULL DEFAULT (pg_current_xact_id()::text::bigint)
)"""


@asynccontextmanager
async def _app(database: Database, url: str | None = None, **options: Any) -> AsyncIterator[App]:
    async with database.engine.begin() as conn:
        await conn.execute(text(CHUNK_ROWS))
    app = App()
    app.use_database(url or str(database.url), **options)
    try:
        yield app
    finally:
        await app.aclose()


async def _insert(run: cronlock.Run, item: int) -> None:
    await run.session.execute(
        text("INSERT INTO chunk_rows (item) VALUES (:item) ON CONFLICT DO NOTHING"), {"item": item}
    )


async def _rows(database: Database) -> int:
    async with database.connect() as conn:
        return int(await conn.scalar(text("SELECT count(*) FROM chunk_rows")) or 0)


async def _per_transaction(database: Database) -> list[int]:
    async with database.connect() as conn:
        result = await conn.execute(
            text("SELECT count(*) FROM chunk_rows GROUP BY xact ORDER BY min(item)")
        )
        return [int(n) for (n,) in result]


async def _run_row(database: Database) -> dict[str, Any]:
    async with database.connect() as conn:
        rows = (await conn.execute(select(runs).where(runs.c.status != "skipped"))).mappings()
        found = [dict(row) for row in rows]
    assert len(found) == 1, found
    return found[0]


async def _holder(database: Database, task: Any) -> tuple[int, Any, Any, str] | None:
    """The backend holding ``task``'s lock: pid, backend_xid, backend_xmin, state."""
    holders = await lock_holders(database, task)
    if len(holders) != 1:
        return None
    async with database.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT pid, backend_xid, backend_xmin, state FROM pg_stat_activity "
                    "WHERE pid = :pid"
                ),
                {"pid": holders[0]},
            )
        ).one()
    return (row.pid, row.backend_xid, row.backend_xmin, row.state)


def _declare(app: App, body: Callable[[cronlock.Run], Awaitable[None]], every: int) -> Any:
    app.periodic("chunky", cron="0 * * * *", commit_every=every)(body)
    return app.task("chunky")


async def test_chunks_commit_while_the_run_holds_its_lock_without_xid_or_snapshot(
    database: Database,
) -> None:
    resume = asyncio.Event()
    holders: list[tuple[int, Any, Any, str] | None] = []
    async with _app(database) as app:

        async def body(run: cronlock.Run) -> None:
            for item in range(50):
                if item % 10 == 0:  # at every chunk boundary, and in the middle of a chunk
                    holders.append(await _holder(database, task))
                if item == 25:
                    await resume.wait()
                async with run.item(item):
                    await _insert(run, item)
                if item == 5:
                    holders.append(await _holder(database, task))

        task = _declare(app, body, 10)
        running = asyncio.create_task(app.run("chunky", now=SLOT))
        # Two chunks committed, seen from another connection while the run waits mid-chunk.
        await eventually(lambda: _rows_are(database, 20))
        row = await _run_row(database)
        assert (row["status"], row["items_ok"], row["chunks"]) == ("running", 20, 2)
        assert row["committed_at"] is not None and row["finished_at"] is None
        committed_mid_run = row["committed_at"]

        # A second run of the task meanwhile is skipped: the lock is held.
        overlap = await app.run("chunky", now=SLOT + timedelta(seconds=1))
        assert (overlap.status, overlap.skip_reason) == (RunStatus.SKIPPED, SkipReason.LOCK_BUSY)
        holders.append(await _holder(database, task))
        resume.set()
        result = await running

    assert (result.status, result.items_ok, result.chunks) == (RunStatus.COMPLETED, 50, 5)
    assert await _per_transaction(database) == [10] * 5
    # One holder throughout, idle in its transaction with no xid and no snapshot.
    assert None not in holders
    assert len({h[0] for h in holders if h}) == 1
    assert {(h[1], h[2], h[3]) for h in holders if h} == {(None, None, "idle in transaction")}
    assert await lock_holders(database, task) == []
    row = await _run_row(database)
    assert (row["status"], row["items_ok"], row["chunks"]) == ("completed", 50, 5)
    assert row["finished_at"] is not None and row["committed_at"] > committed_mid_run


async def _rows_are(database: Database, n: int) -> bool:
    return await _rows(database) == n


async def test_a_slot_runs_once_and_the_next_one_runs(database: Database) -> None:
    async with _app(database) as app:

        async def body(run: cronlock.Run) -> None:
            for item in range(7):
                async with run.item(item):
                    await _insert(run, item)

        _declare(app, body, 3)
        first = await app.run("chunky", now=SLOT)
        again = await app.run("chunky", now=SLOT + timedelta(seconds=30))
        nxt = await app.run("chunky", now=SLOT + timedelta(hours=1))
    assert (first.status, first.items_ok, first.chunks) == (RunStatus.COMPLETED, 7, 3)
    assert (again.status, again.skip_reason) == (RunStatus.SKIPPED, SkipReason.SLOT_DONE)
    assert nxt.status is RunStatus.COMPLETED
    assert await _per_transaction(database) == [3, 3, 1]


@pytest.mark.parametrize("every", [1, 64, 100])
async def test_no_transaction_holds_more_items_than_commit_every(
    database: Database, every: int
) -> None:
    async with _app(database) as app:

        async def body(run: cronlock.Run) -> None:
            for item in range(250):
                async with run.item(item):
                    await _insert(run, item)
                    if item % 50 == 49:
                        raise ValueError("a bad item")  # rolled back: no row, no subxact

        _declare(app, body, every)
        result = await app.run("chunky", manual=True)
    assert (result.status, result.items_ok, result.items_failed) == (RunStatus.PARTIAL, 245, 5)
    # A transaction per chunk of `every` items, holding that chunk's good ones.
    chunks = [range(start, min(start + every, 250)) for start in range(0, 250, every)]
    expected = [n for n in (sum(1 for i in c if i % 50 != 49) for c in chunks) if n]
    assert await _per_transaction(database) == expected
    assert max(expected) <= every


async def test_a_body_that_raises_keeps_the_committed_chunks(database: Database) -> None:
    async with _app(database) as app:

        async def body(run: cronlock.Run) -> None:
            for item in range(25):
                async with run.item(item):
                    await _insert(run, item)
            raise RuntimeError("the body blew up")

        _declare(app, body, 10)
        result = await app.run("chunky", now=SLOT)
        again = await app.run("chunky", now=SLOT + timedelta(seconds=1))
    assert (result.status, result.items_ok, result.chunks) == (RunStatus.FAILED, 20, 2)
    assert result.error == "RuntimeError: the body blew up"
    assert await _rows(database) == 20  # the third chunk rolled back
    row = await _run_row(database)
    assert (row["status"], row["items_ok"], row["chunks"]) == ("failed", 20, 2)
    assert again.skip_reason is SkipReason.SLOT_DONE


async def test_every_item_failing_is_failed(database: Database) -> None:
    async with _app(database) as app:

        async def body(run: cronlock.Run) -> None:
            for item in range(5):
                async with run.item(item):
                    raise ValueError(f"item {item} is bad")

        _declare(app, body, 2)
        result = await app.run("chunky", manual=True)
    assert (result.status, result.items_ok, result.items_failed) == (RunStatus.FAILED, 0, 5)
    assert result.error == "all 5 items failed; the first: ValueError: item 0 is bad"
    assert (await _run_row(database))["status"] == "failed"


async def test_a_run_whose_lock_is_lost_commits_no_further_chunk(database: Database) -> None:
    cut = asyncio.Event()
    async with _app(database) as app:

        async def body(run: cronlock.Run) -> None:
            for item in range(30):
                if item == 15:
                    holder = await _holder(database, task)
                    assert holder is not None
                    async with database.connect() as conn:
                        await conn.execute(
                            text("SELECT pg_terminate_backend(:pid)"), {"pid": holder[0]}
                        )
                    cut.set()
                async with run.item(item):
                    await _insert(run, item)

        task = _declare(app, body, 10)
        result = await app.run("chunky", now=SLOT)
    assert cut.is_set()
    assert (result.status, result.items_ok, result.chunks) == (RunStatus.INTERRUPTED, 10, 1)
    assert result.error is not None and "lock" in result.error
    assert await _rows(database) == 10
    row = await _run_row(database)
    assert (row["status"], row["items_ok"], row["chunks"]) == ("interrupted", 10, 1)


async def test_sigkill_mid_run_leaves_its_committed_chunks_and_where_it_stopped(
    database: Database, database_url: str, tmp_path: Path
) -> None:
    await create_scratch(database)
    marker = tmp_path / "crashing"
    proc = start_cli(
        "--app", "testapps.chunked", "run", "chunky", database_url=database_url,
        CRASH_MARKER=str(marker), CRASH_AFTER="12",
    )  # fmt: skip
    wait_for(marker.exists, timeout=60)
    task = chunked.create_app().task("chunky")
    assert await lock_holders(database, task), "the run should hold its lock while it works"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    await eventually(lambda: _unlocked(database, task), timeout=10)

    # Two chunks of 5 committed; the two items of the third did not.
    assert await count(database, items.processed) == 10
    row = await _run_row(database)
    assert (row["status"], row["items_ok"], row["chunks"]) == ("running", 10, 2)
    assert row["committed_at"] is not None and row["finished_at"] is None

    app = chunked.create_app()
    app.use_database(str(database.url))
    try:
        # The same slot again: the dead run is recorded interrupted, and its slot not rerun.
        same = await app.run("chunky", now=row["slot"] + timedelta(seconds=2))
        dead = await _row_by_id(database, row["id"])
        # The next slot carries on with what is left.
        nxt = await app.run("chunky", now=row["slot"] + timedelta(minutes=1))
    finally:
        await app.aclose()
    assert (same.status, same.skip_reason) == (RunStatus.SKIPPED, SkipReason.SLOT_DONE)
    assert (dead["status"], dead["items_ok"], dead["chunks"]) == ("interrupted", 10, 2)
    assert dead["finished_at"] == dead["committed_at"]
    assert (nxt.status, nxt.items_ok) == (RunStatus.COMPLETED, 100)
    assert await count(database, items.processed) == 100


async def _unlocked(database: Database, task: Any) -> bool:
    return not await lock_holders(database, task)


async def _row_by_id(database: Database, run_id: int) -> dict[str, Any]:
    async with database.connect() as conn:
        return dict((await conn.execute(select(runs).where(runs.c.id == run_id))).mappings().one())


async def test_chunked_runs_through_pgbouncer(database: Database) -> None:
    with running_pgbouncer(database.url, pool_size=2) as bouncer:
        through = bouncer.render_as_string(hide_password=False)
        async with _app(database, through, pgbouncer=True) as app:

            async def body(run: cronlock.Run) -> None:
                for item in range(40):
                    async with run.item(item):
                        await _insert(run, item)

            task = _declare(app, body, 10)
            first = await app.run("chunky", now=SLOT)
            second = await app.run("chunky", now=SLOT + timedelta(hours=1))
    assert (first.status, first.chunks, second.status) == (
        RunStatus.COMPLETED,
        4,
        RunStatus.COMPLETED,
    )
    assert await lock_holders(database, task) == []


def test_commit_every_must_be_a_positive_number_of_items() -> None:
    app = App()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ConfigurationError, match="commit_every"):
            app.periodic("chunky", cron="* * * * *", commit_every=bad)  # type: ignore[arg-type]


async def test_downgrade_below_0005_keeps_chunked_rows_as_failed(database: Database) -> None:
    from cronlock import schema

    async with database.engine.begin() as conn:
        for status in ("running", "interrupted"):
            await conn.execute(
                runs.insert().values(task="chunky", status=status, items_ok=10, chunks=2)
            )
    await schema.downgrade(database, "0004")
    async with database.connect() as conn:
        rows = (await conn.execute(text("SELECT status, error FROM cronlock.runs"))).all()
    assert sorted(tuple(row) for row in rows) == [
        ("failed", "interrupted (chunked run, downgraded)"),
        ("failed", "running (chunked run, downgraded)"),
    ]
    await schema.upgrade(database)
    assert await schema.current_revision(database) == schema.head_revision()


async def test_cronlock_run_of_a_chunked_task(database: Database, database_url: str) -> None:
    await create_scratch(database)
    done = await invoke_async(
        "--app", "testapps.chunked", "run", "chunky", "--json", database_url=database_url
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["status"], out["items_ok"], out["chunks"]) == ("completed", 100, 20)


async def test_cronlock_list_shows_commit_every(database_url: str) -> None:
    done = await invoke_async(
        "--app", "testapps.chunked", "list", "--json", database_url=database_url
    )
    assert done.returncode == 0, done.stderr
    (task,) = json.loads(done.stdout)["tasks"]
    assert (task["name"], task["commit_every"]) == ("chunky", chunked.EVERY)
