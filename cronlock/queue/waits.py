"""Waiting for a job's end: woken by the completion's notification, not by a polling loop.

A wait first reads the job: if it has ended (``completed``, ``failed``, ``cancelled``) that is
the answer, with nothing written. Otherwise it registers a row in ``job_waits``, commits it and
reads the job again; from then on the ``jobs_ended``
trigger of the statement that finishes it notifies ``<schema>.ended`` with its id at that
commit (it notifies only jobs with a wait row, so commits nobody awaits never take NOTIFY's
commit lock), and the process's one LISTEN connection wakes the waits for it, which read the
row again. The row is removed when the wait ends, however it ends, beside the caller's answer
rather than before it.

A completion whose trigger ran in the instant before the wait row's commit notifies nobody,
and its commit may come after the read that follows the row's (a flush later). That read
sees it: the version it reads has its xmax set. Then, and only then, the job is read again
``FOR SHARE``, which waits for such a commit (at most ``SETTLE_WAIT``, the time a strict or
batch lane running the job may hold the row too) and reads what it left. A row no one holds
is never locked: a claim's SKIP LOCKED would pass the job by.
(Early reads 10 to 300 ms after the first once stood in for it: in the wait-latency benchmark
they cost more in pool traffic than they found.) A slow safety read of every pending wait's
job, one statement for all of them, covers the rest of what a notification cannot: a commit
slower than ``SETTLE_WAIT``, a job deleted while awaited (``JobNotFound``), and a LISTEN
connection that was cut.
Behind PgBouncer in transaction mode there is no LISTEN: the safety read is all there is, at
``POLL_BEHIND_PGBOUNCER``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Coroutine, Iterable, Sequence

from sqlalchemy import RowMapping
from sqlalchemy.exc import DBAPIError

from .. import pg, sql
from ..database import Database
from ..errors import JobNotFound
from ..outcome import JOB_FINISHED_STATUSES, root_cause
from ..sql.tables import ended_channel
from .operate import JobInfo

__all__ = ["POLL_BEHIND_PGBOUNCER", "SAFETY_INTERVAL", "SETTLE_WAIT", "Waits"]

logger = logging.getLogger("cronlock.queue")

# How often the pending waits' jobs are read again beside the notifications (seconds).
SAFETY_INTERVAL = 1.0
POLL_BEHIND_PGBOUNCER = 0.25
# How long the read after a wait's row commits waits for a transaction holding the job's row
# (seconds): a completion's commit, or a strict or batch lane running the job, whose end the
# notification then brings.
SETTLE_WAIT = 0.3
_SETTLE_TIMEOUT = f"{int(SETTLE_WAIT * 1000)}ms"


class Waits:
    """The waits of one process on one database (an app's ``wait``); made on first use."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._waiting: dict[uuid.UUID, list[asyncio.Future[JobInfo]]] = {}
        self._listener: pg.DriverConnection | None = None
        self._listening = asyncio.Lock()
        self._safety: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # notified reads and row removals

    async def wait(self, job_id: uuid.UUID, timeout: float | None) -> JobInfo:  # noqa: ASYNC109
        """The job's row once it has ended; ``TimeoutError`` after ``timeout`` seconds (None:
        no limit), ``JobNotFound`` if there is no such job or it was deleted."""
        future: asyncio.Future[JobInfo] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(job_id, []).append(future)
        wait_id: uuid.UUID | None = None
        try:
            async with asyncio.timeout(timeout):
                # A job that has already ended needs no wait row, no LISTEN and no commit.
                await self._read([job_id], missing_ends=True)
                if future.done():
                    return await future
                await self._listen()
                wait_id = uuid.uuid4()
                async with self.database.engine.begin() as conn:
                    await conn.execute(sql.WAIT_ADD, {"id": wait_id, "job_id": job_id})
                self._start_safety()
                await self._read_registered(job_id)
                return await future
        finally:
            futures = self._waiting.get(job_id, [])
            if future in futures:
                futures.remove(future)
            if not futures:
                self._waiting.pop(job_id, None)
            future.cancel()
            if wait_id is not None:
                # Removed beside the caller, not before it gets its answer: the row's commit
                # is a flush the caller need not wait for (close() waits for it).
                self._background(self._remove(wait_id))

    async def _remove(self, wait_id: uuid.UUID) -> None:
        with contextlib.suppress(Exception):  # a row left behind is pruned by retention
            async with self.database.engine.begin() as conn:
                await conn.execute(sql.WAIT_REMOVE, {"id": wait_id})

    def _background(self, work: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.warning("reading awaited jobs failed: %s", exc, extra={"action": "wait"})

    async def _listen(self) -> None:
        if self._listener is not None or self.database.pgbouncer:
            return
        async with self._listening:
            if self._listener is not None:  # another wait opened it meanwhile
                return  # type: ignore[unreachable]
            try:
                listener = await pg.connect(self.database, "cronlock-waits")
            except (OSError, pg.ServerError) as exc:
                logger.warning(
                    "notifications unavailable (%s): waits read their jobs every %s s",
                    exc,
                    SAFETY_INTERVAL,
                    extra={"action": "listen_unavailable"},
                )
                return
            await listener.add_listener(ended_channel(self.database.schema), self._notified)
            listener.add_termination_listener(self._listener_closed)
            self._listener = listener

    def _listener_closed(self, _conn: object) -> None:
        self._listener = None  # the next wait opens another; the safety read goes on

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        with contextlib.suppress(ValueError):
            job_id = uuid.UUID(payload)
            if job_id in self._waiting:
                self._background(self._read([job_id]))

    def _start_safety(self) -> None:
        if self._safety is None or self._safety.done():
            self._safety = asyncio.get_running_loop().create_task(self._safety_reads())

    async def _safety_reads(self) -> None:
        interval = POLL_BEHIND_PGBOUNCER if self._listener is None else SAFETY_INTERVAL
        while self._waiting:
            await asyncio.sleep(interval)
            try:
                await self._read(list(self._waiting), missing_ends=True)
            except Exception as exc:  # the database is away: the next read tries again
                logger.warning("reading awaited jobs failed: %s", exc, extra={"action": "wait"})
            interval = POLL_BEHIND_PGBOUNCER if self._listener is None else SAFETY_INTERVAL

    async def _read(self, ids: Iterable[uuid.UUID], *, missing_ends: bool = False) -> None:
        """Read the jobs ``ids``: settle the waits of those that ended (and, with
        ``missing_ends``, of those that do not exist)."""
        wanted = list(ids)
        async with self.database.connect() as conn:
            rows = (await conn.execute(sql.WAIT_JOBS, {"ids": wanted})).mappings().all()
        self._settle(wanted, rows, missing_ends)

    async def _read_registered(self, job_id: uuid.UUID) -> None:
        """Read the job after the wait's row committed; if a transaction holds the version
        read, once more when it has ended (``_read_settled``)."""
        async with self.database.connect() as conn:
            rows = (await conn.execute(sql.WAIT_JOBS_HELD, {"ids": [job_id]})).mappings().all()
        if rows and rows[0]["held"] and rows[0]["status"] not in JOB_FINISHED_STATUSES:
            await self._read_settled(job_id)
        else:
            self._settle([job_id], rows, missing_ends=True)

    async def _read_settled(self, job_id: uuid.UUID) -> None:
        """Read the job once no transaction holds its row (at most ``SETTLE_WAIT``): a
        completion that updated it before the wait's row committed, and so notifies nobody,
        is waited for and read here, not left to the safety read."""
        try:
            async with self.database.engine.begin() as conn:
                await conn.execute(sql.LOCK_TIMEOUT_LOCAL, {"timeout": _SETTLE_TIMEOUT})
                result = await conn.execute(sql.WAIT_JOB_SETTLED, {"ids": [job_id]})
                rows = result.mappings().all()
        except DBAPIError as exc:
            if not isinstance(root_cause(exc), pg.LockNotAvailable):
                raise
            return  # a lane runs it (strict, batch): its completion will see the row
        self._settle([job_id], rows, missing_ends=True)

    def _settle(
        self, wanted: list[uuid.UUID], rows: Sequence[RowMapping], missing_ends: bool
    ) -> None:
        found = {uuid.UUID(str(row["id"])): row for row in rows}
        for job_id in wanted:
            row = found.get(job_id)
            futures = self._waiting.get(job_id, [])
            if row is None and missing_ends:
                for future in futures:
                    if not future.done():
                        future.set_exception(JobNotFound(f"no job {job_id}"))
            elif row is not None and row["status"] in JOB_FINISHED_STATUSES:
                info = JobInfo.from_row(row)
                for future in futures:
                    if not future.done():
                        future.set_result(info)

    async def close(self) -> None:
        if self._safety is not None:
            self._safety.cancel()
            with contextlib.suppress(BaseException):
                await self._safety
        if self._tasks:  # the row removals finish (a database away: at most 5 s, then stop)
            await asyncio.wait(list(self._tasks), timeout=5)
            for task in list(self._tasks):
                task.cancel()
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(Exception):
                await listener.close()
