"""APScheduler's side of the scheduler daemon: the triggers that give it fire times.

``ScheduleTrigger`` asks a task's ``CronSchedule`` for its slots and adds the task's jitter
(``jitter_for``), so the daemon and the slot computation cannot disagree on cron or DST
semantics; ``BuiltinTrigger`` gives a built-in task's (``prune``) fire times. Only
``Scheduler.start`` imports this module, and with it APScheduler: a command that does not run
the daemon (``cronlock run TASK``, every crontab line) does not pay for either.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from apscheduler.triggers.base import BaseTrigger

from .cron import CronSchedule
from .periodic import PeriodicTask

__all__ = ["BuiltinTrigger", "ScheduleTrigger", "jitter_for"]

_TICK = timedelta(microseconds=1)


def jitter_for(task: PeriodicTask, slot: datetime) -> timedelta:
    """The delay before firing ``slot``: up to the task's jitter, the same on every host.

    A digest of (task, slot) rather than ``random``: hosts agree, so jitter spreads many tasks
    over time without spreading one task's attempts, and tests can predict it.
    """
    if not task.policy.jitter:
        return timedelta(0)
    digest = hashlib.blake2b(f"{task.name}|{slot.isoformat()}".encode(), digest_size=8).digest()
    fraction = int.from_bytes(digest, "big") / 2**64
    return task.policy.jitter * fraction


class ScheduleTrigger(BaseTrigger):  # type: ignore[misc]
    """An APScheduler trigger whose fire times are the task's slots plus its jitter."""

    __slots__ = ("task",)

    def __init__(self, task: PeriodicTask) -> None:
        self.task = task

    def fire_time(self, slot: datetime) -> datetime:
        return slot + jitter_for(self.task, slot)

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        schedule = self.task.schedule
        start = now if previous_fire_time is None else previous_fire_time + _TICK
        # The latest slot may still be ahead of us once jittered.
        latest = schedule.slot_at(start)
        if latest is not None and self.fire_time(latest) >= start:
            return self.fire_time(latest)
        upcoming = schedule.next_fire_time(start)
        return None if upcoming is None else self.fire_time(upcoming)

    def __str__(self) -> str:
        return f"cronlock[{self.task.schedule.expression} {self.task.schedule.timezone.key}]"


class BuiltinTrigger(BaseTrigger):  # type: ignore[misc]
    """An APScheduler trigger for a built-in task (``prune``): its schedule's fire times."""

    __slots__ = ("schedule",)

    def __init__(self, schedule: CronSchedule) -> None:
        self.schedule = schedule

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        start = now if previous_fire_time is None else previous_fire_time + _TICK
        return self.schedule.next_fire_time(start)

    def __str__(self) -> str:
        return f"cronlock[{self.schedule.expression} UTC]"
