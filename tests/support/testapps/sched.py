"""Tasks for the scheduling tests: 1 ms bodies that log their slot, misfire and DST variants,
and a run that waits to be told to finish (for SIGTERM)."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Column, DateTime, Integer, MetaData, Table, Text, func, insert, select

import cronlock

scratch = MetaData()
# One row per run that did its work: what ran, for which slot.
work = Table(
    "work",
    scratch,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("task", Text, nullable=False),
    Column("slot", DateTime(timezone=True)),
)


async def log_slot(run: cronlock.Run) -> None:
    """A 1 ms task: one row saying it ran for its slot."""
    async with run.item(run.slot):
        await run.session.execute(insert(work).values(task=run.task.name, slot=run.slot))


DST_ZONES = {
    "madrid": "Europe/Madrid",
    "newyork": "America/New_York",
    "lordhowe": "Australia/Lord_Howe",
}


# The test holds this advisory lock; the "held" run waits for it, so the test decides when
# (or whether) the run may finish.
GATE = (4242, 4242)


async def held(run: cronlock.Run) -> None:
    """Writes items, says so through a marker file, then waits at the test's gate."""
    for item in range(5):
        async with run.item(item):
            await run.session.execute(insert(work).values(task="held", slot=run.slot))
    marker = Path(os.environ["HELD_MARKER"])
    await asyncio.to_thread(marker.write_text, str(os.getpid()))
    await run.session.execute(select(func.pg_advisory_xact_lock(*GATE)))


async def failing(run: cronlock.Run) -> None:
    """Writes, then raises: the slot is claimed by its failure, nothing of the work stays."""
    await run.session.execute(insert(work).values(task="failing", slot=run.slot))
    raise RuntimeError("after writing")


async def connection_lost(run: cronlock.Run) -> None:
    """Writes, then its connection dies (the server ends its own backend)."""
    await run.session.execute(insert(work).values(task="connection-lost", slot=run.slot))
    await run.session.execute(select(func.pg_terminate_backend(func.pg_backend_pid())))


def create_app() -> cronlock.App:
    """A new App with these tasks (each test builds its own)."""
    app = cronlock.App()
    app.periodic("tick", cron="* * * * *")(log_slot)
    # Any moment of the year is within grace of its Jan 1 slot: commands run one after the
    # other always map to the same slot, with no clock to inject.
    app.periodic("yearly", cron="0 0 1 1 *", grace=timedelta(days=400))(log_slot)
    app.periodic("jittery", cron="*/5 * * * *", grace=180, jitter=120)(log_slot)
    for policy in ("skip", "once", "each"):
        app.periodic(f"hourly-{policy}", cron="0 * * * *", misfire=policy)(log_slot)
        app.periodic(f"five-{policy}", cron="*/5 * * * *", misfire=policy)(log_slot)
    app.periodic("hourly-once-fresh", cron="0 * * * *", misfire="once", max_lateness=600)(log_slot)
    for short, zone in DST_ZONES.items():
        app.periodic(f"{short}-0230", cron="30 2 * * *", timezone=zone)(log_slot)
        app.periodic(f"{short}-half-hourly", cron="*/30 * * * *", timezone=zone)(log_slot)
    app.periodic("held", cron="* * * * *")(held)
    # Fires on Feb 29 at midnight only: outside that minute, no invocation is within its grace.
    app.periodic("leap-day", cron="0 0 29 2 *")(log_slot)
    app.periodic("failing", cron="* * * * *")(failing)
    app.periodic("connection-lost", cron="* * * * *")(connection_lost)
    return app


app = create_app()  # for `--app testapps.sched`
