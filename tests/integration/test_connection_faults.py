"""Connections cut under the drainer by ``pg_terminate_backend``: an infrastructure fault, never
a job's failure (DESIGN.md invariant 9).

A lane's connection cut mid-job rolls its transaction back: the job runs again, as after a
SIGKILL, and no attempt is consumed (``max_retries=0`` here: one charged attempt would fail the
job). The handlers are the test's own, in process; the cut is a real one, on the server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cli import finish, kill_all, start_cli
from jobsupport import job_rows
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession
from testapps import commitlog
from waiting import eventually

import cronlock
from cronlock import Database


async def terminate(database: Database, where: str, **params: Any) -> list[int]:
    """``pg_terminate_backend`` every other backend of the test database matching ``where``
    (pg_stat_activity's columns); the pids it cut."""
    query = text(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        f"AND pid <> pg_backend_pid() AND {where}"
    )
    async with database.connect() as conn:
        pids = list((await conn.execute(query, params)).scalars())
        for pid in pids:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        await conn.commit()
    return pids


def cut_app(
    database: Database, mode: str
) -> tuple[cronlock.App, Counter[int], asyncio.Event, asyncio.Event]:
    """An app whose handler, on its first attempt of job 0, waits to be cut: in a statement on
    its session (``sql``), or away from it (``idle``: it goes on once told the cut is done,
    and the cut shows at the commit)."""
    attempts: Counter[int] = Counter()
    cut_me, was_cut = asyncio.Event(), asyncio.Event()
    app = cronlock.App()

    @app.job("cut", max_retries=0)
    async def cut(session: AsyncSession, payload: dict[str, Any]) -> dict[str, Any]:
        n = payload["n"]
        attempts[n] += 1
        if n == 0 and attempts[n] == 1:
            cut_me.set()
            if mode == "sql":
                await session.execute(text("SELECT pg_sleep(60)"))
            else:
                await session.execute(text("SELECT 1"))
                await asyncio.wait_for(was_cut.wait(), 60)
        return {"n": n}

    app.use_database(str(database.url))
    return app, attempts, cut_me, was_cut


@pytest.mark.parametrize("where", ["sql", "idle"])
@pytest.mark.parametrize("commit_mode", ["strict", "batch"])
async def test_a_cut_lane_connection_consumes_no_attempt(
    database: Database, where: str, commit_mode: str
) -> None:
    app, attempts, cut_me, was_cut = cut_app(database, where)
    try:
        await app.enqueue_many("cut", [{"n": n} for n in range(5)])
        stop = asyncio.Event()
        drainer = app.drainer(commit_mode=commit_mode, batch_size=5, poll_interval=0.1)
        worker = asyncio.create_task(cronlock.serve_worker(drainer, stop=stop))
        await asyncio.wait_for(cut_me.wait(), 30)
        lane = "query LIKE '%pg_sleep(60)%'" if where == "sql" else "state = 'idle in transaction'"
        lanes = f"application_name = 'cronlock' AND {lane}"
        cut = await eventually(lambda: terminate(database, lanes))
        assert len(cut) == 1
        was_cut.set()
        await eventually(lambda: _all_completed(database, 5), timeout=30)
        stop.set()
        result = await asyncio.wait_for(worker, 30)
    finally:
        await app.aclose()

    rows = await job_rows(database)
    assert [(r["status"], r["retry_count"], r["error_history"]) for r in rows] == [
        ("completed", 0, [])
    ] * 5
    assert attempts[0] == 2  # cut once, then run again
    assert result.status is cronlock.RunStatus.COMPLETED, result.error
    assert result.stats["failed"] == result.stats["retried"] == 0
    assert result.stats["rolled_back"] >= 1


async def _all_completed(database: Database, count: int) -> bool:
    rows = await job_rows(database)
    return len(rows) == count and all(r["status"] == "completed" for r in rows)


# -- the lock connection: a drainer that lost its lock commits nothing after its successor ------


async def _lock_holder(database: Database, queue: str = "default") -> int | None:
    from cronlock.queue.lease import DRAINER_NAMESPACE, queue_lock_key

    query = text(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted "
        "AND classid = :ns AND objid = :key "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    params = {"ns": DRAINER_NAMESPACE & 0xFFFFFFFF, "key": queue_lock_key(queue) & 0xFFFFFFFF}
    async with database.connect() as conn:
        return (await conn.execute(query, params)).scalar()


async def _count(database: Database, query: str) -> int:
    async with database.connect() as conn:
        return int((await conn.execute(text(query))).scalar_one())


@pytest.mark.parametrize("commit_mode", ["strict", "batch"])
async def test_a_drainer_that_lost_its_lock_commits_nothing_after_the_new_one_claims(
    database: Database, commit_mode: str
) -> None:
    await _commit_log(database)
    total = 600
    first, second = _logging_app(database, "first"), _logging_app(database, "second")

    def drainer(app: cronlock.App) -> cronlock.Drainer:
        return app.drainer(commit_mode=commit_mode, batch_size=5, concurrency=2, poll_interval=0.1)

    stop = asyncio.Event()
    try:
        await first.enqueue_many("logged", [{"n": n} for n in range(total)])
        # reconnect=None: the first drainer ends when it loses its lock, rather than ride the
        # loss out as a standby (test_database_restart.py), so its result can be read.
        active = asyncio.create_task(
            cronlock.serve_worker(drainer(first), reconnect=None, stop=stop)
        )
        holder = await eventually(lambda: _lock_holder(database), timeout=30)
        standby = asyncio.create_task(cronlock.serve_worker(drainer(second), stop=stop))
        await eventually(lambda: _standing_by(database), timeout=30)
        await eventually(lambda: _count(database, "SELECT count(*) FROM committed"), timeout=30)
        assert await terminate(database, "pid = :pid", pid=holder) == [holder]
        lost = await asyncio.wait_for(active, 30)  # the first drainer lost its lock: it ends
        await eventually(lambda: _all_completed(database, total), timeout=60)
        stop.set()
        await asyncio.wait_for(standby, 30)
    finally:
        stop.set()
        await first.aclose()
        await second.aclose()

    assert lost.error is not None and "lost the drainer lock" in lost.error
    late, per_job = await _late_commits(database)
    assert late == 0, f"{late} commits of the first drainer after the second one's first claim"
    assert per_job == (total, total)  # every job committed exactly once
    rows = await job_rows(database)
    assert {(r["status"], r["retry_count"]) for r in rows} == {("completed", 0)}


@pytest.mark.parametrize("commit_mode", ["strict", "batch"])
async def test_a_paused_drainer_that_lost_its_lock_is_fenced(
    database: Database, database_url: str, tmp_path: Path, commit_mode: str
) -> None:
    """The worker is frozen (SIGSTOP) with a job in flight, its lock connection is cut, the
    standby takes over and commits; thawed, the first worker's lanes still have their
    connections and try to commit: the fence rolls them back."""
    await _commit_log(database)
    total = 400
    args = (
        "--app", "testapps.commitlog", "worker", "--commit-mode", commit_mode,
        "--batch-size", "5", "--concurrency", "2", "--poll-interval", "0.1",
    )  # fmt: skip
    marker = tmp_path / "slow"
    slow = {
        "SLOW_AT": "20",
        "SLOW_SECONDS": "4",
        "SLOW_MARKER": str(marker),
        "QUICK_SECONDS": "0.005",
    }
    first = start_cli(*args, database_url=database_url, DRAINER="first", **slow)
    second: subprocess.Popen[str] | None = None
    try:
        holder = await eventually(lambda: _lock_holder(database), timeout=30)
        second = start_cli(*args, database_url=database_url, DRAINER="second", **slow)
        await eventually(lambda: _standing_by(database), timeout=30)
        app = _logging_app(database, "setup")  # the jobs come now: both workers are up
        try:
            await app.enqueue_many("logged", [{"n": n} for n in range(total)])
        finally:
            await app.aclose()
        await eventually(lambda: _exists(marker), timeout=30)  # job 20 in flight now
        first.send_signal(signal.SIGSTOP)
        assert await terminate(database, "pid = :pid", pid=holder) == [holder]
        claimed = "SELECT count(*) FROM committed WHERE drainer = 'second'"
        await eventually(lambda: _count(database, claimed), timeout=30)
        first.send_signal(signal.SIGCONT)  # it wakes, its lanes' connections alive
        await eventually(lambda: _all_completed(database, total), timeout=60)
        for worker in (first, second):
            worker.send_signal(signal.SIGTERM)
        for worker in (first, second):
            finish(worker)
    finally:
        first.send_signal(signal.SIGCONT)
        kill_all(first, *([second] if second else []))

    late, per_job = await _late_commits(database)
    assert late == 0, f"{late} commits of the first drainer after the second one's first claim"
    assert per_job == (total, total)
    rows = await job_rows(database)
    assert {(r["status"], r["retry_count"]) for r in rows} == {("completed", 0)}


def _logging_app(database: Database, name: str) -> cronlock.App:
    app = commitlog.create_app(name)
    app.use_database(str(database.url))
    return app


async def _commit_log(database: Database) -> None:
    async with database.connect() as conn:
        for statement in commitlog.COMMIT_LOG:
            await conn.execute(text(statement))
        await conn.commit()


async def _late_commits(database: Database) -> tuple[int, tuple[int, int]]:
    """Commits of the first drainer after the second's first claim, and (commits, jobs)."""
    async with database.connect() as conn:
        taken_over = (
            await conn.execute(text("SELECT min(ran) FROM done WHERE drainer = 'second'"))
        ).scalar_one()
        late = (
            await conn.execute(
                text("SELECT count(*) FROM committed WHERE drainer = 'first' AND at > :at"),
                {"at": taken_over},
            )
        ).scalar_one()
        per_job = (
            await conn.execute(text("SELECT count(*), count(DISTINCT job) FROM committed"))
        ).one()
    return int(late), (int(per_job[0]), int(per_job[1]))


async def _exists(path: Path) -> bool:
    return path.exists()


async def _standing_by(database: Database) -> bool:
    query = "SELECT count(*) FROM cronlock.workers WHERE state = 'standby'"
    return await _count(database, query) == 1


@pytest.mark.parametrize(("commit_mode", "jobs"), [("strict", 1), ("batch", 3)])
async def test_a_lane_whose_fence_fails_commits_nothing(
    database: Database, monkeypatch: pytest.MonkeyPatch, commit_mode: str, jobs: int
) -> None:
    """The fence, which a lane's last write before its commit carries (``sql.fenced``),
    decides, without a race: the lanes' fence holds a token no lock transaction holds, as
    after a lost lock. The lane rolls back (its handler's write too), the drainer ends with
    the lost lock, and the jobs are due again with no attempt charged."""
    from cronlock.queue import drainer as drainer_module
    from cronlock.queue.lanes import Lanes as made

    def lanes_of_a_lost_lock(*args: Any, fence: Any, **kwargs: Any) -> Any:
        stranger = dataclasses.replace(fence, token=fence.token % (2**31 - 2) + 1)
        return made(*args, fence=stranger, **kwargs)

    monkeypatch.setattr(drainer_module, "Lanes", lanes_of_a_lost_lock)
    await _commit_log(database)
    app = _logging_app(database, "first")
    try:
        await app.enqueue_many("logged", [{"n": n} for n in range(jobs)])
        result = await app.drainer(commit_mode=commit_mode, batch_size=jobs).drain()
    finally:
        await app.aclose()
    assert result.error is not None and "lost the drainer lock" in result.error
    assert await _count(database, "SELECT count(*) FROM committed") == 0
    rows = await job_rows(database)
    assert {(r["status"], r["retry_count"]) for r in rows} == {("pending", 0)}
    assert len(rows) == jobs


async def test_a_fence_cancelled_at_the_barrier_costs_no_attempt(database: Database) -> None:
    """The fence rides in the outcome's statement: an error of the fence's part (here its
    wait at the barrier, cancelled) is no refusal of the outcome. The strict lane rolls back
    and runs the job again, not charged (``max_retries=0``: a charged attempt fails it)."""
    from cronlock.queue.lease import BARRIER_NAMESPACE, queue_lock_key
    from cronlock.sql.tables import DEFAULT_QUEUE

    app = cronlock.App()
    app.use_database(str(database.url))
    barrier_held = asyncio.Event()
    runs: list[int] = []

    @app.job("gated", max_retries=0)
    async def gated(session: AsyncSession, payload: dict[str, Any]) -> None:
        runs.append(len(runs))
        await barrier_held.wait()  # the drainer is active: its own barrier pass is over

    keys = {"a": BARRIER_NAMESPACE, "b": queue_lock_key(DEFAULT_QUEUE)}
    waiting = text(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND classid::bigint = :a AND objid::bigint = :b"
    )
    oids = {k: v & 0xFFFFFFFF for k, v in keys.items()}

    async def lane_at_the_barrier() -> int | None:
        async with database.connect() as conn:
            return (await conn.execute(waiting, oids)).scalar()

    try:
        await app.enqueue("gated", {})
        drain = asyncio.create_task(app.drainer(commit_mode="strict").drain())
        await eventually(lambda: _ran(runs), timeout=30)
        async with database.connect() as holder:
            await holder.execute(text("SELECT pg_advisory_lock(:a, :b)"), keys)
            await holder.commit()  # a session lock: it outlives the commit
            barrier_held.set()
            lane = await eventually(lane_at_the_barrier, timeout=30)
            await holder.execute(text("SELECT pg_cancel_backend(:pid)"), {"pid": lane})
            await holder.execute(text("SELECT pg_advisory_unlock(:a, :b)"), keys)
            await holder.commit()
        result = await asyncio.wait_for(drain, 30)
    finally:
        barrier_held.set()
        await app.aclose()
    assert result.error is None and result.stats["processed"] == 1
    assert runs == [0, 1]  # ran again after the rollback
    [row] = await job_rows(database)
    assert (row["status"], row["retry_count"], row["error_history"]) == ("completed", 0, [])


async def _ran(runs: list[int]) -> bool:
    return bool(runs)


async def test_the_fence_holds_a_new_drainer_back_until_old_commits_end(database: Database) -> None:
    """The protocol itself, step by step, on real connections: a lane of the first drainer
    that passed its fence holds the new drainer's first claim back until it commits; after
    that, the first drainer's fence fails (its token is gone with its lock transaction)."""
    from cronlock import pg, sql
    from cronlock.queue.lease import Fence, Lease

    async def holds(fence: Fence, lane: pg.DriverConnection) -> bool:
        """FENCE_CHECK alone, as a lane's last write sends it (``sql.fenced``): True while
        the drainer's lock transaction holds its token."""
        check = pg.AsyncpgStatement.of(sql.FENCE_CHECK, database.schema)
        return not await lane.fetchval(check.sql, *check.args(**fence.params))

    first = Lease(database, "q", keepalive=None, heartbeat_interval=1)
    second = Lease(database, "q", keepalive=None, heartbeat_interval=1)
    lane = await pg.connect(database, "test-lane")
    try:
        await first.connect()
        await first.begin()
        assert await first.try_take()
        commit = lane.transaction()
        await commit.start()
        assert await holds(first.fence, lane)  # alive: the lane may commit, barrier held shared
        await second.connect()
        await second.begin()
        taking = asyncio.create_task(second.wait(asyncio.Event()))
        first_pid = first.driver.get_server_pid()
        assert await terminate(database, "pid = :pid", pid=first_pid) == [first_pid]
        # The second has the queue's lock now, and waits at the barrier for the lane's commit.
        second_pid = second.driver.get_server_pid()
        await eventually(lambda: _waits_at_the_barrier(database, second_pid), timeout=10)
        assert not taking.done()
        await commit.commit()
        assert await asyncio.wait_for(taking, 10)
        late = lane.transaction()
        await late.start()
        assert not await holds(first.fence, lane)  # lost: this lane must roll back
        await late.rollback()
        assert await holds(second.fence, lane)
    finally:
        await lane.close()
        first.close()
        second.close()


async def _waits_at_the_barrier(database: Database, pid: int) -> bool:
    from cronlock.queue.lease import BARRIER_NAMESPACE

    query = (
        "SELECT count(*) FROM pg_locks WHERE pid = :pid AND locktype = 'advisory' "
        "AND NOT granted AND classid = :ns"
    )
    params = {"pid": pid, "ns": BARRIER_NAMESPACE & 0xFFFFFFFF}
    async with database.connect() as conn:
        return bool((await conn.execute(text(query), params)).scalar_one())


# -- the LISTEN connection: cut, it is reopened, and pickup is immediate again -----------------


async def _listeners(database: Database) -> list[int]:
    query = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = 'cronlock-listener:default'"
    )
    async with database.connect() as conn:
        return list((await conn.execute(text(query))).scalars())


async def test_a_cut_listen_connection_is_reopened(database: Database) -> None:
    app = cronlock.App()

    @app.job("quick")
    async def quick(session: AsyncSession, payload: dict[str, Any]) -> None:
        return None

    app.use_database(str(database.url))
    stop = asyncio.Event()
    try:
        # A poll interval of a minute: only LISTEN/NOTIFY can pick a job up within seconds.
        worker = asyncio.create_task(
            cronlock.serve_worker(app.drainer(poll_interval=60), stop=stop)
        )
        [listener] = await eventually(lambda: _listeners(database), timeout=30)
        assert await terminate(database, "pid = :pid", pid=listener) == [listener]
        reopened = await eventually(lambda: _other_listener(database, listener), timeout=10)
        assert reopened != listener
        loop = asyncio.get_running_loop()
        enqueued = loop.time()
        await app.enqueue("quick", {})
        await eventually(lambda: _all_completed(database, 1), timeout=10, interval=0.002)
        latency = loop.time() - enqueued
        stop.set()
        result = await asyncio.wait_for(worker, 30)
    finally:
        stop.set()
        await app.aclose()
    assert latency < 2.0, latency
    assert result.status is cronlock.RunStatus.COMPLETED, result.error


async def _other_listener(database: Database, old: int) -> int | None:
    pids = [pid for pid in await _listeners(database) if pid != old]
    return pids[0] if pids else None
