"""Recovery: two ``cronlock worker`` processes, jobs arriving at a steady rate, SIGKILL of the
active one (read from the workers table); the time from the kill (client clock) to the first
job the standby completes (database). After each kill a new standby is started."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import Any

from .flow import Sent, first_completion_after, steady
from .progress import Progress
from .scratch import Scratch
from .tidy import clear_jobs
from .workers import Workers

__all__ = ["measure_recovery"]

WITHIN = 60.0


async def measure_recovery(
    scratch: Scratch, progress: Progress, *, kills: int, rate: float
) -> dict[str, Any]:
    seconds: list[float] = []
    sent: list[Sent] = []
    async with Workers(scratch) as workers:
        await workers.start()
        await workers.start()
        sender = asyncio.create_task(steady(scratch, rate, sent))
        try:
            for kill in range(kills):
                progress.note(f"kill {kill + 1} of {kills}: waiting for an active and a standby")
                victim = await workers.active()
                # The victim is working: a job completes after this moment.
                await first_completion_after(scratch, datetime.now(UTC), WITHIN)
                killed_at = datetime.now(UTC)
                await workers.kill(victim)
                recovered = await first_completion_after(scratch, killed_at, WITHIN)
                seconds.append((recovered - killed_at).total_seconds())
                progress.note(f"kill {kill + 1} of {kills}: {seconds[-1] * 1000:.0f} ms")
                if kill + 1 < kills:
                    await workers.start()
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
    await clear_jobs(scratch)
    return {"kills": kills, "rate": rate, "jobs": len(sent), "seconds": seconds}
