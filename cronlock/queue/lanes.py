"""The lanes: each claims due jobs, runs them and completes them, in every commit mode.

A *lane* (one pooled connection; ``concurrency`` lanes) loops: claim a batch of due jobs, run
their handlers one after another (``attempt.py``, outcomes as values), complete their
outcomes (``complete.py``). The loop and the batch are written once, here; the commit mode is
a strategy around them (``Commit``, as River's producer -> JobExecutor -> JobCompleter): how
the batch is claimed and how its outcomes are completed.

``InTransaction`` (``strict``, ``batch``): the transaction is the lease. The claim is ``SELECT
… FOR UPDATE SKIP LOCKED`` in the transaction that runs the handlers and writes their
outcomes. No ``processing`` state is committed, so there is nothing to recover: if the worker
dies the transaction aborts, the row locks go and the jobs are due again at once, with none of
their writes applied (DESIGN.md invariant 4). A worker whose connection was cut while it was
paused cannot commit: it is fenced by PostgreSQL itself. ``strict`` (the default, the
reference's semantics): one job per transaction. ``batch``: up to ``batch_size`` jobs per
transaction, one outcome UPDATE and one commit per batch; faster, but a crash or a lost
connection rolls back the whole batch (those jobs run again; their database writes were never
applied, their external side effects may repeat). ``lease`` (``leased.py``): the claim
commits with an owner and an attempt, and the outcomes are written fenced by them.

The hot path runs on the lane's bare asyncpg connection with statements compiled once (no ORM
on it, one claim and one outcome statement per batch). A lane with nothing due sleeps until a
notification for its queue wakes it (LISTEN on the schema's channel, which the jobs table's
trigger notifies at commit; polling behind PgBouncer), until the next job is due, or for the
poll interval. On ``stop()`` lanes finish the job in flight and hand back the claimed jobs not
yet started (left out of the commit, or returned); ``abort()`` cuts their connections, so the
server rolls their transactions back. A lane whose connection is cut gets a new one and goes
on; an outcome the database refuses fails its job alone (``fail_refused``), never the lane.
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
from typing import Any, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from .. import pg, sql
from ..database import Database
from ..observe.stats import DrainStats
from ..outcome import error_line
from ..sql.tables import cancel_channel, jobs_channel
from .attempt import Attempts, ConnectionLost, LostLease
from .complete import Attempt, Cancelled, Completion, Failure, count, given_up, refused
from .jobs import Job
from .lease import Fence, LockLost
from .options import DrainOptions

__all__ = ["Batch", "Commit", "InTransaction", "Lane", "Lanes", "fail_refused"]

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


# A claimed payload is jsonb's text output: one JSON value, no whitespace around it, which
# raw_decode reads without the two regular expressions json.loads runs around it.
_decode = json.JSONDecoder().raw_decode


def read_jobs(batch: Batch, rows: Sequence[Sequence[Any]]) -> list[Job]:
    """Claimed rows as jobs, when a payload among them cannot be read here (JSON nested deeper
    than Python's recursion limit, which plain SQL can store): that job fails for good instead
    of its lane (``complete.given_up``, an outcome of ``batch``). Only then: the claim's own
    loop is the fast path."""
    jobs: list[Job] = []
    for id, kind, payload, retries, most, created, at, *rest in rows:  # rest: timeout, trace
        try:
            jobs.append(Job(id, kind, _decode(payload)[0], retries, most, created, at, *rest))
        except (RecursionError, ValueError) as exc:
            job = Job(id, kind, None, retries, most, created, at)
            error = f"its payload could not be read: {error_line(exc)}"
            batch.outcomes.append(given_up(job, error))
            batch.begun.append(time.perf_counter())
            logger.error(
                "job %s: %s: failed",
                id,
                error,
                extra={"action": "job_unreadable", "job_id": str(id)},
            )
    return jobs


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


async def fail_refused(
    outcome: Attempt,
    why: BaseException,
    write: Callable[[Failure], Awaitable[T]],
    *,
    queue: str,
) -> tuple[Failure, T] | None:
    """An outcome the database refused alone: its job fails (``complete.refused``) by
    ``write``, logged; the failure and what ``write`` returned. One that cannot even be
    failed is left to an operator, logged (None)."""
    failure = refused(outcome, why)
    logger.error(
        "job %s: its outcome could not be written (%s): failed",
        outcome.job.id,
        error_line(why),
        extra={"action": "job_outcome_refused", "queue": queue},
    )
    try:
        return failure, await write(failure)
    except pg.ServerError as again:
        if pg.connection_lost(again):
            raise
        logger.error(
            "job %s: not even its failure could be written (%s): left for an operator",
            outcome.job.id,
            error_line(again),
            extra={"action": "job_outcome_refused", "queue": queue},
        )
        return None


class Lanes:
    """The lanes of one active drainer: their own pool, their loops and their wake-ups, in
    every commit mode (``commit``, made for these lanes: ``InTransaction`` by default)."""

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
        commit: Callable[[Lanes], Commit] | None = None,
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
        self.fence = fence  # checked in the write before each commit (lease.py)
        self.lanes = [Lane(n) for n in range(options.concurrency)]
        self._stopping = stopping
        self._stop = stop  # the drainer's stop(): every lane stops claiming
        self._aborted = False
        self._tasks: list[asyncio.Task[None]] = []
        self._pool: Database | None = None
        self._listener: pg.DriverConnection | None = None
        self._relisten: asyncio.Task[None] | None = None  # reopening a cut LISTEN connection
        self._closing = False
        self.lost_connection = False  # a lane failed because its database went away
        self.fenced = False  # a lane's commit found the drainer's lock gone
        # A traced drainer claims each job's trace context too; the others, what they always did.
        self.traced = attempts.tracing is not None
        self.commit: Commit = (commit or InTransaction)(self)

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
            if self.commit.rolls_back:  # their transactions end with their connections
                self.stats.rolled_back += lane.in_flight
            if lane.driver is not None:
                lane.driver.terminate()
        for task in self._tasks:
            task.cancel()

    def engine(self) -> AsyncEngine:
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

    def db_now(self) -> datetime | None:
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
            async with self.engine().connect() as conn:
                driver = await pg.driver_of(conn)
                lane.driver = driver
                lane.session = None  # a session is bound to one connection
                try:
                    await self._batches(conn, driver, lane, until_empty=until_empty)
                    return
                except LostLease as lost:
                    # The connection is in no state to go on: the failed attempt is recorded
                    # on a fresh one (as the commit mode says), this one is thrown away, and
                    # the lane carries on with a new one.
                    await conn.invalidate()
                    (failure,) = lost.args
                    await self.commit.lost(lane, failure)
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
                    if self._aborted or not self.commit.cut(exc):
                        raise
                    # Cut under us (pg_terminate_backend, a pooler, a restart): what the lane
                    # held goes back to the queue (the commit mode says how), no attempt is
                    # consumed. A new connection goes on; if none can be had, the lane fails
                    # and the drainer rides the outage out (service.py).
                    logger.warning(
                        "lane %d lost its connection (%s): its jobs in flight go back to the "
                        "queue and run again",
                        lane.number,
                        error_line(exc),
                        extra={"action": "lane_connection_lost", "queue": self.queue},
                    )
                    with contextlib.suppress(Exception):
                        await conn.invalidate()
                    await self.commit.cut_off(lane, error_line(exc))
            if self.stopping:
                return

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
        """Claim, run and complete one batch, as the commit mode says; the jobs claimed.

        A handler's session sits on the same connection as the claim (in a transactional mode,
        SQLAlchemy's transaction there is nested in ours, which asyncpg turns into a SAVEPOINT:
        attempt.py). On a stop, the jobs claimed and not yet started are handed back.
        """
        batch = Batch(lane, driver, time.perf_counter())  # just before the claim
        commit = self.commit
        try:
            claimed = await commit.claim(batch)
            if not batch.claimed:  # how long the lane may idle (_idle)
                statement = commit.next_due
                seconds = await driver.fetchval(
                    statement.sql, *statement.args(queue=self.queue, now=self.db_now())
                )
                lane.next_due = None if seconds is None else float(seconds)
            # Looked up once per batch, not per job.
            stopping, perf_counter, ran = self._stopping.is_set, time.perf_counter, commit.ran
            attempt = self.attempts.run_traced if self.traced else self.attempts.run
            for job in claimed:
                if stopping():
                    break
                lane.in_flight = 1
                lane.last_job = job
                # When the job started on this worker's monotonic clock: its handler's run
                # time (a duration, so no clock skew is in it), and with the claim's database
                # time the job's created -> committed latency (complete.count).
                started = perf_counter()
                outcome = await attempt(conn, lane, job)
                lane.in_flight = 0
                await ran(batch, outcome, started)
            await commit.complete(batch)
        except BaseException as exc:
            await commit.abandon(batch, exc)
            lane.in_flight = 0
            raise
        return batch.claimed


@dataclass(slots=True)
class Batch:
    """One claim of one lane, from the claim to the completion."""

    lane: Lane
    driver: pg.DriverConnection
    claimed_clock: float  # the worker's monotonic clock just before the claim (complete.count)
    claimed: int = 0  # the rows the claim returned
    jobs: list[Job] = field(default_factory=list)
    # The outcomes to complete together, and when each job started (perf_counter).
    outcomes: list[Attempt] = field(default_factory=list)
    begun: list[float] = field(default_factory=list)
    transaction: pg.DriverTransaction | None = None  # a transactional mode's, until its commit


class Commit(Protocol):
    """A commit mode, around the one lane loop and batch of ``Lanes``: how a batch is claimed
    (in the transaction that runs it, or committed with an owner and an attempt) and how its
    outcomes are completed (in the claim's transaction, or fenced in a statement of their
    own, or with the handler's writes in its completion session)."""

    rolls_back: bool  # whether a cut connection rolls its batch back (else the claims stand)
    # Seconds until the next job comes due, asked after a claim that found nothing (in its
    # transaction, in a transactional mode: see sql.JOB_NEXT_DUE).
    next_due: pg.AsyncpgStatement

    async def claim(self, batch: Batch) -> list[Job]:
        """Claim due jobs for ``batch`` (its ``claimed`` rows): the jobs to run, in order;
        unreadable ones go to its outcomes."""

    async def ran(self, batch: Batch, outcome: Attempt, started: float) -> None:
        """One attempt of the batch ended: keep its outcome for ``complete``, or complete it."""

    async def complete(self, batch: Batch) -> None:
        """The batch's attempts ran (or the lane stops): complete their outcomes and give
        back what was claimed and not started."""

    async def abandon(self, batch: Batch, exc: BaseException) -> None:
        """The batch ends with ``exc``, raised on to the lane loop."""

    def cut(self, exc: Exception) -> bool:
        """Whether a lane's error is its connection's loss: an infrastructure fault."""

    async def lost(self, lane: Lane, failure: Failure | Cancelled) -> None:
        """The lane threw its connection away under an attempt (``LostLease``): record the
        attempt's ``failure`` on a fresh one."""

    async def cut_off(self, lane: Lane, why: str) -> None:
        """The lane's connection was cut (``cut``), and thrown away: give back what it held."""


class InTransaction:
    """The ``strict`` and ``batch`` commit modes: the claim's transaction is the lease; it runs
    the batch's handlers and writes their outcomes with one statement (``Completion.write``),
    then commits, fenced (``lease.Fence``) by the drainer's lock."""

    rolls_back = True
    next_due: pg.AsyncpgStatement

    def __init__(self, lanes: Lanes) -> None:
        self.lanes = lanes
        self.stats = lanes.stats
        self.completion = lanes.completion
        self._lost_runs: dict[object, int] = {}  # job id -> connections lost running it
        schema = lanes.database.schema
        claim = sql.JOB_CLAIM_TRACED if lanes.traced else sql.JOB_CLAIM
        self._claim = pg.AsyncpgStatement.of(claim, schema)
        self.next_due = pg.AsyncpgStatement.of(sql.JOB_NEXT_DUE, schema)

    async def claim(self, batch: Batch) -> list[Job]:
        lanes, driver = self.lanes, batch.driver
        transaction = batch.transaction = driver.transaction()
        await transaction.start()
        now = lanes.db_now()
        rows = await driver.fetch(
            self._claim.sql, *self._claim.args(queue=lanes.queue, limit=lanes.batch_size, now=now)
        )
        batch.claimed = len(rows)
        try:
            if lanes.traced:
                return [
                    Job(id, kind, _decode(payload)[0], retries, most, created, at, limit, trace)
                    for id, kind, payload, retries, most, created, at, limit, trace in rows
                ]
            return [
                Job(id, kind, _decode(payload)[0], retries, most, created, at, limit)
                for id, kind, payload, retries, most, created, at, limit in rows
            ]
        except (RecursionError, ValueError):
            return read_jobs(batch, rows)

    async def ran(self, batch: Batch, outcome: Attempt, started: float) -> None:
        batch.outcomes.append(outcome)
        batch.begun.append(started)

    async def complete(self, batch: Batch) -> None:
        """Write the outcomes and commit (the jobs not started are left out: handed back)."""
        lanes, driver, outcomes = self.lanes, batch.driver, batch.outcomes
        assert batch.transaction is not None
        if outcomes:
            # The fence (the drainer still holds its lock) is checked in the write's statement.
            fence = None if lanes.fence is None else lanes.fence.params
            try:
                holds = await self.completion.write(
                    driver, outcomes, lanes.db_now(), held=True, fence=fence
                )
            except pg.ServerError as refusal:
                if pg.connection_lost(refusal):
                    raise
                await batch.transaction.rollback()
                await self._refused(batch, refusal)
                return
            if not holds:
                raise LockLost
        # From here on a failure is the commit's, which no one counts (a cut commit's jobs
        # run again; one that went through is done).
        transaction, batch.transaction = batch.transaction, None
        await transaction.commit()
        lane = batch.lane
        if lane.last_job is not None:
            lane.last_job = None
            if self._lost_runs:
                for outcome in outcomes:
                    self._lost_runs.pop(outcome.job.id, None)
        self.stats.handed_back += batch.claimed - len(outcomes)
        count(self.stats, outcomes, batch.begun, queue=lanes.queue, claimed=batch.claimed_clock)

    async def abandon(self, batch: Batch, exc: BaseException) -> None:
        """Roll the batch back: its jobs are due again, none of their writes applied."""
        if batch.transaction is None:
            return
        if isinstance(exc, LostLease):
            self.stats.rolled_back += len(batch.outcomes)
        elif isinstance(exc, LockLost) or (isinstance(exc, Exception) and self.cut(exc)):
            self.stats.rolled_back += len(batch.outcomes) + batch.lane.in_flight
        if not batch.driver.is_closed():
            with contextlib.suppress(Exception):
                await batch.transaction.rollback()

    def cut(self, exc: Exception) -> bool:
        """Only cronlock's own statements and an attempt that saw its transaction go get
        here (``ConnectionLost``)."""
        return isinstance(exc, ConnectionLost) or pg.connection_lost(exc)

    async def lost(self, lane: Lane, failure: Failure | Cancelled) -> None:
        """The server rolled the batch back: the failed attempt is recorded on a connection
        of its own (``Completion.record_lost``)."""
        lanes = self.lanes
        if await self.completion.record_lost(lanes.engine(), failure, lanes.db_now()):
            count(self.stats, [failure], queue=lanes.queue)

    async def cut_off(self, lane: Lane, why: str) -> None:
        """The server rolled the batch back, its jobs are due again. The cut is counted
        against the job the lane was running: at MAX_LOST_RUNS in a row the job is charged a
        failed attempt (DESIGN.md invariant 9: bounded, never forever)."""
        job, lane.last_job = lane.last_job, None
        if job is None:
            return
        runs = self._lost_runs[job.id] = self._lost_runs.get(job.id, 0) + 1
        if runs < MAX_LOST_RUNS:
            return
        del self._lost_runs[job.id]
        attempts = self.lanes.attempts
        failure = attempts.failed(
            job,
            f"its connection was lost {runs} times in a row while it ran (last: {why})",
            time.time_ns() // 1000,
            attempts.handlers.get(job.job_type),
        )
        await self.lost(lane, failure)

    async def _refused(self, batch: Batch, refusal: BaseException) -> None:
        """The database refused the batch's outcomes (a constraint, a trigger's error): the
        batch rolled back. Each outcome the database refuses alone (tried in a transaction
        rolled back) fails its job (``fail_refused``); the others run again, as after a lost
        connection. With the fence in the statement, one outcome is tried alone too: the
        error may be the fence's (its barrier wait cancelled, timed out), no job's doing."""
        lanes, driver, outcomes = self.lanes, batch.driver, batch.outcomes
        batch.lane.last_job = None
        refusals: list[tuple[Attempt, BaseException]] = [(outcomes[0], refusal)]
        if len(outcomes) > 1 or lanes.fence is not None:
            refusals = await refused_alone(
                driver,
                outcomes,
                lambda outcome: self.completion.write(driver, [outcome], lanes.db_now()),
            )
        self.stats.rolled_back += len(outcomes) - len(refusals)
        if not refusals:
            logger.warning(
                "lane %d: its batch's write failed (%s), though no outcome alone is refused: "
                "rolled back, its jobs run again",
                batch.lane.number,
                error_line(refusal),
                extra={"action": "batch_rolled_back", "queue": lanes.queue},
            )
        for outcome, why in refusals:
            failed = await fail_refused(
                outcome,
                why,
                lambda failure: self.completion.write(driver, [failure], lanes.db_now()),
                queue=lanes.queue,
            )
            if failed is not None:
                count(self.stats, [failed[0]], queue=lanes.queue)
