"""The scheduler across DST transitions, fired by its own APScheduler trigger: every documented
slot runs exactly once, nothing is missed, nothing runs twice."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from dstoracle import TRANSITIONS, expected
from history import create_work_table, runs_of, work_slots
from testapps import sched

from cronlock import Database
from cronlock.scheduler import Scheduler
from cronlock.triggers import ScheduleTrigger

SHORT = {zone: short for short, zone in sched.DST_ZONES.items()}
CASES = [
    pytest.param(zone, day, id=f"{zone}-{kind}")
    for zone, spring, fall in TRANSITIONS
    for day, kind in ((spring, "spring"), (fall, "fall"))
]


async def _fire_like_apscheduler(
    scheduler: Scheduler, name: str, start: datetime, end: datetime
) -> None:
    """Wake the task at each fire time its trigger gives (plus a little processing delay)."""
    task = scheduler.app.task(name)
    trigger = ScheduleTrigger(task)
    previous = None
    while True:
        fire = trigger.get_next_fire_time(previous, start if previous is None else previous)
        if fire is None or fire >= end:
            return
        await scheduler.wake(task, now=fire + timedelta(milliseconds=250))
        previous = fire


@pytest.mark.parametrize(("zone_name", "day"), CASES)
async def test_across_a_transition(database: Database, zone_name: str, day: date) -> None:
    await create_work_table(database)
    zone = ZoneInfo(zone_name)
    first = day - timedelta(days=1)
    start = datetime.combine(first, datetime.min.time(), zone).astimezone(UTC)
    end = datetime.combine(day + timedelta(days=2), datetime.min.time(), zone).astimezone(UTC)
    names = {
        f"{SHORT[zone_name]}-0230": "30 2 * * *",
        f"{SHORT[zone_name]}-half-hourly": "*/30 * * * *",
    }
    scheduler = Scheduler(sched.create_app(), database, tasks=list(names))

    await asyncio.gather(*(_fire_like_apscheduler(scheduler, n, start, end) for n in names))

    for name, expression in names.items():
        documented = expected(zone, expression, first, 3)
        slots = await work_slots(database, name)
        assert slots == documented, name  # zero duplicates, zero misses, in order
        rows = await runs_of(database, name)
        assert Counter(row["status"] for row in rows) == {"completed": len(documented)}
