"""Slots nobody fired: the backlog since a task's last claimed slot, and when a task is overdue.

A task's history is its rows in ``runs``; its schedule says which rows there should be. Both
the scheduler's wake and every ``cronlock run`` of a slot look at the slots since the task's
latest claimed slot (a run's outcome or a miss) that have no row at all, and record them
``missed`` (the scheduler may catch some up instead, by the task's misfire policy). The walk
back is bounded by BACKLOG_LIMIT slots: a minutely task whose last row is a year old must not
make one run enumerate and record half a million slots.

*Overdue* needs no process to run: it is computed when ``status`` or ``/metrics`` reads, from
the schedule and two indexed lookups per task. A task is overdue when the first slot after its
latest claimed slot is past its grace with no outcome, so a host that died (or a crontab line
nobody installed, once the task has any row) shows, and ``overdue_seconds`` grows from that
deadline on instead of restarting at every slot. A paused task owes nothing (its slots are
recorded skipped, reason ``paused``), and once resumed it owes the first slot after the resume,
not every slot since the last one before the pause.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from .. import sql
from .task import PeriodicTask

__all__ = [
    "BACKLOG_LIMIT",
    "Overdue",
    "last_claimed_slot",
    "overdue",
    "overdue_by_task",
    "unrecorded",
]

logger = logging.getLogger("cronlock.periodic")

# The most slots one look back covers (a wake of the scheduler, a run from crontab).
BACKLOG_LIMIT = 1000

_TICK = timedelta(microseconds=1)

Executor = AsyncConnection | AsyncSession


async def last_claimed_slot(executor: Executor, task: PeriodicTask) -> datetime | None:
    """The task's latest slot with an outcome or a miss (None: it never had one)."""
    last: datetime | None = await executor.scalar(sql.RUN_LAST_SLOT, {"task": task.name})
    return last


async def unrecorded(
    executor: Executor,
    task: PeriodicTask,
    after: datetime,
    until: datetime,
    *,
    exclude: datetime | None = None,
) -> list[datetime]:
    """Slots in (after, until] other than ``exclude`` that have no row in ``runs``, oldest first.

    Walks back from ``until``, at most BACKLOG_LIMIT slots; older ones are only logged.
    """
    slots: list[datetime] = []
    cursor = until
    while (slot := task.schedule.slot_at(cursor)) is not None and slot > after:
        if len(slots) == BACKLOG_LIMIT:
            logger.warning(
                "%s: more than %d slots passed since %s; only the latest %d are handled "
                "(recorded missed or caught up), the older ones only in this line",
                task.name,
                BACKLOG_LIMIT,
                after.isoformat(),
                BACKLOG_LIMIT,
                extra={"action": "backlog_truncated", "task": task.name},
            )
            break
        if slot != exclude:
            slots.append(slot)
        cursor = slot - _TICK
    if not slots:
        return []
    slots.reverse()
    rows = await executor.execute(
        sql.RUN_SLOTS_RECORDED,
        {
            "task": task.name,
            "since": slots[0] - task.policy.early,
            "low": slots[0],
            "high": slots[-1],
        },
    )
    recorded = set(rows.scalars())
    return [slot for slot in slots if slot not in recorded]


@dataclass(frozen=True)
class Overdue:
    """A task whose ``slot`` passed its grace (``due_by``) with no outcome, for ``seconds``."""

    slot: datetime
    due_by: datetime
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot.isoformat(),
            "due_by": self.due_by.isoformat(),
            "seconds": round(self.seconds, 3),
        }


def overdue(
    task: PeriodicTask,
    last_slot: datetime | None,
    first_started_at: datetime | None,
    now: datetime,
    *,
    resumed_at: datetime | None = None,
) -> Overdue | None:
    """Whether ``task`` is overdue at ``now``, given its latest claimed slot and first row
    (and when it was last resumed, if it was paused once).

    The first slot it owes is the one after ``last_slot``; a task with no outcome yet owes the
    first slot after its first row of any kind (a skip, a manual run). A task with no row at
    all is not overdue: nothing says since when it should have run (a task declared a minute
    ago must not be overdue since its last fire time, a month ago for a monthly one).
    """
    anchor = last_slot if last_slot is not None else first_started_at
    if anchor is not None and resumed_at is not None:
        anchor = max(anchor, resumed_at)
    if anchor is None:
        return None
    owed = task.schedule.next_fire_time(anchor + _TICK)
    if owed is None:
        return None
    due_by = owed + task.policy.grace
    if due_by >= now:
        return None
    return Overdue(slot=owed, due_by=due_by, seconds=(now - due_by).total_seconds())


async def overdue_by_task(
    executor: Executor, tasks: Iterable[PeriodicTask], now: datetime
) -> dict[str, Overdue | None]:
    """``overdue`` of each of ``tasks`` at ``now``, read with one statement (None for a
    paused task)."""
    by_name = {task.name: task for task in tasks}
    if not by_name:
        return {}
    rows = await executor.execute(sql.RUN_LAST_SLOT_PER_TASK, {"tasks": sorted(by_name)})
    return {
        row.task: None
        if row.paused_at is not None
        else overdue(
            by_name[row.task], row.last_slot, row.first_started_at, now, resumed_at=row.resumed_at
        )
        for row in rows
    }
