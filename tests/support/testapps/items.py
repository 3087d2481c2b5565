"""Tasks for tests: items that fail, bodies that raise, a run that waits for its peers."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, Table, func, insert, select

import cronlock
from cronlock.sql.tables import runs

scratch = MetaData()
processed = Table("processed", scratch, Column("item", Integer, primary_key=True))

ITEMS = 1000
FAILING = {i for i in range(ITEMS) if i % 100 == 7}  # 10 items


async def thousand(run: cronlock.Run) -> None:
    """1,000 items, of which 10 raise."""
    for item in range(ITEMS):
        async with run.item(item):
            await run.session.execute(insert(processed).values(item=item))
            if item in FAILING:
                raise ValueError(f"item {item} is bad")


async def explode(run: cronlock.Run) -> None:
    """Writes, then raises: nothing of it may stay."""
    async with run.item("first"):
        await run.session.execute(insert(processed).values(item=1))
    raise RuntimeError("the body blew up")


async def slow(run: cronlock.Run) -> None:
    """Holds its lock until every peer has recorded its skip (or 60 s pass)."""
    peers = int(os.environ.get("OVERLAP_PEERS", "0"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # A statement of its own: READ COMMITTED sees the peers' committed skips.
        skipped = await run.session.scalar(
            select(func.count()).select_from(runs).where(runs.c.status == "skipped")
        )
        if (skipped or 0) >= peers:
            break
        await asyncio.sleep(0.01)
    async with run.item("work"):
        await run.session.execute(insert(processed).values(item=1))


async def crash(run: cronlock.Run) -> None:
    """Writes items; with CRASH_MARKER set, tells the test so and waits to be killed."""
    for item in range(5):
        async with run.item(item):
            await run.session.execute(insert(processed).values(item=item))
    marker = os.environ.get("CRASH_MARKER")
    if marker:
        Path(marker).write_text(str(os.getpid()))
        await asyncio.Event().wait()


def create_app() -> cronlock.App:
    """A new App with these tasks (each test builds its own)."""
    app = cronlock.App()
    app.periodic("thousand", cron="*/5 * * * *")(thousand)
    app.periodic("explode", cron="0 * * * *")(explode)
    app.periodic("slow", cron="* * * * *")(slow)
    app.periodic("crash", cron="* * * * *")(crash)
    return app


app = create_app()  # for `--app testapps.items`
