"""The lanes: each claims due jobs, runs them and writes their outcomes in one transaction.

The transaction is the lease. A *lane* (one pooled connection; ``concurrency`` lanes) claims
due jobs with ``SELECT … FOR UPDATE SKIP LOCKED`` and runs their handlers (``attempt.py``),
then writes their outcomes (``complete.py``), in that same transaction. No ``processing``
state is committed, so there is nothing to recover: if the worker dies the transaction aborts,
the row locks go and the jobs are due again at once, with none of their writes applied
(DESIGN.md invariant 4). A worker whose connection was cut while it was paused cannot commit:
it is fenced by PostgreSQL itself.

Commit modes. ``strict`` (the default, the reference's semantics): one job per transaction.
``batch``: up to ``batch_size`` jobs per transaction, one outcome UPDATE and one commit per
batch; faster, but a crash or a lost connection rolls back the whole batch (those jobs run
again; their database writes were never applied, their external side effects may repeat).

The hot path runs on the lane's bare asyncpg connection with statements compiled once (no ORM
on it, one claim and one outcome statement per batch). A lane with nothing due sleeps until a
notification for its queue wakes it (LISTEN on the schema's channel, which the jobs table's
trigger notifies at commit; polling behind PgBouncer), until the next job is due, or for the
poll interval. On ``stop()`` lanes finish the job in flight and leave the claimed jobs not yet
started out of the commit (handed back); ``abort()`` cuts their connections, so the server
rolls their transactions back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from .. import pg, sql
from ..database import Database
from ..observe.stats import DrainStats
from ..outcome import error_line
from ..sql.tables import cancel_channel, jobs_channel
from .attempt import Attempts, ConnectionLost, LostLease
from .complete import Attempt, Completion, Failure, count, given_up, refused
from .jobs import Job
from .lease import Fence, LockLost
from .options import DrainOptions

__all__ = ["Lane", "Lanes"]

logger = logging.getLogger("cronlock.drainer")
T = TypeVar("T")

# A job whose connection is lost this many times in a row while it runs (in one drainer) is
# charged a failed attempt: its handler is taking its connection down (ran past the server's
# idle_in_transaction_session_timeout, crashed its backend), and would run again forever.
MAX_LOST_RUNS = 3


@dataclass
class Lane:
    number: int
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    driver: pg.DriverConnection | None = None  # under the lane, to cut it on abort
    in_flight: int = 0
    # The job this lane's transaction ran last: the suspect when that transaction is lost.
    last_job: Job | None = None
    # A handler's session that the handler left untouched, for the next job on this lane's
    # connection (see attempt.py); None when the next job needs a fresh one.
    session: AsyncSession | None = None
    # After a claim that found nothing: seconds until the next job comes due (None: none).
    next_due: float | None = None
    # The session a lease-mode handler used, for the completion to commit (attempt.py).
    used: AsyncSession | None = None
    # The worker's monotonic clock just before this lane's last claim (the lease mode's).
    claimed_clock: float = 0.0


# A claimed payload is jsonb's text output: one JSON value, no whitespace around it, which
# raw_decode reads without the two regular expressions json.loads runs around it.
_decode = json.JSONDecoder().raw_decode


def read_jobs(rows: Sequence[Sequence[Any]]) -> tuple[list[Job], list[Failure]]:
    """Claimed rows as jobs, when a payload among them cannot be read here (JSON nested deeper
    than Python's recursion limit, which plain SQL can store): that job fails for good instead
    of its lane (``complete.given_up``). Only then: the claim's own loop is the fast path."""
    jobs: list[Job] = []
    unreadable: list[Failure] = []
    for id, kind, payload, retries, most, created, at, *rest in rows:  # rest: timeout, trace
        try:
            jobs.append(Job(id, kind, _decode(payload)[0], retries, most, created, at, *rest))
        except (RecursionError, ValueError) as exc:
            job = Job(id, kind, None, retries, most, created, at)
            error = f"its payload could not be read: {error_line(exc)}"
            unreadable.append(given_up(job, error))
            logger.error(
                "job %s: %s: failed",
                id,
                error,
                extra={"action": "job_unreadable", "job_id": str(id)},
            )
    return jobs, unreadable


async def refused_alone(
    driver: pg.DriverConnection, items: Sequence[T], write: Callable[[T], Awaitable[object]]
) -> list[tuple[T, BaseException]]:
    """Each item's ``write`` tried alone in a transaction rolled back: the items the database
    refuses, each with its refusal (how a refused batch finds the job that caused it)."""
    refusals: list[tuple[T, BaseException]] = []
    for item in items:
        trial = driver.transaction()
        await trial.start()
        try:
            await write(item)
        except pg.ServerError as alone:
            if pg.connection_lost(alone):
                raise
            refusals.append((item, alone))
        finally:
            await trial.rollback()
    return refusals


class Lanes:
    """The lanes of one active drainer: their own pool, their loops and their wake-ups."""

    def __init__(
        self,
        database: Database,
        attempts: Attempts,
        completion: Completion,
        stats: DrainStats,
        stopping: asyncio.Event,
        stop: Callable[[], None],
        options: DrainOptions,
        *,
        deadline: float | None,
        fence: Fence | None = None,
    ) -> None:
        self.database = database
        self.attempts = attempts
        self.completion = completion
        self.stats = stats
        self.queue = options.queue
        self.batch_size = options.batch
        self.poll_interval = options.poll_interval
        self.clock = options.clock
        self.deadline = deadline
        self.fence = fence  # checked right before each commit (lease.py)
        self.lanes = [Lane(n) for n in range(options.concurrency)]
        self._stopping = stopping
        self._stop = stop  # the drainer's stop(): every lane stops claiming
        self._aborted = False
        self._tasks: list[asyncio.Task[None]] = []
        self._pool: Database | None = None
        self._listener: pg.DriverConnection | None = None
        self._relisten: asyncio.Task[None] | None = None  # reopening a cut LISTEN connection
        self._closing = False
        self._lost_runs: dict[object, int] = {}  # job id -> connections lost running it
        self.lost_connection = False  # a lane failed because its database went away
        self.fenced = False  # a lane's commit found the drainer's lock gone
        # A traced drainer claims each job's trace context too; the others, what they always did.
        self._traced = attempts.tracing is not None
        claim = sql.JOB_CLAIM_TRACED if self._traced else sql.JOB_CLAIM
        self._claim = pg.AsyncpgStatement.of(claim, database.schema)
        self._next_due = pg.AsyncpgStatement.of(sql.JOB_NEXT_DUE, database.schema)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def in_flight(self) -> int:
        return sum(lane.in_flight for lane in self.lanes)

    def wake(self) -> None:
        for lane in self.lanes:
            lane.wake.set()

    def abort(self) -> None:
        """Cut the lanes' connections (the server rolls their transactions back) and stop."""
        self._aborted = True
        for lane in self.lanes:
            self._count_aborted(lane.in_flight)
            if lane.driver is not None:
                lane.driver.terminate()
        for task in self._tasks:
            task.cancel()

    def _count_aborted(self, in_flight: int) -> None:
        self.stats.rolled_back += in_flight  # their transactions end with their connections

    def _engine(self) -> AsyncEngine:
        # The lanes' own pool, configured like the app's (keepalives on direct connections,
        # unnamed statements behind PgBouncer), one connection per lane and one spare.
        if self._pool is None:
            self._pool = Database(
                self.database.url,
                schema=self.database.schema,
                pgbouncer=self.database.pgbouncer,
                pool_size=len(self.lanes) + 1,
            )
        return self._pool.engine

    async def close(self) -> None:
        self._closing = True
        if self._relisten is not None:
            self._relisten.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._relisten
            self._relisten = None
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
            self._listener = None
        if self._pool is not None:
            await self._pool.dispose()
            self._pool = None

    # -- wake-ups -------------------------------------------------------------------------

    async def listen(self) -> None:
        """Subscribe to the schema's channel; a notification for this queue wakes idle lanes."""
        if self.database.pgbouncer:
            # Transaction pooling gives no session to listen on: poll instead.
            logger.info(
                "behind PgBouncer: polling every %s s",
                self.poll_interval,
                extra={"action": "polling", "queue": self.queue},
            )
            return
        try:
            await self._subscribe()
        except (OSError, pg.ServerError) as exc:
            # Behind PgBouncer in transaction mode there is no LISTEN: poll instead.
            logger.warning(
                "notifications unavailable (%s): polling every %s s",
                exc,
                self.poll_interval,
                extra={"action": "listen_unavailable", "queue": self.queue},
            )

    async def _subscribe(self) -> None:
        listener = await pg.connect(self.database, f"cronlock-listener:{self.queue}")
        try:
            await listener.add_listener(jobs_channel(self.database.schema), self._notified)
            # An operator's cancel of a running job (cancel.py), for the attempts of these lanes.
            cancels = self.attempts.cancels.notified
            await listener.add_listener(cancel_channel(self.database.schema), cancels)
        except BaseException:
            listener.terminate()
            raise
        listener.add_termination_listener(self._listener_closed)
        self._listener = listener

    def _listener_closed(self, _conn: object) -> None:
        """The LISTEN connection closed under us (cut, a restart): reopen it, with backoff,
        polling meanwhile; one line now, one when it is back."""
        if self._closing or self._relisten is not None:
            return
        self._listener = None
        logger.warning(
            "the LISTEN connection closed: reopening it, polling every %s s meanwhile",
            self.poll_interval,
            extra={"action": "listen_lost", "queue": self.queue},
        )
        self._relisten = asyncio.get_running_loop().create_task(self._reopen())

    async def _reopen(self) -> None:
        delay = 0.0  # the first try at once; then 0.1 s doubling, at most the poll interval
        try:
            while not self._closing:
                if delay:
                    await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                try:
                    await self._subscribe()
                except (OSError, pg.ServerError, pg.ClientError):
                    delay = min(max(delay * 2, 0.1), max(self.poll_interval, 0.1))
                    continue
                logger.info(
                    "the LISTEN connection is back: notifications wake the lanes again",
                    extra={"action": "listen_back", "queue": self.queue},
                )
                self.wake()  # what was enqueued meanwhile
                return
        finally:
            self._relisten = None

    def _notified(self, _conn: pg.DriverConnection, _pid: int, _channel: str, payload: str) -> None:
        if payload == self.queue:
            self.wake()

    async def _idle(self, lane: Lane) -> None:
        """Sleep until notified, until the next job comes due, or for the poll interval."""
        seconds = lane.next_due
        timeout = self.poll_interval if seconds is None else min(seconds, self.poll_interval)
        if timeout <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(lane.wake.wait(), timeout)

    def _db_now(self) -> datetime | None:
        # None: the claim uses the database's clock, which every host shares.
        return self.clock() if self.clock is not None else None

    # -- the loops ------------------------------------------------------------------------

    async def run(self, *, until_empty: bool) -> str | None:
        """Run the lanes until they are done; an error message if one of them failed."""
        self._tasks = [
            asyncio.create_task(self._lane(lane, until_empty=until_empty)) for lane in self.lanes
        ]
        error: str | None = None
        results = await asyncio.gather(*self._tasks, return_exceptions=True)
        for outcome in results:
            if isinstance(outcome, BaseException) and not isinstance(
                outcome, asyncio.CancelledError
            ):
                error = error_line(outcome)
                if pg.connection_lost(outcome):
                    # No new connection could be had: an outage, not a bug (one line).
                    self.lost_connection = True
                    logger.warning(
                        "a lane has no database: %s",
                        error,
                        extra={"action": "lane_failed", "queue": self.queue},
                    )
                    continue
                logger.error(
                    "a lane failed: %s",
                    error,
                    extra={"action": "lane_failed", "queue": self.queue},
                    exc_info=outcome,
                )
        return error

    async def _lane(self, lane: Lane, *, until_empty: bool) -> None:
        try:
            await self._lane_loop(lane, until_empty=until_empty)
        except (Exception, asyncio.CancelledError):
            if self._aborted:
                return  # its connection was cut on purpose: the server rolled it back
            self._stop()  # a lane that lost its database stops the drainer: exit, restart
            raise

    async def _lane_loop(self, lane: Lane, *, until_empty: bool) -> None:
        while True:
            async with self._engine().connect() as conn:
                driver = await pg.driver_of(conn)
                lane.driver = driver
                lane.session = None  # a session is bound to one connection
                try:
                    await self._batches(conn, driver, lane, until_empty=until_empty)
                    return
                except LostLease as lost:
                    # The connection is in no state to go on: record the failed attempt on a
                    # fresh one, throw this one away, and carry on with a new one.
                    await conn.invalidate()
                    (failure,) = lost.args
                    if await self.completion.record_lost(self._engine(), failure, self._db_now()):
                        count(self.stats, [failure], queue=self.queue)
                except LockLost:
                    # Fenced: the drainer lost its lock, a standby may be active by now. The
                    # batch rolled back, its jobs run there; this drainer stops.
                    logger.warning(
                        "lane %d: the drainer lost its lock; its batch rolled back, not committed",
                        lane.number,
                        extra={"action": "lane_fenced", "queue": self.queue},
                    )
                    self.fenced = True
                    self._stop()
                    return
                except Exception as exc:
                    if not self._lost(exc, driver):
                        raise
                    # Cut under us (pg_terminate_backend, a pooler, a restart): the server
                    # rolled the batch back, its jobs are due again, no attempt is consumed.
                    # A new connection goes on; if none can be had, the lane fails and the
                    # drainer rides the outage out (service.py).
                    logger.warning(
                        "lane %d lost its connection (%s): its jobs in flight rolled back and "
                        "run again",
                        lane.number,
                        error_line(exc),
                        extra={"action": "lane_connection_lost", "queue": self.queue},
                    )
                    with contextlib.suppress(Exception):
                        await conn.invalidate()
                    await self._count_lost_run(lane, error_line(exc))
            if self.stopping:
                return

    async def _count_lost_run(self, lane: Lane, error: str) -> None:
        """Count a lost connection against the job it was running; at MAX_LOST_RUNS in a row
        the job is charged a failed attempt (DESIGN.md invariant 9: bounded, never forever)."""
        job, lane.last_job = lane.last_job, None
        if job is None:
            return
        runs = self._lost_runs[job.id] = self._lost_runs.get(job.id, 0) + 1
        if runs < MAX_LOST_RUNS:
            return
        del self._lost_runs[job.id]
        failure = self.attempts.failed(
            job,
            f"its connection was lost {runs} times in a row while it ran (last: {error})",
            time.time_ns() // 1000,
            self.attempts.handlers.get(job.job_type),
        )
        if await self.completion.record_lost(self._engine(), failure, self._db_now()):
            count(self.stats, [failure], queue=self.queue)

    @staticmethod
    def _lost(exc: BaseException, driver: pg.DriverConnection) -> bool:
        """Whether a lane's error is its connection's loss: an infrastructure fault. Only
        cronlock's own statements and an attempt that saw its transaction go get here."""
        return isinstance(exc, ConnectionLost) or pg.connection_lost(exc)

    async def _batches(
        self, conn: AsyncConnection, driver: pg.DriverConnection, lane: Lane, *, until_empty: bool
    ) -> None:
        while not self.stopping:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                break
            lane.wake.clear()
            claimed = await self._batch(conn, driver, lane)
            if claimed:
                continue
            if until_empty:
                break
            await self._idle(lane)

    async def _batch(self, conn: AsyncConnection, driver: pg.DriverConnection, lane: Lane) -> int:
        """Claim, run and finish one batch in one transaction; the number of jobs claimed.

        A handler's session sits on the same connection as the claim: SQLAlchemy's transaction
        there is nested in ours, which asyncpg turns into a SAVEPOINT (attempt.py).
        """
        outcomes: list[Attempt] = []
        # When each job started on this worker's monotonic clock: its handler's run time (a
        # duration, so no clock skew is in it), and with the claim's database time the job's
        # created -> committed latency (complete.count).
        begun: list[float] = []
        claimed_clock = time.perf_counter()  # the claim's now() is its transaction's start
        transaction = driver.transaction()
        await transaction.start()
        try:
            rows = await driver.fetch(
                self._claim.sql,
                *self._claim.args(queue=self.queue, limit=self.batch_size, now=self._db_now()),
            )
            if not rows:  # asked in the claim's transaction: see sql.JOB_NEXT_DUE
                seconds = await driver.fetchval(
                    self._next_due.sql, *self._next_due.args(queue=self.queue, now=self._db_now())
                )
                lane.next_due = None if seconds is None else float(seconds)
            try:
                if self._traced:
                    claimed = [
                        Job(id, kind, _decode(payload)[0], retries, most, created, at, limit, trace)
                        for id, kind, payload, retries, most, created, at, limit, trace in rows
                    ]
                else:
                    claimed = [
                        Job(id, kind, _decode(payload)[0], retries, most, created, at, limit)
                        for id, kind, payload, retries, most, created, at, limit in rows
                    ]
            except (RecursionError, ValueError):
                claimed, unreadable = read_jobs(rows)
                outcomes += unreadable
                begun += [time.perf_counter()] * len(unreadable)
            # Looked up once per batch, not per job.
            stopping, perf_counter = self._stopping.is_set, time.perf_counter
            attempt = self.attempts.run_traced if self._traced else self.attempts.run
            for job in claimed:
                if stopping():
                    break
                lane.in_flight = 1
                lane.last_job = job
                begun.append(perf_counter())
                outcome = await attempt(conn, lane, job)
                lane.in_flight = 0
                outcomes.append(outcome)
            if outcomes:
                try:
                    await self.completion.write(driver, outcomes, self._db_now())
                except pg.ServerError as refusal:
                    if pg.connection_lost(refusal):
                        raise
                    await transaction.rollback()
                    await self._refused(driver, lane, outcomes, refusal)
                    return len(rows)
                if self.fence is not None and not await self.fence.holds(driver):
                    raise LockLost
        except BaseException as exc:
            if isinstance(exc, LostLease):
                self.stats.rolled_back += len(outcomes)
            elif isinstance(exc, LockLost) or (
                isinstance(exc, Exception) and self._lost(exc, driver)
            ):
                self.stats.rolled_back += len(outcomes) + lane.in_flight
            lane.in_flight = 0
            if not driver.is_closed():
                with contextlib.suppress(Exception):
                    await transaction.rollback()
            raise
        await transaction.commit()
        if lane.last_job is not None:
            lane.last_job = None
            if self._lost_runs:
                for outcome in outcomes:
                    self._lost_runs.pop(outcome.job.id, None)
        self.stats.handed_back += len(rows) - len(outcomes)
        count(self.stats, outcomes, begun, queue=self.queue, claimed=claimed_clock)
        return len(rows)

    async def _refused(
        self,
        driver: pg.DriverConnection,
        lane: Lane,
        outcomes: list[Attempt],
        refusal: BaseException,
    ) -> None:
        """The database refused the batch's outcomes (a constraint, a trigger's error): the
        batch rolled back. Each outcome the database refuses alone (tried in a transaction
        rolled back) fails its job (``complete.refused``); the others run again, as after a
        lost connection. One that cannot even be failed is left to an operator, logged."""
        lane.last_job = None
        refusals: list[tuple[Attempt, BaseException]] = [(outcomes[0], refusal)]
        if len(outcomes) > 1:
            refusals = await refused_alone(
                driver,
                outcomes,
                lambda outcome: self.completion.write(driver, [outcome], self._db_now()),
            )
        self.stats.rolled_back += len(outcomes) - len(refusals)
        for outcome, why in refusals:
            failure = refused(outcome, why)
            logger.error(
                "job %s: its outcome could not be written (%s): failed",
                outcome.job.id,
                error_line(why),
                extra={"action": "job_outcome_refused", "queue": self.queue},
            )
            try:
                await self.completion.write(driver, [failure], self._db_now())
            except pg.ServerError as again:
                if pg.connection_lost(again):
                    raise
                logger.error(
                    "job %s: not even its failure could be written (%s): left for an operator",
                    outcome.job.id,
                    error_line(again),
                    extra={"action": "job_outcome_refused", "queue": self.queue},
                )
                continue
            count(self.stats, [failure], queue=self.queue)
