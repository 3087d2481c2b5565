"""Enqueue rates: ``enqueue_many`` of N jobs in one statement, and jobs one at a time, each
committed on its own (``enqueue`` on the app's Database, what a web request does); timed on
the client's clock."""

from __future__ import annotations

import time
from typing import Any

from .app import JOB_TYPE
from .progress import Progress
from .scratch import Scratch
from .tidy import clear_jobs

__all__ = ["measure_enqueue"]


async def measure_enqueue(
    scratch: Scratch, progress: Progress, *, bulk: int, single: int
) -> dict[str, Any]:
    app, engine = scratch.app, scratch.database.engine
    started = time.perf_counter()
    async with engine.begin() as conn:
        await app.enqueue_many_tx(conn, JOB_TYPE, [{}] * bulk, queue=scratch.queue)
    bulk_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(single):
        await app.enqueue(JOB_TYPE, {}, queue=scratch.queue)
    single_s = time.perf_counter() - started
    progress.note("clearing the queue")
    await clear_jobs(scratch)
    return {
        "bulk_jobs": bulk,
        "bulk_s": bulk_s,
        "bulk_per_s": bulk / bulk_s,
        "single_jobs": single,
        "single_s": single_s,
        "single_per_s": single / single_s,
    }
