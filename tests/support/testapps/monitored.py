"""The app the monitoring kit is tried on (tests/e2e/test_prometheus.py): a job that
completes, one that fails for good after its retry, one that hangs (queue ``batch``); a task
with a poison item (parked after one failed run), one that always fails, and one whose
history the test writes (a run ten minutes ago, none since: overdue).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

import cronlock

ITEMS = ("north", "south", "poison")

app = cronlock.App()


@app.job("ok")
async def ok(session: AsyncSession, payload: Any) -> None:
    return None


@app.job("fails", max_retries=1, backoff=cronlock.Backoff(base=0, jitter=0))
async def fails(session: AsyncSession, payload: Any) -> None:
    raise ConnectionError("smtp refused")


@app.job("hang", max_retries=0, queue="batch")
async def hang(session: AsyncSession, payload: Any) -> None:
    """Tells the test it started (``$HANG_MARKER``), then never returns: its lane is held."""
    Path(os.environ["HANG_MARKER"]).write_text("started")
    await asyncio.Event().wait()


@app.periodic("report", cron="* * * * *", park_after=1)
async def report(run: cronlock.Run) -> None:
    for key in run.skip_parked(ITEMS):
        async with run.item(key):
            if key == "poison":
                raise ValueError("no text search configuration for 'tlh'")


@app.periodic("broken", cron="* * * * *")
async def broken(run: cronlock.Run) -> None:
    raise RuntimeError("the report server is down")


@app.periodic("stale", cron="* * * * *")
async def stale(run: cronlock.Run) -> None:
    """Never run by the test: its one run is a row the test writes."""
