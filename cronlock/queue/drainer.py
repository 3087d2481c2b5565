"""The drainer: one active per queue, jobs claimed in batches, the transaction as the lease.

Single active. A drainer opens a dedicated *lock connection* and, in one long transaction on
it, takes ``pg_advisory_xact_lock(namespace, key-of-queue)``: ``drain`` tries once and is
skipped when another drainer is active; ``worker`` waits there as a standby and becomes active
the moment the holder's transaction ends, also when the holder dies (PostgreSQL aborts it when
the socket closes; TCP keepalives set on the connection notice a dead host in seconds). A
transaction-level lock also works behind PgBouncer in transaction mode.

The transaction is the lease. A *lane* (one pooled connection; ``concurrency`` lanes) claims
due jobs with ``SELECT … FOR UPDATE SKIP LOCKED`` and runs their handlers, then writes their
outcomes, in that same transaction. No ``processing`` state is committed, so there is nothing
to recover: if the worker dies the transaction aborts, the row locks go and the jobs are due
again at once, with none of their writes applied (DESIGN.md invariant 4). A worker whose
connection was cut while it was paused cannot commit: it is fenced by PostgreSQL itself.

Commit modes. ``strict`` (the default, the reference's semantics): one job per transaction.
``batch``: up to ``batch_size`` jobs per transaction, one outcome UPDATE and one commit per
batch; faster, but a crash or a lost connection rolls back the whole batch (those jobs run
again; their database writes were never applied, their external side effects may repeat).
A handler gets the session of that transaction; the session opens a SAVEPOINT only if the
handler uses it, so a failure rolls back that handler's writes alone (invariant 5). A session
its handler left untouched (no transaction, nothing in it or in ``info``) goes to the lane's
next job, as good as new; a used one never does, so a handler must not keep a session past
its return. Successes are written with the narrow JOB_COMPLETE_ONE/JOB_COMPLETE_MANY; a batch
with a failure, with JOB_FINISH_MANY.

Shutdown: ``stop()`` stops claiming; jobs in flight finish (within the grace period the
command line gives), claimed jobs not yet started are handed back by leaving them out of the
commit. ``abort()`` closes the lanes' connections: their transactions roll back, their jobs
are due again.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, cast

import asyncpg
from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from .. import sql
from ..database import Database
from ..locks import lock_key, namespace_key
from ..observe.stats import DrainStats
from ..outcome import DrainResult, JobStatus, RunStatus, error_line
from ..pg import AsyncpgStatement
from ..sql.tables import DEFAULT_QUEUE, jobs_channel
from .jobs import (
    Backoff,
    Handler,
    Job,
    JobOutcome,
    check_queue,
    outcome_of_failure,
    outcome_of_success,
    to_json,
)

__all__ = ["CommitMode", "Drainer", "Keepalive"]

logger = logging.getLogger("cronlock.drainer")

DRAINER_NAMESPACE = namespace_key("cronlock-drainer")
DEFAULT_BATCH_SIZE = 50  # below PostgreSQL's 64 cached subtransactions per backend
# Seconds between checks for due jobs when no notification comes (LISTEN/NOTIFY wakes at once).
DEFAULT_POLL_INTERVAL = 5.0
# Seconds between heartbeats (the workers row, the lock connection's ping).
DEFAULT_HEARTBEAT_INTERVAL = 2.0
_HOST = socket.gethostname()


class CommitMode(enum.StrEnum):
    STRICT = "strict"  # one job per transaction
    BATCH = "batch"  # one transaction (and one outcome UPDATE) per batch


@dataclass(frozen=True)
class Keepalive:
    """How fast the server notices that the active drainer's host vanished without closing
    its sockets, so that a standby gets the lock: set on the lock connection, transaction-local
    (which also works behind PgBouncer in transaction mode).

    Dead after ``idle + interval * count`` seconds of silence, or ``user_timeout_ms`` of
    unacknowledged data. The job lanes use the database's own settings (``Database``); behind
    PgBouncer, set its ``tcp_keepalive``/``tcp_keepidle``/``tcp_keepintvl``/``tcp_keepcnt``/
    ``tcp_user_timeout`` too: the server only sees PgBouncer.
    """

    idle: int = 5
    interval: int = 2
    count: int = 3
    user_timeout_ms: int = 10_000

    def params(self, *, is_local: bool) -> dict[str, Any]:
        return {
            "idle": str(self.idle),
            "interval": str(self.interval),
            "count": str(self.count),
            "user_timeout": str(self.user_timeout_ms),
            "is_local": is_local,
        }


# The lock connection's keepalives unless a drainer is given others (None: the server's).
DEFAULT_KEEPALIVE = Keepalive()


class _JobSession(Session):
    """A handler's session, which remembers whether the handler itself committed it (released
    its savepoint into the job's transaction): after that, a failure cannot roll back to it."""

    released = False

    def commit(self) -> None:
        self.released = True
        super().commit()


class _LostLease(Exception):
    """The lane's transaction is gone (its connection was cut or a savepoint could not be
    rolled back): nothing of it committed."""


class _Success(NamedTuple):
    """A job's successful attempt: lighter than its JobOutcome, which is built only when the
    batch also holds failures and so is written with JOB_FINISH_MANY. Its times are
    microseconds since the Unix epoch, as JOB_COMPLETE_MANY takes them."""

    job: Job
    result: str | None
    started: int
    finished: int

    def outcome(self) -> JobOutcome:
        return outcome_of_success(
            self.job, self.result, _datetime(self.started), _datetime(self.finished)
        )


_Attempt = _Success | JobOutcome


@dataclass
class _Lane:
    number: int
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    raw: Any = None  # the asyncpg connection under the lane, to cut it on abort
    in_flight: int = 0
    # A handler's session that the handler left untouched, for the next job on this lane's
    # connection (see Drainer._attempt); None when the next job needs a fresh one.
    session: AsyncSession | None = None


class Drainer:
    """Drains one queue of an app's jobs; see the module docstring for the model."""

    def __init__(
        self,
        database: Database,
        handlers: Mapping[str, Handler],
        *,
        queue: str = DEFAULT_QUEUE,
        commit_mode: CommitMode | str = CommitMode.STRICT,
        batch_size: int | None = None,
        concurrency: int = 1,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
        keepalive: Keepalive | None = DEFAULT_KEEPALIVE,
        clock: Callable[[], datetime] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.database = database
        self.handlers = handlers
        self.queue = check_queue(queue)
        self.commit_mode = CommitMode(commit_mode)
        if self.commit_mode is CommitMode.STRICT:
            self.batch_size = 1
        else:
            self.batch_size = batch_size or DEFAULT_BATCH_SIZE
        if self.batch_size < 1 or concurrency < 1:
            raise ValueError("batch_size and concurrency must be at least 1")
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval
        self.keepalive = keepalive
        self.clock = clock
        self.rng = rng
        self.lock_key = lock_key("queue:" + self.queue)
        self.worker_id = uuid.uuid4()
        self.stats = DrainStats()
        self.state = "standby"
        self._stopping = asyncio.Event()
        self._aborted = False
        self._lanes: list[_Lane] = []
        self._lane_tasks: list[asyncio.Task[None]] = []
        self._deadline: float | None = None
        self._lanes_db: Database | None = None
        self._claim = self._statement(sql.JOB_CLAIM)
        self._finish = self._statement(sql.JOB_FINISH_MANY)
        self._complete_one = self._statement(sql.JOB_COMPLETE_ONE)
        self._complete_many = self._statement(sql.JOB_COMPLETE_MANY)
        self._next_due = self._statement(sql.JOB_NEXT_DUE)
        self._ping = self._statement(sql.PING)

    # -- control (signal handlers call these) ---------------------------------------------

    def stop(self) -> None:
        """Stop claiming; jobs in flight finish, claimed jobs not started are handed back."""
        if not self._stopping.is_set():
            logger.info(
                "stopping: no new jobs, waiting for the ones in flight",
                extra={"action": "drainer_stopping", "queue": self.queue},
            )
        self._stopping.set()
        for lane in self._lanes:
            lane.wake.set()

    def abort(self) -> None:
        """Roll back the jobs in flight (their connections are cut) and stop now."""
        self.stop()
        if self._aborted:
            return
        self._aborted = True
        logger.warning(
            "aborting: jobs in flight are rolled back and return to the queue",
            extra={"action": "drainer_aborting", "queue": self.queue},
        )
        for lane in self._lanes:
            self.stats.rolled_back += lane.in_flight
            if lane.raw is not None:
                lane.raw.terminate()  # the server rolls the transaction back
        for task in self._lane_tasks:
            task.cancel()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # -- the two ways to run --------------------------------------------------------------

    async def drain(self, *, max_seconds: float | None = None) -> DrainResult:
        """Process due jobs until none is due or ``max_seconds`` passed; skip if not alone."""
        self.stats = DrainStats()
        if max_seconds is not None:
            self._deadline = time.monotonic() + max_seconds
        return await self._run(wait_for_lock=False, until_empty=True)

    async def work(self) -> DrainResult:
        """Stand by until active, then process jobs as they come, until ``stop()``."""
        self.stats = DrainStats()
        return await self._run(wait_for_lock=True, until_empty=False)

    # -- the lock connection ----------------------------------------------------------------

    async def _raw_connect(self, role: str = "cronlock-drainer") -> Any:
        # A bare asyncpg connection: the lock must outlive pooled checkouts, and cancelling a
        # waiting pg_advisory_xact_lock is cleanest at this level.
        _, options = self._engine_or_create().dialect.create_connect_args(self.database.url)
        for key in ("prepared_statement_cache_size", "prepared_statement_name_func"):
            options.pop(key, None)
        if self.database.pgbouncer:
            options["statement_cache_size"] = 0  # any server connection, any transaction
        return await asyncpg.connect(
            **options, server_settings={"application_name": f"{role}:{self.queue}"}
        )

    def _statement(self, statement: Any) -> AsyncpgStatement:
        return AsyncpgStatement.of(statement, self.database.schema)

    async def _run(self, *, wait_for_lock: bool, until_empty: bool) -> DrainResult:
        lock_conn = await self._raw_connect()
        heartbeat: asyncio.Task[None] | None = None
        listener: Any = None
        error: str | None = None
        try:
            transaction = lock_conn.transaction()
            await transaction.start()
            if self.keepalive is not None:
                settings = self._statement(sql.KEEPALIVE_SETTINGS)
                await lock_conn.fetch(
                    settings.sql, *settings.args(**self.keepalive.params(is_local=True))
                )
            no_timeouts = self._statement(sql.NO_TIMEOUTS_LOCAL)
            await lock_conn.fetch(no_timeouts.sql, *no_timeouts.args())
            lock_args = {"namespace": DRAINER_NAMESPACE, "key": self.lock_key}
            if not wait_for_lock:
                try_lock = self._statement(sql.LOCK_TRY_XACT)
                if not await lock_conn.fetchval(try_lock.sql, *try_lock.args(**lock_args)):
                    logger.info(
                        "skipped: another drainer is active on queue %s",
                        self.queue,
                        extra={"action": "drain_skipped", "queue": self.queue},
                    )
                    return self._result(skip_reason="another drainer is active")
            else:
                heartbeat = asyncio.create_task(self._heartbeat())
                if not await self._wait_for_lock(lock_conn, lock_args):
                    return self._result()
            await self._drop_snapshot(lock_conn)
            self.state = "active"
            logger.info(
                "active on queue %s (%s, batch %d, concurrency %d)",
                self.queue,
                self.commit_mode.value,
                self.batch_size,
                self.concurrency,
                extra={"action": "drainer_active", "queue": self.queue},
            )
            if heartbeat is None:
                heartbeat = asyncio.create_task(self._heartbeat())
            if not until_empty:
                listener = await self._listen()
            error = await self._run_lanes(lock_conn, until_empty=until_empty)
            self.state = "stopping"
            with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                await transaction.rollback()  # nothing was written on it: releases the lock
            return self._result(error=error)
        finally:
            self.stats.stop()
            if heartbeat is not None:
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeat
                await self._forget_worker()
            if listener is not None:
                with contextlib.suppress(Exception):
                    await listener.close()
            lock_conn.terminate()
            if self._lanes_db is not None:
                await self._lanes_db.dispose()
                self._lanes_db = None

    async def _drop_snapshot(self, lock_conn: Any) -> None:
        """Let the lock transaction idle without a snapshot. A statement sent with the extended
        protocol (asyncpg's fetch*) leaves its unnamed portal, and the portal's snapshot, open
        until the next statement: in the lock transaction that pins the database's xmin
        horizon until the next ping, so the claim's index entries of the jobs completed since
        cannot be marked dead and every claim visits their rows again. PING goes by the
        simple protocol, which drops the portal."""
        await lock_conn.execute(self._ping.sql)

    async def _wait_for_lock(self, lock_conn: Any, lock_args: dict[str, int]) -> bool:
        """Block on the lock as a standby; False when stopped before getting it."""
        lock = self._statement(sql.LOCK_XACT)
        waiting = asyncio.ensure_future(lock_conn.fetchval(lock.sql, *lock.args(**lock_args)))
        stopped = asyncio.ensure_future(self._stopping.wait())
        logger.info(
            "standing by for queue %s",
            self.queue,
            extra={"action": "drainer_standby", "queue": self.queue},
        )
        done, _ = await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if waiting in done:
            stopped.cancel()
            waiting.result()
            return True
        waiting.cancel()  # asyncpg cancels the server-side wait
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await waiting
        return False

    async def _listen(self) -> Any:
        """Subscribe to the schema's channel; a notification for this queue wakes idle lanes."""
        if self.database.pgbouncer:
            # Transaction pooling gives no session to listen on: poll instead.
            logger.info(
                "behind PgBouncer: polling every %s s",
                self.poll_interval,
                extra={"action": "polling", "queue": self.queue},
            )
            return None
        try:
            listener = await self._raw_connect("cronlock-listener")
            await listener.add_listener(jobs_channel(self.database.schema), self._notified)
        except (OSError, asyncpg.PostgresError) as exc:
            # Behind PgBouncer in transaction mode there is no LISTEN: poll instead.
            logger.warning(
                "notifications unavailable (%s): polling every %s s",
                exc,
                self.poll_interval,
                extra={"action": "listen_unavailable", "queue": self.queue},
            )
            return None
        return listener

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload == self.queue:
            for lane in self._lanes:
                lane.wake.set()

    # -- lanes --------------------------------------------------------------------------------

    def _engine_or_create(self) -> AsyncEngine:
        # The lanes' own pool, configured like the app's (keepalives on direct connections,
        # unnamed statements behind PgBouncer), one connection per lane and one spare.
        if self._lanes_db is None:
            self._lanes_db = Database(
                self.database.url,
                schema=self.database.schema,
                pgbouncer=self.database.pgbouncer,
                pool_size=self.concurrency + 1,
            )
        return self._lanes_db.engine

    async def _run_lanes(self, lock_conn: Any, *, until_empty: bool) -> str | None:
        """Run the lanes until they are done; an error message if the lock was lost."""
        self._lanes = [_Lane(n) for n in range(self.concurrency)]
        self._lane_tasks = [
            asyncio.create_task(self._lane(lane, until_empty=until_empty)) for lane in self._lanes
        ]
        watch = asyncio.create_task(self._watch_lock(lock_conn))
        error: str | None = None
        try:
            results = await asyncio.gather(*self._lane_tasks, return_exceptions=True)
            for outcome in results:
                if isinstance(outcome, BaseException) and not isinstance(
                    outcome, asyncio.CancelledError
                ):
                    error = error_line(outcome)
                    logger.error(
                        "a lane failed: %s",
                        error,
                        extra={"action": "lane_failed", "queue": self.queue},
                        exc_info=outcome,
                    )
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                lost = await watch
                if lost:
                    error = lost
        return error

    async def _watch_lock(self, lock_conn: Any) -> str | None:
        """Stop the lanes if the lock connection dies: another drainer may be active now."""
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await asyncio.wait_for(self._drop_snapshot(lock_conn), self.heartbeat_interval * 3)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                message = f"lost the drainer lock ({type(exc).__name__}: {exc})"
                logger.error(message, extra={"action": "lock_lost", "queue": self.queue})
                self.stop()
                return message

    async def _lane(self, lane: _Lane, *, until_empty: bool) -> None:
        try:
            await self._lane_loop(lane, until_empty=until_empty)
        except (Exception, asyncio.CancelledError):
            if self._aborted:
                return  # its connection was cut on purpose: the server rolled it back
            self.stop()  # a lane that lost its database stops the drainer: exit, restart
            raise

    async def _lane_loop(self, lane: _Lane, *, until_empty: bool) -> None:
        while True:
            async with self._engine_or_create().connect() as conn:
                raw: Any = (await conn.get_raw_connection()).driver_connection
                lane.raw = raw
                lane.session = None  # a session is bound to one connection
                try:
                    await self._lane_batches(conn, raw, lane, until_empty=until_empty)
                    return
                except _LostLease as lost:
                    # The connection is in no state to go on: record the failed attempt on a
                    # fresh one, throw this one away, and carry on with a new one.
                    await conn.invalidate()
                    await self._record_lost_attempt(lost)
            if self.stopping:
                return

    async def _lane_batches(
        self, conn: AsyncConnection, raw: Any, lane: _Lane, *, until_empty: bool
    ) -> None:
        while not self.stopping:
            if self._deadline is not None and time.monotonic() >= self._deadline:
                break
            lane.wake.clear()
            claimed = await self._batch(conn, raw, lane)
            if claimed:
                continue
            if until_empty:
                break
            await self._idle(raw, lane)

    async def _idle(self, raw: Any, lane: _Lane) -> None:
        """Sleep until notified, until the next job is due, or for the poll interval."""
        seconds = await raw.fetchval(
            self._next_due.sql, *self._next_due.args(queue=self.queue, now=self._db_now())
        )
        timeout = self.poll_interval if seconds is None else min(float(seconds), self.poll_interval)
        if timeout <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(lane.wake.wait(), timeout)

    def _now(self) -> datetime:
        return self.clock() if self.clock is not None else datetime.now(UTC)

    def _db_now(self) -> datetime | None:
        # None: the claim uses the database's clock, which every host shares.
        return self.clock() if self.clock is not None else None

    async def _batch(self, conn: AsyncConnection, raw: Any, lane: _Lane) -> int:
        """Claim, run and finish one batch in one transaction; the number of jobs claimed.

        The hot path runs on the lane's bare asyncpg connection with statements compiled once
        (no ORM, one claim and one outcome UPDATE per batch). A handler's session sits on the
        same connection: SQLAlchemy's transaction there is nested in ours, which asyncpg
        turns into a SAVEPOINT, opened only when the handler first uses the session.
        """
        outcomes: list[_Attempt] = []
        begun: list[float] = []  # when each job started, for its started -> committed latency
        transaction = raw.transaction()
        await transaction.start()
        try:
            rows = await raw.fetch(
                self._claim.sql,
                *self._claim.args(queue=self.queue, limit=self.batch_size, now=self._db_now()),
            )
            claimed = [
                Job(id, job_type, _decode(payload)[0], retry_count, max_retries, created_at)
                for id, job_type, payload, retry_count, max_retries, created_at in rows
            ]
            stopping, perf_counter = self._stopping.is_set, time.perf_counter  # per job
            for job in claimed:
                if stopping():
                    break
                lane.in_flight = 1
                begun.append(perf_counter())
                outcome = await self._attempt(conn, lane, job)
                lane.in_flight = 0
                outcomes.append(outcome)
            if outcomes:
                await self._write(raw, outcomes)
        except BaseException as exc:
            lane.in_flight = 0
            if isinstance(exc, _LostLease):
                self.stats.rolled_back += len(outcomes)
            if not raw.is_closed():
                with contextlib.suppress(Exception):
                    await transaction.rollback()
            raise
        await transaction.commit()
        self.stats.handed_back += len(claimed) - len(outcomes)
        self._count(outcomes, begun)
        return len(claimed)

    async def _write(self, raw: Any, outcomes: list[_Attempt]) -> None:
        """Write a batch's outcomes with one statement: the narrow ones when all succeeded."""
        successes = [o for o in outcomes if isinstance(o, _Success)]
        if len(successes) < len(outcomes):
            written = [o.outcome() if isinstance(o, _Success) else o for o in outcomes]
            await raw.execute(self._finish.sql, *self._finish.args(**_columns(written)))
        elif len(successes) == 1:
            (success,) = successes
            args = self._complete_one.args(
                id=success.job.id,
                result=success.result,
                started_at=_datetime(success.started),
                completed_at=_datetime(success.finished),
            )
            await raw.execute(self._complete_one.sql, *args)
        else:
            await raw.execute(
                self._complete_many.sql, *self._complete_many.args(**_successes(successes))
            )

    async def _attempt(self, conn: AsyncConnection, lane: _Lane, job: Job) -> _Attempt:
        handler = self.handlers.get(job.job_type)
        # The clock as an integer (µs), read twice per job: cheaper to read and to send.
        clock = self.clock
        started = _micros(clock()) if clock is not None else time.time_ns() // 1000
        if handler is None:
            return self._failed(
                job, f"no handler registered for job type {job.job_type!r}", started, None
            )
        # The session needs no close(): its transaction always ends here (committed or rolled
        # back) and it is dropped with the attempt; closing costs more than a no-op job. A
        # session the previous handler left untouched is as good as new: it is reused.
        session = lane.session or AsyncSession(
            bind=conn, expire_on_commit=False, sync_session_class=_JobSession
        )
        lane.session = None
        try:
            if handler.timeout is None:
                value = await handler.func(session, job.payload)
            else:
                async with asyncio.timeout(handler.timeout):
                    value = await handler.func(session, job.payload)
            result = None if value is None else to_json(value, "the handler's result")
            sync = cast(_JobSession, session.sync_session)
            if _untouched(sync):
                lane.session = session
            elif sync.in_transaction() or sync.new or sync.dirty or sync.deleted:
                await session.commit()  # flush, RELEASE SAVEPOINT; the lane commits later
        except Exception as exc:
            error = _describe(exc, handler)
            try:
                if session.in_transaction():
                    await session.rollback()  # ROLLBACK TO SAVEPOINT: this job's writes only
            except Exception as broken:
                raise _LostLease(self._failed(job, error, started, handler)) from broken
            if conn.invalidated or cast(_JobSession, session.sync_session).released:
                # The handler committed its session (released the savepoint) and then
                # failed: only dropping the whole transaction keeps its writes from staying.
                raise _LostLease(self._failed(job, error, started, handler)) from exc
            return self._failed(job, error, started, handler)
        finished = _micros(clock()) if clock is not None else time.time_ns() // 1000
        return _Success(job, result, started, finished)

    def _failed(self, job: Job, error: str, started: int, handler: Handler | None) -> JobOutcome:
        backoff = handler.backoff if handler is not None else Backoff()
        began = _datetime(started)
        outcome = outcome_of_failure(job, error, began, self._now(), backoff, self.rng)
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

    async def _record_lost_attempt(self, lost: _LostLease) -> None:
        """Record a failed attempt whose transaction is gone; the rest of its batch runs again
        (JOB_FINISH_MANY's status guard keeps it from overwriting a newer outcome)."""
        (outcome,) = lost.args
        try:
            async with self._engine_or_create().begin() as conn:
                await conn.execute(sql.JOB_FINISH_MANY, _columns([outcome]))
        except (OSError, DBAPIError, InterfaceError) as exc:
            logger.error(
                "could not record the failure of job %s: %s",
                outcome.id,
                exc,
                extra={"action": "job_outcome_lost", "queue": self.queue},
            )
            return
        self._count([outcome])

    def _count(self, outcomes: list[_Attempt], begun: list[float] | None = None) -> None:
        """Count committed outcomes (called after the commit): a job's latency ends when its
        completion is committed (in batch mode, with its batch). Each histogram takes the
        batch's latencies in one call."""
        now, clock = datetime.now(UTC), time.perf_counter()
        stats = self.stats
        run_times: list[float] = []
        waits: list[float] = []
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, _Success):
                created: datetime | None = outcome.job.created_at
            elif outcome.status is JobStatus.COMPLETED:
                created = outcome.created_at
            else:
                if outcome.status is JobStatus.RETRYING:
                    stats.retried += 1
                else:
                    stats.failed += 1
                continue
            stats.processed += 1
            if begun is not None:
                run_times.append(clock - begun[i])
            if created is not None:
                waits.append((now - created).total_seconds())
        stats.run_time.record_many(run_times)
        stats.end_to_end.record_many(waits)

    # -- visibility -------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        engine = self.database.engine
        first = True
        while True:
            try:
                async with engine.begin() as conn:
                    if first:
                        await conn.execute(sql.WORKER_PRUNE, {"older_than": _STALE_WORKERS})
                        first = False
                    await conn.execute(
                        sql.WORKER_UPSERT,
                        {
                            "id": self.worker_id,
                            "queue": self.queue,
                            "state": "stopping" if self.stopping else self.state,
                            "host": _HOST,
                            "pid": os.getpid(),
                            "processed": self.stats.processed,
                            "failed": self.stats.failed,
                            "retried": self.stats.retried,
                            "in_flight": sum(lane.in_flight for lane in self._lanes),
                        },
                    )
            except (OSError, DBAPIError) as exc:
                logger.warning("heartbeat failed: %s", exc, extra={"action": "heartbeat_failed"})
            await asyncio.sleep(self.heartbeat_interval)

    async def _forget_worker(self) -> None:
        with contextlib.suppress(OSError, DBAPIError):
            async with self.database.engine.begin() as conn:
                await conn.execute(sql.WORKER_DELETE, {"id": self.worker_id})

    def _result(self, *, skip_reason: str | None = None, error: str | None = None) -> DrainResult:
        self.stats.stop()
        if skip_reason is not None:
            status = RunStatus.SKIPPED
        elif error is not None:
            status = RunStatus.FAILED
        elif self.stats.failed or self.stats.retried:
            status = RunStatus.PARTIAL
        else:
            status = RunStatus.COMPLETED
        return DrainResult(
            queue=self.queue,
            status=status,
            stats=self.stats.report(),
            skip_reason=skip_reason,
            error=error,
        )


_STALE_WORKERS = timedelta(hours=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(moment: datetime) -> int:
    """A clock's reading in microseconds since the Unix epoch (a naive one taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MICROSECOND


def _datetime(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


# A claimed payload is jsonb's text output: one JSON value, no whitespace around it, which
# raw_decode reads without the two regular expressions json.loads runs around it.
_decode = json.JSONDecoder().raw_decode


def _describe(exc: BaseException, handler: Handler) -> str:
    if isinstance(exc, TimeoutError) and handler.timeout is not None:
        return f"TimeoutError: the handler ran longer than its timeout of {handler.timeout} s"
    return error_line(exc)


def _untouched(sync: _JobSession) -> bool:
    """Whether a handler's session is as a new one would be, so the next handler may have it:
    never in a transaction (so never committed), nothing in it, nothing stashed in ``info``.

    Once per job: the session's own dicts of pending and deleted objects are read, not its
    ``new`` and ``deleted``, which build a set each (a third of a no-op job's Python time).
    """
    return not (
        sync.released
        or sync._transaction is not None
        or sync.identity_map
        or sync._new
        or sync._deleted
        or sync.info
    )


def _successes(successes: list[_Success]) -> dict[str, list[Any]]:
    """Successes as the column arrays JOB_COMPLETE_MANY unnests."""
    return {
        "ids": [s.job.id for s in successes],
        "results": [s.result for s in successes],
        "started_ats": [s.started for s in successes],
        "completed_ats": [s.finished for s in successes],
    }


def _columns(outcomes: list[JobOutcome]) -> dict[str, list[Any]]:
    """Outcomes as the column arrays JOB_FINISH_MANY unnests."""
    return {
        "ids": [o.id for o in outcomes],
        "statuses": [o.status.value for o in outcomes],
        "retry_counts": [o.retry_count for o in outcomes],
        "run_ats": [o.run_at for o in outcomes],
        "errors": [o.error for o in outcomes],
        "error_entries": [o.error_entry for o in outcomes],
        "results": [o.result for o in outcomes],
        "started_ats": [o.started_at for o in outcomes],
        "completed_ats": [o.completed_at for o in outcomes],
    }
