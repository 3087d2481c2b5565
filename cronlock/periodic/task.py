"""A periodic task as declared: its schedule, its lock, and how invocations map to slots.

Every run but a manual one belongs to a *slot*, a fire time of the task's schedule. Which slot
an invocation belongs to: the next fire time if it is at most ``early`` ahead (a clock a little
fast), else the latest fire time if it is at most ``grace`` behind (a slow host, a late cron).
Outside both there is no slot: the run is ``skipped`` (``no_slot``) unless it was asked for as
manual, which runs under the lock with no slot at all. ``misfire`` says what the scheduler does
with slots that passed while nobody fired them. ``commit_every`` makes its runs chunked
(``chunks.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..cron import CronSchedule

if TYPE_CHECKING:
    from .run import Run

__all__ = ["Misfire", "PeriodicTask", "SlotPolicy", "TaskBody", "resolve_slot"]

# A plain def body runs in a thread of its own, its session sync (queue/threads.py).
TaskBody = Callable[["Run"], Awaitable[None]] | Callable[["Run"], None]


class Misfire(enum.StrEnum):
    """What the scheduler does with slots that passed while nobody fired them."""

    SKIP = "skip"  # record them missed; run only slots that are on time
    ONCE = "once"  # run the latest one once (unless an on-time slot runs anyway)
    EACH = "each"  # run each, oldest first, up to catch_up_limit (the most recent ones)


@dataclass(frozen=True)
class SlotPolicy:
    """How a task's invocations map to slots and how missed slots are handled."""

    grace: timedelta = timedelta(seconds=60)
    early: timedelta = timedelta(seconds=5)
    misfire: Misfire = Misfire.SKIP
    max_lateness: timedelta | None = None
    catch_up_limit: int = 10
    jitter: timedelta = timedelta(0)


@dataclass(frozen=True)
class PeriodicTask:
    """A registered periodic task: when it fires and which advisory lock guards it."""

    name: str
    schedule: CronSchedule
    namespace: str | int
    lock_namespace: int
    lock_key: int
    body: TaskBody = field(repr=False)
    description: str = ""
    policy: SlotPolicy = SlotPolicy()
    # Commit every this many top-level items (a chunked run, ``chunks.py``); None: the run is
    # one transaction.
    commit_every: int | None = None
    threaded: bool = False  # a plain def body: run in a thread (run.py, queue/threads.py)


def resolve_slot(
    task: PeriodicTask, moment: datetime, *, grace: timedelta | None = None
) -> datetime | None:
    """The slot an invocation at ``moment`` belongs to, or None outside every slot's grace.

    The schedule decides (``CronSchedule.invocation_slot``): the upcoming fire time within
    ``early``, else the latest within ``grace``, and, around a DST jump, the slot cron's own
    catch-up invocation is for, so a time cron fires never lands outside a slot.
    """
    policy = task.policy
    return task.schedule.invocation_slot(
        moment, early=policy.early, grace=policy.grace if grace is None else grace
    )
