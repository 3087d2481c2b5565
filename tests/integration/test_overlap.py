"""Overlap safety across real processes: one run does the work; a killed run leaves nothing."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from cli import start_cli
from itemsupport import count, create_scratch, items_app
from testapps import items
from waiting import eventually, wait_for

from cronlock import Database, RunStatus
from cronlock.demo import lock_holders
from cronlock.sql.tables import runs

PROCESSES = 8


async def test_eight_processes_one_completes_seven_skip(
    database: Database, database_url: str
) -> None:
    await create_scratch(database)
    # The task holds its lock until its peers have recorded their skips, so all 8 overlap.
    procs = [
        start_cli(
            "--app",
            "testapps.items",
            "run",
            "slow",
            "--json",
            database_url=database_url,
            OVERLAP_PEERS=str(PROCESSES - 1),
        )
        for _ in range(PROCESSES)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    codes = [proc.returncode for proc in procs]
    statuses = sorted(json.loads(out)["status"] for out, _ in outputs)

    assert codes == [0] * PROCESSES, [err for _, err in outputs]
    assert statuses == ["completed"] + ["skipped"] * (PROCESSES - 1)
    recorded = await count(database, runs)
    assert recorded == PROCESSES
    assert await count(database, items.processed) == 1


async def test_killed_run_leaves_no_lock_and_no_writes(
    database: Database, database_url: str, tmp_path: Path
) -> None:
    await create_scratch(database)
    marker = tmp_path / "crashing"
    proc = start_cli(
        "--app",
        "testapps.items",
        "run",
        "crash",
        database_url=database_url,
        CRASH_MARKER=str(marker),
    )
    wait_for(marker.exists, timeout=60)
    task = items.create_app().task("crash")
    assert await lock_holders(database, task), "the run should hold its lock while it works"

    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)  # reaps it and closes its pipes
    killed_at = time.monotonic()
    await eventually(lambda: _no_holders(database, task), timeout=10)

    # Nothing of the killed run was committed: no items, no run row.
    assert await count(database, items.processed) == 0
    assert await count(database, runs) == 0

    async with items_app(database) as app:
        result = await app.run("crash")
    assert result.status is RunStatus.COMPLETED
    assert time.monotonic() - killed_at < 5  # the next run proceeds at once
    assert await count(database, items.processed) == 5


async def _no_holders(database: Database, task: object) -> bool:
    return not await lock_holders(database, task)  # type: ignore[arg-type]
