"""The lease commit mode: the claim commits, handlers run with no transaction of cronlock's.

A lane of a ``lease``-mode drainer claims due jobs with one statement that commits on its own
(``JOB_LEASE_CLAIM``): each job is ``processing``, with the worker's id as ``owner`` (alive
exactly while it holds its liveness lock, ``liveness.py``) and ``attempt`` counting its claims.
Then the handlers run while the lane's connection idles outside any transaction: no
transaction id, no snapshot, no ``idle in transaction`` to hold back vacuum or to be killed by
``idle_in_transaction_session_timeout``, however long they take.

The handler's ``session`` (the reference's ``handler(session, payload)``) is *the completion's
session*. It opens no transaction until the handler first uses it; whatever the handler does
with it then commits together with the job's completion, in one transaction that writes the
completion last and commits, or not at all (DESIGN.md invariant 4, as River's JobCompleteTx):
a handler that fails, or whose completion is fenced, leaves none of its writes. ``commit()``
inside the handler only flushes: the completion commits it. So a handler keeps that
transaction short by using its session at its end, after the long work (a read at the start
can be ended with ``rollback()``, which writes nothing). A handler that leaves its session
untouched (the common case) is completed with the others of its batch in one statement after
the batch; with ``batch_size`` 1 (the default of this mode) at once.

Fencing. Every write of a running job names its owner and attempt: a completion of a job
that was returned and claimed again since (its worker was paused, its liveness connection
cut) matches no row. It is not applied (its session's writes roll back), and it is recorded
as an ``error_history`` entry ``{"fenced": …}`` of the job and counted in ``stats.fenced``.

Stopping: claimed jobs not yet started are handed back (``JOB_LEASE_HAND_BACK``, nothing
charged). A lane whose connection is cut hands its held jobs back on a fresh connection and
carries on. At its end the drainer hands back whatever its owner still holds (an abort, a
failed lane), then closes its liveness connection; if even that fails, the lock goes with the
process and any worker returns the jobs as lost. An operator's cancel reaches a running
handler as in the other modes (``cancel.py``'s scope).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from .. import pg, sql
from ..database import Database
from ..observe.stats import DrainStats
from ..outcome import error_line
from .attempt import ConnectionLost, LeaseSession, LostLease, _describe
from .complete import (
    REFUSED,
    Attempt,
    Failure,
    Success,
    count,
    finish_columns,
    micros_now,
    micros_of,
    refused,
)
from .jobs import Handler, Job
from .lanes import Lane, Lanes, _decode, read_jobs, refused_alone
from .lease import Keepalive
from .liveness import DEFAULT_SWEEP_INTERVAL, Liveness, Sweeper, give_up

__all__ = ["LeaseMode", "LeasedLanes"]

logger = logging.getLogger("cronlock.drainer")

# What a cut connection looks like from here: the job goes back, nothing is charged.
_CONNECTION_LOST = (OSError, pg.ClientError, InterfaceError)


@dataclass
class _Held:
    """One lane's claimed jobs and their attempts (fencing tokens), until finished."""

    attempts: dict[uuid.UUID, int] = field(default_factory=dict)


class _HandBack(Exception):
    """The attempt could not finish for a reason that is not the job's (its connection was
    cut): the job is handed back, nothing charged."""


class LeasedLanes(Lanes):
    """The lanes of one active lease-mode drainer (``lanes.py`` with the claim committed)."""

    def __init__(self, *args: Any, owner: uuid.UUID, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.owner = owner
        schema = self.database.schema
        claim = sql.JOB_LEASE_CLAIM_TRACED if self._traced else sql.JOB_LEASE_CLAIM
        self._lease_claim = pg.AsyncpgStatement.of(claim, schema)
        keyed = sql.JOB_LEASE_CLAIM_KEYED_TRACED if self._traced else sql.JOB_LEASE_CLAIM_KEYED
        self._keyed_claim = pg.AsyncpgStatement.of(keyed, schema)
        self._keys_lock = pg.AsyncpgStatement.of(sql.JOB_LEASE_KEYS_LOCK, schema)
        self._complete_many = pg.AsyncpgStatement.of(sql.JOB_LEASE_COMPLETE_MANY, schema)
        self._finish_many = pg.AsyncpgStatement.of(sql.JOB_LEASE_FINISH_MANY, schema)
        self._hand_back = pg.AsyncpgStatement.of(sql.JOB_LEASE_HAND_BACK, schema)
        self._next_due = pg.AsyncpgStatement.of(sql.JOB_LEASE_NEXT_DUE, schema)
        self._held = {lane.number: _Held() for lane in self.lanes}

    def engine(self) -> AsyncEngine:
        return self._engine()

    def _count_aborted(self, in_flight: int) -> None:
        """Nothing of this mode rolls back: the claims committed, and the lease mode's close
        hands the jobs in flight back (counted there, as handed back)."""

    # -- the loop -------------------------------------------------------------------------

    async def _lane_loop(self, lane: Lane, *, until_empty: bool) -> None:
        while True:
            async with self._engine().connect() as conn:
                driver = await pg.driver_of(conn)
                lane.driver = driver
                lane.session = None
                try:
                    await self._batches(conn, driver, lane, until_empty=until_empty)
                    return
                except LostLease as lost:
                    # The attempt's connection went under it (a statement its timeout or an
                    # operator's cancel interrupted): its outcome is written on a fresh one,
                    # fenced; the batch's others go back below, and the lane goes on.
                    await conn.invalidate()
                    (failure,) = lost.args
                    held = self._held[lane.number].attempts
                    async with self._engine().connect() as fresh:
                        await self._write(await pg.driver_of(fresh), [failure], [0.0], held, 0.0)
                except (*_CONNECTION_LOST, _HandBack, ConnectionLost) as exc:
                    if self._aborted:
                        raise
                    await conn.invalidate()
                    logger.warning(
                        "a lane lost its connection (%s): its jobs go back to the queue",
                        exc,
                        extra={"action": "lane_reconnect", "queue": self.queue},
                    )
            await self._hand_back_held(lane)
            if self.stopping:
                return

    async def _hand_back_held(self, lane: Lane) -> None:
        held = self._held[lane.number].attempts
        if not held:
            return
        async with self._engine().begin() as conn:
            returned = await conn.execute(
                sql.JOB_LEASE_HAND_BACK, {"worker": self.owner, "ids": list(held)}
            )
            self.stats.handed_back += len(returned.all())
        held.clear()

    async def _batch(self, conn: AsyncConnection, driver: pg.DriverConnection, lane: Lane) -> int:
        """Claim (committed), run, and complete one batch; the number of jobs claimed."""
        held = self._held[lane.number].attempts
        now = self._db_now()
        lane.claimed_clock = time.perf_counter()  # just before the claim: see complete.count
        try:
            rows = await driver.fetch(
                self._lease_claim.sql,
                *self._lease_claim.args(
                    queue=self.queue, limit=self.batch_size, worker=self.owner, now=now
                ),
            )
        except pg.ServerError as exc:
            if pg.connection_lost(exc):
                raise
            await self._claim_refused(driver, exc)
            return 1  # claim again at once: the job that stopped it is out of the way
        if len(rows) < self.batch_size:  # room left: jobs with a concurrency key, if any
            rows += await self._claim_keyed(driver, self.batch_size - len(rows), now)
        if not rows:  # how long the lane may idle (Lanes._idle)
            seconds = await driver.fetchval(
                self._next_due.sql, *self._next_due.args(queue=self.queue, now=now)
            )
            lane.next_due = None if seconds is None else float(seconds)
        claimed: list[Job] = []
        batched: list[Attempt] = []
        begun: list[float] = []
        try:
            if self._traced:
                for id, kind, payload, retries, most, created, attempt, at, limit, trace in rows:
                    held[id] = attempt
                    payload = _decode(payload)[0]
                    claimed.append(Job(id, kind, payload, retries, most, created, at, limit, trace))
            else:
                for id, kind, payload, retries, most, created, attempt, at, limit in rows:
                    held[id] = attempt  # rows come in claim order
                    payload = _decode(payload)[0]
                    claimed.append(Job(id, kind, payload, retries, most, created, at, limit))
        except (RecursionError, ValueError):
            for row in rows:
                held[row[0]] = row[6]
            claimed, unreadable = read_jobs([(*row[:6], *row[7:]) for row in rows])
            batched += unreadable
            begun += [time.perf_counter()] * len(unreadable)
        attempt = self.attempts.run_traced if self._traced else self.attempts.run
        for job in claimed:
            if self.stopping:
                break
            lane.in_flight = 1
            started = time.perf_counter()
            try:
                outcome = await attempt(conn, lane, job)
            finally:
                lane.in_flight = 0
            if lane.used is not None:  # the handler used its session: completed with it
                session, lane.used = lane.used, None
                await self._complete_in_session(
                    session, driver, outcome, held[job.id], started, lane.claimed_clock
                )
                continue
            batched.append(outcome)
            begun.append(started)
        ran = _ids(batched)
        not_started = [job.id for job in claimed if job.id in held and job.id not in ran]
        if not_started:
            done = await driver.fetch(
                self._hand_back.sql, *self._hand_back.args(worker=self.owner, ids=not_started)
            )
            self.stats.handed_back += len(done)
            for job_id in not_started:
                held.pop(job_id, None)
        if batched:
            await self._write(driver, batched, begun, held, lane.claimed_clock)
        return len(rows)

    # -- completing in the handler's session -------------------------------------------

    async def _complete_in_session(
        self,
        session: AsyncSession,
        driver: pg.DriverConnection,
        success: Attempt,
        attempt: int,
        began: float,
        claimed: float,
    ) -> None:
        """The handler's writes and the completion (its result, or the JobCancel/JobSnooze
        it returned), last, in one transaction: both or none."""
        held = self._held_of(success.job.id)
        try:
            await session.flush()
            if isinstance(success, Success):
                statement = self._complete_many
                args = statement.args(
                    ids=[success.job.id],
                    attempts=[attempt],
                    results=[success.result],
                    worker=self.owner,
                    now=self._db_now(),
                )
            else:
                statement = self._finish_many
                columns = finish_columns([success], {success.job.id: attempt})
                args = statement.args(worker=self.owner, now=self._db_now(), **columns)
            done = await driver.fetch(statement.sql, *args)
            applied = bool(done)
            sync = cast(LeaseSession, session.sync_session)
            if applied:
                sync.completing = True
                await session.commit()
            else:
                await session.rollback()
        except _CONNECTION_LOST as exc:
            if await self._committed(success.job.id, attempt):
                applied = True  # the commit went through before the cut
            else:
                raise _HandBack(f"the completion of job {success.job.id} was cut") from exc
        except Exception as exc:
            # Its writes could not be flushed or committed (a constraint, a serialization
            # failure): that is the attempt's failure, recorded with the batch's outcomes.
            with contextlib.suppress(Exception):
                await session.rollback()
            handler = self.attempts.handlers[success.job.job_type]
            if isinstance(success, Success):
                # A success keeps no worker time: its failure is reckoned from the worker's
                # clock now (only the log's worker-side duration is shorter for it).
                started = micros_now(self.clock)
            else:
                started = micros_of(success.worker_started_at)
            failure = self.attempts.failed(success.job, _describe(exc, handler), started, handler)
            await self._write(driver, [failure], [began], held, claimed)
            return
        if held is not None:
            held.pop(success.job.id, None)
        if applied:
            count(self.stats, [success], [began], queue=self.queue, claimed=claimed)
        else:
            await self._record_fenced(success.job, attempt)

    def _held_of(self, job_id: uuid.UUID) -> dict[uuid.UUID, int] | None:
        for held in self._held.values():
            if job_id in held.attempts:
                return held.attempts
        return None

    async def _committed(self, job_id: uuid.UUID, attempt: int) -> bool:
        """After a cut completion: whether it committed (the row is no longer this claim's
        running job), read on a fresh connection."""
        async with self._engine().connect() as conn:
            row = (await conn.execute(sql.JOB_LEASE_STATE, {"id": job_id})).one_or_none()
        if row is None:
            return False
        status, owner, claims = row
        return not (status == "processing" and owner == self.owner and claims == attempt)

    # -- writing outcomes -----------------------------------------------------------------

    async def _write(
        self,
        driver: pg.DriverConnection,
        outcomes: list[Attempt],
        begun: list[float],
        held: dict[uuid.UUID, int] | None,
        claimed: float,
    ) -> None:
        """Write a batch's outcomes (fenced) in one statement; count what was applied and
        record what was fenced. ``claimed``: the worker's monotonic clock at their claim."""
        attempts = {o.job.id: (held or {}).get(o.job.id, 0) for o in outcomes}
        now = self._db_now()
        if all(isinstance(o, Success) for o in outcomes):
            statement = self._complete_many
            results = [cast(Success, o).result for o in outcomes]
            args = statement.args(
                ids=list(attempts),
                attempts=list(attempts.values()),
                # NULL: every result is, and the statement need not look them up.
                results=results if any(r is not None for r in results) else None,
                worker=self.owner,
                now=now,
            )
        else:
            statement = self._finish_many
            args = statement.args(worker=self.owner, now=now, **finish_columns(outcomes, attempts))
        try:
            rows = await driver.fetch(statement.sql, *args)
        except pg.ServerError as exc:
            if pg.connection_lost(exc):
                raise
            await self._write_refused(driver, outcomes, begun, held, claimed, exc)
            return
        applied = {row[0] for row in rows}
        kept = [(o, b) for o, b in zip(outcomes, begun, strict=True) if o.job.id in applied]
        ran = [o for o, _ in kept]
        count(self.stats, ran, [b for _, b in kept], queue=self.queue, claimed=claimed)
        if held is not None:
            for job_id in attempts:
                held.pop(job_id, None)
        for outcome in outcomes:
            if outcome.job.id not in applied:
                await self._record_fenced(outcome.job, attempts[outcome.job.id])

    async def _claim_keyed(
        self, driver: pg.DriverConnection, limit: int, now: datetime | None
    ) -> list[Any]:
        """Claim up to ``limit`` due jobs with a concurrency key, within their keys' limits
        (sql.JOB_LEASE_CLAIM_KEYED): the keyed claims' lock first, then the claim in a
        statement of its own, committed together. Two statements and no claim when no keyed
        job is due; none at all while the unkeyed claim fills the batch."""
        transaction = driver.transaction()
        await transaction.start()
        try:
            locked = await driver.fetch(
                self._keys_lock.sql, *self._keys_lock.args(queue=self.queue, now=now)
            )
            rows: list[Any] = []
            if locked:
                rows = await driver.fetch(
                    self._keyed_claim.sql,
                    *self._keyed_claim.args(
                        queue=self.queue, limit=limit, worker=self.owner, now=now
                    ),
                )
        except BaseException:
            if not driver.is_closed():
                with contextlib.suppress(Exception):
                    await transaction.rollback()
            raise
        await transaction.commit()
        return rows

    async def _claim_refused(self, driver: pg.DriverConnection, exc: BaseException) -> None:
        """The database refused the claim (one job's row, a trigger): each due job is tried
        alone in a transaction rolled back, and one the database refuses to hand out fails
        with the refusal in its history, or, when not even that can be written, stays for an
        operator; the lane claims on."""
        candidates = pg.AsyncpgStatement.of(sql.JOB_LEASE_CANDIDATES, self.database.schema)
        trial = pg.AsyncpgStatement.of(sql.JOB_LEASE_TRY_CLAIM, self.database.schema)
        ids = await driver.fetch(
            candidates.sql,
            *candidates.args(queue=self.queue, limit=self.batch_size, now=self._db_now()),
        )
        refusals = await refused_alone(
            driver,
            [job_id for (job_id,) in ids],
            lambda job_id: driver.execute(trial.sql, *trial.args(job_id=job_id, worker=self.owner)),
        )
        if not refusals:
            raise exc  # not one job's doing: the lane's failure, as before
        for job_id, why in refusals:
            error = f"it could not be claimed: {error_line(why)}"
            await give_up(self._engine(), job_id, error, queue=self.queue)

    async def _write_refused(
        self,
        driver: pg.DriverConnection,
        outcomes: list[Attempt],
        begun: list[float],
        held: dict[uuid.UUID, int] | None,
        claimed: float,
        exc: BaseException,
    ) -> None:
        """The database refused a batch's outcomes: each is written on its own, and one it
        refuses alone fails its job (``complete.refused``). One that cannot even be failed is
        left to an operator, running (returned as lost once this worker ends), logged."""
        if len(outcomes) > 1:
            for outcome, began in zip(outcomes, begun, strict=True):
                await self._write(driver, [outcome], [began], held, claimed)
            return
        (outcome,) = outcomes
        if isinstance(outcome, Failure) and outcome.error.startswith(REFUSED):
            logger.error(
                "job %s: not even its failure could be written (%s): left running for an operator",
                outcome.job.id,
                error_line(exc),
                extra={"action": "job_outcome_refused", "queue": self.queue},
            )
            if held is not None:
                held.pop(outcome.job.id, None)
            return
        logger.error(
            "job %s: its outcome could not be written (%s): failed",
            outcome.job.id,
            error_line(exc),
            extra={"action": "job_outcome_refused", "queue": self.queue},
        )
        await self._write(driver, [refused(outcome, exc)], begun, held, claimed)

    async def _record_fenced(self, job: Job, attempt: int) -> None:
        self.stats.fenced += 1
        entry = json.dumps(
            {
                "attempt": job.retry_count + 1,
                "error": "fenced: a completion by a worker that no longer held the job was "
                "not applied",
                "fenced": {"owner": str(self.owner), "attempt": attempt},
            }
        )
        logger.warning(
            "job %s: completion fenced (worker %s, attempt %d): the job was handed on",
            job.id,
            self.owner,
            attempt,
            extra={"action": "job_fenced", "queue": self.queue, "job_id": str(job.id)},
        )
        with contextlib.suppress(*_CONNECTION_LOST, DBAPIError):
            async with self._engine().begin() as conn:
                await conn.execute(sql.JOB_LEASE_RECORD_FENCED, {"job_id": job.id, "entry": entry})


def _ids(outcomes: list[Attempt]) -> set[uuid.UUID]:
    return {o.job.id for o in outcomes}


class LeaseMode:
    """What a drainer adds in the lease commit mode: its liveness lock, the sweeper that
    returns lost workers' jobs, and its lanes (``hold`` first, ``close`` in the end)."""

    def __init__(
        self,
        database: Database,
        handlers: Mapping[str, Handler],
        *,
        queue: str,
        owner: uuid.UUID,
        keepalive: Keepalive | None,
        heartbeat_interval: float,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
    ) -> None:
        self.handlers = handlers
        self.queue = queue
        self.sweep_interval = sweep_interval
        self.liveness = Liveness(
            database,
            queue,
            keepalive=keepalive,
            heartbeat_interval=heartbeat_interval,
            owner=owner,
        )
        self.lanes: LeasedLanes | None = None
        self._handed_back = False  # the drainer's stop did it: close() need not again
        self.sweeper: Sweeper | None = None

    async def hold(self) -> uuid.UUID:
        return await self.liveness.hold()

    def make_lanes(self, *args: Any, **kwargs: Any) -> LeasedLanes:
        lanes = self.lanes = LeasedLanes(*args, owner=self.liveness.owner, **kwargs)
        self.sweeper = Sweeper(
            lanes.engine,
            self.handlers,
            queue=self.queue,
            interval=self.sweep_interval,
            on_returned=lanes.wake,
        )
        return lanes

    async def run(
        self, stats: DrainStats, stop: Callable[[], None], lanes_run: Awaitable[str | None]
    ) -> str | None:
        """Run the lanes (``lanes_run``, a coroutine) with the sweeper and the liveness
        watch beside them; an error message if the liveness lock was lost."""
        assert self.sweeper is not None, "make_lanes() first"
        sweeper = self.sweeper
        try:
            await sweeper.sweep()  # the jobs of workers that died before this one became active
        except BaseException:
            cast(Coroutine[Any, Any, Any], lanes_run).close()  # never started: no warning
            raise
        sweeping = asyncio.create_task(sweeper.run())
        watch = asyncio.create_task(self.liveness.watch(stop))
        try:
            error: str | None = await lanes_run
        finally:
            for task in (sweeping, watch):
                task.cancel()
            lost: str | None = None
            with contextlib.suppress(asyncio.CancelledError):
                await sweeping
            try:
                lost = await watch
            except asyncio.CancelledError:
                lost = None
            stats.lost_returned += sweeper.returned
        return lost or error

    async def hand_back(self) -> None:
        """Hand back what this worker still holds (an abort, a failed lane): due again, no
        attempt charged, counted as handed back. Once: after one that reached the database,
        a second call (``close`` after the drainer's stop) does nothing."""
        if self.lanes is None or self._handed_back:
            return
        with contextlib.suppress(*_CONNECTION_LOST, DBAPIError):
            async with self.lanes.engine().begin() as conn:
                returned = await conn.execute(
                    sql.JOB_LEASE_HAND_BACK, {"worker": self.liveness.owner, "ids": None}
                )
                self.lanes.stats.handed_back += len(returned.all())
            self._handed_back = True

    async def close(self) -> None:
        """Hand back what is still held, then let the liveness lock go."""
        try:
            await self.hand_back()
        finally:
            self.liveness.close()
