"""A run of a periodic task: lock, body with a savepoint per item, one recorded outcome.

One run is one transaction. It first takes ``pg_try_advisory_xact_lock(namespace, key)``:
busy means another run is active, so this one is ``skipped`` (overlap is normal for cron).
Free, the body runs with the transaction's session; ``run.item(key)`` wraps a unit of work in
a SAVEPOINT, so an exception there rolls back that item only and is recorded. The run's row in
``runs`` is written in the same transaction as its work: ``completed`` or ``partial`` commit
together with what the items wrote. A body that raises rolls everything back and the ``failed``
row is written in a transaction of its own. The lock ends with the transaction, including when
the process dies, so a crash never leaves it behind.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from . import queries
from .cron import CronSchedule
from .database import Database

__all__ = ["ItemFailure", "PeriodicTask", "Run", "RunResult", "RunStatus", "TaskBody", "execute"]

logger = logging.getLogger("cronlock.periodic")

TaskBody = Callable[["Run"], Awaitable[None]]

# A run's row keeps at most this many failures (items_failed still counts them all).
MAX_RECORDED_FAILURES = 1000
MAX_MESSAGE_LENGTH = 2000


class RunStatus(enum.StrEnum):
    COMPLETED = "completed"
    PARTIAL = "partial"
    FAILED = "failed"
    SKIPPED = "skipped"


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


@dataclass(frozen=True)
class ItemFailure:
    """One item that failed inside a run and was rolled back to its savepoint."""

    item: str | None
    error_type: str
    message: str

    @classmethod
    def from_exception(cls, item: object, exc: BaseException) -> ItemFailure:
        return cls(
            item=None if item is None else str(item),
            error_type=type(root_cause(exc)).__name__,
            message=_message(exc),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"item": self.item, "error_type": self.error_type, "message": self.message}


def root_cause(exc: BaseException) -> BaseException:
    """The driver's own exception behind SQLAlchemy's wrappers (asyncpg's names say more)."""
    found = getattr(exc, "orig", None) or exc
    cause = found.__cause__
    if cause is not None and type(cause).__module__.startswith("asyncpg"):
        return cause
    return found


def _message(exc: BaseException) -> str:
    text = str(root_cause(exc)).strip() or type(exc).__name__
    return text.splitlines()[0][:MAX_MESSAGE_LENGTH]


@dataclass(frozen=True)
class RunResult:
    """The outcome of one run, as recorded in ``runs``."""

    task: str
    status: RunStatus
    slot: datetime | None
    started_at: datetime
    finished_at: datetime
    duration_ms: float
    items_ok: int = 0
    items_failed: int = 0
    failures: tuple[ItemFailure, ...] = ()
    error: str | None = None
    skip_reason: str | None = None
    run_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "status": self.status.value,
            "slot": _iso(self.slot),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "duration_ms": round(self.duration_ms, 3),
            "items_ok": self.items_ok,
            "items_failed": self.items_failed,
            "failures": [f.to_dict() for f in self.failures],
            "error": self.error,
            "skip_reason": self.skip_reason,
            "run_id": self.run_id,
        }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


class Run:
    """What a task body receives: the run's session and a savepoint per item."""

    def __init__(self, task: PeriodicTask, session: AsyncSession, slot: datetime | None) -> None:
        self.task = task
        self.session = session
        self.slot = slot
        self.items_ok = 0
        self.items_failed = 0
        self.failures: list[ItemFailure] = []

    @asynccontextmanager
    async def item(self, key: object = None) -> AsyncIterator[AsyncSession]:
        """Process one item inside its own SAVEPOINT.

        An exception inside the block rolls back to the savepoint, is recorded against ``key``
        and does not propagate: the run goes on with the next item. If the savepoint itself
        cannot be rolled back (the connection is gone), that error propagates and fails the run.
        """
        savepoint = await self.session.begin_nested()
        try:
            yield self.session
            await savepoint.commit()  # flushes pending ORM changes, then RELEASE SAVEPOINT
        except Exception as exc:
            if savepoint.is_active:
                await savepoint.rollback()
            self._record_failure(key, exc)
        else:
            self.items_ok += 1

    def _record_failure(self, key: object, exc: BaseException) -> None:
        self.items_failed += 1
        failure = ItemFailure.from_exception(key, exc)
        if len(self.failures) < MAX_RECORDED_FAILURES:
            self.failures.append(failure)
        logger.warning(
            "%s: item %s failed: %s: %s",
            self.task.name,
            failure.item,
            failure.error_type,
            failure.message,
            extra={"action": "item_failed", "task": self.task.name, "item": failure.item},
        )


async def execute(
    database: Database, task: PeriodicTask, *, now: datetime | None = None
) -> RunResult:
    """Run ``task`` once under its lock and record the outcome; never raises for the body."""
    started_at = now or datetime.now(UTC)
    clock = time.perf_counter()
    slot = task.schedule.slot_at(started_at)

    def result(status: RunStatus, run: Run | None = None, **extra: Any) -> RunResult:
        return RunResult(
            task=task.name,
            status=status,
            slot=slot,
            started_at=started_at,
            finished_at=started_at + _elapsed(clock),
            duration_ms=(time.perf_counter() - clock) * 1000,
            items_ok=run.items_ok if run else 0,
            items_failed=run.items_failed if run else 0,
            failures=tuple(run.failures) if run else (),
            **extra,
        )

    async with database.session() as session:
        locked = await session.scalar(
            queries.LOCK_TRY_XACT, {"namespace": task.lock_namespace, "key": task.lock_key}
        )
        if not locked:
            await session.rollback()
            outcome = result(RunStatus.SKIPPED, skip_reason="lock_busy")
            logger.info(
                "%s: skipped, another run holds the lock",
                task.name,
                extra={"action": "run_skipped", "task": task.name},
            )
            return await _record(session, outcome)

        run = Run(task, session, slot)
        try:
            await task.body(run)
            status = RunStatus.PARTIAL if run.items_failed else RunStatus.COMPLETED
            outcome = result(status, run)
            outcome = await _record(session, outcome)  # commits the work and its row together
        except Exception as exc:
            await session.rollback()
            error = f"{type(root_cause(exc)).__name__}: {_message(exc)}"
            logger.error(
                "%s: failed and rolled back: %s",
                task.name,
                error,
                extra={"action": "run_failed", "task": task.name},
                exc_info=exc,
            )
            outcome = result(RunStatus.FAILED, run, error=error)
            outcome = await _record(session, _without_committed_items(outcome))
        return outcome


def _without_committed_items(outcome: RunResult) -> RunResult:
    # Nothing of a failed run was committed: no item counts as done.
    return replace(outcome, items_ok=0)


def _elapsed(clock: float) -> timedelta:
    return timedelta(seconds=time.perf_counter() - clock)


async def _record(session: AsyncSession, outcome: RunResult) -> RunResult:
    """Insert the run's row in the session's current transaction and commit it."""
    run_id = await session.scalar(
        queries.RUN_INSERT,
        {
            "task": outcome.task,
            "slot": outcome.slot,
            "status": outcome.status.value,
            "started_at": outcome.started_at,
            "finished_at": outcome.finished_at,
            "items_ok": outcome.items_ok,
            "items_failed": outcome.items_failed,
            "failures": [f.to_dict() for f in outcome.failures],
            "error": outcome.error,
            "skip_reason": outcome.skip_reason,
            "host": _HOST,
            "pid": os.getpid(),
        },
    )
    await session.commit()
    return replace(outcome, run_id=run_id)


_HOST = socket.gethostname()
