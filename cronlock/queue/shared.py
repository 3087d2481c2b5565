"""Shared queues: any number of active drainers on one queue, and exclusive ones kept apart.

A queue's drainers are *exclusive* by default: one is active and the others stand by
(``lease.py``). A *shared* drainer (``Drainer(shared=True)``, ``cronlock worker --shared``)
takes the same advisory lock of its queue in shared mode, so any number of them, on any hosts,
are active at once. Nothing else changes: their lanes claim with ``FOR UPDATE SKIP LOCKED`` as
an exclusive drainer's do, so in every commit mode a job is claimed by one lane at a time and
its lease is what that commit mode makes it (in ``strict`` and ``batch`` the claiming
transaction; a dead drainer's jobs are due again at once and none of its writes apply). What
the exclusive lock adds, a single drainer committing at a time (DESIGN.md invariant 11), is
what a shared queue gives up for its throughput. The shared lock transaction is the exclusive
one's: keepalives, no snapshot while it idles, a ping every heartbeat, and a drainer that loses
it stops claiming.

Exclusive and shared drainers never serve one queue together, and the lock tells them apart:

- A shared drainer that cannot take its shared lock meets an exclusive drainer, active or
  standing by (PostgreSQL queues a shared request behind a waiting exclusive one): it refuses
  to start (``DrainerConflict``; the command line's exit code 2). It never stands by.
- An exclusive drainer that cannot take its lock asks ``pg_locks`` whether shared drainers hold
  it: then it refuses the same way. Otherwise another exclusive drainer is active and it is
  skipped (``drain``) or stands by (``worker``), as always. A standby asks again every
  heartbeat while it waits, so shared drainers that started in the moment between its question
  and its wait cannot keep it waiting behind them unseen.

Switching a queue from one kind to the other is therefore a stop of every drainer of one kind
before the other kind starts.
"""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy.exc import DBAPIError

from .. import pg, sql
from ..database import Database
from ..errors import DrainerConflict
from .lease import DRAINER_NAMESPACE, Keepalive, Lease, queue_lock_key

__all__ = ["ExclusiveLease", "SharedLease", "lease_for"]

_OID = 0xFFFFFFFF  # pg_locks shows the two int4 keys as oids (unsigned)


def lease_for(
    database: Database,
    queue: str,
    *,
    shared: bool,
    keepalive: Keepalive | None,
    heartbeat_interval: float,
) -> Lease:
    """The lease of a drainer of ``queue``: shared, or exclusive (single active, standbys)."""
    kind = SharedLease if shared else ExclusiveLease
    return kind(database, queue, keepalive=keepalive, heartbeat_interval=heartbeat_interval)


def _lock_args(queue: str) -> dict[str, int]:
    return {"namespace": DRAINER_NAMESPACE, "key": queue_lock_key(queue)}


def _holders_args(queue: str) -> dict[str, int]:
    return {"namespace_oid": DRAINER_NAMESPACE & _OID, "key_oid": queue_lock_key(queue) & _OID}


class SharedLease(Lease):
    """A shared drainer's lock: taken at once beside other shared drainers, or refused."""

    async def try_take(self) -> bool:
        statement = pg.AsyncpgStatement.of(sql.LOCK_TRY_XACT_SHARED, self.database.schema)
        if await self.driver.fetchval(statement.sql, *statement.args(**_lock_args(self.queue))):
            return True
        raise DrainerConflict(
            f"queue {self.queue!r} has an exclusive drainer (active or standing by): a shared "
            "drainer cannot join it; stop it, or start this one without --shared"
        )

    async def wait(self, stopping: asyncio.Event) -> bool:
        # Shared drainers never stand by: with shared drainers only, the lock is always free.
        return await self.try_take()


def _exclusive_refused(queue: str, holders: int) -> DrainerConflict:
    return DrainerConflict(
        f"queue {queue!r} is drained by {holders} shared drainer(s): an exclusive drainer "
        "cannot serve it beside them; stop them, or start this one with --shared"
    )


class ExclusiveLease(Lease):
    """The exclusive lease (``lease.py``) that refuses to serve a queue shared drainers hold."""

    async def shared_holders(self) -> int:
        """How many shared drainers hold this queue's lock now (asked on the lock connection)."""
        statement = pg.AsyncpgStatement.of(sql.LOCK_SHARED_HOLDERS, self.database.schema)
        return int(
            await self.driver.fetchval(statement.sql, *statement.args(**_holders_args(self.queue)))
        )

    async def try_take(self) -> bool:
        if await super().try_take():
            return True
        holders = await self.shared_holders()
        if holders:
            raise _exclusive_refused(self.queue, holders)
        return False

    async def wait(self, stopping: asyncio.Event) -> bool:
        if await self.try_take():
            return True
        # Stand by, asking every heartbeat (on a pooled connection: the lock connection is
        # busy waiting) whether shared drainers took the lock meanwhile.
        given_up = asyncio.Event()
        found: list[int] = []

        async def watch_for_shared() -> None:
            statement = sql.LOCK_SHARED_HOLDERS
            while True:
                await asyncio.sleep(self.heartbeat_interval)
                with contextlib.suppress(OSError, DBAPIError):  # asked again next beat
                    async with self.database.connect() as conn:
                        holders = (
                            await conn.execute(statement, _holders_args(self.queue))
                        ).scalar_one()
                    if holders:
                        found.append(holders)
                        given_up.set()
                        return

        async def stop_when_stopping() -> None:
            await stopping.wait()
            given_up.set()

        helpers = [
            asyncio.create_task(watch_for_shared()),
            asyncio.create_task(stop_when_stopping()),
        ]
        try:
            taken = await super().wait(given_up)
        finally:
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
        if not taken and found:
            raise _exclusive_refused(self.queue, found[0])
        return taken
