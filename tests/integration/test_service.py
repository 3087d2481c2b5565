"""The serve entry points in process, as an application embedding cronlock uses them: a stop
event (or, when asked, SIGTERM/SIGINT) stops them gracefully, and the scheduler supervises the
drainer beside it. Each test has its own App; a handler waits on events the test sets."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from cli import run_cli
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncSession
from waiting import eventually

from cronlock import (
    App,
    Database,
    Drainer,
    RunStatus,
    Scheduler,
    serve_drain,
    serve_scheduler,
    serve_worker,
)
from cronlock.schema import head_revision
from cronlock.sql.tables import jobs, workers


@dataclass
class Gate:
    """What the ``gated`` handler tells the test and waits for."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Served:
    app: App
    gate: Gate


@pytest.fixture
async def served(database_url: str) -> AsyncIterator[Served]:
    app, gate = App(), Gate()

    @app.job("gated")
    async def gated(session: AsyncSession, payload: Any) -> Any:
        gate.started.set()
        await gate.release.wait()
        return payload

    @app.job("noop")
    async def noop(session: AsyncSession, payload: Any) -> None:
        return None

    @app.job("boom", max_retries=0)
    async def boom(session: AsyncSession, payload: Any) -> None:
        raise ValueError("boom")

    app.use_database(database_url)
    try:
        yield Served(app, gate)
    finally:
        await app.aclose()


async def _statuses(database: Database) -> dict[str, int]:
    async with database.connect() as conn:
        rows = await conn.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status))
        return {status: count for status, count in rows}


async def _workers(database: Database) -> int:
    async with database.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(workers)) or 0)


async def test_serve_worker_stops_with_the_event_and_finishes_the_job_in_flight(
    served: Served, database: Database
) -> None:
    app, gate = served.app, served.gate
    await app.enqueue_many("gated", [{"n": n} for n in range(3)])
    before = signal.getsignal(signal.SIGTERM)
    drainer = app.drainer(commit_mode="batch", batch_size=10)  # all three in one batch
    stop = asyncio.Event()
    serving = asyncio.create_task(serve_worker(drainer, stop=stop))
    await asyncio.wait_for(gate.started.wait(), 30)
    assert signal.getsignal(signal.SIGTERM) is before  # not asked to: its signals are the app's

    stop.set()
    await eventually(lambda: _state_is_stopping(drainer))
    gate.release.set()  # the job in flight may finish now
    result = await asyncio.wait_for(serving, 30)

    assert result.status is RunStatus.COMPLETED
    assert (result.stats["processed"], result.stats["handed_back"]) == (1, 2)
    assert await _statuses(database) == {"completed": 1, "pending": 2}
    assert await _workers(database) == 0  # the worker removed its row


async def _state_is_stopping(drainer: Drainer) -> bool:
    return drainer.stopping


async def test_serve_worker_aborts_the_job_in_flight_when_the_grace_period_ends(
    served: Served, database: Database
) -> None:
    app, gate = served.app, served.gate
    await app.enqueue("gated", {"n": 1})
    stop = asyncio.Event()
    serving = asyncio.create_task(serve_worker(app.drainer(), grace_period=0, stop=stop))
    await asyncio.wait_for(gate.started.wait(), 30)
    stop.set()  # never released: the grace period ends first
    result = await asyncio.wait_for(serving, 30)

    assert (result.stats["processed"], result.stats["rolled_back"]) == (0, 1)
    assert await _statuses(database) == {"pending": 1}  # due again, nothing of it committed


async def test_serve_worker_with_signals_stops_on_sigterm_and_aborts_on_a_second_signal(
    served: Served, database: Database
) -> None:
    app, gate = served.app, served.gate
    await app.enqueue("gated", {"n": 1})
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    drainer = app.drainer()
    serving = asyncio.create_task(serve_worker(drainer, handle_signals=True))
    await asyncio.wait_for(gate.started.wait(), 30)
    # Only once the handler is there may this process signal itself (else SIGTERM ends pytest).
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None, before[signal.SIGTERM])

    os.kill(os.getpid(), signal.SIGTERM)
    await eventually(lambda: _state_is_stopping(drainer))
    assert not serving.done()  # graceful: the job in flight has 30 s
    os.kill(os.getpid(), signal.SIGINT)  # the second signal aborts it
    result = await asyncio.wait_for(serving, 30)

    assert (result.stats["processed"], result.stats["rolled_back"]) == (0, 1)
    assert await _statuses(database) == {"pending": 1}
    after = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    assert after == before  # what was there is put back


async def test_serve_drain_drains_until_nothing_is_due(served: Served, database: Database) -> None:
    app = served.app
    await app.enqueue_many("noop", [None] * 5)
    result = await serve_drain(app.drainer(concurrency=2))
    assert result.status is RunStatus.COMPLETED
    assert result.stats["processed"] == 5
    assert await _statuses(database) == {"completed": 5}


async def test_serve_scheduler_restarts_a_drainer_that_ends_on_its_own(
    served: Served, database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    app = served.app
    made: list[Drainer] = []

    def make() -> Drainer:
        made.append(app.drainer(heartbeat_interval=0.05))
        return made[-1]

    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="cronlock.drainer"):
        serving = asyncio.create_task(
            # reconnect=None: the drainer ends when it loses its lock (with a policy it rides
            # the loss out, below), and the scheduler makes it again.
            serve_scheduler(
                Scheduler(app, reconnect=None), drainer=make, restart_delay=0, stop=stop
            )
        )
        await eventually(lambda: _made_and_active(made, 1), timeout=30)
        # The first drainer loses its database (an admin, or a server restart, cut it).
        assert await _cut_drainer_lock(database) == 1
        await eventually(lambda: _made_and_active(made, 2), timeout=30)
        await app.enqueue("noop", None)  # the new one drains
        await eventually(lambda: _statuses_are(database, {"completed": 1}), timeout=30)

        stop.set()
        await asyncio.wait_for(serving, 30)

    assert len(made) == 2  # stopped with the scheduler: not started again
    stopped = [r for r in caplog.records if r.getMessage().startswith("drainer stopped")]
    assert [r.levelno for r in stopped] == [logging.WARNING, logging.INFO]
    assert json.loads(stopped[0].getMessage().partition(": ")[2])["status"] == "failed"
    assert await _workers(database) == 0


async def test_serve_schedulers_drainer_rides_out_a_lost_lock(
    served: Served, database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    app = served.app
    made: list[Drainer] = []

    def make() -> Drainer:
        made.append(app.drainer(heartbeat_interval=0.05))
        return made[-1]

    stop = asyncio.Event()
    with caplog.at_level(logging.INFO):
        serving = asyncio.create_task(serve_scheduler(Scheduler(app), drainer=make, stop=stop))
        await eventually(lambda: _made_and_active(made, 1), timeout=30)
        assert await _cut_drainer_lock(database) == 1
        await eventually(lambda: _said(caplog, "answers again"), timeout=30)
        await eventually(lambda: _made_and_active(made, 1), timeout=30)
        await app.enqueue("noop", None)  # the same drainer drains again
        await eventually(lambda: _statuses_are(database, {"completed": 1}), timeout=30)
        stop.set()
        await asyncio.wait_for(serving, 30)

    assert len(made) == 1  # ridden out in place: not made again
    assert await _workers(database) == 0


async def _said(caplog: pytest.LogCaptureFixture, words: str) -> bool:
    return words in caplog.text


async def _cut_drainer_lock(database: Database) -> int:
    """Terminate the drainer's lock connection (an admin, or a server restart, cut it)."""
    async with database.connect() as conn:
        killed: int = await conn.scalar(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'cronlock-drainer:default' "
                "AND datname = current_database()"
            )
        )
    return killed


async def _made_and_active(made: list[Drainer], count: int) -> bool:
    return len(made) == count and made[-1].state == "active"


async def _statuses_are(database: Database, expected: dict[str, int]) -> bool:
    return await _statuses(database) == expected


async def test_serve_scheduler_gives_the_drainers_job_in_flight_the_shutdown_grace(
    served: Served, database: Database
) -> None:
    app, gate = served.app, served.gate
    await app.enqueue("gated", {"n": 1})
    stop = asyncio.Event()
    serving = asyncio.create_task(
        serve_scheduler(Scheduler(app, shutdown_grace=60), drainer=app.drainer, stop=stop)
    )
    await asyncio.wait_for(gate.started.wait(), 30)
    stop.set()
    assert not serving.done()
    gate.release.set()
    await asyncio.wait_for(serving, 30)
    assert await _statuses(database) == {"completed": 1}


async def test_migrate_and_status_from_code(empty_database: Database) -> None:
    app = App()

    @app.job("noop")
    async def noop(session: AsyncSession, payload: Any) -> None:
        return None

    @app.job("boom", max_retries=0)
    async def boom(session: AsyncSession, payload: Any) -> None:
        raise ValueError("boom")

    url = empty_database.url.set(drivername="postgresql").render_as_string(hide_password=False)
    app.use_database(url)
    try:
        assert await app.migrate() == head_revision()
        assert await app.migrate() == head_revision()  # idempotent
        await app.enqueue("noop", None)
        await app.enqueue("boom", None)
        await app.drain()
        report = await app.status()
    finally:
        await app.aclose()

    assert [q["counts"] for q in report["queue"]["queues"]] == [{"completed": 1, "failed": 1}]
    assert [f["error_message"] for f in report["queue"]["recent_failures"]] == ["ValueError: boom"]
    # The same dict `cronlock status --json` prints (an app with no periodic tasks, as ours).
    printed = await asyncio.to_thread(
        run_cli, "--app", "testapps.jobs", "status", "--json", database_url=url
    )
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == report


async def test_status_of_an_unmigrated_database_says_so(empty_database: Database) -> None:
    from cronlock import DatabaseUnavailable

    app = App()
    app.use_database(str(empty_database.url.render_as_string(hide_password=False)))
    try:
        with pytest.raises(DatabaseUnavailable, match="run `cronlock migrate`"):
            await app.status()
    finally:
        await app.aclose()
