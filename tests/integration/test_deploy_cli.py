"""The deploy verbs: ``migrate --check`` and ``--sql`` for a pipeline and a DBA, and
``queue pause --wait-idle`` for a deploy that wants the queue quiet."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import uuid
from pathlib import Path

import asyncpg
from cli import finish, invoke, invoke_async, kill_all, start_cli
from testdb import libpq_url
from waiting import eventually, wait_for

from cronlock import Database, schema

# Test-only rows: a lease-mode job that is running, a drainer's heartbeat row.
_PROCESSING = """
INSERT INTO cronlock.jobs (job_type, payload, queue, status, owner, attempt, started_at)
VALUES ('slow', '{}', 'deploy', 'processing', gen_random_uuid(), 1, now())"""
_BEAT = """
INSERT INTO cronlock.workers (id, queue, state, in_flight) VALUES ($1, 'deploy', 'active', $2)
ON CONFLICT (id) DO UPDATE SET in_flight = excluded.in_flight, heartbeat_at = now()"""
_PAUSED = "SELECT paused_at IS NOT NULL FROM cronlock.queues WHERE name = 'deploy'"


def test_check_at_head_exits_0_in_one_line(database_url: str) -> None:
    result = invoke("migrate", "--check", database_url=database_url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1
    assert f"is at revision {schema.head_revision()} (head): nothing to migrate" in result.stdout


async def test_check_with_a_pending_migration_exits_1(empty_database: Database) -> None:
    url = libpq_url(empty_database.url)
    missing = await invoke_async("migrate", "--check", database_url=url)
    assert missing.returncode == 1
    assert "is not installed: " in missing.stdout and missing.stdout.count("\n") == 1
    await schema.upgrade(empty_database, "0012")
    behind = await invoke_async("migrate", "--check", database_url=url)
    assert behind.returncode == 1
    # The count and the head move with every new migration; the line's shape does not.
    pending = rf"is at revision 0012: \d+ migration\(s\) pending \(to {schema.head_revision()}\)"
    assert re.search(pending + r": run `cronlock migrate`", behind.stdout), behind.stdout
    assert await schema.current_revision(empty_database) == "0012"  # --check migrated nothing


async def test_sql_prints_what_a_dba_applies_by_hand(empty_database: Database) -> None:
    url = libpq_url(empty_database.url)
    await schema.upgrade(empty_database, "0011")
    result = await invoke_async("migrate", "--sql", database_url=url)
    assert result.returncode == 0, result.stderr
    assert "Running upgrade 0011 -> 0012" in result.stdout
    assert "Running upgrade 0010 -> 0011" not in result.stdout
    assert "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_jobs_retried" in result.stdout
    assert await schema.current_revision(empty_database) == "0011"  # printed, not run
    applied = await asyncio.to_thread(
        subprocess.run,
        ["psql", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", "-"],
        input=result.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    assert await schema.current_revision(empty_database) == schema.head_revision()
    at_head = await invoke_async("migrate", "--sql", database_url=url)
    assert (at_head.returncode, at_head.stdout) == (0, "-- at head\n")


def test_check_and_sql_together_is_a_usage_error(database_url: str) -> None:
    result = invoke("migrate", "--check", "--sql", database_url=database_url)
    assert result.returncode == 2
    assert "--check and --sql do not go together" in result.stderr


def test_wait_idle_on_an_idle_queue_exits_0(database_url: str) -> None:
    # Nothing names the queue yet: --create, or queue pause refuses it as a typo.
    result = invoke(
        "queue", "pause", "deploy", "--create", "--wait-idle", database_url=database_url
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "queue deploy: idle (no job of it runs)"


async def test_wait_idle_exits_3_while_a_job_still_runs(database: Database) -> None:
    url = libpq_url(database.url)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(_PROCESSING)
        result = await invoke_async(
            "queue", "pause", "deploy", "--wait-idle", "--timeout", "0.5", database_url=url
        )
        paused = await conn.fetchval(_PAUSED)
    finally:
        await conn.close()
    assert result.returncode == 3
    assert "still running after 0.5 s: 1 lease-mode job(s) processing" in result.stdout
    assert paused  # the queue stays paused


async def test_wait_idle_waits_for_a_drainer_to_finish_its_job(database: Database) -> None:
    url = libpq_url(database.url)
    worker = uuid.uuid4()
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(_BEAT, worker, 1)
        waiting = asyncio.create_task(
            invoke_async(
                "queue", "pause", "deploy", "--wait-idle", "--timeout", "20", database_url=url
            )
        )

        async def beat_busy() -> bool:
            # The drainer beats with its job in flight, as it does every heartbeat.
            await conn.execute(_BEAT, worker, 1)
            return bool(await conn.fetchval(_PAUSED))

        await eventually(beat_busy)
        for _ in range(5):
            await beat_busy()
            await asyncio.sleep(0.1)  # heartbeats, a steady rate
        assert not waiting.done()
        await conn.execute(_BEAT, worker, 0)  # its job ended: the next beat says so
        result = await asyncio.wait_for(waiting, 20)
    finally:
        await conn.close()
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "queue deploy: idle (no job of it runs)"


def test_worker_heartbeat_file_is_touched_at_every_beat(database_url: str, tmp_path: Path) -> None:
    alive = tmp_path / "alive"
    worker = start_cli(
        "--app",
        "testapps.jobs",
        "worker",
        "--heartbeat-file",
        str(alive),
        database_url=database_url,
    )
    try:
        first = wait_for(lambda: alive.exists() and alive.stat().st_mtime_ns, timeout=30)
        # The next beat (every 2 s) touches it again: its age is what a liveness probe reads.
        wait_for(lambda: alive.stat().st_mtime_ns > first, timeout=30)
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker)
    finally:
        kill_all(worker)
    assert code == 0, err
