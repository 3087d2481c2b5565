"""Job dependencies (issue 25, item 4): ``enqueue(..., depends_on=[a, c])``.

A child waits ``blocked`` (outside the claim) until every parent completed and is released to
``pending`` in the transaction of its last parent's completion (the jobs_released trigger,
migration 0018); a parent that fails or is cancelled cancels what depends on it, transitively.
The concurrency tests use connections of their own and plain UPDATEs, as a drainer's
completion is one: two parents ending in two transactions, an enqueue meeting a parent's end
from either side. Every commit and queue mode: the matrix's row (test_matrix.py).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import httpx
import psycopg
import psycopg2
import pytest
from cli import invoke_async
from jobsupport import job_rows
from sqlalchemy.ext.asyncio import AsyncSession
from testdb import libpq_url
from waiting import eventually

from cronlock import App, Database, InvalidJobOption
from cronlock.http import create_api

_COMPLETE = "UPDATE cronlock.jobs SET status = 'completed', completed_at = now() WHERE id = $1"
_STATE = "SELECT status, parents_left FROM cronlock.jobs WHERE id = $1"
_EDGES = "SELECT count(*) FROM cronlock.job_dependencies"
# A session waiting for an advisory lock (the trigger behind an enqueue, or the reverse).
_LOCK_WAITS = """
SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""


def _app(order: list[str]) -> App:
    app = App()

    @app.job("step")
    async def step(_session: AsyncSession, payload: Any) -> None:
        order.append(payload["name"])

    @app.job("fails", max_retries=0)
    async def fails(_session: AsyncSession, _payload: Any) -> None:
        raise RuntimeError("no luck")

    return app


@asynccontextmanager
async def _on(database: Database) -> AsyncIterator[tuple[App, list[str]]]:
    order: list[str] = []
    app = _app(order)
    app.use_database(str(database.url))
    try:
        yield app, order
    finally:
        await app.aclose()


async def _row(database: Database, job_id: uuid.UUID) -> dict[str, Any]:
    [row] = await job_rows(database, id=job_id)
    return row


async def _state(conn: asyncpg.Connection, job_id: uuid.UUID) -> tuple[str, int | None]:
    row = await conn.fetchrow(_STATE, job_id)
    assert row is not None
    return row["status"], row["parents_left"]


async def test_a_chain_runs_in_order(database: Database) -> None:
    async with _on(database) as (app, order):
        a = await app.enqueue("step", {"name": "a"})
        b = await app.enqueue("step", {"name": "b"}, depends_on=[a])
        c = await app.enqueue("step", {"name": "c"}, depends_on=[b.id])
        row = await _row(database, c.id)
        assert (row["status"], row["parents_left"], row["depends_on"]) == ("blocked", 1, [b.id])
        result = await app.drain()
        assert result.stats["processed"] == 3
        assert order == ["a", "b", "c"]
        assert [(await _row(database, j.id))["status"] for j in (a, b, c)] == ["completed"] * 3
        assert (await _row(database, c.id))["parents_left"] == 0
        shown = await app.get_job(c.id)
        assert shown is not None and shown.to_dict()["depends_on"] == [str(b.id)]


async def test_fan_out_and_fan_in(database: Database) -> None:
    async with _on(database) as (app, order):
        root = await app.enqueue("step", {"name": "root"})
        leaves = await app.enqueue_many(
            "step", [{"name": f"leaf{i}"} for i in range(5)], depends_on=[root]
        )
        join = await app.enqueue("step", {"name": "join"}, depends_on=leaves)
        assert (await _row(database, join.id))["parents_left"] == 5
        result = await app.drain(commit_mode="batch", batch_size=3)
        assert result.stats["processed"] == 7
        assert order[0] == "root" and order[-1] == "join"
        assert sorted(order[1:-1]) == [f"leaf{i}" for i in range(5)]


async def test_a_fan_in_of_many_parents_is_released_once_in_the_last_parents_transaction(
    database: Database,
) -> None:
    async with _on(database) as (app, order):
        parents = await app.enqueue_many("step", [{"name": "p"}] * 2000)
        child = await app.enqueue("step", {"name": "child"}, depends_on=parents)
        *first, last = [parent.id for parent in parents]
        conn = await asyncpg.connect(libpq_url(database.url))
        watcher = await asyncpg.connect(libpq_url(database.url))
        try:
            await conn.execute(
                "UPDATE cronlock.jobs SET status = 'completed', completed_at = now() "
                "WHERE id = ANY($1)",
                first,
            )
            assert await _state(conn, child.id) == ("blocked", 1)
            async with conn.transaction():
                await conn.execute(_COMPLETE, last)
                assert await _state(conn, child.id) == ("pending", 0)  # in this transaction
                assert await _state(watcher, child.id) == ("blocked", 1)  # not yet committed
            assert await _state(watcher, child.id) == ("pending", 0)
            assert await watcher.fetchval(_EDGES) == 0
        finally:
            await conn.close()
            await watcher.close()
        result = await app.drain()
        assert (result.stats["processed"], order) == (1, ["child"])  # it ran once


async def test_many_parents_completed_in_one_statement_count_once_each(
    database: Database,
) -> None:
    async with _on(database) as (app, order):
        parents = await app.enqueue_many("step", [{"name": f"p{i}"} for i in range(300)])
        child = await app.enqueue("step", {"name": "child"}, depends_on=parents)
        result = await app.drain(commit_mode="lease", batch_size=500)
        assert result.stats["processed"] == 301
        assert order.count("child") == 1 and order[-1] == "child"
        assert (await _row(database, child.id))["parents_left"] == 0


async def test_concurrent_parent_completions_release_the_child_exactly_once(
    database: Database,
) -> None:
    async with _on(database) as (app, _order):
        parents = await app.enqueue_many("step", [{"name": f"p{i}"} for i in range(12)])
        child = await app.enqueue("step", {"name": "child"}, depends_on=parents)
        url = libpq_url(database.url)
        conns = [await asyncpg.connect(url) for _ in parents]
        try:
            # Every parent's completion open at once in its own transaction; then all commit
            # together. Each trigger waits for the child's row, then counts from the last.
            transactions = [conn.transaction() for conn in conns]
            for transaction in transactions:
                await transaction.start()
            await conns[0].execute(_COMPLETE, parents[0].id)

            async def complete(i: int) -> None:
                await conns[i].execute(_COMPLETE, parents[i].id)  # waits for the child's row
                await transactions[i].commit()

            others = [asyncio.create_task(complete(i)) for i in range(1, len(conns))]

            async def all_waiting() -> bool:
                rows = await conns[0].fetch(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
                return bool(rows[0][0] == len(others))

            await eventually(all_waiting)
            assert await _state(conns[0], child.id) == ("blocked", 11)
            await transactions[0].commit()
            await asyncio.wait_for(asyncio.gather(*others), 30)
            assert await _state(conns[0], child.id) == ("pending", 0)
        finally:
            for conn in conns:
                await conn.close()
        assert (await app.drain()).stats["processed"] == 1


async def test_two_parents_racing_in_both_orders(database: Database) -> None:
    async with _on(database) as (app, _order):
        url = libpq_url(database.url)
        one, two = await asyncpg.connect(url), await asyncpg.connect(url)
        try:
            for _ in range(20):
                a, b = await app.enqueue_many("step", [{"name": "a"}, {"name": "b"}])
                child = await app.enqueue("step", {"name": "c"}, depends_on=[a, b])

                async def complete(conn: asyncpg.Connection, job_id: uuid.UUID) -> None:
                    async with conn.transaction():
                        await conn.execute(_COMPLETE, job_id)

                await asyncio.gather(complete(one, a.id), complete(two, b.id))
                assert await _state(one, child.id) == ("pending", 0)
                await one.execute("DELETE FROM cronlock.jobs")
        finally:
            await one.close()
            await two.close()


async def test_a_failed_parent_cancels_its_dependents_transitively(database: Database) -> None:
    async with _on(database) as (app, order):
        bad = await app.enqueue("fails", {})
        good = await app.enqueue("step", {"name": "good"})
        child = await app.enqueue("step", {"name": "child"}, depends_on=[good, bad])
        grandchild = await app.enqueue("step", {"name": "grandchild"}, depends_on=[child])
        other = await app.enqueue("step", {"name": "other"}, depends_on=[good])
        result = await app.drain()
        assert (result.stats["processed"], result.stats["failed"]) == (2, 1)
        assert sorted(order) == ["good", "other"]
        assert (await _row(database, other.id))["status"] == "completed"
        for job in (child, grandchild):
            row = await _row(database, job.id)
            assert row["status"] == "cancelled"
            assert row["completed_at"] is not None
            assert row["error_message"] == (
                "cancelled: a job it depends on failed or was cancelled"
            )
        async with database.connect() as conn:
            assert (await conn.exec_driver_sql(_EDGES)).scalar() == 0


async def test_an_operators_cancel_of_a_blocked_job_cancels_what_depends_on_it(
    database: Database,
) -> None:
    async with _on(database) as (app, order):
        root = await app.enqueue("step", {"name": "root"})
        middle = await app.enqueue("step", {"name": "middle"}, depends_on=[root])
        leaf = await app.enqueue("step", {"name": "leaf"}, depends_on=[middle])
        change = await app.cancel_job(middle.id)
        assert change.outcome.value == "cancelled", change
        assert (await _row(database, leaf.id))["status"] == "cancelled"
        assert (await app.drain()).stats["processed"] == 1
        assert order == ["root"]


async def test_an_unknown_parent_is_refused_with_nothing_written(database: Database) -> None:
    async with _on(database) as (app, _order):
        real = await app.enqueue("step", {"name": "real"})
        ghost = uuid.uuid4()
        with pytest.raises(InvalidJobOption) as refused:
            await app.enqueue("step", {"name": "x"}, depends_on=[real, ghost])
        assert str(refused.value) == (f"depends_on names no job {ghost}: a parent must exist first")
        with pytest.raises(InvalidJobOption, match="is not a job id"):
            await app.enqueue("step", {"name": "x"}, depends_on=["nope"])
        with pytest.raises(InvalidJobOption, match="cannot have a dedup key"):
            await app.enqueue("step", {"name": "x"}, depends_on=[real], dedup_key="k")
        async with database.session() as session:
            with pytest.raises(InvalidJobOption):
                await app.enqueue_tx(session, "step", {"name": "x"}, depends_on=[ghost])
        assert [row["id"] for row in await job_rows(database)] == [real.id]


async def test_a_parent_that_ended_before_the_enqueue(database: Database) -> None:
    async with _on(database) as (app, order):
        done = await app.enqueue("step", {"name": "done"})
        bad = await app.enqueue("fails", {})
        await app.drain()
        ready = await app.enqueue("step", {"name": "ready"}, depends_on=[done])
        row = await _row(database, ready.id)
        assert (row["status"], row["parents_left"]) == ("pending", 0)
        doomed = await app.enqueue("step", {"name": "doomed"}, depends_on=[done, bad])
        row = await _row(database, doomed.id)
        assert row["status"] == "cancelled"
        assert row["error_message"] == f"cancelled: job {bad.id} it depends on was failed already"
        await app.drain()
        assert order == ["done", "ready"]


async def test_an_enqueue_in_flight_holds_back_its_parents_end(database: Database) -> None:
    """The enqueue's edge is not visible to the parent's trigger until it commits: the
    trigger waits for it (on the parent's lock), then counts it."""
    async with _on(database) as (app, _order):
        parent = await app.enqueue("step", {"name": "p"})
        conn = await asyncpg.connect(libpq_url(database.url))
        try:
            async with database.session() as session:
                child = await app.enqueue_tx(session, "step", {"name": "c"}, depends_on=[parent])
                ending = asyncio.create_task(conn.execute(_COMPLETE, parent.id))

                async def waiting() -> bool:
                    async with database.connect() as probe:
                        return bool((await probe.exec_driver_sql(_LOCK_WAITS)).scalar() == 1)

                await eventually(waiting)
                assert not ending.done()
                await session.commit()
            await ending
            assert await _state(conn, child.id) == ("pending", 0)
        finally:
            await conn.close()


async def test_a_parents_end_in_flight_holds_back_the_enqueue(database: Database) -> None:
    """A parent completed in a transaction not committed yet: the enqueue waits for it and
    then sees it completed (the child is pending at once, with no edge)."""
    async with _on(database) as (app, _order):
        parent = await app.enqueue("step", {"name": "p"})
        conn = await asyncpg.connect(libpq_url(database.url))
        try:
            transaction = conn.transaction()
            await transaction.start()
            await conn.execute(_COMPLETE, parent.id)
            enqueue = asyncio.create_task(
                app.enqueue("step", {"name": "c"}, depends_on=[parent.id])
            )

            async def waiting() -> bool:
                return bool(await conn.fetchval(_LOCK_WAITS) == 1)

            await eventually(waiting)
            await transaction.commit()
            child = await enqueue
            assert await _state(conn, child.id) == ("pending", 0)
            assert await conn.fetchval(_EDGES) == 0
        finally:
            await conn.close()


async def test_the_http_api_and_the_cli_take_depends_on(
    database: Database, database_url: str
) -> None:
    async with _on(database) as (app, _order):
        parent = await app.enqueue("step", {"name": "p"})
        transport = httpx.ASGITransport(app=create_api(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            made = await client.post(
                "/jobs",
                json={"job_type": "step", "payload": {"name": "c"}, "depends_on": [str(parent.id)]},
            )
            assert made.status_code == 201, made.text
            shown = (await client.get(f"/jobs/{made.json()['id']}")).json()
            assert (shown["status"], shown["depends_on"], shown["parents_left"]) == (
                "blocked",
                [str(parent.id)],
                1,
            )
            ghost = uuid.uuid4()
            body = {"job_type": "noop", "depends_on": [str(ghost)], "allow_unknown": True}
            refused = await client.post("/jobs", json=body)
            assert refused.status_code == 422
            assert refused.json()["detail"] == (
                f"depends_on names no job {ghost}: a parent must exist first"
            )
    app_args = ("--app", "testapps.jobs")
    done = await invoke_async(
        *app_args,
        "enqueue",
        "noop",
        "--depends-on",
        str(parent.id),
        "--json",
        database_url=database_url,
    )
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout)["id"]
    shown_cli = await invoke_async(*app_args, "jobs", "show", child, database_url=database_url)
    assert shown_cli.returncode == 0, shown_cli.stderr
    assert f"parents     {parent.id} (1 not completed yet)" in shown_cli.stdout
    assert "status      blocked" in shown_cli.stdout
    bad = await invoke_async(
        *app_args, "enqueue", "noop", "--depends-on", str(ghost), database_url=database_url
    )
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
async def test_sync_clients_take_depends_on(database: Database, driver: str) -> None:
    async with _on(database) as (app, order):
        parent = await app.enqueue("step", {"name": "p"})
        url = libpq_url(database.url)

        def enqueue() -> uuid.UUID:
            conn = (psycopg if driver == "psycopg" else psycopg2).connect(url)
            try:
                answer = app.sync.enqueue_tx(conn, "step", {"name": "c"}, depends_on=[parent])
                conn.commit()
            finally:
                conn.close()
            return answer.id

        child = await asyncio.to_thread(enqueue)
        row = await _row(database, child)
        assert (row["status"], row["parents_left"], row["depends_on"]) == (
            "blocked",
            1,
            [parent.id],
        )
        await app.drain()
        assert order == ["p", "c"]


async def test_a_parents_completion_killed_before_its_commit_releases_nothing(
    database: Database,
) -> None:
    """A worker killed between its completion and its commit: the release rolls back with the
    completion, so the child stays blocked (its edge kept) until the parent completes again."""
    async with _on(database) as (app, order):
        parent = await app.enqueue("step", {"name": "p"})
        child = await app.enqueue("step", {"name": "c"}, depends_on=[parent])
        url = libpq_url(database.url)
        victim, killer = await asyncpg.connect(url), await asyncpg.connect(url)
        try:
            transaction = victim.transaction()
            await transaction.start()
            await victim.execute(_COMPLETE, parent.id)
            assert await _state(victim, child.id) == ("pending", 0)  # released in there
            pid = victim.get_server_pid()
            await killer.execute("SELECT pg_terminate_backend($1)", pid)

            async def gone() -> bool:
                found = await killer.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid
                )
                return bool(found == 0)

            await eventually(gone)
            assert await _state(killer, child.id) == ("blocked", 1)
            assert await killer.fetchval(_EDGES) == 1
        finally:
            victim.terminate()
            await killer.close()
        assert (await app.drain()).stats["processed"] == 2
        assert order == ["p", "c"]


async def test_a_statement_that_ends_many_jobs_holds_few_locks(database: Database) -> None:
    # The trigger's shared locks live in the server's lock table until the commit (6,400
    # slots by default, for every connection): a lane's batch of 500 must not take hundreds.
    async with _on(database) as (app, _order):
        await app.enqueue_many("step", [{"name": str(n)} for n in range(500)])
    conn = await asyncpg.connect(libpq_url(database.url))
    try:
        async with conn.transaction():
            ended = await conn.execute(
                "UPDATE cronlock.jobs SET status = 'completed', completed_at = now()"
            )
            held = await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid = pg_backend_pid()"
            )
    finally:
        await conn.close()
    assert ended == "UPDATE 500"
    assert 0 < held <= 64
