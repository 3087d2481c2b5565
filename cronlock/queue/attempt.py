"""One attempt: a claimed job's handler, run with its session and its timeout.

A handler gets an ORM session on its lane's connection, whose transaction is the job's (and in
batch mode its batch's): SQLAlchemy's transaction there is nested in the lane's, which asyncpg
turns into a SAVEPOINT, opened only when the handler first uses the session. A failure rolls
back to it, so a failing job loses its own writes and nothing else (DESIGN.md invariant 5). A
session its handler left untouched (no transaction, nothing in it or in ``info``) goes to the
lane's next job, as good as new; a used one never does, so a handler must not keep a session
past its return. A handler that committed its session released the savepoint into the job's
transaction, so if it fails after that, only dropping the whole transaction keeps its writes
from staying: the attempt raises ``LostLease``, as when the connection was cut or a savepoint
could not be rolled back. The attempt's outcome is a value (``complete.py``): the handler's
result, or the ``JobCancel``/``JobSnooze`` it returned (``handling.py``), whose writes commit
as a result's do. Around the handler the job is ``current_job()``'s. A typed job type's
payload is loaded into its model here, once per attempt, for every mode; a row that does not
fit fails the attempt with the fields named (``payloads.py``), and a typed result is checked
against its model before it is stored.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol, cast

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from ..errors import InvalidPayload
from ..observe.tracehooks import Tracer
from ..outcome import JobStatus, error_line
from ..pg import connection_lost, session_has_pending, session_untouched
from .cancel import CancelRequested, Cancels, Scope
from .complete import (
    Attempt,
    Cancelled,
    Failure,
    Snoozed,
    Success,
    cancelled,
    datetime_of,
    micros_now,
    outcome_of_failure,
    snoozed,
)
from .handling import JobCancel, JobSnooze, reason_of, running
from .jobs import AsyncHandler, Backoff, Handler, Job, to_json
from .threads import Threads

__all__ = ["Attempts", "ConnectionLost", "JobSession", "LostLease", "SessionSlot"]

logger = logging.getLogger("cronlock.drainer")


class JobSession(Session):
    """A handler's session, which remembers whether the handler itself committed it (released
    its savepoint into the job's transaction): after that, a failure cannot roll back to it."""

    released = False
    stranded = False  # a def handler's thread outran its attempt (threads.py)

    def commit(self) -> None:
        self.released = True
        super().commit()


class LeaseSession(Session):
    """The lease mode's session, the completion's: ``commit()`` from the handler flushes, and
    the completion commits (with the job's completion, or not at all: ``leased.py``)."""

    released = False  # never: the completion commits it
    completing = False
    stranded = False  # a def handler's thread outran its attempt (threads.py)

    def commit(self) -> None:
        if self.completing:
            super().commit()
        else:
            self.flush()


class LostLease(Exception):
    """The lane's transaction is gone (its connection was cut or a savepoint could not be
    rolled back): nothing of it committed. Its one argument is the attempt's ``Failure``."""


class ConnectionLost(Exception):
    """The lane's connection is gone (cut, or the server went away): its transaction rolled
    back with everything in it, and its jobs are due again with no attempt consumed. An
    infrastructure fault, never a job's failure (``pg.connection_lost`` tells them apart)."""


class SessionSlot(Protocol):
    """Where a lane keeps the session an untouched handler left, for its next job, and (the
    lease mode's) the session a handler used, for the completion to commit with its outcome."""

    session: AsyncSession | None
    used: AsyncSession | None


class Attempts:
    """Runs attempts of one drainer's jobs: its handlers, its clock and its retry jitter, in
    every commit mode. The mode's only say here is what becomes of a session the handler used:
    in a transactional mode its savepoint is released into the lane's transaction; in the
    ``lease`` mode (``lease=True``) it is left in the slot's ``used`` for the completion to
    commit with the job's outcome (``leased.py``)."""

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        queue: str,
        clock: Callable[[], datetime] | None = None,
        rng: random.Random | None = None,
        tracing: Tracer | None = None,
        lease: bool = False,
        threads: int = 1,
    ) -> None:
        self.handlers = handlers
        self.queue = queue
        self.clock = clock
        self.rng = rng
        self.lease = lease
        self._session_class: type[Session] = LeaseSession if lease else JobSession
        # The attempts running now, for an operator's cancel (cancel.py).
        self.cancels = Cancels(queue)
        self.tracing = tracing  # cronlock.tracing's spans; the lanes then call run_traced
        self.threads = Threads(threads)  # where plain def handlers run

    async def run(self, conn: AsyncConnection, slot: SessionSlot, job: Job) -> Attempt:
        """One attempt of ``job`` on ``conn`` (inside the lane's transaction)."""
        scope = self.cancels.enter(job.id)
        try:
            return await self._run(conn, slot, job, scope)
        finally:
            self.cancels.leave(scope)

    async def _run(
        self, conn: AsyncConnection, slot: SessionSlot, job: Job, scope: Scope
    ) -> Attempt:
        handler = self.handlers.get(job.job_type)
        # The worker's clock as an integer (µs), what a failure's error entry and its retry's
        # due time are reckoned from (the row's started_at/completed_at are the database's).
        started = micros_now(self.clock)
        if scope.requested:  # an operator's cancel came before the attempt
            return self.stopped(job, started, ran=False)
        if handler is None:
            return self.failed(
                job, f"no handler registered for job type {job.job_type!r}", started, None
            )
        payload = job.payload
        if handler.payload_model is not None:
            # Once per attempt, in every mode: a row that no longer fits the model (it changed
            # since the job was enqueued, or plain SQL wrote it) is this job's failed attempt.
            try:
                payload = handler.payload_model.load(payload, "its payload")
            except Exception as exc:
                error = str(exc) if isinstance(exc, InvalidPayload) else _unloadable(exc, handler)
                return self.failed(job, error, started, handler)
        # The session needs no close(): its transaction always ends here (committed or rolled
        # back) and it is dropped with the attempt; closing costs more than a no-op job. A
        # session the previous handler left untouched is as good as new: it is reused.
        session = slot.session or AsyncSession(
            bind=conn, expire_on_commit=False, sync_session_class=self._session_class
        )
        slot.session = None
        context = running.set((job, self.queue, scope))
        directed: JobCancel | JobSnooze | None = None
        try:
            scope.begin()
            try:
                limit = handler.timeout if job.timeout is None else job.timeout
                if limit is None:
                    value = await self._call(handler, session, payload)
                else:
                    async with asyncio.timeout(limit):
                        value = await self._call(handler, session, payload)
            except BaseException as exc:
                # An operator's cancel is the scope's own cancellation: any other (the
                # drainer's abort) goes on.
                if scope.end() and isinstance(exc, asyncio.CancelledError):
                    raise CancelRequested() from None
                raise
            scope.end()
            if value is None:
                result = None
            elif isinstance(value, JobCancel | JobSnooze):
                result, directed = None, value
            elif handler.result_model is not None:
                result = handler.result_model.dump(value, "the handler's result")
            else:
                result = to_json(value, "the handler's result")
            sync = cast(JobSession, session.sync_session)
            if not sync.released and session_untouched(sync):
                slot.session = session
            elif sync.in_transaction() or session_has_pending(sync):
                if self.lease:
                    slot.used = session  # the completion commits it, with the outcome
                else:
                    await session.commit()  # flush, RELEASE SAVEPOINT; the lane commits later
        except Exception as exc:
            error = _describe(exc, handler, job)
            if cast(JobSession, session.sync_session).stranded:
                # A def handler's thread runs on with the session: the loop leaves it alone
                # and the lane throws the connection away, the transaction with it.
                raise LostLease(self.ended(job, error, started, handler, scope)) from exc
            try:
                if session.in_transaction():
                    await session.rollback()  # ROLLBACK TO SAVEPOINT: this job's writes only
            except Exception as broken:
                if connection_lost(broken):
                    # The lane's connection went under the handler: the server rolled the
                    # job back, the job is not to blame (whatever the handler made of it).
                    raise ConnectionLost(error_line(broken)) from exc
                raise LostLease(self.ended(job, error, started, handler, scope)) from broken
            if conn.invalidated and connection_lost(exc):  # SQLAlchemy saw it drop: the same
                raise ConnectionLost(error) from exc
            if conn.invalidated or cast(JobSession, session.sync_session).released:
                # SQLAlchemy threw the connection away (a statement cancelled by the timeout),
                # or the handler committed its session (released the savepoint) and then
                # failed: only dropping the whole transaction keeps its writes from staying.
                raise LostLease(self.ended(job, error, started, handler, scope)) from exc
            return self.ended(job, error, started, handler, scope)
        finally:
            running.reset(context)
        if directed is not None:
            finished = micros_now(self.clock)
            return self.directed(job, directed, started, finished)
        return Success(job, result)

    def _call(self, handler: Handler, session: AsyncSession, payload: Any) -> Awaitable[Any]:
        """The handler's run: an ``async def`` on the loop, a ``def`` in a thread."""
        if handler.threaded:
            sync = cast(JobSession, session.sync_session)
            return self.threads.run(handler.func, sync, payload, session=sync)
        return cast(AsyncHandler, handler.func)(session, payload)

    def ended(
        self, job: Job, error: str, started: int, handler: Handler | None, scope: Scope
    ) -> Failure | Cancelled:
        """A handler that raised: a failed attempt, unless an operator asked to cancel the
        job (then, whatever it raised, it is cancelled, not retried)."""
        if scope.requested:
            return self.stopped(job, started, ran=True)
        return self.failed(job, error, started, handler)

    def stopped(self, job: Job, started: int, *, ran: bool) -> Cancelled:
        """An operator's cancel ended the attempt (its writes rolled back), logged."""
        now = self.clock() if self.clock is not None else datetime.now(UTC)
        error = (
            "cancelled by an operator while running: its handler was stopped"
            if ran
            else "cancelled by an operator before its handler started"
        )
        logger.info(
            "job %s (%s) attempt %d: %s",
            job.id,
            job.job_type,
            job.retry_count + 1,
            error,
            extra={"action": "job_cancelled", "queue": self.queue, "job_id": str(job.id)},
        )
        return cancelled(job, error, datetime_of(started), now)

    def directed(
        self, job: Job, outcome: JobCancel | JobSnooze, started: int, finished: int
    ) -> Cancelled | Snoozed:
        """The outcome a handler returned (JobCancel, JobSnooze), logged: not a failure."""
        begun, now = datetime_of(started), datetime_of(finished)
        extra = {"queue": self.queue, "job_id": str(job.id)}
        if isinstance(outcome, JobCancel):
            ended = cancelled(job, reason_of(outcome), begun, now)
            logger.info(
                "job %s (%s) attempt %d: %s",
                job.id,
                job.job_type,
                job.retry_count + 1,
                ended.error,
                extra={"action": "job_cancelled", **extra},
            )
            return ended
        again = snoozed(job, outcome.seconds, begun, now)
        logger.info(
            "job %s (%s) attempt %d snoozed for %.3f s, until %s by the worker's clock "
            "(not counted)",
            job.id,
            job.job_type,
            job.retry_count + 1,
            again.delay,
            again.worker_run_at.isoformat(),
            extra={"action": "job_snoozed", **extra},
        )
        return again

    async def run_traced(self, conn: AsyncConnection, slot: SessionSlot, job: Job) -> Attempt:
        """``run`` in a span of its own, the child of the one that enqueued ``job``: what a
        traced drainer's lanes call instead (``run`` itself stays as it is)."""
        assert self.tracing is not None
        outcome: Attempt = await self.tracing.attempt(
            lambda: self.run(conn, slot, job), job, self.queue
        )
        return outcome

    def failed(self, job: Job, error: str, started: int, handler: Handler | None) -> Failure:
        """The failed attempt (the retry rule decides retrying or failed), logged."""
        backoff = handler.backoff if handler is not None else Backoff()
        now = self.clock() if self.clock is not None else datetime.now(UTC)
        outcome = outcome_of_failure(job, error, datetime_of(started), now, backoff, self.rng)
        logger.warning(
            "job %s (%s) attempt %d failed: %s%s",
            job.id,
            job.job_type,
            job.retry_count + 1,
            error,
            "; retrying" if outcome.status is JobStatus.RETRYING else "; giving up",
            extra={"action": "job_failed", "queue": self.queue, "job_id": str(job.id)},
        )
        return outcome


def _unloadable(exc: Exception, handler: Handler) -> str:
    """A model that raised something else than a validation error loading a payload (a
    validator's own exception, a dataclass's ``__post_init__``)."""
    assert handler.payload_model is not None
    return f"its payload could not be loaded as {handler.payload_model.name}: {error_line(exc)}"


def _describe(exc: BaseException, handler: Handler, job: Job | None = None) -> str:
    if isinstance(exc, CancelRequested):
        return "cancelled by an operator while running"
    limit = handler.timeout if job is None or job.timeout is None else job.timeout
    if isinstance(exc, TimeoutError) and limit is not None:
        return f"TimeoutError: the handler ran longer than its timeout of {limit:g} s"
    return error_line(exc)
