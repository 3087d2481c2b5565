"""Control of periodic tasks for the whole cluster: pause, resume, run now, parked items.

``app.tasks`` is this module's ``Tasks``: the registry by name (a read-only mapping, as it
always was) with the operator's verbs beside it, so that they do not each become a method of
``App``. A pause is a row of ``tasks`` with ``paused_at`` set (the twin of a paused queue's row
of ``queues``); every run reads it under the task's lock (``run.py``), so from the commit on
every slot of the task, fired by any scheduler or crontab line on any host, is recorded
``skipped`` with reason ``paused``, and resuming lets the next slot run. Run-now is a manual run
under the same lock, in the calling process: it runs even while the task is paused (it is
asked for by hand), and while another run holds the lock it is ``skipped`` (``lock_busy``).
Parked items are the rows of ``failing_items`` (``poison.py``): listed, retried (unparked, so
the next run tries them again) or cleared (forgotten).
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from .. import sql
from ..database import Database
from ..errors import UnknownTask
from ..observe.tracehooks import Tracer
from ..outcome import RunResult, iso
from .run import execute
from .task import PeriodicTask

__all__ = ["FailingItem", "TaskState", "Tasks", "operator"]

# The most failing items one listing returns.
MAX_LISTED = 1000


def operator() -> str:
    """Who is acting, for ``paused_by``: ``user@host`` of this process."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name (a container's numeric uid)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class TaskState:
    """A task's pause: whether it is paused now, since when and by whom, and whether the call
    that returned this changed it."""

    name: str
    paused: bool
    paused_at: datetime | None = None
    paused_by: str | None = None
    changed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "paused": self.paused,
            "paused_at": iso(self.paused_at),
            "paused_by": self.paused_by,
            "changed": self.changed,
        }


@dataclass(frozen=True)
class FailingItem:
    """An item of a task that failed in its latest ``failures`` runs; parked once it reached
    the task's ``park_after``."""

    task: str
    item: str
    failures: int
    error: str
    first_failed_at: datetime
    last_failed_at: datetime
    parked_at: datetime | None

    @property
    def parked(self) -> bool:
        return self.parked_at is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "item": self.item,
            "parked": self.parked,
            "failures": self.failures,
            "error": self.error,
            "first_failed_at": iso(self.first_failed_at),
            "last_failed_at": iso(self.last_failed_at),
            "parked_at": iso(self.parked_at),
        }


class _Owner(Protocol):
    """What ``Tasks`` needs of its App."""

    @property
    def database(self) -> Database: ...

    @property
    def tracing(self) -> Tracer | None: ...


class Tasks(Mapping[str, PeriodicTask]):
    """An app's periodic tasks by name, and their control (see the module docstring)."""

    def __init__(self, owner: _Owner, registry: Mapping[str, PeriodicTask]) -> None:
        self._owner = owner
        self._registry = registry

    def __getitem__(self, name: str) -> PeriodicTask:
        return self._registry[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._registry)

    def __len__(self) -> int:
        return len(self._registry)

    def task(self, name: str) -> PeriodicTask:
        """The task ``name``; an ``UnknownTask`` naming the registered ones if there is none."""
        try:
            return self._registry[name]
        except KeyError:
            known = ", ".join(sorted(self._registry)) or "none"
            raise UnknownTask(f"unknown task {name!r} (registered: {known})") from None

    async def pause(
        self, name: str, *, by: str | None = None, now: datetime | None = None
    ) -> TaskState:
        """Pause ``name`` everywhere: from the commit on its slots are recorded skipped
        (``paused``). ``by`` says who (default: ``user@host``). Pausing a paused task changes
        nothing (``changed`` is False; who and since when are the first pause's)."""
        self.task(name)
        moment = now or datetime.now(UTC)
        async with self._owner.database.engine.begin() as conn:
            changed = (
                await conn.execute(
                    sql.TASK_PAUSE, {"task": name, "by": by or operator(), "now": moment}
                )
            ).first() is not None
        return await self._state(name, changed)

    async def resume(self, name: str, *, now: datetime | None = None) -> TaskState:
        """Resume ``name``: its next slot runs; it is overdue only if that one is missed."""
        self.task(name)
        async with self._owner.database.engine.begin() as conn:
            result = await conn.execute(
                sql.TASK_RESUME, {"task": name, "now": now or datetime.now(UTC)}
            )
            changed = result.first() is not None
        return await self._state(name, changed)

    async def states(self) -> dict[str, TaskState]:
        """Every task an operator paused or resumed, by name (those of other apps in the
        schema included)."""
        async with self._owner.database.connect() as conn:
            rows = (await conn.execute(sql.TASK_STATES)).mappings().all()
        return {
            row["name"]: TaskState(
                row["name"], row["paused_at"] is not None, row["paused_at"], row["paused_by"]
            )
            for row in rows
        }

    async def _state(self, name: str, changed: bool) -> TaskState:
        found = (await self.states()).get(name, TaskState(name, False))
        return TaskState(found.name, found.paused, found.paused_at, found.paused_by, changed)

    async def run_now(self, name: str, *, now: datetime | None = None) -> RunResult:
        """One manual run of ``name`` now, in this process, under the task's lock: ``skipped``
        (``lock_busy``) while another run holds it. It runs even while the task is paused."""
        return await execute(
            self._owner.database,
            self.task(name),
            now=now,
            manual=True,
            tracing=self._owner.tracing,
        )

    async def parked(self, name: str, *, limit: int = MAX_LISTED) -> list[FailingItem]:
        """The task's failing items, parked ones first, most recent failure first."""
        self.task(name)
        async with self._owner.database.connect() as conn:
            rows = await conn.execute(
                sql.ITEMS_OF_TASK, {"task": name, "limit": min(limit, MAX_LISTED)}
            )
            return [FailingItem(**row) for row in rows.mappings()]

    async def retry_parked(self, name: str, item: object) -> bool:
        """Unpark ``item``: the next run tries it again (one more failure parks it again).
        False if it was not parked."""
        self.task(name)
        async with self._owner.database.engine.begin() as conn:
            result = await conn.execute(sql.ITEM_UNPARK, {"of_task": name, "of_item": str(item)})
            return result.first() is not None

    async def clear_parked(self, name: str, item: object | None = None) -> int:
        """Forget ``item`` (None: every failing item of the task): it starts again from no
        failures. The number of items forgotten."""
        self.task(name)
        async with self._owner.database.engine.begin() as conn:
            if item is None:
                result = await conn.execute(sql.ITEMS_FORGET_ALL, {"task": name})
            else:
                result = await conn.execute(sql.ITEMS_FORGET, {"task": name, "item": str(item)})
            return len(result.all())
