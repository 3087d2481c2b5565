"""The lease commit mode: the claim commits, handlers run with no transaction of cronlock's.

``Leased`` is this mode's ``Commit`` strategy around the one lane loop and batch of
``lanes.py`` (the attempts are ``attempt.py``'s, as in every mode, tracing, timeouts, cancel
and snooze with them). A lane of a ``lease``-mode drainer claims due jobs with one statement
that commits on its own (``JOB_LEASE_CLAIM``): each job is ``processing``, with the worker's
id as ``owner`` (alive exactly while it holds its liveness lock, ``liveness.py``) and
``attempt`` counting its claims. Then the handlers run while the lane's connection idles
outside any transaction: no transaction id, no snapshot, no ``idle in transaction`` to hold
back vacuum or to be killed by ``idle_in_transaction_session_timeout``, however long they take.

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
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any, cast

from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.ext.asyncio import AsyncSession

from .. import pg, sql
from ..database import Database
from ..observe.stats import DrainStats
from ..outcome import error_line
from .attempt import ConnectionLost, LeaseSession, _describe
from .complete import Attempt, Cancelled, Failure, Success, count, micros_now, micros_of
from .jobs import Handler, Job
from .lanes import Batch, Lane, Lanes, _decode, fail_refused, read_jobs, refused_alone
from .lease import Keepalive
from .liveness import DEFAULT_SWEEP_INTERVAL, Liveness, Sweeper, give_up

__all__ = ["LeaseMode", "Leased"]

logger = logging.getLogger("cronlock.drainer")

# What a cut connection looks like from here: the job goes back, nothing is charged.
_CONNECTION_LOST = (OSError, pg.ClientError, InterfaceError)


class _HandBack(Exception):
    """The attempt could not finish for a reason that is not the job's (its connection was
    cut): the job is handed back, nothing charged."""


class Leased:
    """The ``lease`` commit mode around ``Lanes``: the claim commits (the jobs ``processing``,
    this worker their owner), and the outcomes are written fenced by owner and attempt, in one
    statement per batch or with the handler's writes in its completion session."""

    rolls_back = False  # the claims committed; the drainer's end hands the jobs back
    next_due: pg.AsyncpgStatement

    def __init__(self, lanes: Lanes, owner: uuid.UUID) -> None:
        self.lanes = lanes
        self.stats = lanes.stats
        self.completion = lanes.completion
        self.owner = owner
        schema = lanes.database.schema
        claim = sql.JOB_LEASE_CLAIM_TRACED if lanes.traced else sql.JOB_LEASE_CLAIM
        self._claim = pg.AsyncpgStatement.of(claim, schema)
        keyed = sql.JOB_LEASE_CLAIM_KEYED_TRACED if lanes.traced else sql.JOB_LEASE_CLAIM_KEYED
        self._keyed_claim = pg.AsyncpgStatement.of(keyed, schema)
        self._keys_lock = pg.AsyncpgStatement.of(sql.JOB_LEASE_KEYS_LOCK, schema)
        self._hand_back = pg.AsyncpgStatement.of(sql.JOB_LEASE_HAND_BACK, schema)
        self.next_due = pg.AsyncpgStatement.of(sql.JOB_LEASE_NEXT_DUE, schema)
        # Each lane's claimed jobs and their attempts (fencing tokens), until finished.
        self._held: dict[int, dict[uuid.UUID, int]] = {lane.number: {} for lane in lanes.lanes}

    # -- the claim ------------------------------------------------------------------------

    async def claim(self, batch: Batch) -> list[Job]:
        """Claim (committed) up to a batch of due jobs, the keyed ones within their limits."""
        lanes, driver = self.lanes, batch.driver
        held = self._held[batch.lane.number]
        now = lanes.db_now()
        try:
            rows = await driver.fetch(
                self._claim.sql,
                *self._claim.args(
                    queue=lanes.queue, limit=lanes.batch_size, worker=self.owner, now=now
                ),
            )
        except pg.ServerError as exc:
            if pg.connection_lost(exc):
                raise
            await self._claim_refused(driver, exc)
            batch.claimed = 1  # claim again at once: the job that stopped it is out of the way
            return []
        if len(rows) < lanes.batch_size:  # room left: jobs with a concurrency key, if any
            rows += await self._claim_keyed(driver, lanes.batch_size - len(rows), now)
        batch.claimed = len(rows)
        claimed = batch.jobs
        try:
            if lanes.traced:
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
            batch.jobs = read_jobs(batch, [(*row[:6], *row[7:]) for row in rows])
        return batch.jobs

    async def _claim_keyed(
        self, driver: pg.DriverConnection, limit: int, now: datetime | None
    ) -> list[Any]:
        """Claim up to ``limit`` due jobs with a concurrency key, within their keys' limits
        (sql.JOB_LEASE_CLAIM_KEYED): the keyed claims' lock first, then the claim in a
        statement of its own, committed together. Two statements and no claim when no keyed
        job is due; none at all while the unkeyed claim fills the batch."""
        queue = self.lanes.queue
        transaction = driver.transaction()
        await transaction.start()
        try:
            locked = await driver.fetch(
                self._keys_lock.sql, *self._keys_lock.args(queue=queue, now=now)
            )
            rows: list[Any] = []
            if locked:
                rows = await driver.fetch(
                    self._keyed_claim.sql,
                    *self._keyed_claim.args(queue=queue, limit=limit, worker=self.owner, now=now),
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
        lanes = self.lanes
        candidates = pg.AsyncpgStatement.of(sql.JOB_LEASE_CANDIDATES, lanes.database.schema)
        trial = pg.AsyncpgStatement.of(sql.JOB_LEASE_TRY_CLAIM, lanes.database.schema)
        ids = await driver.fetch(
            candidates.sql,
            *candidates.args(queue=lanes.queue, limit=lanes.batch_size, now=lanes.db_now()),
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
            await give_up(lanes.engine(), job_id, error, queue=lanes.queue)

    # -- the completion -------------------------------------------------------------------

    async def ran(self, batch: Batch, outcome: Attempt, started: float) -> None:
        """A handler that used its session is completed with it now; the others together,
        after the batch."""
        lane = batch.lane
        if lane.used is None:
            batch.outcomes.append(outcome)
            batch.begun.append(started)
            return
        session, lane.used = lane.used, None
        await self._complete_in_session(session, batch, outcome, started)

    async def complete(self, batch: Batch) -> None:
        """Hand back the jobs not started, then write the others' outcomes, fenced."""
        held = self._held[batch.lane.number]
        ran = {o.job.id for o in batch.outcomes}
        not_started = [job.id for job in batch.jobs if job.id in held and job.id not in ran]
        if not_started:
            await self._give_back(batch.driver, held, not_started)
        if batch.outcomes:
            await self._write(batch.driver, batch.outcomes, batch.begun, held, batch.claimed_clock)

    async def abandon(self, batch: Batch, exc: BaseException) -> None:
        """Nothing to roll back: the jobs still held go back after the lane's loss."""

    def cut(self, exc: Exception) -> bool:
        return isinstance(exc, (*_CONNECTION_LOST, _HandBack, ConnectionLost))

    async def lost(self, lane: Lane, failure: Failure | Cancelled) -> None:
        """A failed attempt whose connection went under it (a statement its timeout or an
        operator's cancel interrupted) is written on a fresh connection, fenced; the batch's
        others go back (``cut_off``)."""
        held = self._held[lane.number]
        async with self.lanes.engine().connect() as fresh:
            await self._write(await pg.driver_of(fresh), [failure], [0.0], held, 0.0)
        await self.cut_off(lane, "")

    async def cut_off(self, lane: Lane, why: str) -> None:
        """The jobs the lane still holds go back to the queue, nothing charged."""
        held = self._held[lane.number]
        if held:
            async with self.lanes.engine().connect() as fresh:
                await self._give_back(await pg.driver_of(fresh), held, list(held))

    async def _give_back(
        self, driver: pg.DriverConnection, held: dict[uuid.UUID, int], ids: list[uuid.UUID]
    ) -> None:
        """Hand back ``ids`` of a lane's held jobs: due again, nothing charged."""
        done = await driver.fetch(
            self._hand_back.sql, *self._hand_back.args(worker=self.owner, ids=ids)
        )
        self.stats.handed_back += len(done)
        for job_id in ids:
            held.pop(job_id, None)

    async def _complete_in_session(
        self, session: AsyncSession, batch: Batch, success: Attempt, began: float
    ) -> None:
        """The handler's writes and the completion (its result, or the JobCancel/JobSnooze
        it returned), last, in one transaction: both or none."""
        lanes, driver, job = self.lanes, batch.driver, success.job
        held = self._held[batch.lane.number]
        attempt = held[job.id]
        try:
            await session.flush()
            done = await self.completion.write_fenced(
                driver, [success], {job.id: attempt}, self.owner, lanes.db_now()
            )
            applied = bool(done)
            sync = cast(LeaseSession, session.sync_session)
            if applied:
                sync.completing = True
                await session.commit()
            else:
                await session.rollback()
        except _CONNECTION_LOST as exc:
            if await self._committed(job.id, attempt):
                applied = True  # the commit went through before the cut
            else:
                raise _HandBack(f"the completion of job {job.id} was cut") from exc
        except Exception as exc:
            # Its writes could not be flushed or committed (a constraint, a serialization
            # failure): that is the attempt's failure, recorded with the batch's outcomes.
            with contextlib.suppress(Exception):
                await session.rollback()
            handler = lanes.attempts.handlers[job.job_type]
            if isinstance(success, Success):
                # A success keeps no worker time: its failure is reckoned from the worker's
                # clock now (only the log's worker-side duration is shorter for it).
                started = micros_now(lanes.clock)
            else:
                started = micros_of(success.worker_started_at)
            failure = lanes.attempts.failed(job, _describe(exc, handler), started, handler)
            await self._write(driver, [failure], [began], held, batch.claimed_clock)
            return
        held.pop(job.id, None)
        if applied:
            count(self.stats, [success], [began], queue=lanes.queue, claimed=batch.claimed_clock)
        else:
            await self._record_fenced(job, attempt)

    async def _committed(self, job_id: uuid.UUID, attempt: int) -> bool:
        """After a cut completion: whether it committed (the row is no longer this claim's
        running job), read on a fresh connection."""
        async with self.lanes.engine().connect() as conn:
            row = (await conn.execute(sql.JOB_LEASE_STATE, {"id": job_id})).one_or_none()
        if row is None:
            return False
        status, owner, claims = row
        return not (status == "processing" and owner == self.owner and claims == attempt)

    async def _write(
        self,
        driver: pg.DriverConnection,
        outcomes: list[Attempt],
        begun: list[float],
        held: dict[uuid.UUID, int],
        claimed: float,
    ) -> None:
        """Write outcomes (fenced) in one statement; count what was applied and record what
        was fenced. ``claimed``: the worker's monotonic clock at their claim. When the
        database refuses them, each is written on its own, and one it refuses alone fails its
        job (``fail_refused``; one that cannot even be failed stays running for an operator,
        handed back when this worker ends)."""
        attempts = {o.job.id: held.get(o.job.id, 0) for o in outcomes}
        now = self.lanes.db_now()
        try:
            applied = await self.completion.write_fenced(
                driver, outcomes, attempts, self.owner, now
            )
        except pg.ServerError as exc:
            if pg.connection_lost(exc):
                raise
            if len(outcomes) > 1:
                for outcome, began in zip(outcomes, begun, strict=True):
                    await self._write(driver, [outcome], [began], held, claimed)
                return
            failed = await fail_refused(
                outcomes[0],
                exc,
                lambda failure: self.completion.write_fenced(
                    driver, [failure], attempts, self.owner, now
                ),
                queue=self.lanes.queue,
            )
            if failed is None:
                held.pop(outcomes[0].job.id, None)
                return
            outcomes, applied = [failed[0]], failed[1]
        kept = [(o, b) for o, b in zip(outcomes, begun, strict=True) if o.job.id in applied]
        ran = [o for o, _ in kept]
        count(self.stats, ran, [b for _, b in kept], queue=self.lanes.queue, claimed=claimed)
        for job_id in attempts:
            held.pop(job_id, None)
        for outcome in outcomes:
            if outcome.job.id not in applied:
                await self._record_fenced(outcome.job, attempts[outcome.job.id])

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
            extra={"action": "job_fenced", "queue": self.lanes.queue, "job_id": str(job.id)},
        )
        with contextlib.suppress(*_CONNECTION_LOST, DBAPIError):
            async with self.lanes.engine().begin() as conn:
                await conn.execute(sql.JOB_LEASE_RECORD_FENCED, {"job_id": job.id, "entry": entry})


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
        self.lanes: Lanes | None = None
        self._handed_back = False  # the drainer's stop did it: close() need not again
        self.sweeper: Sweeper | None = None

    async def hold(self) -> uuid.UUID:
        return await self.liveness.hold()

    def make_lanes(self, *args: Any, **kwargs: Any) -> Lanes:
        owner = self.liveness.owner
        lanes = self.lanes = Lanes(*args, commit=lambda lanes: Leased(lanes, owner), **kwargs)
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
