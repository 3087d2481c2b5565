"""Jobs in, completions out: one-at-a-time enqueues at a steady rate, and completion times
read back from the database (the database's clock writes them, whichever host the worker is on)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime

from . import sql as bench_sql
from .app import JOB_TYPE
from .scratch import Scratch

__all__ = ["Sent", "completed_at", "enqueue_one", "first_completion_after", "steady", "wait_done"]

POLL = 0.02

# A job's id and the client's clock (time.time()) read just before its enqueue began.
Sent = tuple[uuid.UUID, float]


async def enqueue_one(scratch: Scratch) -> Sent:
    before = time.time()
    answer = await scratch.app.enqueue(JOB_TYPE, {}, queue=scratch.queue)
    return answer.id, before


async def steady(
    scratch: Scratch, rate: float, sent: list[Sent], *, count: int | None = None
) -> None:
    """Enqueue at ``rate`` jobs/s (``count`` jobs, or until cancelled); a late start is not
    made up with a burst beyond the schedule's own catch-up."""
    start = time.monotonic()
    i = 0
    while count is None or i < count:
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        sent.append(await enqueue_one(scratch))
        i += 1


async def completed_at(scratch: Scratch, ids: list[uuid.UUID]) -> dict[uuid.UUID, datetime]:
    async with scratch.database.connect() as conn:
        rows = await conn.execute(bench_sql.BENCH_COMPLETED_AT, {"ids": ids})
        return {job_id: at for job_id, at in rows}


async def wait_done(
    scratch: Scratch, ids: list[uuid.UUID], within: float
) -> dict[uuid.UUID, datetime]:
    deadline = time.monotonic() + within
    while True:
        done = await completed_at(scratch, ids)
        if len(done) == len(ids):
            return done
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(done)} of {len(ids)} jobs completed within {within:g} s")
        await asyncio.sleep(POLL)


async def first_completion_after(scratch: Scratch, moment: datetime, within: float) -> datetime:
    deadline = time.monotonic() + within
    while True:
        async with scratch.database.connect() as conn:
            found = await conn.scalar(
                bench_sql.BENCH_FIRST_COMPLETED_AFTER, {"queue": scratch.queue, "after": moment}
            )
        if found is not None:
            return found  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise RuntimeError(f"no job completed within {within:g} s")
        await asyncio.sleep(POLL)
