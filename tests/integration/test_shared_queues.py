"""Shared queues: many active drainers on one queue, none running a job twice or losing one;
exclusive drainers stay exclusive, and the two kinds refuse to meet on one queue.

Drainers run in this process where the point is their locks and states (each with its own
connections, as on two hosts), and as real ``cronlock worker --shared`` processes where a
SIGKILL is the point. Nothing sleeps to synchronise: rows and markers are polled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from cli import finish, invoke, kill_all, start_cli
from jobsupport import job_app
from sqlalchemy import func, select
from testapps import jobs as testjobs
from waiting import eventually, wait_for

from cronlock import App, Database, Drainer, DrainerConflict, RunStatus, pg, sql
from cronlock.observe.prometheus import render_metrics, scrape
from cronlock.observe.status import collect_queue
from cronlock.queue.lease import DRAINER_NAMESPACE, queue_lock_key
from cronlock.queue.shared import ExclusiveLease
from cronlock.sql.tables import jobs, workers

APP = ("--app", "testapps.jobs")
T = TypeVar("T")


async def _enqueue(database: Database, job_type: str, count: int) -> None:
    async with job_app(database) as app, database.session() as session:
        await app.enqueue_many_tx(session, job_type, [{"n": i} for i in range(count)])
        await session.commit()


async def _statuses(database: Database) -> dict[str, int]:
    async with database.connect() as conn:
        rows = await conn.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status))
        return {status: count for status, count in rows}


async def _states(database: Database) -> list[str]:
    async with database.connect() as conn:
        return sorted((await conn.execute(select(workers.c.state))).scalars().all())


async def _states_are(database: Database, expected: list[str]) -> bool:
    return await _states(database) == expected


async def _exists(path: Path) -> bool:
    return path.exists()


async def _applied_once(database: Database, total: int) -> None:
    """Every job's writes applied exactly once: ``total`` lines in the log, all different."""
    log = select(func.count(), func.count(func.distinct(testjobs.job_log.c.job)))
    async with database.connect() as conn:
        assert tuple((await conn.execute(log)).one()) == (total, total)


@contextlib.asynccontextmanager
async def _working(*drainers: Drainer) -> AsyncIterator[list[asyncio.Task[object]]]:
    """Drainers working in the background; stopped (and awaited) on the way out."""
    tasks: list[asyncio.Task[object]] = [asyncio.create_task(d.work()) for d in drainers]
    try:
        yield tasks
    finally:
        for drainer in drainers:
            drainer.stop()
        await asyncio.gather(*tasks, return_exceptions=True)


def _drainer(app: App, *, shared: bool, **options: object) -> Drainer:
    return app.drainer(shared=shared, heartbeat_interval=0.05, poll_interval=0.05, **options)


@pytest.mark.parametrize("mode", ["strict", "batch", "lease"])
async def test_two_shared_drainers_are_active_at_once_and_drain_beside_each_other(
    database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    # One job holds a drainer inside its handler until released: the other drainer alone
    # completes the twenty jobs behind it meanwhile, which an exclusive queue cannot do.
    started, release = tmp_path / "started", tmp_path / "release"
    monkeypatch.setenv("GATE_STARTED", str(started))
    monkeypatch.setenv("GATE_RELEASE", str(release))
    async with job_app(database) as app, database.session() as session:
        await app.enqueue_tx(session, "gated", {"n": 0}, priority=1)
        await app.enqueue_many_tx(session, "log", [{"n": i} for i in range(1, 21)])
        await session.commit()
    async with job_app(database) as one, job_app(database) as two:
        first = _drainer(one, shared=True, commit_mode=mode, batch_size=1)
        second = _drainer(two, shared=True, commit_mode=mode, batch_size=1)
        async with _working(first, second):
            await eventually(lambda: _states_are(database, ["active", "active"]), timeout=10)
            await eventually(lambda: _exists(started), timeout=10)
            held = "processing" if mode == "lease" else "pending"  # lease mode commits its claim
            await eventually(
                lambda: _statuses_are(database, {"completed": 20, held: 1}), timeout=20
            )
            # Status and the metrics show both as active.
            shown = (await collect_queue(database))["queues"]
            assert [q["active_drainers"] for q in shown if q["queue"] == "default"] == [2]
            metrics = render_metrics(await scrape(database)).decode()
            assert 'cronlock_drainers{queue="default",state="active"} 2.0' in metrics
            release.write_text("go")
            await eventually(lambda: _statuses_are(database, {"completed": 21}), timeout=20)
    # The gated job (claimed first: its priority) kept one drainer; the other did the rest.
    assert sorted([first.stats.processed, second.stats.processed]) == [1, 20]
    await _applied_once(database, 21)  # the gated job's line, and the twenty


async def _statuses_are(database: Database, expected: dict[str, int]) -> bool:
    return await _statuses(database) == expected


async def test_a_shared_drain_returns_when_nothing_is_due(database: Database) -> None:
    await _enqueue(database, "log", 30)
    async with job_app(database) as app:
        result = await app.drain(shared=True, commit_mode="batch", batch_size=7)
    assert result.status is RunStatus.COMPLETED and result.stats["processed"] == 30
    await _applied_once(database, 30)


def _sync(database_url: str, probe: Callable[[Database], Awaitable[T]]) -> T:
    """``probe`` on a database of its own, from a synchronous test (the command line's tests
    are: drain and worker install signal handlers, which only the main thread may)."""

    async def go() -> T:
        database = Database(database_url)
        try:
            return await probe(database)
        finally:
            await database.dispose()

    return asyncio.run(go())


def test_drain_shared_on_the_command_line(database_url: str) -> None:
    _sync(database_url, lambda database: _enqueue(database, "log", 5))
    answer = invoke(*APP, "drain", "--shared", "--json", database_url=database_url)
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout)["processed"] == 5
    _sync(database_url, lambda database: _applied_once(database, 5))


async def test_exclusive_stays_exclusive_one_active_one_standby(database: Database) -> None:
    await _enqueue(database, "log", 10)
    async with job_app(database) as one, job_app(database) as two:
        first, second = _drainer(one, shared=False), _drainer(two, shared=False)
        async with _working(first, second):
            await eventually(lambda: _states_are(database, ["active", "standby"]), timeout=10)
            await eventually(lambda: _statuses_are(database, {"completed": 10}), timeout=20)
            # A drain beside them is skipped, as before shared queues existed.
            skipped = await one.drain()
            assert skipped.status is RunStatus.SKIPPED
            assert await _states(database) == ["active", "standby"]
    assert sorted([first.stats.processed, second.stats.processed]) == [0, 10]


async def test_a_shared_drainer_refuses_a_queue_an_exclusive_one_serves(
    database: Database,
) -> None:
    async with job_app(database) as one, job_app(database) as two:
        exclusive, standby = _drainer(one, shared=False), _drainer(one, shared=False)
        async with _working(exclusive):
            await eventually(lambda: _states_are(database, ["active"]), timeout=10)
            with pytest.raises(DrainerConflict, match="has an exclusive drainer"):
                await two.drain(shared=True)
            with pytest.raises(DrainerConflict, match="has an exclusive drainer"):
                await _drainer(two, shared=True).work()
            # Behind a standby too (PostgreSQL queues shared requests behind a waiting one).
            async with _working(standby):
                await eventually(lambda: _states_are(database, ["active", "standby"]), timeout=10)
                with pytest.raises(DrainerConflict):
                    await two.drain(shared=True)
            assert exclusive.state == "active"


async def test_an_exclusive_drainer_refuses_a_queue_shared_ones_serve(database: Database) -> None:
    async with (
        job_app(database) as one,
        job_app(database) as two,
        _working(_drainer(one, shared=True), _drainer(one, shared=True)),
    ):
        await eventually(lambda: _states_are(database, ["active", "active"]), timeout=10)
        with pytest.raises(DrainerConflict, match="2 shared drainer"):
            await two.drain()
        with pytest.raises(DrainerConflict, match="shared drainer"):
            await _drainer(two, shared=False).work()
        assert await _states(database) == ["active", "active"]


async def test_a_standby_that_shared_drainers_overtook_gives_up_waiting(
    database: Database,
) -> None:
    # The moment between a standby's question and its wait, forced: its first look finds the
    # lock free of shared holders, then a shared drainer holds it while the standby waits.
    holder = await pg.connect(database, "test-shared-holder")
    transaction = holder.transaction()
    await transaction.start()
    try:
        await holder.fetchval(
            "SELECT pg_advisory_xact_lock_shared($1, $2)",
            DRAINER_NAMESPACE,
            queue_lock_key("default"),
        )

        class Overtaken(ExclusiveLease):
            async def try_take(self) -> bool:
                return False  # as if asked just before the shared drainer came

        lease = Overtaken(database, "default", keepalive=None, heartbeat_interval=0.05)
        await lease.connect()
        try:
            await lease.begin()
            with pytest.raises(DrainerConflict, match="1 shared drainer"):
                await asyncio.wait_for(lease.wait(asyncio.Event()), 10)
        finally:
            lease.close()
    finally:
        await holder.close()


@pytest.mark.parametrize("mode", ["strict", "batch", "lease"])
async def test_sigkill_of_one_of_two_shared_workers_loses_nothing_and_runs_nothing_twice(
    database: Database, database_url: str, tmp_path: Path, mode: str
) -> None:
    total = 300
    await _enqueue(database, "log", total)
    hold = tmp_path / "hold"
    env = {"HOLD_MARKER": str(hold), "HOLD_AT": "100", "COUNT_DELAY": "0.002"}
    args = (*APP, "worker", "--json", "--shared", "--commit-mode", mode, "--batch-size", "10")
    first = start_cli(*args, "--poll-interval", "0.5", database_url=database_url, **env)
    second = start_cli(*args, "--poll-interval", "0.5", database_url=database_url, **env)
    try:
        await eventually(lambda: _states_are(database, ["active", "active"]), timeout=30)
        # One worker is stuck in job 100, its transaction open (and in batch mode the rest of
        # its batch with it); the other drains everything else meanwhile.
        await eventually(lambda: _exists(hold), timeout=30)
        stuck_pid = int(hold.read_text())
        # All the stuck worker ever completes was committed before it got stuck.
        before = (await _statuses(database)).get("completed", 0)
        stuck, other = (first, second) if first.pid == stuck_pid else (second, first)

        async def the_rest_done() -> bool:
            return (await _statuses(database)).get("completed", 0) >= total - 10

        await eventually(the_rest_done, timeout=60)
        assert stuck.poll() is None
        stuck.kill()
        await eventually(lambda: _statuses_are(database, {"completed": total}), timeout=60)
        other.send_signal(signal.SIGTERM)
        code, stdout, stderr = finish(other)
    finally:
        kill_all(first, second)

    assert code == 0, stderr
    assert json.loads(stdout)["processed"] >= total - before
    await _applied_once(database, total)


@pytest.mark.parametrize("first", ["exclusive", "shared"])
def test_the_command_line_refuses_mixing_with_one_line_and_exit_2(
    database_url: str, first: str
) -> None:
    # A worker of one kind serves queue q1; a drain of the other kind exits 2 with one line.
    kind = ("--shared",) if first == "shared" else ()
    worker = start_cli(*APP, "worker", "--queue", "q1", *kind, database_url=database_url)
    try:
        wait_for(lambda: _sync(database_url, _states) == ["active"], timeout=30)
        other = () if first == "shared" else ("--shared",)
        answer = invoke(*APP, "drain", "--queue", "q1", *other, database_url=database_url)
    finally:
        kill_all(worker)
    assert answer.returncode == 2
    if first == "exclusive":
        expected = (
            "Error: queue 'q1' has an exclusive drainer (active or standing by): a shared "
            "drainer cannot join it; stop it, or start this one without --shared"
        )
    else:
        expected = (
            "Error: queue 'q1' is drained by 1 shared drainer(s): an exclusive drainer cannot "
            "serve it beside them; stop them, or start this one with --shared"
        )
    assert answer.stderr.strip().splitlines() == [expected]


async def test_an_idle_lane_does_not_count_a_job_another_lane_holds_as_due(
    database: Database,
) -> None:
    # A lane whose claim found nothing sleeps until the next job comes due: a job that was
    # already due (and so was held by another lane: here a transaction of the test's) does not
    # count, or the lane would claim again at once, over and over, until that job finished.
    await _enqueue(database, "log", 1)
    async with job_app(database) as app, database.session() as session:
        await app.enqueue_tx(session, "log", {"n": 1}, delay=30)
        await session.commit()
    holder = await pg.connect(database, "test-holder")
    lane = await pg.connect(database, "test-lane")
    claim = pg.AsyncpgStatement.of(sql.JOB_CLAIM, database.schema)
    next_due = pg.AsyncpgStatement.of(sql.JOB_NEXT_DUE, database.schema)
    try:
        async with holder.transaction():
            held = await holder.fetch(claim.sql, *claim.args(queue="default", limit=5, now=None))
            assert len(held) == 1
            async with lane.transaction():
                assert (
                    await lane.fetch(claim.sql, *claim.args(queue="default", limit=5, now=None))
                    == []
                )
                seconds = await lane.fetchval(
                    next_due.sql, *next_due.args(queue="default", now=None)
                )
        assert 25 < float(seconds) <= 30  # the delayed job, not the held one
    finally:
        await holder.close()
        await lane.close()
