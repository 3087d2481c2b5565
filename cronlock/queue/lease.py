"""The lease: one active drainer per queue, held as an advisory lock on a connection of its own.

A drainer opens a dedicated *lock connection* and, in one long transaction on it, takes
``pg_advisory_xact_lock(namespace, key-of-queue)``: ``drain`` tries once and is skipped when
another drainer is active; ``worker`` waits there as a standby and becomes active the moment
the holder's transaction ends, also when the holder dies (PostgreSQL aborts it when the socket
closes; TCP keepalives set in the transaction, ``Keepalive``, notice a dead host in seconds).
A transaction-level lock also works behind PgBouncer in transaction mode. The transaction
writes nothing and idles without a snapshot (``ping``), so it holds back no vacuum. While
active, the drainer pings it every heartbeat (``watch``): a drainer that lost it (its
connection cut, or it was paused while a standby took over) stops claiming, and whatever it
still had in flight cannot commit, since its lanes' transactions went with their connections:
PostgreSQL fences it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import pg, sql
from ..database import Database
from ..locks import lock_key, namespace_key

__all__ = ["DEFAULT_KEEPALIVE", "DRAINER_NAMESPACE", "Keepalive", "Lease", "queue_lock_key"]

logger = logging.getLogger("cronlock.drainer")

DRAINER_NAMESPACE = namespace_key("cronlock-drainer")


def queue_lock_key(queue: str) -> int:
    """The advisory lock key of a queue's drainers (in DRAINER_NAMESPACE)."""
    return lock_key("queue:" + queue)


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

# What losing the lock connection looks like from here.
_LOST = (OSError, TimeoutError, pg.ServerError, pg.ClientError)


class Lease:
    """One drainer's lock connection for one queue (``connect``, then ``begin``, then
    ``try_take`` or ``wait``; ``close`` in the end, whatever happened)."""

    def __init__(
        self,
        database: Database,
        queue: str,
        *,
        keepalive: Keepalive | None,
        heartbeat_interval: float,
    ) -> None:
        self.database = database
        self.queue = queue
        self.keepalive = keepalive
        self.heartbeat_interval = heartbeat_interval
        self._lock_args = {"namespace": DRAINER_NAMESPACE, "key": queue_lock_key(queue)}
        self._driver: pg.DriverConnection | None = None
        self._lock_transaction: pg.DriverTransaction | None = None
        self._ping = self._statement(sql.PING)

    def _statement(self, statement: Any) -> pg.AsyncpgStatement:
        return pg.AsyncpgStatement.of(statement, self.database.schema)

    @property
    def driver(self) -> pg.DriverConnection:
        assert self._driver is not None, "connect() first"
        return self._driver

    async def connect(self) -> None:
        # A bare asyncpg connection: the lock must outlive pooled checkouts, and cancelling a
        # waiting pg_advisory_xact_lock is cleanest at this level.
        self._driver = await pg.connect(self.database, f"cronlock-drainer:{self.queue}")

    async def begin(self) -> None:
        """The lock transaction, with its keepalives and no server-side timeouts."""
        driver = self.driver
        self._lock_transaction = driver.transaction()
        await self._lock_transaction.start()
        if self.keepalive is not None:
            settings = self._statement(sql.KEEPALIVE_SETTINGS)
            await driver.fetch(settings.sql, *settings.args(**self.keepalive.params(is_local=True)))
        no_timeouts = self._statement(sql.NO_TIMEOUTS_LOCAL)
        await driver.fetch(no_timeouts.sql, *no_timeouts.args())

    async def try_take(self) -> bool:
        """Take the lock if it is free (``drain``); False when another drainer is active."""
        try_lock = self._statement(sql.LOCK_TRY_XACT)
        return bool(await self.driver.fetchval(try_lock.sql, *try_lock.args(**self._lock_args)))

    async def wait(self, stopping: asyncio.Event) -> bool:
        """Block on the lock as a standby; False when stopped before getting it."""
        lock = self._statement(sql.LOCK_XACT)
        waiting = asyncio.ensure_future(
            self.driver.fetchval(lock.sql, *lock.args(**self._lock_args))
        )
        stopped = asyncio.ensure_future(stopping.wait())
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

    async def ping(self) -> None:
        """Let the lock transaction idle without a snapshot. A statement sent with the extended
        protocol (asyncpg's fetch*) leaves its unnamed portal, and the portal's snapshot, open
        until the next statement: in the lock transaction that pins the database's xmin
        horizon until the next ping, so the claim's index entries of the jobs completed since
        cannot be marked dead and every claim visits their rows again. PING goes by the
        simple protocol, which drops the portal."""
        await self.driver.execute(self._ping.sql)

    async def watch(self, on_lost: Callable[[], None]) -> str:
        """Ping every heartbeat until the lock connection dies: then call ``on_lost`` (another
        drainer may be active now) and return what happened. Runs until cancelled."""
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await asyncio.wait_for(self.ping(), self.heartbeat_interval * 3)
            except _LOST as exc:
                message = f"lost the drainer lock ({type(exc).__name__}: {exc})"
                logger.error(message, extra={"action": "lock_lost", "queue": self.queue})
                on_lost()
                return message

    async def release(self) -> None:
        """End the lock transaction (nothing was written in it): a standby takes over."""
        if self._lock_transaction is not None:
            with contextlib.suppress(OSError, pg.ServerError, pg.ClientError):
                await self._lock_transaction.rollback()

    def close(self) -> None:
        if self._driver is not None:
            self._driver.terminate()
