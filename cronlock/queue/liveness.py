"""Liveness by lock: a lease-mode worker is alive exactly while it holds its identity's lock.

In the ``lease`` commit mode a claimed job is committed ``processing`` with its ``owner``, the
worker's id. The worker holds ``pg_advisory_xact_lock(owner_key(id))`` (the one-key form, 8
bytes of the id) in a transaction of its own on a connection of its own, the *liveness
connection*, for as long as it lives. The transaction writes nothing and idles without a
snapshot (``ping`` goes by the simple protocol, as the drainer's lock transaction does in
``lease.py``): it holds no transaction id and no vacuum horizon, no server-side timeout may
end it, and a transaction-level lock works behind PgBouncer in transaction mode. When the
worker dies, PostgreSQL aborts that transaction as its socket closes (TCP keepalives set on it
notice a vanished host in seconds), and the lock is free.

Any worker of the queue can then tell, at once, that the owner is gone: ``Sweeper`` runs
``JOB_LEASE_RETURN_LOST`` every ``sweep_interval`` (and when its drainer becomes active),
which takes ``pg_try_advisory_xact_lock`` on each running job's owner: it succeeds only where
no one holds the lock. Those jobs are due again, with an ``error_history`` entry saying the
worker was lost; that is not a failed attempt (``retry_count`` stays), but ``lost_runs``
counts it, and a job whose lost runs reach its type's ``max_lost_runs`` is failed and says
so, never retried forever. No heartbeat timeout decides anything here.

An owner never takes its lock again once it lost it: a worker whose liveness connection is cut
stops claiming (``watch``); its drainer ends, and what it still finishes is fenced by owner and
attempt (``leased.py``). A new worker takes a new id, and an id whose key is held by a live
worker (8 bytes: never in practice) is drawn again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.ext.asyncio import AsyncEngine

from .. import pg, sql
from ..database import Database
from ..outcome import error_line
from .jobs import Handler
from .lease import Keepalive

__all__ = [
    "DEFAULT_MAX_LOST_RUNS",
    "DEFAULT_SWEEP_INTERVAL",
    "Liveness",
    "Sweeper",
    "give_up",
    "owner_key",
]

logger = logging.getLogger("cronlock.drainer")

# Seconds between two looks for running jobs whose owner is gone: a dead worker's jobs on the
# same host are due again within about this long (its socket closes at once).
DEFAULT_SWEEP_INTERVAL = 0.5
# A job whose worker was lost this many times while it ran is stopped (failed), unless its
# handler says otherwise (App.job(max_lost_runs=)).
DEFAULT_MAX_LOST_RUNS = Handler.max_lost_runs


def owner_key(owner: uuid.UUID) -> int:
    """The bigint advisory lock key of a worker id: its first 8 bytes, signed (what
    ``sql.owner_lock_key`` computes from the ``owner`` column)."""
    return int.from_bytes(owner.bytes[:8], "big", signed=True)


class Liveness:
    """One worker's liveness connection (``hold``, then ``watch`` while it works, ``close``
    in the end whatever happened)."""

    def __init__(
        self,
        database: Database,
        queue: str,
        *,
        keepalive: Keepalive | None,
        heartbeat_interval: float,
        owner: uuid.UUID | None = None,
    ) -> None:
        self.database = database
        self.queue = queue
        self.keepalive = keepalive
        self.heartbeat_interval = heartbeat_interval
        self.owner = owner or uuid.uuid4()
        self._driver: pg.DriverConnection | None = None
        self._ping = self._statement(sql.PING)

    def _statement(self, statement: Any) -> pg.AsyncpgStatement:
        return pg.AsyncpgStatement.of(statement, self.database.schema)

    async def hold(self) -> uuid.UUID:
        """Open the liveness connection and take the lock of an id of its own; the id."""
        driver = self._driver = await pg.connect(self.database, f"cronlock-liveness:{self.queue}")
        transaction = driver.transaction()
        await transaction.start()
        if self.keepalive is not None:
            settings = self._statement(sql.KEEPALIVE_SETTINGS)
            await driver.fetch(settings.sql, *settings.args(**self.keepalive.params(is_local=True)))
        no_timeouts = self._statement(sql.NO_TIMEOUTS_LOCAL)
        await driver.fetch(no_timeouts.sql, *no_timeouts.args())
        take = self._statement(sql.LOCK_TRY_XACT_BIGINT)
        while not await driver.fetchval(take.sql, *take.args(key=owner_key(self.owner))):
            self.owner = uuid.uuid4()  # a live worker's key: another id
        await self.ping()  # from here on the transaction idles without a snapshot
        logger.info(
            "worker %s holds its liveness lock",
            self.owner,
            extra={"action": "liveness_held", "queue": self.queue, "worker": str(self.owner)},
        )
        return self.owner

    async def ping(self) -> None:
        """By the simple protocol, which leaves no portal (and no snapshot) behind."""
        assert self._driver is not None, "hold() first"
        await self._driver.execute(self._ping.sql)

    async def watch(self, on_lost: Callable[[], None]) -> str:
        """Ping every heartbeat until the liveness connection dies: then call ``on_lost``
        (this worker's jobs may be handed on) and return what happened. Runs until cancelled."""
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            assert self._driver is not None, "hold() first"
            try:
                await pg.answer_within(self._driver, self.ping(), self.heartbeat_interval * 3)
            except Exception as exc:  # only an answered ping proves the lock
                message = f"lost the worker's liveness lock ({type(exc).__name__}: {exc})"
                logger.error(message, extra={"action": "liveness_lost", "queue": self.queue})
                on_lost()
                return message

    def close(self) -> None:
        """End the connection: the lock goes, and any job still owned is returned as lost."""
        if self._driver is not None:
            self._driver.terminate()
            self._driver = None


class Sweeper:
    """Returns the running jobs of one queue whose owner is gone (``sweep``), every
    ``interval`` seconds (``run``)."""

    def __init__(
        self,
        engine: Callable[[], AsyncEngine],
        handlers: Mapping[str, Handler],
        *,
        queue: str,
        interval: float = DEFAULT_SWEEP_INTERVAL,
        on_returned: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.queue = queue
        self.interval = interval
        self.on_returned = on_returned
        self.returned = 0  # jobs this sweeper returned, for the drainer's stats
        self.stopped = 0  # of those, jobs failed for good: they kept taking workers down
        types = sorted(handlers)
        self._params = {
            "queue_name": queue,
            "job_types": types,
            "max_lost_runs": [handlers[t].max_lost_runs for t in types],
            "default_max_lost_runs": DEFAULT_MAX_LOST_RUNS,
            "ids": None,
        }

    async def sweep(self) -> int:
        """Return the jobs of dead owners once; how many. When the database refuses the
        statement (one job's row, a trigger), each job is returned on its own, and one it
        refuses to return is failed with the refusal in its history; one it refuses to fail
        too stays for an operator, logged: one job's state never stops a sweep."""
        try:
            async with self.engine().begin() as conn:
                rows = (await conn.execute(sql.JOB_LEASE_RETURN_LOST, self._params)).all()
        except DBAPIError as exc:
            if pg.connection_lost(exc):
                raise
            rows = await self._one_by_one()
        for job_id, status, owner in rows:
            stopped = status == "failed"
            self.stopped += stopped
            logger.warning(
                "job %s: its worker %s was lost; %s",
                job_id,
                owner,
                "stopped: it lost too many workers" if stopped else "due again",
                extra={"action": "job_worker_lost", "queue": self.queue, "job_id": str(job_id)},
            )
        self.returned += len(rows)
        if rows and self.on_returned is not None:
            self.on_returned()
        return len(rows)

    async def _one_by_one(self) -> list[Any]:
        async with self.engine().begin() as conn:
            ids = (await conn.scalars(sql.JOB_LEASE_LOST_IDS, self._params)).all()
        rows: list[Any] = []
        for job_id in ids:
            try:
                async with self.engine().begin() as conn:
                    params = {**self._params, "ids": [job_id]}
                    rows += (await conn.execute(sql.JOB_LEASE_RETURN_LOST, params)).all()
                continue
            except DBAPIError as exc:
                if pg.connection_lost(exc):
                    raise
                error = f"its worker was lost and it could not be returned: {error_line(exc)}"
            await give_up(self.engine(), job_id, error, queue=self.queue)
        return rows

    async def run(self) -> None:
        """Sweep every ``interval`` until cancelled; a failed sweep is logged and tried again
        (the lanes notice a lost database themselves)."""
        while True:
            with contextlib.suppress(OSError, DBAPIError, InterfaceError):
                try:
                    await self.sweep()
                except (OSError, DBAPIError, InterfaceError) as exc:
                    logger.warning(
                        "could not look for lost workers' jobs: %s",
                        exc,
                        extra={"action": "sweep_failed", "queue": self.queue},
                    )
                    raise
            await asyncio.sleep(self.interval)


async def give_up(engine: AsyncEngine, job_id: uuid.UUID, error: str, *, queue: str) -> None:
    """Fail a job the database refuses to hand out or to return (JOB_LEASE_GIVE_UP), with
    ``error`` in its history, logged; one whose failure is refused too stays for an operator,
    logged: nothing raises but the loss of the database."""
    extra = {"action": "job_refused", "queue": queue, "job_id": str(job_id)}
    logger.error("job %s: %s; failed", job_id, error, extra=extra)
    try:
        async with engine.begin() as conn:
            await conn.execute(sql.JOB_LEASE_GIVE_UP, {"job_id": job_id, "error": error})
    except DBAPIError as exc:
        if pg.connection_lost(exc):
            raise
        logger.error(
            "job %s: not even its failure could be written (%s): left for an operator",
            job_id,
            error_line(exc),
            extra=extra,
        )
