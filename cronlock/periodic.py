"""A run of a periodic task: lock, body with a savepoint per item, one recorded outcome.

One run is one transaction. It first takes ``pg_try_advisory_xact_lock(namespace, key)``:
busy means another run is active, so this one is ``skipped`` (overlap is normal for cron).
Free, the body runs with the transaction's session; ``run.item(key)`` wraps a unit of work in
a SAVEPOINT (``items.py``), so an exception there rolls back that item only and is recorded.
The run's row in ``runs`` is written in the same transaction as its work: ``completed`` or
``partial`` commit together with what the items wrote. A body that raises rolls back to a
savepoint taken right after the lock, so nothing of it stays, and the ``failed`` row is
written under the lock (in a transaction of its own only if the connection is gone). The lock
ends with the transaction, including when the process dies, so a crash never leaves it behind.

Every run but a manual one belongs to a *slot*, a fire time of the task's schedule, and at
most one run per (task, slot) does the work (invariant 3). Under the lock, before the body, the
run checks whether the slot is already claimed (a committed completed, partial, failed or
missed row): then it is ``skipped`` with reason ``slot_done``. The lock alone would not do: a
1 ms run on one host commits and releases it before another host's crontab, a second later,
asks. A partial unique index on ``runs(task, slot)`` makes the claim durable in the very
transaction that commits the work. A failed body rolls back to a savepoint taken after the
lock, so its ``failed`` row claims the slot under the same lock.

Which slot an invocation belongs to: the next fire time if it is at most ``early`` ahead (a
clock a little fast), else the latest fire time if it is at most ``grace`` behind (a slow host,
a late cron). Outside both there is no slot: the run is ``skipped`` (``no_slot``) unless it was
asked for as manual, which runs under the lock with no slot at all.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from . import queries
from .cron import CronSchedule
from .database import Database
from .items import ItemFrame, ItemSavepoints

__all__ = [
    "ItemBlock",
    "ItemFailure",
    "Misfire",
    "PeriodicTask",
    "Run",
    "RunResult",
    "RunStatus",
    "RunTrigger",
    "SkipReason",
    "SlotPolicy",
    "TaskBody",
    "execute",
    "record_missed",
    "resolve_slot",
    "run_slot",
]

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
    MISSED = "missed"


class RunTrigger(enum.StrEnum):
    """Who started a run."""

    CRON = "cron"  # `cronlock run TASK` / App.run: an invocation mapped to its slot
    SCHEDULER = "scheduler"  # the scheduler, on time (within grace)
    CATCH_UP = "catch_up"  # the scheduler, for a slot missed while it was down
    MANUAL = "manual"  # asked for by hand, outside any slot


class SkipReason(enum.StrEnum):
    LOCK_BUSY = "lock_busy"  # another run holds the task's lock right now
    SLOT_DONE = "slot_done"  # this slot already has its outcome
    NO_SLOT = "no_slot"  # the invocation is outside every slot's grace and not manual


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
    trigger: RunTrigger = RunTrigger.CRON
    lateness_ms: float | None = None

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
            "trigger": self.trigger.value,
            "lateness_ms": None if self.lateness_ms is None else round(self.lateness_ms, 3),
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
        self._savepoints = ItemSavepoints(session)

    def item(self, key: object = None) -> ItemBlock:
        """Process one item inside its own SAVEPOINT: ``async with run.item(key) as session``.

        An exception inside the block rolls back to the savepoint, is recorded against ``key``
        and does not propagate: the run goes on with the next item. If the savepoint itself
        cannot be rolled back (the connection is gone), that error propagates and fails the run.
        Pending ORM changes are flushed before the release; a failed item's ORM changes are
        undone in the session too (see ``items.py``). Items may nest.
        """
        return ItemBlock(self, key)

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


class ItemBlock:
    """The context manager ``Run.item`` returns. A plain class: the periodic path enters one
    per item, and ``@asynccontextmanager``'s generator costs several microseconds more."""

    __slots__ = ("_frame", "_key", "_run")

    def __init__(self, run: Run, key: object) -> None:
        self._run = run
        self._key = key
        self._frame: ItemFrame | None = None

    async def __aenter__(self) -> AsyncSession:
        self._frame = await self._run._savepoints.begin()
        return self._run.session

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        run = self._run
        savepoints = run._savepoints
        frame = self._frame
        assert frame is not None, "the item was not entered"
        try:
            if exc is None:
                try:
                    await savepoints.release(frame)
                except Exception as failure:
                    await savepoints.rollback(frame)
                    run._record_failure(self._key, failure)
                else:
                    run.items_ok += 1
                return False
            if isinstance(exc, Exception):
                await savepoints.rollback(frame)
                run._record_failure(self._key, exc)
                return True  # recorded: the run goes on with the next item
            return False  # cancellation, KeyboardInterrupt: not an item's failure
        finally:
            savepoints.end(frame)


def resolve_slot(
    task: PeriodicTask, moment: datetime, *, grace: timedelta | None = None
) -> datetime | None:
    """The slot an invocation at ``moment`` belongs to, or None outside every slot's grace."""
    policy = task.policy
    upcoming = task.schedule.next_fire_time(moment)
    if upcoming is not None and upcoming - moment <= policy.early:
        return upcoming
    latest = task.schedule.slot_at(moment)
    if latest is not None and moment - latest <= (policy.grace if grace is None else grace):
        return latest
    return None


async def execute(
    database: Database,
    task: PeriodicTask,
    *,
    now: datetime | None = None,
    manual: bool = False,
    grace: timedelta | None = None,
) -> RunResult:
    """Run ``task`` once for the slot ``now`` belongs to (or, ``manual``, outside any slot).

    Never raises for the body. Outside every slot's grace, and not manual, nothing runs: the
    result is ``skipped`` with reason ``no_slot`` (recorded, so the attempt is visible).
    """
    started_at = now or datetime.now(UTC)
    if manual:
        return await run_slot(database, task, None, now=started_at, trigger=RunTrigger.MANUAL)
    slot = resolve_slot(task, started_at, grace=grace)
    if slot is None:
        latest = task.schedule.slot_at(started_at)
        limit = task.policy.grace if grace is None else grace
        note = (
            f"no slot within {limit.total_seconds():g} s of {started_at.isoformat()}"
            + (f" (the latest was {latest.isoformat()})" if latest else "")
            + "; run it by hand with --manual"
        )
        logger.info(
            "%s: skipped, %s",
            task.name,
            note,
            extra={"action": "run_skipped", "task": task.name, "reason": SkipReason.NO_SLOT},
        )
        outcome = RunResult(
            task=task.name,
            status=RunStatus.SKIPPED,
            slot=None,
            started_at=started_at,
            finished_at=started_at,
            duration_ms=0.0,
            skip_reason=SkipReason.NO_SLOT,
            error=note,
        )
        async with database.session() as session:
            return await _record(session, outcome)
    return await run_slot(database, task, slot, now=started_at, trigger=RunTrigger.CRON)


async def run_slot(
    database: Database,
    task: PeriodicTask,
    slot: datetime | None,
    *,
    now: datetime | None = None,
    trigger: RunTrigger = RunTrigger.CRON,
    record_busy: bool = True,
) -> RunResult:
    """Run ``task`` for ``slot`` (None: a manual run) under its lock; record the outcome.

    ``record_busy=False`` leaves no row when the lock is busy, so the slot stays open: the
    scheduler's catch-up uses it to try again later rather than mark the slot as handled.
    """
    started_at = now or datetime.now(UTC)
    clock = time.perf_counter()
    lateness_ms = None if slot is None else (started_at - slot).total_seconds() * 1000

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
            trigger=trigger,
            lateness_ms=lateness_ms,
            **extra,
        )

    def skipped(reason: SkipReason, why: str) -> RunResult:
        logger.info(
            "%s: skipped, %s",
            task.name,
            why,
            extra={"action": "run_skipped", "task": task.name, "reason": reason},
        )
        return result(RunStatus.SKIPPED, skip_reason=reason)

    async with database.session() as session:
        locked = await session.scalar(
            queries.LOCK_TRY_XACT, {"namespace": task.lock_namespace, "key": task.lock_key}
        )
        if not locked:
            await session.rollback()
            outcome = skipped(SkipReason.LOCK_BUSY, "another run holds the lock")
            return await _record(session, outcome) if record_busy else outcome
        if slot is not None and await session.scalar(
            queries.RUN_SLOT_CLAIMED, {"task": task.name, "slot": slot}
        ):
            return await _record(
                session, skipped(SkipReason.SLOT_DONE, f"slot {slot.isoformat()} already ran")
            )

        run = Run(task, session, slot)
        # Taken after the lock: a body that raises rolls back to here, and the failed row
        # then claims the slot while the lock is still held.
        body_savepoint = await session.begin_nested()
        try:
            await task.body(run)
            if body_savepoint.is_active:
                # Its RELEASE also releases an item savepoint whose RELEASE was held back.
                await body_savepoint.commit()
        except Exception as exc:
            error = f"{type(root_cause(exc)).__name__}: {_message(exc)}"
            logger.error(
                "%s: failed and rolled back: %s",
                task.name,
                error,
                extra={"action": "run_failed", "task": task.name},
                exc_info=exc,
            )
            outcome = _without_committed_items(result(RunStatus.FAILED, run, error=error))
            try:
                await body_savepoint.rollback()
                return await _record_claim(session, outcome)
            except SQLAlchemyError:
                # The connection is gone (the savepoint's rollback may even "succeed" on an
                # invalidated connection): the transaction went with its writes and its lock.
                # Record the failure afresh.
                await session.rollback()
                return await _record_claim(session, outcome)
        status = RunStatus.PARTIAL if run.items_failed else RunStatus.COMPLETED
        return await _record_claim(session, result(status, run))


async def _record_claim(session: AsyncSession, outcome: RunResult) -> RunResult:
    """Record a claiming outcome; if another run claimed the slot first, roll back and skip.

    Under the lock the slot was free, so this only happens when something bypassed it (a
    peer recording the slot missed without the lock, an older cronlock): the unique index
    keeps the slot's single outcome, and this run's work is not committed.
    """
    try:
        return await _record(session, outcome)
    except IntegrityError as exc:
        if "ux_runs_task_slot" not in str(exc):
            raise
        await session.rollback()
        logger.warning(
            "%s: slot %s was claimed by another run meanwhile; rolled back",
            outcome.task,
            _iso(outcome.slot),
            extra={"action": "slot_conflict", "task": outcome.task},
        )
        return await _record(
            session,
            replace(
                outcome,
                status=RunStatus.SKIPPED,
                skip_reason=SkipReason.SLOT_DONE,
                items_ok=0,
                items_failed=0,
                failures=(),
                error=None,
            ),
        )


async def record_missed(
    database: Database,
    task: PeriodicTask,
    slots: Sequence[datetime],
    *,
    now: datetime,
) -> int | None:
    """Record ``slots`` as ``missed``; the number of rows written, None if the lock was busy.

    Under the task's lock, so a slot whose run is in progress (not committed yet) is never
    recorded missed under it; the caller tries again later. Slots already claimed are left
    alone (ON CONFLICT DO NOTHING on the unique index).
    """
    if not slots:
        return 0
    async with database.session() as session:
        locked = await session.scalar(
            queries.LOCK_TRY_XACT, {"namespace": task.lock_namespace, "key": task.lock_key}
        )
        if not locked:
            await session.rollback()
            return None
        written = 0
        for slot in slots:
            row = await session.scalar(
                queries.RUN_INSERT_MISSED,
                {
                    "task": task.name,
                    "slot": slot,
                    "status": RunStatus.MISSED.value,
                    "started_at": now,
                    "finished_at": now,
                    "trigger": RunTrigger.SCHEDULER.value,
                    "lateness_ms": (now - slot).total_seconds() * 1000,
                    "host": _HOST,
                    "pid": os.getpid(),
                },
            )
            written += row is not None
        await session.commit()
    if written:
        logger.warning(
            "%s: %d slot(s) missed, %s … %s",
            task.name,
            written,
            slots[0].isoformat(),
            slots[-1].isoformat(),
            extra={"action": "slots_missed", "task": task.name, "count": written},
        )
    return written


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
            "trigger": outcome.trigger.value,
            "lateness_ms": outcome.lateness_ms,
        },
    )
    await session.commit()
    return replace(outcome, run_id=run_id)


_HOST = socket.gethostname()
