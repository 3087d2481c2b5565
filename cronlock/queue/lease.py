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

The commit fence. A drainer whose lock connection is cut while its lanes' connections live on
could otherwise commit jobs after a standby took the lock. So the active drainer also holds an
*alive token* in its lock transaction (a lock of the queue's alive namespace, a random key of
its own), and every lane checks ``sql.FENCE_CHECK`` before it commits, in the statement of
the batch's outcome write (``sql.fenced``, with ``Fence.params``): take the queue's barrier
lock shared, then see whether the token is still held; if not, the lane rolls back. A
drainer that becomes active, before its first claim, waits until no other backend holds a
token of the queue (the previous holder's lock transaction ended entirely)
and then takes the barrier exclusively for a moment (``_fence_up``): a lane of the old drainer
that checked its token before that holds the barrier shared until it has committed or rolled
back, and one that checks after finds its token gone. So no commit of a drainer that lost its
lock lands after its successor's first claim (DESIGN.md invariant 11), whatever the timing.

Standing by never needs a cancel request. A standby waits for the lock in a savepoint with a
``lock_timeout`` (``WAIT_SLICE``): the lock is granted the moment it is free, and between two
slices nothing runs on the connection, so a standby told to stop rolls back and closes it
cleanly. (A cancelled ``pg_advisory_xact_lock`` sent a cancel request, which through PgBouncer
1.18 could crash the pooler: ``disconnect_client(): bad client state``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import pg, sql
from ..database import Database
from ..locks import lock_key, namespace_key

__all__ = [
    "DEFAULT_KEEPALIVE",
    "DRAINER_NAMESPACE",
    "WAIT_SLICE",
    "Fence",
    "Keepalive",
    "Lease",
    "LockLost",
    "queue_lock_key",
]

logger = logging.getLogger("cronlock.drainer")

DRAINER_NAMESPACE = namespace_key("cronlock-drainer")
# The barrier the commit fence takes: one key per queue (the queue's key) in this namespace.
BARRIER_NAMESPACE = namespace_key("cronlock-drainer-barrier")
# Seconds a standby waits for the lock in one slice (its lock_timeout), and so at most before
# it notices a stop request: the lock itself is granted at once when it is free.
WAIT_SLICE = 0.5
# Seconds a new active drainer waits at the barrier for the previous drainer's lanes to end
# their commits; lanes still there after that are a frozen process's, and are ended.
BARRIER_WAIT = 1.0
# A new active drainer waits this long at most for the previous one's token to go (it goes
# with the previous lock transaction, within microseconds of the lock).
_TOKEN_GONE_WITHIN = 30.0


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


def alive_namespace(queue: str) -> int:
    """The namespace of a queue's alive tokens (one per active drainer, a random key)."""
    return lock_key("alive:" + queue)


class LockLost(Exception):
    """The drainer lost its lock (its lock connection is gone): a lane's commit was fenced and
    rolled back; its jobs are due again with no attempt consumed."""


@dataclass(frozen=True)
class Fence:
    """What a lane checks right before each commit: that its drainer still holds its lock."""

    queue_key: int
    alive_namespace: int
    token: int
    schema: str

    @functools.cached_property
    def params(self) -> dict[str, int]:
        """FENCE_CHECK's parameters, which a lane's last write sends with it (``sql.fenced``)."""
        return {
            "barrier_namespace": BARRIER_NAMESPACE,
            "key": self.queue_key,
            "alive_namespace": self.alive_namespace,
            "token": self.token,
        }


# The lock connection's keepalives unless a drainer is given others (None: the server's).
DEFAULT_KEEPALIVE = Keepalive()

# What losing the lock connection looks like from here.


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
        self._lost = asyncio.Event()  # the lock connection closed under us
        # A random key of this drainer's own: a positive int4, never 0.
        self.fence = Fence(
            queue_lock_key(queue),
            alive_namespace(queue),
            secrets.randbelow(2**31 - 1) + 1,
            database.schema,
        )

    def _statement(self, statement: Any) -> pg.AsyncpgStatement:
        return pg.AsyncpgStatement.of(statement, self.database.schema)

    @property
    def driver(self) -> pg.DriverConnection:
        assert self._driver is not None, "connect() first"
        return self._driver

    async def connect(self) -> None:
        # A bare asyncpg connection: the lock must outlive pooled checkouts.
        self._driver = await pg.connect(self.database, f"cronlock-drainer:{self.queue}")
        self._driver.add_termination_listener(lambda _conn: self._lost.set())

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
        if not await self.driver.fetchval(try_lock.sql, *try_lock.args(**self._lock_args)):
            return False
        await self._fence_up()
        return True

    async def wait(self, stopping: asyncio.Event) -> bool:
        """Wait for the lock as a standby; False when stopped before getting it.

        One slice at a time, each a savepoint with a ``lock_timeout``: the lock is granted the
        moment it is free, and a stop request is seen between slices, when no statement runs
        that would need a cancel request (see the module docstring)."""
        logger.info(
            "standing by for queue %s",
            self.queue,
            extra={"action": "drainer_standby", "queue": self.queue},
        )
        driver = self.driver
        lock = self._statement(sql.LOCK_XACT)
        lock_args = lock.args(**self._lock_args)
        timeout = self._statement(sql.LOCK_TIMEOUT_LOCAL)
        await driver.fetch(timeout.sql, *timeout.args(timeout=f"{int(WAIT_SLICE * 1000)}ms"))
        while not stopping.is_set():
            attempt = driver.transaction()  # a SAVEPOINT: a timed-out wait rolls back to it
            await attempt.start()
            try:
                await driver.fetchval(lock.sql, *lock_args)
            except pg.LockNotAvailable:
                await attempt.rollback()
                continue
            await attempt.commit()  # RELEASE: the lock stays with the lock transaction
            await driver.fetch(timeout.sql, *timeout.args(timeout="0"))
            await self._fence_up()
            return True
        return False

    async def _fence_up(self) -> None:
        """Just active: take this drainer's alive token, wait until the previous drainer's is
        gone, then pass the barrier, which waits for its lanes' commits in progress (see the
        module docstring). Only then may a lane claim."""
        driver, fence = self.driver, self.fence
        lock = self._statement(sql.LOCK_XACT)
        await driver.fetchval(
            lock.sql, *lock.args(namespace=fence.alive_namespace, key=fence.token)
        )
        others = self._statement(sql.FENCE_OTHER_HOLDERS)
        others_args = others.args(namespace_oid=fence.alive_namespace & 0xFFFFFFFF)
        deadline = time.monotonic() + _TOKEN_GONE_WITHIN
        while await driver.fetchval(others.sql, *others_args):
            if time.monotonic() > deadline:
                logger.warning(
                    "the previous drainer's alive token is still held after %g s; going on",
                    _TOKEN_GONE_WITHIN,
                    extra={"action": "fence_token_held", "queue": self.queue},
                )
                break
            await asyncio.sleep(0.001)
        timeout = self._statement(sql.LOCK_TIMEOUT_LOCAL)
        stalled = self._statement(sql.FENCE_TERMINATE_STALLED)
        await driver.fetch(timeout.sql, *timeout.args(timeout=f"{int(BARRIER_WAIT * 1000)}ms"))
        while True:
            barrier = driver.transaction()  # a SAVEPOINT: its rollback releases the barrier
            await barrier.start()
            try:
                await driver.fetchval(
                    lock.sql, *lock.args(namespace=BARRIER_NAMESPACE, key=fence.queue_key)
                )
            except pg.LockNotAvailable:
                # A lane of the old drainer sits between its fence and its commit: frozen.
                # Ending its backend rolls it back, as the fence would have.
                await barrier.rollback()
                ended = await driver.fetch(
                    stalled.sql,
                    *stalled.args(
                        namespace_oid=BARRIER_NAMESPACE & 0xFFFFFFFF,
                        key_oid=fence.queue_key & 0xFFFFFFFF,
                    ),
                )
                logger.warning(
                    "ended %d lane connection(s) of the previous drainer, stalled at their "
                    "commit for over %g s",
                    len(ended),
                    BARRIER_WAIT,
                    extra={"action": "fence_stalled_lanes", "queue": self.queue},
                )
                continue
            await barrier.rollback()
            break
        await driver.fetch(timeout.sql, *timeout.args(timeout="0"))

    async def ping(self) -> None:
        """Let the lock transaction idle without a snapshot. A statement sent with the extended
        protocol (asyncpg's fetch*) leaves its unnamed portal, and the portal's snapshot, open
        until the next statement: in the lock transaction that pins the database's xmin
        horizon until the next ping, so the claim's index entries of the jobs completed since
        cannot be marked dead and every claim visits their rows again. PING goes by the
        simple protocol, which drops the portal."""
        await self.driver.execute(self._ping.sql)

    async def watch(self, on_lost: Callable[[], None]) -> str:
        """Until the lock connection dies (its close is seen at once, a silent death by the
        ping every heartbeat): then call ``on_lost`` (another drainer may be active now; the
        fence keeps this one's lanes from committing) and return what happened. Runs until
        cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), self.heartbeat_interval)
            if self._lost.is_set():
                return self._on_lost("its connection closed", on_lost)
            try:
                await pg.answer_within(self.driver, self.ping(), self.heartbeat_interval * 3)
            except Exception as exc:
                # Only an answered ping proves the lock: whatever the driver raises instead
                # (asyncpg's InternalClientError, too, when the socket goes mid-ping).
                return self._on_lost(f"{type(exc).__name__}: {exc}", on_lost)

    def _on_lost(self, why: str, on_lost: Callable[[], None]) -> str:
        message = f"lost the drainer lock ({why})"
        logger.error(message, extra={"action": "lock_lost", "queue": self.queue})
        on_lost()
        return message

    async def release(self) -> None:
        """End the lock transaction (nothing was written in it): a standby takes over."""
        if self._lock_transaction is not None:
            try:
                await self._lock_transaction.rollback()
            except (OSError, pg.ServerError, pg.ClientError):
                pass
            except Exception as exc:
                # asyncpg's "cannot switch to state …" when the cut connection's socket went
                # mid-statement: the lock went with the connection, there is nothing to end.
                if not pg.connection_lost(exc):
                    raise

    def close(self) -> None:
        if self._driver is not None:
            self._driver.terminate()
