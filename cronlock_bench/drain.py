"""Drain rate: N no-op jobs enqueued in bulk, then drained by one in-process drainer.

Throughput is read from the database: N over first ``started_at`` → last ``completed_at``.
p95 is the drainer's own started → committed figure (the reference's per-job latency: the
drainer commits no claim, so the database only sees the handler's time).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from cronlock.queue.drainer import CommitMode, Drainer

from . import sql as bench_sql
from .app import JOB_TYPE
from .progress import Progress
from .scratch import Scratch
from .tidy import clear_jobs

__all__ = ["measure_drain"]

# How often the progress line shows the jobs drained so far.
PROGRESS_EVERY = 0.5


async def measure_drain(
    scratch: Scratch, progress: Progress, *, n: int, mode: CommitMode, batch_size: int | None
) -> dict[str, Any]:
    app = scratch.app
    async with scratch.database.engine.begin() as conn:
        await app.enqueue_many_tx(conn, JOB_TYPE, [{}] * n, queue=scratch.queue)
    drainer = app.drainer(queue=scratch.queue, commit_mode=mode, batch_size=batch_size)
    watcher = asyncio.create_task(_show(drainer, n, progress))
    started = time.perf_counter()
    try:
        result = await drainer.drain()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    wall_s = time.perf_counter() - started
    if result.status.value != "completed":
        raise RuntimeError(f"the {mode} drain of {n} jobs ended {result.status}: {result.error}")
    async with scratch.database.connect() as conn:
        window = (await conn.execute(bench_sql.BENCH_DRAIN_WINDOW, {"queue": scratch.queue})).one()
    if window.completed != n:
        raise RuntimeError(f"the {mode} drain completed {window.completed} of {n} jobs")
    seconds = (window.last_completed - window.first_started).total_seconds()
    await clear_jobs(scratch)
    return {
        "mode": mode.value,
        "n": n,
        "seconds": seconds,
        "jobs_per_s": n / seconds if seconds > 0 else float(n) / wall_s,
        "p95_ms": result.stats.get("p95_latency_ms"),
        "wall_s": wall_s,
    }


async def _show(drainer: Drainer, n: int, progress: Progress) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY)
        progress.note(f"{drainer.stats.processed:,} of {n:,}")
