"""Cooperative cancellation of a running job: the operator's request and the drainer's side.

A waiting job is cancelled by ``operate`` at once (it never runs). A job a drainer is running
is another matter: in the transactional commit modes its row is locked by the lane's
transaction until the handler ends, so nothing can write to it. The operator's cancel
(``cancel_job``) then records a *request* (a row of ``cancel_requests``) and commits it with a
NOTIFY on the schema's cancel channel, and waits, for at most ``wait`` seconds, for the job to
settle: it waits on the row lock itself (``FOR SHARE`` under a lock timeout), so it learns the
outcome the moment the lane commits, and in the ``lease`` mode, whose running rows are not
locked, it looks again every ``SETTLE_POLL`` seconds.

The drainer's side is ``Cancels``, one per drainer: every attempt registers a ``Scope`` while
it runs (``Attempts.run``). The notification (``Cancels.notified``, on the lanes' listener)
or, without one, the drainer's poll of the requests of its attempts running longer than
``CANCEL_POLL_INTERVAL`` (``Cancels.watch``: a one-off ``drain``, PgBouncer, a missed
notification) reaches the scope, which cancels the handler's asyncio task: the handler gets
``CancelledError`` at its next await, its savepoint is rolled back and the job ends
``cancelled``, never retried, with an ``error_history`` entry, in the same transaction as
the rest of its batch. The cancellation is the scope's own (it is taken back with
``Task.uncancel``, as ``asyncio.timeout`` does), so a drainer's abort still aborts. A request
for a job claimed but not started (a batch in flight), or for one this drainer will claim
within ``EARLY_TTL`` seconds, is remembered: that attempt ends cancelled without running.

The hook, for any way of running attempts: ``scope = cancels.enter(job_id)`` before the
attempt (``scope.requested``: end it cancelled without running the handler), ``scope.begin()``
(or ``scope.begin(task)`` for a handler run in a task of its own) right before awaiting the
handler, ``scope.end()`` as soon as the await returns or raises (True: the CancelledError is
the operator's, end the attempt ``Cancelled``), ``cancels.leave(scope)`` after. ``Attempts.run``
does this for the transactional modes.

The races: a cancel and the claim lock the row with ``SKIP LOCKED``, so the first wins — the
job is cancelled before it runs, or the lane has it and the request stops it. A cancel and the
completion: whichever the lane's commit holds is the outcome, and the operator is told which
(``cancelled``, or ``completed`` before the cancel reached it). A lane that hands the job back
or dies leaves it waiting, and the operator's next look cancels it outright. In every case the
job runs at most once and ends in one status.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError, InterfaceError

from .. import pg, sql
from ..database import Database
from ..errors import InvalidJobOption
from ..outcome import JobStatus, root_cause
from ..sql.tables import cancel_channel
from . import operate
from .operate import ChangeOutcome, JobChange, Verb

__all__ = [
    "CANCEL_POLL_INTERVAL",
    "DEFAULT_CANCEL_WAIT",
    "EARLY_TTL",
    "SETTLE_POLL",
    "CancelRequested",
    "Cancels",
    "Scope",
    "cancel_job",
]

logger = logging.getLogger("cronlock.drainer")

# How long an operator's cancel waits for a running job to stop before it answers
# ``cancel_requested`` (the request stands).
DEFAULT_CANCEL_WAIT = 10.0
# A drainer looks up the requests for its attempts running longer than this (seconds): what
# no notification reached stops within about this long.
CANCEL_POLL_INTERVAL = 1.0
# A request for a job this drainer is not running is kept this long (seconds), for a claim it
# may be about to start.
EARLY_TTL = 60.0
_EARLY_MAX = 10_000
# In the lease mode a running job's row is not locked: the operator looks again this often.
SETTLE_POLL = 0.05
_LOCK_NOT_AVAILABLE = "55P03"


class CancelRequested(Exception):
    """An operator's cancel stopped the handler (internal: the attempt turns it into its
    ``Cancelled`` outcome)."""


class Scope:
    """One running attempt, as cancellation sees it: whether a cancel was requested, and the
    task to cancel while the handler runs."""

    __slots__ = ("_cancelled", "_task", "job_id", "requested", "started")

    def __init__(self, job_id: uuid.UUID, requested: bool = False) -> None:
        self.job_id = job_id
        self.requested = requested
        self.started = time.monotonic()
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False

    def begin(self, task: asyncio.Task[Any] | None = None) -> None:
        """The handler starts now, in ``task`` (default: the current one; a commit mode that
        runs handlers in a task of their own passes it, and awaits it)."""
        self._task = task or asyncio.current_task()

    def end(self) -> bool:
        """The handler is over: take back our cancellation; whether it is what stopped the
        task (requested, and no other cancellation pending)."""
        task, self._task = self._task, None
        if not self._cancelled or task is None:
            return False
        self._cancelled = False
        return task.uncancel() == 0

    def request(self) -> None:
        """Cancel: the handler, if it runs now, gets CancelledError at its next await."""
        self.requested = True
        if self._task is not None and not self._cancelled:
            self._cancelled = True
            self._task.cancel()


class Cancels:
    """The attempts of one drainer that an operator's cancel may stop."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self._running: dict[uuid.UUID, Scope] = {}
        self._early: dict[uuid.UUID, float] = {}

    def enter(self, job_id: uuid.UUID) -> Scope:
        """An attempt of ``job_id`` starts (requested already if a request came first)."""
        early = self._early.pop(job_id, None) is not None if self._early else False
        scope = self._running[job_id] = Scope(job_id, early)
        return scope

    def leave(self, scope: Scope) -> None:
        if self._running.get(scope.job_id) is scope:
            del self._running[scope.job_id]

    def request(self, job_id: uuid.UUID) -> bool:
        """An operator asked to cancel ``job_id``: stop it if it runs here (True), else
        remember it for a while."""
        scope = self._running.get(job_id)
        if scope is not None:
            if not scope.requested:
                logger.info(
                    "job %s: cancel requested, stopping its handler",
                    job_id,
                    extra={"action": "job_cancel_requested", "queue": self.queue},
                )
            scope.request()
            return True
        now = time.monotonic()
        if len(self._early) >= _EARLY_MAX or (
            self._early and now - next(iter(self._early.values())) > EARLY_TTL
        ):
            self._early = {k: t for k, t in self._early.items() if now - t <= EARLY_TTL}
            while len(self._early) >= _EARLY_MAX:
                del self._early[next(iter(self._early))]
        self._early[job_id] = now
        return False

    def knows(self, job_id: uuid.UUID) -> bool:
        """Whether a cancel of ``job_id`` has reached this drainer (running or not)."""
        scope = self._running.get(job_id)
        return job_id in self._early or (scope is not None and scope.requested)

    def notified(self, _conn: pg.DriverConnection, _pid: int, _channel: str, payload: str) -> None:
        """The cancel channel's listener."""
        try:
            job_id = uuid.UUID(payload)
        except ValueError:
            return
        self.request(job_id)

    async def watch(self, database: Database, interval: float = CANCEL_POLL_INTERVAL) -> None:
        """Until cancelled: every ``interval`` seconds, the requests for the attempts that run
        longer than that, for what no notification reached."""
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            ids = [
                job_id
                for job_id, scope in self._running.items()
                if not scope.requested and now - scope.started >= interval
            ]
            if not ids:
                continue
            try:
                async with database.connect() as conn:
                    found = (await conn.execute(sql.CANCEL_REQUESTED, {"ids": ids})).scalars()
                    requested = [uuid.UUID(str(job_id)) for job_id in found]
            except (OSError, DBAPIError, InterfaceError) as exc:
                # The lanes meet the same database: they stop the drainer if it is gone.
                logger.debug("cancel requests not read: %s", exc)
                continue
            for job_id in requested:
                self.request(job_id)


# -- the operator's side --------------------------------------------------------------------


@dataclass(frozen=True)
class _Settled:
    """What the job's row says once the lane running it let go (or the lock wait ran out)."""

    timed_out: bool
    status: JobStatus | None = None


async def _request(database: Database, job_id: uuid.UUID) -> None:
    channel = cancel_channel(database.schema)
    async with database.engine.begin() as conn:
        await conn.execute(sql.CANCEL_REQUEST, {"ids": [job_id]})
        await conn.execute(sql.CANCEL_NOTIFY, {"ids": [job_id], "channel": channel})


async def _forget(database: Database, job_id: uuid.UUID) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(sql.CANCEL_FORGET, {"ids": [job_id]})


async def _settle(database: Database, job_id: uuid.UUID, seconds: float) -> _Settled:
    """Wait up to ``seconds`` for the row lock of the lane running the job, then read it."""
    try:
        async with database.engine.begin() as conn:
            timeout = f"{max(int(seconds * 1000), 1)}ms"
            await conn.execute(sql.LOCK_TIMEOUT_LOCAL, {"timeout": timeout})
            status = (await conn.execute(sql.JOB_STATUS_SETTLED, {"id": job_id})).scalar()
    except DBAPIError as exc:
        if getattr(root_cause(exc), "sqlstate", None) == _LOCK_NOT_AVAILABLE:
            return _Settled(timed_out=True)
        raise
    return _Settled(False, None if status is None else JobStatus(status))


def _told(change: JobChange) -> JobChange:
    """What a cancel that had to ask the drainer says, once the job let go of its lane."""
    job_id, status = change.job_id, change.status
    if change.outcome is ChangeOutcome.CANCELLED:
        return JobChange(job_id, change.outcome, status, "cancelled: its attempt had ended")
    if status is JobStatus.CANCELLED:
        detail = "cancelled while running: its handler was stopped, its writes rolled back"
        return JobChange(job_id, ChangeOutcome.CANCELLED, status, detail)
    if status is JobStatus.COMPLETED:
        detail = "completed before the cancel reached it: not cancelled"
        return JobChange(job_id, ChangeOutcome.COMPLETED, status, detail)
    if status is JobStatus.FAILED:
        detail = "failed for good before the cancel reached it: not cancelled"
        return JobChange(job_id, ChangeOutcome.WRONG_STATUS, status, detail)
    return change


async def cancel_job(
    database: Database, job_id: uuid.UUID | str, *, wait: float = DEFAULT_CANCEL_WAIT
) -> JobChange:
    """Cancel a job: a waiting one at once; a running one by asking its drainer to stop it,
    waiting up to ``wait`` seconds for the outcome (``cancelled``, ``completed`` when it ended
    first, or ``cancel_requested`` when it had not stopped by then: the request stands)."""
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 3600:
        raise InvalidJobOption(f"wait must be 0 to 3600 seconds, not {wait!r}")
    target = operate.job_id_of(job_id)
    deadline = time.monotonic() + wait
    requested = False
    while True:
        change = await operate.change_job(database, Verb.CANCEL, target)
        if change.outcome is not ChangeOutcome.RUNNING:
            if not requested:
                return change
            await _forget(database, target)
            return _told(change)
        if not requested:
            await _request(database, target)
            requested = True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            detail = (
                "cancel requested: its drainer stops the handler at its next await "
                f"(not stopped within {wait:g} s)"
            )
            return JobChange(target, ChangeOutcome.CANCEL_REQUESTED, change.status, detail)
        settled = await _settle(database, target, remaining)
        if settled.status is JobStatus.PROCESSING:
            # The lease mode: the row is not locked while its handler runs.
            await asyncio.sleep(min(SETTLE_POLL, max(deadline - time.monotonic(), 0)))
