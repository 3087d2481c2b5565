"""A database restart or outage under a running worker, scheduler and ``serve`` (issue 11,
point 4): they ride it out and resume; nothing is lost, nothing runs twice, no attempt is
consumed, and draining resumes within 2 s of the server's return.

The server is a cluster of the test's own (``cluster.py``: initdb on another port, run as
``nobody``), restarted with ``pg_ctl restart -m fast`` or ``-m immediate``, or stopped for 5 s;
the machine's server is never touched. The worker is a real ``cronlock worker`` process.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import pytest_asyncio
from cli import finish, free_port, kill_all, run_cli, start_cli
from cluster import Cluster, private_cluster
from history import runs_of
from jobsupport import create_job_tables
from sqlalchemy import func, select
from testapps import jobs as testjobs
from waiting import eventually, wait_for

import cronlock
from cronlock import Database, Scheduler
from cronlock.outage import Reconnect
from cronlock.sql.tables import jobs

pytestmark = pytest.mark.faults

JOBS = 1_000
RESUMED_WITHIN = 2.0  # seconds from the server's return to the next completion


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with private_cluster() as started:
        yield started


@pytest_asyncio.fixture
async def cluster_url(cluster: Cluster) -> AsyncIterator[str]:
    """A database of this test's own in the cluster, migrated, with the handlers' tables."""
    name = f"restart_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(cluster.url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = cluster.url.rsplit("/", 1)[0] + f"/{name}"
    migrated = run_cli("migrate", database_url=url)
    assert migrated.returncode == 0, migrated.stderr
    database = Database(url)
    try:
        await create_job_tables(database)
    finally:
        await database.dispose()
    yield url
    if not cluster.running():
        cluster.start()
    admin = await asyncpg.connect(cluster.url)
    try:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def _completed(url: str) -> int:
    """Completed jobs, on a connection of its own (None while the server is away)."""
    connection = await asyncpg.connect(url)
    try:
        count: int = await connection.fetchval(
            "SELECT count(*) FROM cronlock.jobs WHERE status = 'completed'"
        )
        return count
    finally:
        await connection.close()


async def _resumed_after(url: str, back: float, before: int) -> float:
    """Seconds from ``back`` (the server's return) to the first completion past ``before``."""
    deadline = back + 30
    while time.monotonic() < deadline:
        with_server = await _completed(url)
        if with_server > before:
            return time.monotonic() - back
        await asyncio.sleep(0.02)
    raise AssertionError("draining did not resume within 30 s of the server's return")


def _fault(cluster: Cluster, fault: str) -> float:
    """Do the fault; the monotonic time the server accepted connections again."""
    if fault == "outage":
        cluster.stop("immediate")
        stopped = time.monotonic()
        wait_for(lambda: time.monotonic() - stopped >= 5, timeout=10, interval=0.1)
        cluster.start()
    else:
        cluster.restart(fault)
    return time.monotonic()


@pytest.mark.parametrize("fault", ["fast", "immediate", "outage"])
@pytest.mark.parametrize("commit_mode", ["strict", "batch", "lease"])
async def test_a_worker_rides_out_a_restart(
    cluster: Cluster, cluster_url: str, commit_mode: str, fault: str
) -> None:
    database = Database(cluster_url)
    app = testjobs.create_app()
    app.use_database(cluster_url)
    await app.enqueue_many("count", [{"n": n} for n in range(JOBS)])
    await app.aclose()
    args = ["--app", "testapps.jobs", "worker", "--commit-mode", commit_mode]
    if commit_mode == "lease":
        args += ["--batch-size", "20"]
    worker = start_cli(*args, database_url=cluster_url)
    try:
        await eventually(lambda: _above(cluster_url, JOBS // 10), timeout=60)
        back = _fault(cluster, fault)
        before = await _completed(cluster_url)
        resumed = await _resumed_after(cluster_url, back, before)
        await eventually(lambda: _above(cluster_url, JOBS - 1), timeout=120)
        assert worker.poll() is None, "the worker exited"
        worker.send_signal(signal.SIGTERM)
        code, _, stderr = finish(worker)
    finally:
        kill_all(worker)

    print(f"\n{commit_mode}/{fault}: draining resumed {resumed:.2f} s after the server's return")
    assert code == 0, stderr
    assert "lost the database" in stderr and "answers again" in stderr
    assert "Traceback" not in stderr
    assert resumed <= RESUMED_WITHIN
    try:
        async with database.connect() as conn:
            by_status = select(jobs.c.status, func.count()).group_by(jobs.c.status)
            statuses: dict[str, int] = dict((await conn.execute(by_status)).all())
            retries = await conn.scalar(select(func.max(jobs.c.retry_count)))
            logged = (await conn.execute(select(testjobs.job_log.c.job))).scalars().all()
            counter = await conn.scalar(select(testjobs.counter.c.n))
    finally:
        await database.dispose()
    assert statuses == {"completed": JOBS}
    assert retries == 0  # no attempt consumed by the fault
    assert sorted(map(int, logged)) == list(range(JOBS))  # each job's writes once
    assert counter == JOBS


async def _above(url: str, count: int) -> bool:
    try:
        return await _completed(url) > count
    except (OSError, asyncpg.PostgresError):
        return False


def _ticking(cluster_url: str) -> tuple[cronlock.App, list[datetime]]:
    """An app with one every-minute task that notes the slots it ran."""
    app = cronlock.App()
    ran: list[datetime] = []

    @app.periodic("tick", cron="* * * * *")
    async def tick(run: cronlock.Run) -> None:
        assert run.slot is not None
        ran.append(run.slot)

    app.use_database(cluster_url)
    return app, ran


async def _clear_of_a_fire_time() -> None:
    """Wait, if need be, until the next fire time is over 15 s away: a scheduler test's
    outage takes a few seconds, and a fire time inside it would wake the task once more."""
    await eventually(_early_in_the_minute, timeout=20, interval=0.1)


async def _early_in_the_minute() -> bool:
    return datetime.now(UTC).second < 45


async def _slots(cluster_url: str) -> dict[datetime, list[str]]:
    """The statuses of the tick task's runs, by slot, in the order they were recorded."""
    database = Database(cluster_url)
    try:
        recorded = await runs_of(database, "tick")
    finally:
        await database.dispose()
    found: dict[datetime, list[str]] = {}
    for run in recorded:
        found.setdefault(run["slot"], []).append(run["status"])
    return found


@contextlib.asynccontextmanager
async def _through_an_outage(
    app: cronlock.App, scheduler: Scheduler, ran: list[datetime], cluster: Cluster
) -> AsyncIterator[None]:
    """``scheduler`` serving ``app`` with the server stopped: the block runs once a wake
    waits for the database; then the server starts again, and the scheduler is stopped once
    the task ran and no wake of its is in flight."""
    stop = asyncio.Event()
    cluster.stop("immediate")
    serving = asyncio.create_task(scheduler.serve(stop))
    try:
        await eventually(lambda: _waiting(scheduler), timeout=10)
        yield
        cluster.start()
        await eventually(lambda: _ran(ran), timeout=10)
        await eventually(lambda: _settled(scheduler), timeout=10)
    finally:
        stop.set()
        await serving
        await app.aclose()


def _riding_out(app: cronlock.App, clock: Callable[[], datetime] | None = None) -> Scheduler:
    reconnect = Reconnect(first_delay=0.05, max_delay=0.5)
    if clock is None:
        return Scheduler(app, reconnect=reconnect)
    return Scheduler(app, clock=clock, reconnect=reconnect)


async def test_the_scheduler_runs_a_slot_its_outage_held_back(
    cluster: Cluster, cluster_url: str
) -> None:
    """A wake that finds the database gone leaves its slot unrecorded, waits, and runs it
    once the server is back (within the slot's grace)."""
    app, ran = _ticking(cluster_url)
    scheduler = _riding_out(app)
    await _clear_of_a_fire_time()
    async with _through_an_outage(app, scheduler, ran, cluster):
        down_at = datetime.now(UTC)
    assert len(ran) == 1 and ran[0] <= down_at
    assert await _slots(cluster_url) == {ran[0]: ["completed"]}


async def test_fire_times_lost_in_one_outage_wake_the_task_once_after_it(
    cluster: Cluster, cluster_url: str
) -> None:
    """Two wakes of the task find the database gone (a fire time passed while it was away):
    once it is back the task is woken once, not once per lost wake, so no second run of the
    slot finds its lock busy and records itself skipped."""
    app, ran = _ticking(cluster_url)
    scheduler = _riding_out(app)
    await _clear_of_a_fire_time()
    async with _through_an_outage(app, scheduler, ran, cluster):
        assert await scheduler.wake(app.task("tick")) == []  # the next fire, lost as well
    assert len(ran) == 1
    assert await _slots(cluster_url) == {ran[0]: ["completed"]}


async def test_a_slot_lost_before_the_first_horizon_is_recorded_once_the_database_is_back(
    cluster: Cluster, cluster_url: str
) -> None:
    """The process's first wake finds the database gone, and the server is back only after
    the next fire time: the slot of that first wake is still handled by the task's misfire
    policy (``skip``: recorded missed), not passed over, and the next one runs."""
    app, ran = _ticking(cluster_url)
    await _clear_of_a_fire_time()
    first = datetime.now(UTC).replace(second=0, microsecond=0)
    moment = [first + timedelta(seconds=10)]
    scheduler = _riding_out(app, clock=lambda: moment[0])
    async with _through_an_outage(app, scheduler, ran, cluster):
        moment[0] = first + timedelta(minutes=1, seconds=10)
    second = first + timedelta(minutes=1)
    assert ran == [second]
    assert await _slots(cluster_url) == {first: ["missed"], second: ["completed"]}


async def _settled(scheduler: Scheduler) -> bool:
    """No wake of the scheduler's is in flight or waiting for the database."""
    return not scheduler._inflight


async def _waiting(scheduler: Scheduler) -> bool:
    return scheduler._outage is not None and not scheduler._outage.done()


async def _ran(ran: list[datetime]) -> bool:
    return bool(ran)


def test_serve_answers_503_while_the_database_is_away_then_200(
    cluster: Cluster, cluster_url: str
) -> None:
    port = free_port()
    server = start_cli(
        "--app", "testapps.jobs", "serve", "--port", str(port),
        database_url=cluster_url, CRONLOCK_API_TOKEN="t",
    )  # fmt: skip
    try:
        wait_for(lambda: _get(port, "/jobs") == 200, timeout=30, interval=0.05)
        cluster.stop("immediate")
        assert _get(port, "/jobs") == 503
        cluster.start()
        statuses = [_get(port, "/jobs") for _ in range(3)]
        assert statuses[-1] == 200
        assert server.poll() is None
        server.send_signal(signal.SIGTERM)
        code, _, stderr = finish(server)
    finally:
        kill_all(server)
    assert code == 0, stderr
    assert "Traceback" not in stderr


def _get(port: int, path: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"Authorization": "Bearer t"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (OSError, subprocess.SubprocessError):
        return 0


def test_a_worker_gives_up_after_its_time_with_one_line(cluster: Cluster, cluster_url: str) -> None:
    worker = start_cli(
        "--app", "testapps.jobs", "worker", "--give-up-after", "1", database_url=cluster_url
    )  # fmt: skip
    try:
        wait_for(lambda: _active_backends(cluster_url) > 0, timeout=30, interval=0.05)
        cluster.stop("immediate")
        code, stdout, stderr = finish(worker, timeout=60)
    finally:
        kill_all(worker)
        cluster.start()
    assert code == 1, stderr
    assert "error: worker default: gave up after 1 s without the database" in stdout
    assert "Traceback" not in stderr


def _active_backends(url: str) -> int:
    """The worker's drainer lock is held (it is active)."""
    return asyncio.run(_holders(url))


async def _holders(url: str) -> int:
    connection = await asyncpg.connect(url)
    try:
        count: int = await connection.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        )
        return count
    finally:
        await connection.close()
