"""A run of a periodic task: lock, body with a savepoint per item, one recorded outcome.

One run is one transaction. It first takes ``pg_try_advisory_xact_lock(namespace, key)``:
busy means another run is active, so this one is ``skipped`` (overlap is normal for cron).
Free, the body runs with the transaction's session; ``run.item(key)`` wraps a unit of work in
a SAVEPOINT (``items.py``), so an exception there rolls back that item only and is recorded.
The run's row in ``runs`` is written in the same transaction as its work: ``completed`` or
``partial`` commit together with what the items wrote. A body that raises rolls back to a
savepoint taken right after the lock, so nothing of it stays, and the ``failed`` row is
written under the lock (in a transaction of its own only if the connection is gone). A body
that had items and did none of them (every one failed) is ``failed`` the same way: it is
no success, and ``failed`` always means nothing of the run was committed. The lock
ends with the transaction, including when the process dies, so a crash never leaves it behind.

Every run but a manual one belongs to a *slot* (``task.py``), and at most one run per
(task, slot) does the work (invariant 3). Under the lock, before the body, the
run checks whether the slot is already claimed (a committed completed, partial, failed or
missed row): then it is ``skipped`` with reason ``slot_done``. The lock alone would not do: a
1 ms run on one host commits and releases it before another host's crontab, a second later,
asks. A partial unique index on ``runs(task, slot)`` makes the claim durable in the very
transaction that commits the work. A failed body rolls back to a savepoint taken after the
lock, so its ``failed`` row claims the slot under the same lock.

Under the lock the run also reads whether the task is paused (``cronlock task pause``): a
paused task's slot is recorded ``skipped`` with reason ``paused``, whoever fired it (the
scheduler, a crontab line), so its slot history stays whole; a manual run (run-now) still runs,
being asked for by hand. And it reads the task's failing items (``poison.py``): ``run.skip_parked``
leaves out the parked ones, and a run whose only failures are items that were failing already
is ``partial``, not ``failed``; a run in which every new item failed still is.

A run from crontab (``execute``) also leaves a trace of the slots nobody fired: under the
lock, before its body, it records ``missed`` those since the task's latest claimed slot that
have no row (``backlog``, the scheduler's look back), so a crontab-only deployment whose host
died shows the gap.

A task declared with ``commit_every`` runs chunked instead (``_run_chunked``): its lock is
held by a guard connection for the whole run (``guard.py``), its row is committed ``running``
before the body and claims the slot from then on, and its items commit in chunks
(``chunks.py``), each with the row's progress.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast

from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession

from .. import sql
from ..database import Database
from ..logs import RUNS_LOGGER
from ..observe.tracehooks import Tracer
from ..outcome import (
    RunResult,
    RunStatus,
    RunTrigger,
    SkipReason,
    error_line,
)
from ..queue.threads import Threads
from . import backlog
from .chunks import Chunks, LockLost
from .guard import Guard
from .poison import ItemMemory
from .task import PeriodicTask, Run, resolve_slot

__all__ = ["execute", "record_missed", "run_slot"]

logger = logging.getLogger("cronlock.periodic")
# A run's outcome (cronlock.logs: `cronlock run` prints it itself).
runs_logger = logging.getLogger(RUNS_LOGGER)


async def _body(task: PeriodicTask, run: Run) -> None:
    """The task's body: an ``async def`` on the loop, a plain ``def`` in a thread of its own
    (if the run is cancelled first, the thread's statements are refused: ``threads.py``)."""
    if not task.threaded:
        await cast(Callable[[Run], Awaitable[None]], task.body)(run)
        return
    threads = Threads(1)
    try:
        await threads.run(task.body, run)
    finally:
        threads.close()


async def execute(
    database: Database,
    task: PeriodicTask,
    *,
    now: datetime | None = None,
    manual: bool = False,
    grace: timedelta | None = None,
    tracing: Tracer | None = None,
) -> RunResult:
    """Run ``task`` once for the slot ``now`` belongs to (or, ``manual``, outside any slot).

    Never raises for the body. Outside every slot's grace, and not manual, nothing runs: the
    result is ``skipped`` with reason ``no_slot`` (recorded, so the attempt is visible).
    """
    started_at = now or datetime.now(UTC)
    if manual:
        return await run_slot(
            database, task, None, now=started_at, trigger=RunTrigger.MANUAL, tracing=tracing
        )
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
    return await run_slot(
        database,
        task,
        slot,
        now=started_at,
        trigger=RunTrigger.CRON,
        record_gaps=True,
        tracing=tracing,
    )


async def run_slot(
    database: Database,
    task: PeriodicTask,
    slot: datetime | None,
    *,
    now: datetime | None = None,
    trigger: RunTrigger = RunTrigger.CRON,
    record_busy: bool = True,
    record_gaps: bool = False,
    tracing: Tracer | None = None,
) -> RunResult:
    """Run ``task`` for ``slot`` (None: a manual run) under its lock; record the outcome.

    ``record_busy=False`` leaves no row when the lock is busy, so the slot stays open: the
    scheduler's catch-up uses it to try again later rather than mark the slot as handled.
    ``record_gaps=True`` (a run from crontab) first records ``missed`` the slots since the
    task's latest claimed one that have no row (``backlog``), under the lock: without a
    scheduler, a host that died would otherwise leave no trace. They are only recorded, never
    run, whatever the task's misfire policy: catching up is the scheduler's (README,
    "Misfires").
    """
    if tracing is not None:  # the same run, in a span of its own (cronlock.tracing)
        return await tracing.periodic_run(
            task.name,
            slot,
            trigger.value,
            lambda: run_slot(
                database,
                task,
                slot,
                now=now,
                trigger=trigger,
                record_busy=record_busy,
                record_gaps=record_gaps,
            ),
        )
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
            items_parked=run.items_parked if run else 0,
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
        # A pause says who paused the task, and since when, in the row.
        return result(
            RunStatus.SKIPPED,
            skip_reason=reason,
            error=why if reason is SkipReason.PAUSED else None,
        )

    async def gate(session: AsyncSession) -> RunResult | ItemMemory:
        """Take the lock and check the slot: the recorded skip, or the items' memory to go on."""
        locked = await session.scalar(
            sql.LOCK_TRY_XACT, {"namespace": task.lock_namespace, "key": task.lock_key}
        )
        if not locked:
            await session.rollback()
            outcome = skipped(SkipReason.LOCK_BUSY, "another run holds the lock")
            return await _record(session, outcome) if record_busy else outcome
        return await _gate_read(session, task, slot, skipped)

    if task.commit_every is not None:
        return await _run_chunked(
            database,
            task,
            slot,
            task.commit_every,
            result=result,
            skipped=skipped,
            started_at=started_at,
            trigger=trigger,
            record_busy=record_busy,
            record_gaps=record_gaps,
        )

    async with database.session() as session:
        memory = await gate(session)
        if isinstance(memory, RunResult):
            return memory
        # Recorded misses commit on their own, so they stand whatever becomes of this run
        # (even if its connection dies); the lock goes with that transaction, hence the gate
        # again.
        if (
            record_gaps
            and slot is not None
            and await _record_gaps(session, task, slot, now=started_at, trigger=trigger)
        ):
            memory = await gate(session)
            if isinstance(memory, RunResult):
                return memory

        run = Run(task, session, slot, memory=memory)
        # Taken after the lock: a body that raises rolls back to here, and the failed row
        # then claims the slot while the lock is still held.
        body_savepoint = await session.begin_nested()
        error: str | None = None
        raised: Exception | None = None
        try:
            await _body(task, run)
            if _every_new_item_failed(run):
                error = _every_item_failed(run)
            elif body_savepoint.is_active:
                # Its RELEASE also releases an item savepoint whose RELEASE was held back.
                await body_savepoint.commit()
        except Exception as exc:
            error, raised = error_line(exc), exc
        if error is None:
            status = RunStatus.PARTIAL if run.items_failed else RunStatus.COMPLETED
            await run.memory.save(session, task.name, started_at, committed=True)
            return await _record_claim(session, result(status, run))
        runs_logger.error(
            "%s: failed and rolled back: %s",
            task.name,
            error,
            extra={"action": "run_failed", "task": task.name},
            exc_info=raised,
        )
        outcome = _without_committed_items(result(RunStatus.FAILED, run, error=error))
        try:
            await body_savepoint.rollback()
            await run.memory.save(session, task.name, started_at, committed=False)
            return await _record_claim(session, outcome)
        except SQLAlchemyError:
            # The connection is gone (the savepoint's rollback may even "succeed" on an
            # invalidated connection): the transaction went with its writes and its lock.
            # Record the failure afresh.
            await session.rollback()
            return await _record_claim(session, outcome)


class _Result(Protocol):
    def __call__(self, status: RunStatus, run: Run | None = None, **extra: Any) -> RunResult: ...


async def _run_chunked(
    database: Database,
    task: PeriodicTask,
    slot: datetime | None,
    every: int,
    *,
    result: _Result,
    skipped: Callable[[SkipReason, str], RunResult],
    started_at: datetime,
    trigger: RunTrigger,
    record_busy: bool,
    record_gaps: bool,
) -> RunResult:
    """A chunked run (``commit_every``): the lock on a guard connection, the slot claimed by
    a ``running`` row committed before the body, a commit every ``every`` items (README
    "Chunked runs").

    The lock is held by the guard for the whole run, so a second run skips (``lock_busy``)
    until this one's row says how it ended, and then skips ``slot_done``: the ``running`` row
    claims the slot from its first commit on. Under the lock, ``running`` rows of the task
    are runs that died: they are marked ``interrupted`` first, so a crashed run's slot is
    not run again, and the next slot's run carries on from what the task left to do.
    """
    guard = Guard(database, task.name, task.lock_namespace, task.lock_key)
    try:
        if not await guard.take():
            outcome = skipped(SkipReason.LOCK_BUSY, "another run holds the lock")
            if not record_busy:
                return outcome
            async with database.session() as session:
                return await _record(session, outcome)
        async with database.session() as session:
            await _interrupt_dead(session, task)
            memory = await _gate_read(session, task, slot, skipped)
            if isinstance(memory, RunResult):
                return memory
            if record_gaps and slot is not None:
                await _record_gaps(session, task, slot, now=started_at, trigger=trigger)
            # The row that claims the slot, committed before any work.
            claim = await _record_claim(session, result(RunStatus.RUNNING, chunks=0))
            if claim.status is not RunStatus.RUNNING:
                return claim
            assert claim.run_id is not None
            chunks = Chunks(session, guard, claim.run_id, every)
            await chunks.begin()
            run = Run(task, session, slot, chunks, memory)
            return await _chunked_body(session, task, run, chunks, result, started_at)
    finally:
        await guard.release()


async def _chunked_body(
    session: AsyncSession,
    task: PeriodicTask,
    run: Run,
    chunks: Chunks,
    result: _Result,
    started_at: datetime,
) -> RunResult:
    """Run the body of a chunked run and record how it ended in its row."""

    def ended(status: RunStatus, **extra: Any) -> RunResult:
        return replace(result(status, run, **extra), run_id=chunks.run_id)

    error: str | None = None
    raised: BaseException | None = None
    try:
        await _body(task, run)
        if chunks.broken is not None:
            raise chunks.broken  # the body caught a failed commit: the run cannot go on
        if _every_new_item_failed(run):
            error = _every_item_failed(run)
        else:
            await chunks.check_lock()
            status = RunStatus.PARTIAL if run.items_failed else RunStatus.COMPLETED
            last = chunks.committed + (1 if chunks.pending or not chunks.committed else 0)
            outcome = ended(status, chunks=last)
            await run.memory.save(session, task.name, started_at, committed=True)
            if await _finish(session, outcome) is None:
                raise LockLost("another run marked this run interrupted: it had lost its lock")
            await session.commit()
            return outcome
    except LockLost as exc:
        await session.rollback()
        message = str(exc)
        logger.error(
            "%s: interrupted after %d chunk(s), %d item(s) committed: %s",
            task.name,
            chunks.committed,
            chunks.committed_ok,
            message,
            extra={"action": "run_interrupted", "task": task.name},
        )
        await session.scalar(sql.RUN_INTERRUPT, {"run_id": chunks.run_id, "new_error": message})
        await session.commit()
        return replace(
            ended(RunStatus.INTERRUPTED, error=message, chunks=chunks.committed),
            items_ok=chunks.committed_ok,
        )
    except Exception as exc:
        error, raised = error_line(exc), exc
    logger.error(
        "%s: failed after %d committed chunk(s), the chunk in progress rolled back: %s",
        task.name,
        chunks.committed,
        error,
        extra={"action": "run_failed", "task": task.name},
        exc_info=raised,
    )
    await session.rollback()
    outcome = replace(
        ended(RunStatus.FAILED, error=error, chunks=chunks.committed),
        items_ok=chunks.committed_ok,
    )
    await run.memory.save(session, task.name, started_at, committed=False)
    await _finish(session, outcome)
    await session.commit()
    return outcome


async def _finish(session: AsyncSession, outcome: RunResult) -> int | None:
    """Write a chunked run's outcome into its row (not committed); None if the row is no
    longer ``running`` (another run marked it interrupted)."""
    run_id: int | None = await session.scalar(
        sql.RUN_FINISH,
        {
            "run_id": outcome.run_id,
            "new_status": outcome.status.value,
            "new_finished_at": outcome.finished_at,
            "new_items_ok": outcome.items_ok,
            "new_items_failed": outcome.items_failed,
            "new_items_parked": outcome.items_parked,
            "new_failures": [f.to_dict() for f in outcome.failures],
            "new_error": outcome.error,
            "new_chunks": outcome.chunks,
            "commits_work": outcome.status is not RunStatus.FAILED,
        },
    )
    return run_id


async def _interrupt_dead(session: AsyncSession, task: PeriodicTask) -> None:
    """Under the task's lock: mark its ``running`` rows interrupted (their runs died) and
    commit."""
    dead = (
        await session.execute(
            sql.RUN_INTERRUPT_DEAD,
            {
                "run_task": task.name,
                "new_error": "the run stopped before its end (its process or its lock was lost); "
                "its committed chunks stay",
            },
        )
    ).all()
    if not dead:
        await session.rollback()
        return
    await session.commit()
    for row in dead:
        logger.warning(
            "%s: run %d (slot %s) died after %s chunk(s), %d item(s) committed: "
            "recorded interrupted",
            task.name,
            row.id,
            row.slot.isoformat() if row.slot else None,
            row.chunks,
            row.items_ok,
            extra={"action": "run_interrupted", "task": task.name, "run_id": row.id},
        )


async def _gate_read(
    session: AsyncSession,
    task: PeriodicTask,
    slot: datetime | None,
    skipped: Callable[[SkipReason, str], RunResult],
) -> RunResult | ItemMemory:
    """Under the lock: the recorded skip of a slot already claimed or of a paused task, else
    the task's failing items (one statement, ``sql.RUN_GATE``)."""
    found = (await session.execute(sql.RUN_GATE, {"task": task.name, "slot": slot})).one()
    if slot is not None and found.claimed:
        return await _record(
            session, skipped(SkipReason.SLOT_DONE, f"slot {slot.isoformat()} already ran")
        )
    if slot is not None and found.paused_at is not None:
        return await _record(
            session,
            skipped(
                SkipReason.PAUSED,
                f"paused by {found.paused_by} since {found.paused_at.isoformat()}",
            ),
        )
    return ItemMemory(found.items, task.park_after)


def _every_new_item_failed(run: Run) -> bool:
    """Whether the run had items, did none of them, and some of its failures were new: items
    that were failing already (``poison.py``) alone do not make a run ``failed``."""
    return bool(run.items_failed and not run.items_ok and run.memory.new_failures)


def _every_item_failed(run: Run) -> str:
    """The error of a run that had items and did none of them.

    Such a run is ``failed``, not ``partial``: it is no success anywhere (status, metrics,
    exit code), so a task that fails every item is seen failing. And like a body that raised
    it commits nothing, what it wrote outside its items included, so that ``failed`` keeps
    meaning "nothing of the run was committed" (README, Outcomes).
    """
    first = run.failures[0]
    error = f"{first.error_type}: {first.message}"
    known = run.items_failed - run.memory.new_failures
    if known:
        new = run.memory.new_failures
        what = "its one new item" if new == 1 else f"all {new} new items"
        return f"{what} failed ({known} more were failing already); the first: {error}"
    if run.items_failed == 1:
        return f"its one item failed: {error}"
    return f"all {run.items_failed} items failed; the first: {error}"


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
            outcome.slot.isoformat() if outcome.slot else None,
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
            sql.LOCK_TRY_XACT, {"namespace": task.lock_namespace, "key": task.lock_key}
        )
        if not locked:
            await session.rollback()
            return None
        written = await _insert_missed(session, task, slots, now=now, trigger=RunTrigger.SCHEDULER)
        await session.commit()
    return written


async def _record_gaps(
    session: AsyncSession, task: PeriodicTask, slot: datetime, *, now: datetime, trigger: RunTrigger
) -> bool:
    """Under the lock: record ``missed`` the slots between the task's latest claimed slot and
    ``slot`` that have no row, and commit them; False if there were none (nothing committed).

    A task that never claimed a slot has no gaps: its history starts with this run.
    """
    last = await backlog.last_claimed_slot(session, task)
    if last is None or last >= slot:
        return False
    gaps = await backlog.unrecorded(session, task, last, slot, exclude=slot)
    if not gaps:
        return False
    await _insert_missed(session, task, gaps, now=now, trigger=trigger)
    await session.commit()
    return True


async def _insert_missed(
    session: AsyncSession,
    task: PeriodicTask,
    slots: Sequence[datetime],
    *,
    now: datetime,
    trigger: RunTrigger,
) -> int:
    """Insert ``missed`` rows for ``slots`` in the session's transaction; the number written."""
    written = 0
    for slot in slots:
        row = await session.scalar(
            sql.RUN_INSERT_MISSED,
            {
                "task": task.name,
                "slot": slot,
                "status": RunStatus.MISSED.value,
                "started_at": now,
                "finished_at": now,
                "trigger": trigger.value,
                "lateness_ms": (now - slot).total_seconds() * 1000,
                "host": _HOST,
                "pid": os.getpid(),
            },
        )
        written += row is not None
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
        sql.RUN_INSERT,
        {
            "task": outcome.task,
            "slot": outcome.slot,
            "status": outcome.status.value,
            "started_at": outcome.started_at,
            # A chunked run's row is committed running, before it has finished.
            "finished_at": None if outcome.status is RunStatus.RUNNING else outcome.finished_at,
            "items_ok": outcome.items_ok,
            "items_failed": outcome.items_failed,
            "items_parked": outcome.items_parked,
            "failures": [f.to_dict() for f in outcome.failures],
            "error": outcome.error,
            "skip_reason": outcome.skip_reason,
            "chunks": outcome.chunks,
            "host": _HOST,
            "pid": os.getpid(),
            "trigger": outcome.trigger.value,
            "lateness_ms": outcome.lateness_ms,
        },
    )
    await session.commit()
    recorded = replace(outcome, run_id=run_id)
    _log_outcome(recorded)
    return recorded


def _log_outcome(outcome: RunResult) -> None:
    """The line per run, at INFO, once its row is committed."""
    if not runs_logger.isEnabledFor(logging.INFO):
        return
    slot = outcome.slot.isoformat().replace("+00:00", "Z") if outcome.slot else "manual"
    what = outcome.status.value
    if outcome.skip_reason is not None:
        what = f"{what} ({outcome.skip_reason})"
    elif outcome.items_ok or outcome.items_failed or outcome.items_parked:
        items = "1 item" if outcome.items_ok == 1 else f"{outcome.items_ok} items"
        what = f"{what}: {items} ok, {outcome.items_failed} failed"
        if outcome.items_parked:
            what += f", {outcome.items_parked} parked"
    runs_logger.info(
        "%s %s: %s in %.0f ms (run %s, %s)",
        outcome.task,
        slot,
        what,
        outcome.duration_ms,
        outcome.run_id,
        outcome.trigger.value,
        extra={
            "action": "run_finished",
            "task": outcome.task,
            "slot": outcome.slot,
            "run_id": outcome.run_id,
            "trigger": outcome.trigger,
            "outcome": outcome.status,
            "duration_ms": round(outcome.duration_ms, 3),
            "items_ok": outcome.items_ok,
            "items_failed": outcome.items_failed,
        },
    )


_HOST = socket.gethostname()
