"""Per-key concurrency limits: at most K jobs with one concurrency key run at once, across
every lane of every drainer, exclusive or shared, in every commit mode.

The jobs count themselves while they run: in this process on a counter of the test's, in
worker processes on a row of ``gauge`` each updates on a connection of its own (committed at
once). Jobs without a key, through the same count, show that the lanes do run at once: a
limit that held only because nothing ran concurrently would prove nothing.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from cli import finish, invoke, kill_all, start_cli
from jobsupport import job_app, job_rows
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession
from testapps import jobs as testjobs
from waiting import ended_within, eventually

from cronlock import App, Database, InvalidJobOption, RunStatus
from cronlock.sql.tables import jobs, workers

APP = ("--app", "testapps.jobs")


class Gauge:
    """Jobs running now and the most that ever ran at once, per gauge name."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    async def run(self, name: str, seconds: float) -> None:
        self.running[name] = self.running.get(name, 0) + 1
        self.peak[name] = max(self.peak.get(name, 0), self.running[name])
        await asyncio.sleep(seconds)
        self.running[name] -= 1


def _gauged_app(gauge: Gauge) -> App:
    app = App()

    @app.job("limited", concurrency_limit=2)
    async def limited(session: AsyncSession, payload: Any) -> None:
        await gauge.run(payload["gauge"], 0.01)

    return app


@asynccontextmanager
async def _apps(database: Database, count: int, gauge: Gauge) -> AsyncIterator[list[App]]:
    apps = [_gauged_app(gauge) for _ in range(count)]
    for app in apps:
        app.use_database(str(database.url))
    try:
        yield apps
    finally:
        for app in apps:
            await app.aclose()


async def _statuses(database: Database) -> dict[str, int]:
    async with database.connect() as conn:
        rows = await conn.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status))
        return {status: count for status, count in rows}


@pytest.mark.parametrize("mode", ["strict", "batch", "lease"])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "exclusive"])
async def test_no_more_than_the_limit_of_a_key_run_at_once_across_lanes_and_drainers(
    database: Database, mode: str, shared: bool
) -> None:
    gauge = Gauge()
    async with _apps(database, 3, gauge) as apps, database.session() as session:
        enqueue = apps[0].enqueue_many_tx
        await enqueue(session, "limited", [{"gauge": "a"}] * 40, concurrency_keys=["a"] * 40)
        await enqueue(
            session,
            "limited",
            [{"gauge": "b"}] * 20,
            concurrency_keys=["b"] * 20,
            concurrency_limit=1,
        )
        await enqueue(session, "limited", [{"gauge": "free"}] * 40)  # no key: no limit
        await session.commit()
        # Shared: three active drainers of three lanes each. Exclusive: the active one's three
        # lanes (the others stand by).
        drainers = [
            app.drainer(
                shared=shared,
                commit_mode=mode,
                batch_size=4,
                concurrency=3,
                poll_interval=0.05,
                heartbeat_interval=0.05,
            )
            for app in apps
        ]
        tasks = [asyncio.create_task(d.work()) for d in drainers]
        try:
            await eventually(lambda: _statuses_are(database, {"completed": 100}), timeout=60)
        finally:
            for drainer in drainers:
                drainer.stop()
            await ended_within(
                tasks,
                about="the stopped drainers",
                describe=lambda: [(d.state, d.in_flight, d.stats.processed) for d in drainers],
            )
    assert gauge.peak["a"] == 2  # the type's limit, reached and never passed
    assert gauge.peak["b"] == 1  # the enqueue's own
    assert gauge.peak["free"] >= 3  # the lanes do run jobs at once
    assert sum(d.stats.processed for d in drainers) == 100


async def _statuses_are(database: Database, expected: dict[str, int]) -> bool:
    return await _statuses(database) == expected


async def _peaks(database: Database) -> dict[str, int]:
    async with database.connect() as conn:
        rows = await conn.execute(select(testjobs.gauge.c.name, testjobs.gauge.c.peak))
        return {name: peak for name, peak in rows}


async def _active(database: Database) -> int:
    async with database.connect() as conn:
        query = select(func.count()).where(workers.c.state == "active")
        return int((await conn.execute(query)).scalar_one())


@pytest.mark.parametrize("mode", ["strict", "batch"])
async def test_the_limit_holds_across_worker_processes(
    database: Database, database_url: str, mode: str
) -> None:
    args = (*APP, "worker", "--shared", "--concurrency", "2", "--commit-mode", mode)
    workers_ = [start_cli(*args, "--batch-size", "3", database_url=database_url) for _ in range(3)]
    try:
        await eventually(lambda: _all_active(database, 3), timeout=30)
        async with job_app(database) as app, database.session() as session:
            keyed = [{"n": i, "gauge": "k", "ms": 20} for i in range(40)]
            free = [{"n": i, "gauge": "free", "ms": 20} for i in range(40, 80)]
            await app.enqueue_many_tx(session, "gauged", keyed, concurrency_keys=["k"] * 40)
            await app.enqueue_many_tx(session, "gauged", free)
            await session.commit()
        await eventually(lambda: _statuses_are(database, {"completed": 80}), timeout=60)
        for worker in workers_:
            worker.send_signal(signal.SIGTERM)
        codes = [finish(worker)[0] for worker in workers_]
    finally:
        kill_all(*workers_)
    assert codes == [0, 0, 0]
    peaks = await _peaks(database)
    assert peaks["k"] == 2  # gauged's declared limit, across three processes of two lanes
    assert peaks["free"] >= 3  # without a key, more than one process's lanes ran at once
    log = select(func.count(), func.count(func.distinct(testjobs.job_log.c.job)))
    async with database.connect() as conn:
        assert tuple((await conn.execute(log)).one()) == (80, 80)


async def _all_active(database: Database, count: int) -> bool:
    return await _active(database) == count


async def test_a_key_s_jobs_are_stored_with_their_limit_and_bad_options_write_nothing(
    database: Database,
) -> None:
    async with job_app(database) as app, database.session() as session:
        await app.enqueue_tx(session, "gauged", {"n": 1}, concurrency_key="acct-1")
        await app.enqueue_tx(session, "log", {"n": 2}, concurrency_key="acct-1")
        await app.enqueue_tx(
            session, "log", {"n": 3}, concurrency_key="acct-2", concurrency_limit=5
        )
        await app.enqueue_tx(session, "log", {"n": 4})
        cases: list[tuple[dict[str, Any], str]] = [
            ({"concurrency_limit": 2}, "needs a concurrency_key"),
            ({"concurrency_key": "x", "concurrency_limit": 0}, "between 1 and 100"),
            ({"concurrency_key": "x", "concurrency_limit": 101}, "between 1 and 100"),
            ({"concurrency_key": ""}, "1 to 200 characters"),
        ]
        for bad, message in cases:
            with pytest.raises(InvalidJobOption, match=message):
                await app.enqueue_tx(session, "log", {"n": 9}, **bad)
        await session.commit()
    rows = sorted(await job_rows(database), key=lambda r: int(r["payload"]["n"]))
    assert [(r["concurrency_key"], r["concurrency_limit"]) for r in rows] == [
        ("acct-1", 2),  # gauged's declared limit
        ("acct-1", 1),  # log declares none: a key alone runs one at a time
        ("acct-2", 5),
        (None, None),
    ]


async def test_an_idle_lane_waits_instead_of_spinning_on_a_key_at_its_limit(
    database: Database,
) -> None:
    # Five jobs of one key with a limit of 1: one lane runs them one after another, claiming
    # the next as it commits; the drain ends when all are done, whichever lane ran them.
    gauge = Gauge()
    async with _apps(database, 1, gauge) as (app,), database.session() as session:
        await app.enqueue_many_tx(
            session, "limited", [{"gauge": "one"}] * 5, concurrency_keys=["one"] * 5,
            concurrency_limit=1,
        )  # fmt: skip
        await session.commit()
        result = await app.drain(concurrency=4)
    assert result.status is RunStatus.COMPLETED and result.stats["processed"] == 5
    assert gauge.peak["one"] == 1


def test_enqueue_on_the_command_line_takes_a_concurrency_key(database_url: str) -> None:
    answer = invoke(
        *APP, "enqueue", "log", '{"n": 1}', "--concurrency-key", "acct-9",
        "--concurrency-limit", "3", database_url=database_url,
    )  # fmt: skip
    assert answer.returncode == 0, answer.stderr

    async def stored() -> list[tuple[Any, Any]]:
        database = Database(database_url)
        try:
            rows = await job_rows(database)
        finally:
            await database.dispose()
        return [(r["concurrency_key"], r["concurrency_limit"]) for r in rows]

    assert asyncio.run(stored()) == [("acct-9", 3)]
    bad = invoke(
        *APP, "enqueue", "log", "--concurrency-limit", "3", database_url=database_url
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip() == "Error: concurrency_limit needs a concurrency_key"
