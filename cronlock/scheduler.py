"""The scheduler daemon: APScheduler 3 decides *when* a periodic task fires, the run path whether.

``cronlock scheduler`` gives APScheduler's ``AsyncIOScheduler`` one job per task, with a
``ScheduleTrigger`` (``triggers.py``, which only ``Scheduler.start`` imports: APScheduler is
the daemon's alone) that asks the task's ``CronSchedule`` for fire times, so the daemon and the
slot computation cannot disagree on cron or DST semantics. A firing does not run the body
itself: it *wakes* the task, and a wake

1. maps the current time to the slot it belongs to (within the task's grace),
2. looks at the slots between the last one this process knows of (at start: the latest slot
   claimed in ``runs``) and now that have no row at all — slots that passed while nobody
   fired them (``periodic.backlog``, the look back every ``cronlock run`` makes too) — and
   applies the task's misfire policy: record them ``missed``, or run the latest once, or run
   each up to a cap, as ``catch_up`` runs;
3. runs the current slot through ``periodic.run_slot``, the very path ``cronlock run`` takes
   (advisory lock, slot claim, savepoints).

Because the slot claim lives in the database, any number of schedulers on any number of hosts
plus crontab invocations may fire the same task: one run per slot does the work and every other
attempt is recorded ``skipped`` (``lock_busy`` or ``slot_done``). Time comes from an injectable
clock, so tests drive wakes without waiting.

Shutdown (SIGTERM): no new firing starts; runs in flight get ``shutdown_grace`` seconds to
finish and commit, then are cancelled, which closes their transaction: a rollback, never half a
run. APScheduler's own executor would cancel them at once, so runs are tasks of this module's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from . import pg
from .app import App
from .database import Database
from .outage import DEFAULT_RECONNECT, OutageEnd, Reconnect, RideOut, ride_out
from .outcome import RunResult, RunTrigger, SkipReason, error_line
from .periodic import Misfire, PeriodicTask, backlog, record_missed, resolve_slot, run_slot
from .periodic.backlog import BACKLOG_LIMIT
from .retention import PRUNE_TASK, prune

if TYPE_CHECKING:
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

__all__ = [
    "BACKLOG_LIMIT",
    "DEFAULT_SHUTDOWN_GRACE",
    "Clock",
    "Scheduler",
]

logger = logging.getLogger("cronlock.scheduler")

Clock = Callable[[], datetime]

# Seconds runs in flight get to finish and commit after a stop request (SIGTERM).
DEFAULT_SHUTDOWN_GRACE = 30.0
# A catch-up that found the task's lock busy tries again after this, doubling up to the cap.
CATCH_UP_RETRY = 1.0
CATCH_UP_RETRY_CAP = 30.0

_TICK = timedelta(microseconds=1)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Scheduler:
    """Fires an app's periodic tasks on time, and the built-in ``prune`` on its schedule
    (unless the app turned retention off, or only some tasks were asked for); see the module
    docstring."""

    def __init__(
        self,
        app: App,
        database: Database | None = None,
        *,
        clock: Clock = _utcnow,
        tasks: Sequence[str] | None = None,
        shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
        catch_up_retry: float = CATCH_UP_RETRY,
        reconnect: Reconnect | None = DEFAULT_RECONNECT,
    ) -> None:
        """``database`` defaults to the app's; tests give each scheduler its own engine.
        ``catch_up_retry``: seconds before a catch-up that found the lock busy tries again
        (doubling, at most CATCH_UP_RETRY_CAP). ``reconnect``: how a wake that lost the
        database waits for it (``outage.py``), and when the daemon gives up; ``None``: such a
        wake fails and is logged, and the drainer beside the scheduler ends (and is made
        again after ``serve_scheduler``'s restart delay)."""
        self.app = app
        self.database = database if database is not None else app.database
        self.clock = clock
        self.tasks = [app.task(name) for name in tasks] if tasks else list(app.tasks.values())
        # The built-in retention fires beside every task, not beside a chosen few.
        self.retention = None if tasks else app.retention
        self.shutdown_grace = shutdown_grace
        self._horizon: dict[str, datetime] = {}
        self._inflight: set[asyncio.Task[Any]] = set()
        self._apscheduler: AsyncIOScheduler | None = None
        self._stopping = asyncio.Event()
        self._retrying: set[str] = set()
        self.catch_up_retry = catch_up_retry
        self.reconnect = reconnect
        self._outage: asyncio.Future[RideOut] | None = None  # the one wait for the database
        # Tasks with a wake waiting for the database: one per task, however many fire times
        # were lost while it was away (each would wake the task again, all at once).
        self._reviving: set[str] = set()
        # Per task, the horizon a lost wake set before the task's first horizon was known
        # (the process's first wake found the database gone): the catch-up starts no later.
        self._floor: dict[str, datetime] = {}
        self.gave_up: str | None = None  # why the daemon stopped on its own, if it did
        self._gave_up = asyncio.Event()

    # -- one wake ------------------------------------------------------------------------

    async def wake(self, task: PeriodicTask, *, now: datetime | None = None) -> list[RunResult]:
        """Handle missed slots by the task's policy, then run the current slot, if any.

        Serving, a wake that loses the database leaves its slot unrecorded, waits for the
        database (one wait for all tasks) and then catches up: the slot is run late or
        recorded ``missed`` by the task's misfire policy, as after any downtime."""
        now = now or self.clock()
        current = resolve_slot(task, now)
        try:
            return await self._wake(task, now, current)
        except Exception as exc:
            if self._apscheduler is None or self.reconnect is None:
                raise
            if not pg.connection_lost(exc):
                raise
            if current is not None:
                # Not past a slot whose run never got recorded: the catch-up looks at it.
                held = self._horizon if task.name in self._horizon else self._floor
                held[task.name] = min(held.get(task.name, current), current - _TICK)
            self._revive(task, error_line(exc))
            return []

    def _revive(self, task: PeriodicTask, cause: str) -> None:
        """Wake ``task`` again once the database is back, unless a wake already waits."""
        if task.name not in self._reviving:
            self._reviving.add(task.name)
            self._spawn(self._after_outage(task, cause), f"{task.name} (reconnect)")

    async def _wake(
        self, task: PeriodicTask, now: datetime, current: datetime | None
    ) -> list[RunResult]:
        results, left_open = await self.catch_up(task, now=now)
        if left_open and self._apscheduler is not None:
            self._retry_catch_up(task)
        if current is not None:
            results.append(
                await run_slot(
                    self.database,
                    task,
                    current,
                    now=now,
                    trigger=RunTrigger.SCHEDULER,
                    tracing=self.app.tracing,
                )
            )
        return results

    async def _after_outage(self, task: PeriodicTask, cause: str) -> None:
        """Wait for the database (one wait for every task), then wake the task again: its
        slot runs if still within its grace, or is handled by its misfire policy."""
        assert self.reconnect is not None, "no outage is ridden out without a policy"
        if self._outage is None or self._outage.done():
            self._outage = asyncio.ensure_future(
                ride_out(
                    self.database, self.reconnect, who="scheduler", cause=cause, stop=self._stopping
                )
            )
        try:
            outage = await asyncio.shield(self._outage)
        finally:
            self._reviving.discard(task.name)  # a wake that fails from here waits again
        if outage.end is OutageEnd.GAVE_UP:
            if self.gave_up is None:
                self.gave_up = outage.gave_up_line("scheduler")
                logger.error(self.gave_up, extra={"action": "scheduler_gave_up"})
            self._gave_up.set()
        elif outage.end is OutageEnd.BACK:
            await self.wake(task)  # should the database go again, the wake waits again

    async def catch_up(
        self, task: PeriodicTask, *, now: datetime | None = None
    ) -> tuple[list[RunResult], bool]:
        """Handle the slots that passed unrecorded by the task's misfire policy (the current
        slot excepted): the catch-up runs, and whether some slot was left open because the
        task's lock was busy (another scheduler catching up, or any run in progress)."""
        now = now or self.clock()
        current = resolve_slot(task, now)
        horizon = self._horizon.get(task.name)
        if horizon is None:
            horizon = await self._initial_horizon(task, now)
            horizon = min(horizon, self._floor.get(task.name, horizon))
        end = max(now, current) if current is not None else now
        passed = await self._unrecorded(task, horizon, end, exclude=current)
        catch_up, missed = self._plan(task, passed, current, now)

        # Where to look from next time: past everything handled, but not past a slot left
        # open because another run held the lock (it may be that slot's run in progress).
        open_slots = []
        if missed and await record_missed(self.database, task, missed, now=now) is None:
            open_slots.append(min(missed))
        results = []
        for slot in catch_up:
            result = await run_slot(
                self.database,
                task,
                slot,
                now=now,
                trigger=RunTrigger.CATCH_UP,
                record_busy=False,
                tracing=self.app.tracing,
            )
            if result.skip_reason == SkipReason.LOCK_BUSY:
                # Another scheduler catching up the same backlog, or only a run of the current
                # slot: leave the rest open rather than leapfrog slot by slot, and try again
                # shortly (the daemon retries; see _retry_catch_up).
                open_slots.append(slot)
                break
            results.append(result)
        self._horizon[task.name] = min(open_slots) - _TICK if open_slots else max(horizon, end)
        self._floor.pop(task.name, None)
        return results, bool(open_slots)

    def _retry_catch_up(self, task: PeriodicTask) -> None:
        """Try the catch-up again soon, with backoff, until no slot is left open: the run
        that held the lock is usually the on-time slot's, done in a moment, and waiting for
        the next fire time would run the missed slots an interval late (or not at all, past
        max_lateness)."""
        if task.name in self._retrying:
            return
        self._retrying.add(task.name)

        async def retry() -> None:
            delay = self.catch_up_retry
            try:
                while not self._stopping.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), delay)
                    if self._stopping.is_set():
                        return
                    try:
                        _, left_open = await self.catch_up(task)
                    except Exception as exc:
                        if self.reconnect is None or not pg.connection_lost(exc):
                            raise  # without a policy: the wake fails and is logged, as before
                        self._revive(task, error_line(exc))
                        return
                    if not left_open:
                        return
                    delay = min(delay * 2, CATCH_UP_RETRY_CAP)
            finally:
                self._retrying.discard(task.name)

        self._spawn(retry(), f"{task.name} (catch-up)")

    async def _initial_horizon(self, task: PeriodicTask, now: datetime) -> datetime:
        """Where this process picks up a task's history: its latest claimed slot, or now."""
        async with self.database.connect() as conn:
            last = await backlog.last_claimed_slot(conn, task)
        return min(last, now) if last is not None else now

    async def _unrecorded(
        self, task: PeriodicTask, after: datetime, until: datetime, *, exclude: datetime | None
    ) -> list[datetime]:
        """Slots in (after, until] other than ``exclude`` that have no row in ``runs``
        (``periodic.backlog``: at most BACKLOG_LIMIT, the latest)."""
        async with self.database.connect() as conn:
            return await backlog.unrecorded(conn, task, after, until, exclude=exclude)

    @staticmethod
    def _plan(
        task: PeriodicTask, passed: list[datetime], current: datetime | None, now: datetime
    ) -> tuple[list[datetime], list[datetime]]:
        """(slots to run as catch-up, slots to record missed), by the task's misfire policy."""
        policy = task.policy
        eligible = [
            slot
            for slot in passed
            if policy.max_lateness is None or now - slot <= policy.max_lateness
        ]
        if policy.misfire is Misfire.EACH:
            catch_up = eligible[-policy.catch_up_limit :]
        elif policy.misfire is Misfire.ONCE and current is None:
            catch_up = eligible[-1:]
        else:  # SKIP, or ONCE with an on-time slot that runs anyway and catches up for all
            catch_up = []
        chosen = set(catch_up)
        return catch_up, [slot for slot in passed if slot not in chosen]

    # -- the daemon ----------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._inflight.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._inflight.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        assert error is not None
        lost = pg.connection_lost(error)  # one line, no traceback: not a bug of the task
        logger.error(
            "%s: wake failed: %s",
            task.get_name(),
            error_line(error) if lost else error,
            exc_info=None if lost else error,
            extra={"action": "wake_failed"},
        )

    async def _fire(self, name: str) -> None:
        # Returns at once: the run is this scheduler's task, not APScheduler's (see docstring).
        self._spawn(self.wake(self.app.task(name)), name)

    async def _fire_prune(self) -> None:
        retention = self.retention
        if retention is not None:  # a prune of its own: batches of short transactions
            self._spawn(prune(self.database, retention), PRUNE_TASK)

    def start(self) -> None:
        """Wake every task once (catch up after downtime), then fire them on time."""
        # APScheduler is imported here, by the daemon that uses it, not by every command
        # that imports the App (issue 26: `cronlock run TASK` never starts a scheduler).
        from apscheduler.schedulers.asyncio import AsyncIOScheduler

        from .triggers import BuiltinTrigger, ScheduleTrigger

        apscheduler = AsyncIOScheduler(
            timezone=UTC,
            job_defaults={
                # Never let APScheduler drop a late firing on its own: a wake decides what a
                # late slot becomes (run or recorded missed) by the task's policy.
                "misfire_grace_time": None,
                "coalesce": True,
                "max_instances": 1,
            },
        )
        for task in self.tasks:
            self._spawn(self.wake(task), task.name)
            apscheduler.add_job(
                self._fire,
                trigger=ScheduleTrigger(task),
                args=[task.name],
                id=task.name,
                name=f"cronlock task {task.name}",
            )
        if self.retention is not None:
            apscheduler.add_job(
                self._fire_prune,
                trigger=BuiltinTrigger(self.retention.schedule),
                id=PRUNE_TASK,
                name="cronlock built-in prune",
            )
        apscheduler.start()
        self._apscheduler = apscheduler
        logger.info(
            "scheduler started: %d task(s)",
            len(self.tasks),
            extra={"action": "scheduler_started", "tasks": [t.name for t in self.tasks]},
        )

    async def stop(self) -> None:
        """Stop firing; let runs in flight finish within the grace, then roll the rest back."""
        self._stopping.set()
        if self._apscheduler is not None:
            self._apscheduler.shutdown(wait=False)
            self._apscheduler = None
        pending = set(self._inflight)
        if pending:
            logger.info(
                "waiting up to %g s for %d run(s) in flight",
                self.shutdown_grace,
                len(pending),
                extra={"action": "scheduler_draining"},
            )
            _, pending = await asyncio.wait(pending, timeout=self.shutdown_grace)
        for task in pending:
            task.cancel()  # closes the run's transaction: a rollback
        if pending:
            names = sorted(task.get_name() for task in pending)
            logger.warning(
                "cancelled %d run(s) still in flight after %g s (%s); rolled back",
                len(pending),
                self.shutdown_grace,
                ", ".join(names),
                extra={"action": "runs_cancelled", "tasks": names},
            )
            await asyncio.gather(*pending, return_exceptions=True)

    async def serve(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then shut down gracefully (``cronlock.serve_scheduler``
        adds the signals and a drainer beside it)."""
        self.start()
        try:
            stopped = asyncio.ensure_future(stop.wait())
            gave_up = asyncio.ensure_future(self._gave_up.wait())
            try:
                await asyncio.wait((stopped, gave_up), return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                gave_up.cancel()
        finally:
            await self.stop()
        logger.info("scheduler stopped", extra={"action": "scheduler_stopped"})
