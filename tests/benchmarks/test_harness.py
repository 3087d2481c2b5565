"""The benchmark harness stays honest: its baselines do the work they claim, on tiny N.

No timing is asserted (the machine is shared); what is asserted is that every job is
completed exactly once, that the windows and latencies are read back from the database, that
the savepoint loops update every item once, and that each scratch database is dropped.
"""

from __future__ import annotations

import json
import uuid

import asyncpg
import pytest
from sqlalchemy import URL

from benchmarks import agent, savepoints
from benchmarks.run import Runner, Variant
from benchmarks.systems import load
from benchmarks.systems.base import Unsupported
from benchmarks.systems.cronlock_queue import CronlockQueue, queue_available
from benchmarks.systems.raw import RawQueue
from cronlock.database import Database


def _url(database: Database) -> str:
    return database.url.set(drivername="postgresql").render_as_string(hide_password=False)


async def _statuses(url: str) -> list[tuple[str, int]]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT status, count(*) FROM bench_jobs GROUP BY status")
    finally:
        await conn.close()
    return sorted((row[0], row[1]) for row in rows)


@pytest.mark.parametrize(
    "options",
    [{"mode": "strict"}, {"mode": "batch", "batch_size": 7}, {"mode": "split", "batch_size": 7}],
)
async def test_raw_drain_completes_every_job_once(
    database: Database, options: dict[str, object]
) -> None:
    url = _url(database)
    system = RawQueue(url, options)
    try:
        await system.install()
        result = await agent._drain(system, 40)
        window = await system.window()
    finally:
        await system.close()
    assert await _statuses(url) == [("completed", 40)]
    assert window.completed == 40
    assert window.last_completion >= window.first_claim
    assert result["n"] == 40 and result["jobs_per_s"] > 0
    assert window.p95_ms is not None and window.p95_ms >= 0


async def test_raw_enqueue_counts_what_it_wrote(database: Database) -> None:
    url = _url(database)
    system = RawQueue(url, {})
    try:
        await system.install()
        result = await agent._enqueue(system, 30, 5)
    finally:
        await system.close()
    assert await _statuses(url) == [("pending", 35)]
    assert result["bulk_n"] == 30 and result["single_n"] == 5


async def test_raw_idle_worker_latency_is_read_from_the_database(database: Database) -> None:
    url = _url(database)
    system = RawQueue(url, {"mode": "strict"})
    try:
        await system.install()
        result = await agent._latency(system, ["raw", url, "{}"], rate=50, seconds=0.2)
    finally:
        await system.close()
    # warm-up jobs plus the timed ones, every one completed by the worker process
    assert await _statuses(url) == [("completed", agent.WARMUP_JOBS + 10)]
    assert result["jobs"] == 10
    assert 0 < result["p50_ms"] <= result["p95_ms"] <= result["p99_ms"] <= result["max_ms"]


async def test_savepoint_loops_update_every_item_once(database: Database) -> None:
    url = _url(database)
    raw = await savepoints.run_raw(url, 25)
    assert raw["items"] == 25
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("DROP TABLE bench_items")
    finally:
        await conn.close()
    # run_cronlock checks the run's outcome and that every item was updated exactly once.
    mine = await savepoints.run_cronlock(url, 25)
    assert mine["items"] == 25 and mine["seconds"] > 0


@pytest.mark.parametrize("mode", ["strict", "batch"])
async def test_cronlock_queue_adapter_drains_or_says_it_cannot(
    database: Database, mode: str
) -> None:
    url = _url(database)
    if not queue_available():
        with pytest.raises(Unsupported):
            CronlockQueue(url, {})
        return
    system = CronlockQueue(url, {"commit_mode": mode})
    try:
        await system.install()  # already migrated: the upgrade is a no-op
        result = await agent._drain(system, 20)
        ids = [await system.enqueue_one() for _ in range(3)]
        await system.drain()
        done = await system.completed_at(ids)
    finally:
        await system.close()
    assert result["n"] == 20 and result["jobs_per_s"] > 0
    assert set(done) == set(ids)


def test_every_system_is_registered() -> None:
    assert load("raw") is RawQueue


async def test_runner_uses_and_drops_a_scratch_database(pg_server: URL) -> None:
    server = pg_server.set(drivername="postgresql").render_as_string(hide_password=False)

    # A prefix of its own: other runs on the same server make and drop bench_* databases.
    prefix = "benchtest" + uuid.uuid4().hex[:8]

    async def scratch_count() -> int:
        conn = await asyncpg.connect(server)
        try:
            return int(
                await conn.fetchval(
                    "SELECT count(*) FROM pg_database WHERE starts_with(datname, $1)", prefix
                )
            )
        finally:
            await conn.close()

    runner = Runner(server, py312=None, log=False, prefix=prefix)
    entry = await runner.repeat("drain", Variant("raw", "batch", {"mode": "batch"}), 2, "--n", "15")
    assert entry["errors"] == []
    assert len(entry["runs"]) == 2
    assert entry["summary"]["jobs_per_s"]["runs"] == 2
    assert {run["n"] for run in entry["runs"]} == {15}
    assert all(run["database"].startswith(prefix + "_") for run in entry["runs"])
    failed = await runner.repeat("drain", Variant("raw", "bad", {"mode": "nonsense"}), 1)
    assert failed["runs"] == [] and "unknown raw mode" in failed["errors"][0]
    json.dumps(entry)  # what the results file will hold
    assert await scratch_count() == 0  # each run dropped its scratch database
