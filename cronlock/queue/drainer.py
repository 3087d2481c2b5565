"""The drainer: one active per queue (or many, shared), jobs claimed in batches, the transaction
as the lease.

A ``Drainer`` drains one queue of an app's jobs. It is small: it puts together the parts, each
in its own module, in the order a job meets them.

1. The lease (``lease.py``). Single active: the drainer takes an advisory lock in a long
   transaction on a connection of its own; ``drain`` is skipped when another drainer holds it,
   ``worker`` stands by until it is free, also when the holder dies. While active it watches
   that connection: a drainer that lost it stops claiming, and PostgreSQL fences whatever it
   still had in flight. Shared (``shared.py``): the same lock in shared mode, any number of
   drainers active at once; exclusive and shared drainers refuse to meet on one queue.
2. The lanes (``lanes.py``): one loop and one batch in every mode, the commit mode a strategy
   around them (``Commit``). In ``strict`` and ``batch`` (``InTransaction``) the
   transaction is the lease: each lane claims due jobs with
   ``FOR UPDATE SKIP LOCKED``, runs them and writes their outcomes in one transaction, so no
   ``processing`` state is committed and a dead worker's jobs are due again at once, none of
   their writes applied. ``strict`` commits each job, ``batch`` up to ``batch_size`` at once.
   ``lease`` (``leased.py``, ``liveness.py``) commits the claim instead, runs handlers with no
   transaction open, and holds the worker's liveness lock, by which lost workers' running
   jobs are returned and stale completions fenced.
   Idle lanes wake on NOTIFY, when the next job is due, or every poll interval.
3. One attempt (``attempt.py``): a job's handler, with a session whose SAVEPOINT is opened only
   if the handler uses it, its timeout, and the session handed on when left untouched.
4. The completion (``complete.py``): an attempt's outcome as a value (success, or the retry
   rule's retrying/failed) and the one statement that writes a batch's outcomes.
5. Cancellation (``cancel.py``): an operator's cancel of a running job reaches its attempt by
   a notification (or the drainer's poll of the requests) and stops its handler's task.
6. The workers table (``workers.py``): a heartbeat row that makes the drainer visible; the one
   rule for when such a row stops counting as alive is ``sql.WORKER_ALIVE_WITHIN``.

Shutdown: ``stop()`` stops claiming; jobs in flight finish (within the grace period the
command line gives), claimed jobs not yet started are handed back by leaving them out of the
commit. ``abort()`` closes the lanes' connections: their transactions roll back, their jobs
are due again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from .. import pg
from ..database import Database
from ..observe.stats import DrainStats
from ..observe.tracehooks import Tracer
from ..outage import OutageEnd, Reconnect, ride_out
from ..outcome import DrainResult, RunStatus, error_line
from .attempt import Attempts
from .complete import Completion
from .control import queue_paused
from .jobs import Handler
from .lanes import Lanes
from .lease import DEFAULT_KEEPALIVE, Keepalive, Lease, queue_lock_key
from .leased import LeaseMode
from .options import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_POLL_INTERVAL,
    CommitMode,
    DrainOptions,
)
from .shared import lease_for
from .workers import Heartbeat

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_KEEPALIVE",
    "DEFAULT_POLL_INTERVAL",
    "CommitMode",
    "DrainOptions",
    "Drainer",
    "Keepalive",
]

logger = logging.getLogger("cronlock.drainer")


class Drainer:
    """Drains one queue of an app's jobs; see the module docstring for the model."""

    def __init__(
        self,
        database: Database,
        handlers: Mapping[str, Handler],
        options: DrainOptions | None = None,
        *,
        tracing: Tracer | None = None,
        **changes: Any,
    ) -> None:
        """``options`` (default ``DrainOptions()``) with ``changes``, any of its fields."""
        self.database = database
        self.handlers = handlers
        self.options = options = replace(options or DrainOptions(), **changes)
        self.queue = options.queue
        self.commit_mode = options.mode
        self.batch_size = options.batch
        self.concurrency = options.concurrency
        self.shared = options.shared  # many active drainers (shared.py), none standing by
        self.clock = options.clock
        self.rng = options.rng
        self.lock_key = queue_lock_key(self.queue)
        self.worker_id = uuid.uuid4()
        self.stats = DrainStats()
        self.state = "standby"
        self._stopping = asyncio.Event()  # this round stops claiming
        self._requested = asyncio.Event()  # the caller asked: no new round either
        self._aborted = False
        self._lost_database = False  # this round ended because the database or a lock went
        self._lanes: Lanes | None = None
        self._deadline: float | None = None
        self._attempts = Attempts(
            handlers,
            queue=self.queue,
            clock=self.clock,
            rng=self.rng,
            tracing=tracing,
            lease=self.commit_mode is CommitMode.LEASE,
            threads=options.threads or options.concurrency,  # plain def handlers (threads.py)
        )
        self._completion = Completion(database.schema, self.queue)

    # -- control (signal handlers call these) ---------------------------------------------

    def stop(self) -> None:
        """Stop claiming; jobs in flight finish, claimed jobs not started are handed back."""
        self._requested.set()
        self._halt()

    def abort(self) -> None:
        """Roll back the jobs in flight (their connections are cut) and stop now."""
        self._requested.set()
        self._halt(abort=True)

    def _halt(self, *, abort: bool = False) -> None:
        """Stop this round of serving (a caller's stop, a lost lock, a failed lane); only a
        caller's ends ``work`` too, the others let it ride the outage out."""
        if not self._stopping.is_set():
            logger.info(
                "stopping: no new jobs, waiting for the ones in flight",
                extra={"action": "drainer_stopping", "queue": self.queue},
            )
        self._stopping.set()
        if self._lanes is not None:
            self._lanes.wake()
        if not abort or self._aborted:
            return
        self._aborted = True
        logger.warning(
            "aborting: jobs in flight are rolled back and return to the queue",
            extra={"action": "drainer_aborting", "queue": self.queue},
        )
        if self._lanes is not None:
            self._lanes.abort()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def in_flight(self) -> int:
        """How many jobs its lanes are running now."""
        return self._lanes.in_flight if self._lanes is not None else 0

    # -- the two ways to run --------------------------------------------------------------

    async def drain(self, *, max_seconds: float | None = None) -> DrainResult:
        """Process due jobs until none is due or ``max_seconds`` passed; skip if not alone."""
        self.stats = DrainStats()
        if max_seconds is not None:
            self._deadline = time.monotonic() + max_seconds
        return await self._run(wait_for_lock=False, until_empty=True)

    async def work(self, *, reconnect: Reconnect | None = None) -> DrainResult:
        """Stand by until active, then process jobs as they come, until ``stop()``.

        With ``reconnect``, a drainer that loses its database or its lock does not end: it
        waits for the database as the policy says (``outage.py``) and stands by again, its
        stats carried on, until stopped or the policy gives up (a failed result saying so).
        Without, such a loss ends it with a failed result."""
        self.stats = DrainStats()
        while True:
            self._lost_database = False
            try:
                result = await self._run(wait_for_lock=True, until_empty=False)
            except Exception as exc:
                if reconnect is None or self._requested.is_set() or not pg.connection_lost(exc):
                    raise
                cause = error_line(exc)
            else:
                if reconnect is None or self._requested.is_set() or not self._lost_database:
                    return result
                cause = result.error or "the connection closed"
            outage = await ride_out(
                self.database,
                reconnect,
                who=f"worker {self.queue}",
                cause=cause,
                stop=self._requested,
                rng=self.rng,
            )
            if outage.end is OutageEnd.STOPPED:
                return self._result()
            if outage.end is OutageEnd.GAVE_UP:
                return self._result(error=outage.gave_up_line(f"worker {self.queue}"))
            # A new round: fresh connections, standby until the lock is ours again, and a
            # new identity (the lease mode's liveness lock: the last round's running jobs
            # are a lost worker's, returned by the liveness rule, not this one's).
            self.worker_id = uuid.uuid4()
            self._stopping = asyncio.Event()
            self._aborted = False
            self.state = "standby"
            self.stats.stopped = None

    async def _run(self, *, wait_for_lock: bool, until_empty: bool) -> DrainResult:
        lease = lease_for(
            self.database,
            self.queue,
            shared=self.shared,
            keepalive=self.options.keepalive,
            heartbeat_interval=self.options.heartbeat_interval,
        )
        await lease.connect()
        heartbeat: Heartbeat | None = None
        beating: asyncio.Task[None] | None = None
        lanes: Lanes | None = None
        leasing = self._lease_mode()
        try:
            if leasing is not None:
                self.worker_id = await leasing.hold()
            await lease.begin()
            if not wait_for_lock:
                if not await lease.try_take():
                    logger.info(
                        "skipped: another drainer is active on queue %s",
                        self.queue,
                        extra={"action": "drain_skipped", "queue": self.queue},
                    )
                    return self._result(skip_reason="another drainer is active")
            else:
                heartbeat, beating = self._beat()
                if not await lease.wait(self._stopping):
                    return self._result()
            await lease.ping()  # from here on the lock transaction idles without a snapshot
            self.state = "active"
            paused = await queue_paused(self.database, self.queue)
            logger.info(
                "active on queue %s%s (%s%s, batch %d, concurrency %d)",
                self.queue,
                ", paused: claims nothing until it is resumed" if paused else "",
                "shared, " if self.shared else "",
                self.commit_mode.value,
                self.batch_size,
                self.concurrency,
                extra={"action": "drainer_active", "queue": self.queue},
            )
            if paused and until_empty:  # a drain has nothing to wait for
                return self._result(skip_reason=f"queue {self.queue} is paused", paused=True)
            if heartbeat is None:
                heartbeat, beating = self._beat()
            make_lanes = leasing.make_lanes if leasing is not None else Lanes
            lanes = self._lanes = make_lanes(
                self.database,
                self._attempts,
                self._completion,
                self.stats,
                self._stopping,
                self._halt,  # a lane that failed or was fenced ends this round
                self.options,
                deadline=self._deadline,
                # Shared drainers commit side by side by design: no fence.
                fence=None if self.shared else lease.fence,
            )
            if self._aborted:
                lanes.abort()
            if not until_empty:
                await lanes.listen()
            error = await self._run_lanes(lease, lanes, until_empty=until_empty, leasing=leasing)
            self.state = "stopping"
            if leasing is not None:
                await leasing.hand_back()  # before the result, which counts them
            await lease.release()  # nothing was written in it: a standby takes over
            paused = error is None and await queue_paused(self.database, self.queue)
            return self._result(error=error, paused=paused)
        finally:
            self.stats.stop()
            if beating is not None and heartbeat is not None:
                beating.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beating
                await heartbeat.forget()
            lease.close()
            if leasing is not None:
                await leasing.close()
            if lanes is not None:
                await lanes.close()
            self._attempts.threads.close()

    def _lease_mode(self) -> LeaseMode | None:
        if self.commit_mode is not CommitMode.LEASE:
            return None
        return LeaseMode(
            self.database,
            self.handlers,
            queue=self.queue,
            owner=self.worker_id,
            keepalive=self.options.keepalive,
            heartbeat_interval=self.options.heartbeat_interval,
            sweep_interval=self.options.sweep_interval,
        )

    async def _run_lanes(
        self, lease: Lease, lanes: Lanes, *, until_empty: bool, leasing: LeaseMode | None
    ) -> str | None:
        """Run the lanes under the lease's watch (and, in the lease mode, the liveness lock's
        and the sweeper); an error message if a lane failed or a lock was lost."""
        watch = asyncio.create_task(lease.watch(self._lock_lost))
        # What no notification reached of an operator's cancel of a running job (cancel.py).
        cancels = asyncio.create_task(self._attempts.cancels.watch(self.database))
        try:
            running = lanes.run(until_empty=until_empty)
            if leasing is not None:
                error = await leasing.run(self.stats, self._lock_lost, running)
            else:
                error = await running
        finally:
            if lanes.lost_connection:
                self._lost_database = True
            cancels.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await cancels
            watch.cancel()
            try:
                lost: str | None = await watch
            except asyncio.CancelledError:
                lost = None
        if lost is None and lanes.fenced:
            # A lane's fence saw the lock gone before the watch saw its connection close.
            self._lost_database = True
            lost = "lost the drainer lock (a lane's commit was fenced)"
        return lost or error

    def _lock_lost(self) -> None:
        """The lock connection is gone: the lanes' commits would be fenced (lease.py), so the
        jobs in flight are rolled back now rather than run to a commit that cannot land."""
        self._lost_database = True
        # The lease mode fences its completions by owner (leased.py): no abort needed.
        self._halt(abort=self.commit_mode is not CommitMode.LEASE)

    def _beat(self) -> tuple[Heartbeat, asyncio.Task[None]]:
        heartbeat = Heartbeat(
            self.database,
            self.worker_id,
            queue=self.queue,
            interval=self.options.heartbeat_interval,
            row=self._row,
        )
        return heartbeat, asyncio.create_task(heartbeat.beat())

    def _row(self) -> dict[str, Any]:
        """What the heartbeat writes of this drainer besides who and where it is."""
        return {
            "state": "stopping" if self.stopping else self.state,
            "processed": self.stats.processed,
            "failed": self.stats.failed,
            "retried": self.stats.retried,
            "in_flight": self.in_flight,
        }

    def _result(
        self, *, skip_reason: str | None = None, error: str | None = None, paused: bool = False
    ) -> DrainResult:
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
            paused=paused,
        )
