"""Tasks for the health tests: a batch whose every item fails while a switch is on, a task with
no items, minutely tasks for overdue and crontab-recorded misses, and one whose connection dies.

Switches are rows of ``health_switch`` (``broken``: the batch's items fail; ``doomed``: the
doomed task's connection dies), so a test flips them for runs in its own process and for
``cronlock run`` in a subprocess alike.
"""

from __future__ import annotations

from sqlalchemy import Column, DateTime, Integer, MetaData, Table, Text, func, insert, select

import cronlock

scratch = MetaData()
# One row per item a run committed.
done = Table(
    "health_done",
    scratch,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("task", Text, nullable=False),
    Column("slot", DateTime(timezone=True)),
    Column("item", Integer),
)
# What a body writes outside its items.
notes = Table(
    "health_notes",
    scratch,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("task", Text, nullable=False),
    Column("slot", DateTime(timezone=True)),
)
switch = Table("health_switch", scratch, Column("name", Text, primary_key=True))

ITEMS = 3


async def _on(run: cronlock.Run, name: str) -> bool:
    found = await run.session.scalar(select(func.count()).where(switch.c.name == name))
    return bool(found)


async def batch(run: cronlock.Run) -> None:
    """A note outside items, then three items; while ``broken`` is on, every item fails."""
    await run.session.execute(insert(notes).values(task=run.task.name, slot=run.slot))
    broken = await _on(run, "broken")
    for item in range(ITEMS):
        async with run.item(item):
            await run.session.execute(
                insert(done).values(task=run.task.name, slot=run.slot, item=item)
            )
            if broken:
                raise ValueError(f"item {item} cannot be done")


async def single(run: cronlock.Run) -> None:
    """One statement and no items (the reference's stats cron)."""
    await run.session.execute(insert(notes).values(task=run.task.name, slot=run.slot))


async def one_item(run: cronlock.Run) -> None:
    """One item; it fails while ``broken`` is on."""
    async with run.item("only"):
        await run.session.execute(insert(done).values(task=run.task.name, slot=run.slot))
        if await _on(run, "broken"):
            raise LookupError("nothing to look up")


async def doomed(run: cronlock.Run) -> None:
    """One item; while ``doomed`` is on, its connection dies (the server ends its backend)."""
    async with run.item("only"):
        await run.session.execute(insert(done).values(task=run.task.name, slot=run.slot))
    if await _on(run, "doomed"):
        await run.session.execute(select(func.pg_terminate_backend(func.pg_backend_pid())))


def create_app() -> cronlock.App:
    """A new App with these tasks."""
    app = cronlock.App()
    # Its items are the same every run and all fail while broken: without a memory of failing
    # items (park_after=None), every such run is failed, not partial on known-bad items.
    app.periodic("batch", cron="* * * * *", park_after=None)(batch)
    app.periodic("single", cron="* * * * *")(single)
    app.periodic("one-item", cron="* * * * *")(one_item)
    app.periodic("minutely", cron="* * * * *")(one_item)
    app.periodic("minutely-each", cron="* * * * *", misfire="each")(one_item)
    app.periodic("hourly", cron="0 * * * *")(one_item)
    app.periodic("monthly", cron="0 0 1 * *")(one_item)
    app.periodic("doomed", cron="* * * * *")(doomed)
    return app


app = create_app()  # for `--app testapps.health`
