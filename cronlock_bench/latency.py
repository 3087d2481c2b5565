"""Latency: an idle ``cronlock worker`` process; jobs enqueued one at a time at a steady rate.

A job's latency is its ``completed_at`` (the database's clock, at its outcome's statement)
minus the client's clock read just before its enqueue began (client and database on this
host here, one clock).
"""

from __future__ import annotations

import time
from typing import Any

from .flow import Sent, steady, wait_done
from .progress import Progress
from .scratch import Scratch
from .stats import percentile
from .tidy import clear_jobs
from .workers import Workers

__all__ = ["measure_latency"]

WARMUP_JOBS = 5


async def measure_latency(
    scratch: Scratch, progress: Progress, *, rate: float, seconds: float
) -> dict[str, Any]:
    count = max(round(rate * seconds), 1)
    async with Workers(scratch) as workers:
        worker = await workers.start()
        progress.note("warming up")
        warm: list[Sent] = []
        await steady(scratch, rate, warm, count=WARMUP_JOBS)
        await wait_done(scratch, [job for job, _ in warm], within=60)
        progress.note(f"{count:,} jobs at {rate:g}/s")
        sent: list[Sent] = []
        started = time.monotonic()
        await steady(scratch, rate, sent, count=count)
        achieved = count / (time.monotonic() - started) if count > 1 else rate
        done = await wait_done(scratch, [job for job, _ in sent], within=60 + seconds)
        await workers.stop(worker)
    await clear_jobs(scratch)
    latencies = [(done[job].timestamp() - before) * 1000 for job, before in sent]
    return {
        "rate": rate,
        "achieved_rate": achieved,
        "jobs": count,
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
    }
