"""Workers as real processes: SIGTERM is graceful, a second signal aborts, SIGKILL loses nothing.

Each test starts ``cronlock worker`` in subprocesses (tests/support/cli.py) and watches the
database; nothing sleeps to synchronise: markers and rows are polled with a deadline.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from cli import finish, kill_all, start_cli
from jobsupport import job_app, scalar
from sqlalchemy import func, select
from testapps import jobs as testjobs
from waiting import eventually

from cronlock import Database
from cronlock.sql.tables import jobs, workers

APP = ("--app", "testapps.jobs")


async def _enqueue(database: Database, job_type: str, count: int) -> None:
    async with job_app(database) as app, database.session() as session:
        await app.enqueue_many_tx(session, job_type, [{"n": i} for i in range(count)])
        await session.commit()


async def _statuses(database: Database) -> dict[str, int]:
    async with database.connect() as conn:
        rows = await conn.execute(select(jobs.c.status, func.count()).group_by(jobs.c.status))
        return {status: count for status, count in rows}


async def _worker_states(database: Database) -> list[str]:
    async with database.connect() as conn:
        return sorted((await conn.execute(select(workers.c.state))).scalars().all())


async def test_sigterm_mid_batch_in_flight_finishes_rest_stays_pending(
    database: Database, database_url: str, tmp_path: Path
) -> None:
    await _enqueue(database, "gated", 10)
    started, release = tmp_path / "started", tmp_path / "release"
    worker = start_cli(
        *APP, "worker", "--json", "--commit-mode", "batch", "--batch-size", "10",
        database_url=database_url, GATE_STARTED=str(started), GATE_RELEASE=str(release),
    )  # fmt: skip
    try:
        await eventually(lambda: _exists(started), timeout=30)
        worker.send_signal(signal.SIGTERM)
        await eventually(lambda: _worker_states_are(database, ["stopping"]), timeout=10)
        release.write_text("go")  # the job in flight may finish now
        code, stdout, stderr = finish(worker)
    finally:
        kill_all(worker)

    assert code == 0, stderr
    report = json.loads(stdout)
    assert (report["processed"], report["handed_back"]) == (1, 9)
    assert await _statuses(database) == {"completed": 1, "pending": 9}
    assert await scalar(database, select(func.count()).select_from(testjobs.job_log)) == 1
    assert await _worker_states(database) == []  # the worker removed its row


@pytest.mark.parametrize("how", ["second signal", "grace period"])
async def test_abort_rolls_back_the_job_in_flight(
    database: Database, database_url: str, tmp_path: Path, how: str
) -> None:
    await _enqueue(database, "gated", 3)
    started = tmp_path / "started"
    worker = start_cli(
        *APP, "worker", "--json", "--grace-period", "0.5" if how == "grace period" else "60",
        database_url=database_url,
        GATE_STARTED=str(started), GATE_RELEASE=str(tmp_path / "never"),
    )  # fmt: skip
    try:
        await eventually(lambda: _exists(started), timeout=30)
        worker.send_signal(signal.SIGTERM)
        if how == "second signal":
            await eventually(lambda: _worker_states_are(database, ["stopping"]), timeout=10)
            worker.send_signal(signal.SIGINT)
        code, stdout, stderr = finish(worker)
    finally:
        kill_all(worker)

    assert code == 0, stderr
    report = json.loads(stdout)
    assert (report["processed"], report["rolled_back"]) == (0, 1)
    assert await _statuses(database) == {"pending": 3}
    assert await scalar(database, select(func.count()).select_from(testjobs.job_log)) == 0


@pytest.mark.parametrize("mode", ["strict", "batch", "lease"])
async def test_sigkill_with_a_standby_loses_nothing_and_applies_nothing_twice(
    database: Database, database_url: str, tmp_path: Path, mode: str
) -> None:
    total = 300
    await _enqueue(database, "count", total)
    hold = tmp_path / "hold"
    env = {"HOLD_MARKER": str(hold), "HOLD_AT": "100", "COUNT_DELAY": "0.002"}
    args = (*APP, "worker", "--json", "--commit-mode", mode, "--poll-interval", "0.5")
    active = start_cli(*args, database_url=database_url, **env)
    standby: subprocess.Popen[str] | None = None
    try:
        # The active worker is stuck in job 100, its transaction open; the standby waits.
        await eventually(lambda: _exists(hold), timeout=30)
        standby = start_cli(*args, database_url=database_url, **env)
        await eventually(lambda: _worker_states_are(database, ["active", "standby"]), timeout=30)
        before = await _statuses(database)

        active.kill()
        killed_at = time.monotonic()
        held_job = jobs.c.payload["n"].as_integer() == 100
        await eventually(
            lambda: _one(database, select(jobs.c.status).where(held_job), "completed"),
            timeout=30,
            interval=0.005,
        )
        recovery = time.monotonic() - killed_at
        await eventually(lambda: _statuses_are(database, {"completed": total}), timeout=60)
        standby.send_signal(signal.SIGTERM)
        code, stdout, stderr = finish(standby)
    finally:
        kill_all(active, *([standby] if standby else []))

    print(f"\n[{mode}] recovery after SIGKILL: {recovery * 1000:.0f} ms; before: {before}")
    # A bound that catches a recovery that waits for a timeout (a heartbeat row's 10 s
    # age), not the figure itself: that is measured in benchmarks (benchmarks.lease_sigkill,
    # the harness's recovery), not here. It took 0.3-3.9 s here in lease mode on a loaded
    # 2-core machine, and once 5.7 s, which a bound of 5 s failed.
    assert recovery < 8.0
    assert code == 0, stderr
    assert json.loads(stdout)["processed"] >= total - before.get("completed", 0)
    assert await scalar(database, select(testjobs.counter.c.n)) == total
    log = select(func.count(), func.count(func.distinct(testjobs.job_log.c.job)))
    async with database.connect() as conn:
        assert tuple((await conn.execute(log)).one()) == (total, total)


async def test_idle_worker_picks_up_a_new_job_at_once(
    database: Database, database_url: str
) -> None:
    async with job_app(database):
        pass
    # A poll interval of a minute: only LISTEN/NOTIFY can make this fast.
    worker = start_cli(*APP, "worker", "--json", "--poll-interval", "60", database_url=database_url)
    standby = start_cli(*APP, "worker", "--json", database_url=database_url)
    try:
        await eventually(lambda: _worker_states_are(database, ["active", "standby"]), timeout=30)
        # A standby told to stop cancels its wait for the lock and leaves at once.
        standby.send_signal(signal.SIGTERM)
        standby_code, standby_out, _ = finish(standby, timeout=10)
        assert standby_code == 0
        assert json.loads(standby_out)["processed"] == 0
        await _enqueue(database, "noop", 1)
        enqueued_at = time.monotonic()
        await eventually(
            lambda: _statuses_are(database, {"completed": 1}), timeout=10, interval=0.002
        )
        latency = time.monotonic() - enqueued_at
        worker.send_signal(signal.SIGTERM)
        code, _, stderr = finish(worker)
    finally:
        kill_all(worker, standby)
    print(f"\nenqueue -> completed seen by the test: {latency * 1000:.1f} ms")
    assert code == 0, stderr
    assert latency < 2.0


async def _exists(path: Path) -> bool:
    return path.exists()


async def _worker_states_are(database: Database, states: list[str]) -> bool:
    return await _worker_states(database) == states


async def _statuses_are(database: Database, expected: dict[str, int]) -> bool:
    return await _statuses(database) == expected


async def _one(database: Database, query: Any, expected: Any) -> bool:
    return bool(await scalar(database, query) == expected)


class _Lines:
    """A started command's stderr, read line by line as it comes (in a thread)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        import threading

        self.lines: list[str] = []
        assert process.stderr is not None
        stream = process.stderr
        self._thread = threading.Thread(target=lambda: self.lines.extend(stream), daemon=True)
        self._thread.start()

    async def saying(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def rest(self) -> str:
        self._thread.join(timeout=30)
        return "".join(self.lines)


@pytest.mark.parametrize("second", [False, True])
async def test_ctrl_c_during_drain_says_what_it_waits_for_then_interrupted(
    database: Database, database_url: str, tmp_path: Path, second: bool
) -> None:
    # Issue 16, point 8: Ctrl-C with jobs pending printed `completed` and exited 0, and with a
    # handler in flight said nothing for the whole grace period.
    await _enqueue(database, "gated", 4)
    started, release = tmp_path / "started", tmp_path / "release"
    drain = start_cli(
        *APP, "drain", database_url=database_url,
        GATE_STARTED=str(started), GATE_RELEASE=str(release),
    )  # fmt: skip
    try:
        stderr = _Lines(drain)
        await eventually(lambda: _exists(started), timeout=30)
        drain.send_signal(signal.SIGINT)
        # Said at once, while the job in flight still runs.
        await eventually(lambda: stderr.saying("waiting up to 30 s"), timeout=10)
        if second:
            drain.send_signal(signal.SIGINT)
            await eventually(lambda: stderr.saying("SIGINT again: aborting"), timeout=10)
        else:
            release.write_text("go")
        code = drain.wait(timeout=30)
        assert drain.stdout is not None
        stdout, said = drain.stdout.read(), stderr.rest()
    finally:
        kill_all(drain)

    assert code == 130, said
    [first, *_] = [line for line in said.splitlines() if "SIGINT" in line]
    assert first.endswith(
        " WARNING cronlock.cli: drain: SIGINT: stopping; no new jobs; waiting up to 30 s for "
        "the 1 job in flight to finish and commit (a second signal aborts them: they roll back "
        "and stay queued)"
    )
    [line] = stdout.splitlines()
    assert line.startswith("drain default: interrupted (SIGINT) — ")
    done = 0 if second else 1
    assert line.split(" — ")[1].startswith(f"{done} completed")
    assert await _statuses(database) == (
        {"pending": 4} if second else {"completed": 1, "pending": 3}
    )
