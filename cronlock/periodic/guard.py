"""The guard of a chunked run: the task's advisory lock, held on a connection of its own.

A run that is one transaction takes ``pg_try_advisory_xact_lock`` in that transaction. A
chunked run (``commit_every``) commits many transactions, and the lock must outlive each of
them, so it is held as the drainer holds its queue's (``queue/lease.py``): in a transaction
on a dedicated connection that only takes the lock and idles. That transaction writes nothing
(no transaction id) and, its last statement sent on the simple query protocol, keeps no
snapshot: it holds back no vacuum for however long the run lasts, and no server-side idle
timeout ends it (they are disabled in it, transaction-local). Its keepalives are the drainer
lock's, so a vanished host's lock goes in seconds. A transaction-level lock also works behind
PgBouncer in transaction mode (the guard then pins one server connection for the run, beside
the one its chunks use). The run asks the guard before every chunk commits (``alive``): a run
whose guard connection died has lost its lock, and must not commit.
"""

from __future__ import annotations

from .. import pg, sql
from ..database import Database
from ..queue.lease import DEFAULT_KEEPALIVE

__all__ = ["PING_TIMEOUT", "Guard"]

# How long the guard's ping may take before the lock counts as lost (seconds).
PING_TIMEOUT = 10.0

# What losing the guard's connection looks like from here.
_LOST = (OSError, TimeoutError, pg.ServerError, pg.ClientError)


class Guard:
    """One chunked run's lock connection (``take``, then ``alive`` per chunk, ``release``
    in the end, whatever happened), for the task ``name`` and its lock ``(namespace, key)``."""

    def __init__(self, database: Database, name: str, namespace: int, key: int) -> None:
        self.database = database
        self.name = name
        self.lock = {"namespace": namespace, "key": key}
        self._driver: pg.DriverConnection | None = None
        self._lock_transaction: pg.DriverTransaction | None = None
        self._ping = self._statement(sql.PING)

    def _statement(self, statement: object) -> pg.AsyncpgStatement:
        return pg.AsyncpgStatement.of(statement, self.database.schema)  # type: ignore[arg-type]

    @property
    def backend_pid(self) -> int | None:
        """The guard's server process (the lock's holder), once connected."""
        return None if self._driver is None else self._driver.get_server_pid()

    async def take(self) -> bool:
        """Connect, begin the lock transaction and try the lock; False when another run holds
        it (the connection is then closed)."""
        driver = self._driver = await pg.connect(self.database, f"cronlock-run:{self.name}")
        self._lock_transaction = driver.transaction()
        await self._lock_transaction.start()
        keepalive = self._statement(sql.KEEPALIVE_SETTINGS)
        await driver.fetch(
            keepalive.sql, *keepalive.args(**DEFAULT_KEEPALIVE.params(is_local=True))
        )
        no_timeouts = self._statement(sql.NO_TIMEOUTS_LOCAL)
        await driver.fetch(no_timeouts.sql, *no_timeouts.args())
        try_lock = self._statement(sql.LOCK_TRY_XACT)
        locked = bool(
            await driver.fetchval(
                try_lock.sql,
                *try_lock.args(**self.lock),
            )
        )
        if not locked:
            await self.release()
            return False
        # The extended protocol's portal keeps the last statement's snapshot until the next
        # one: a statement on the simple protocol drops it.
        await driver.execute(self._ping.sql)
        return True

    async def alive(self) -> bool:
        """Whether the lock is still held (its connection answers)."""
        driver = self._driver
        if driver is None or driver.is_closed():
            return False
        try:
            await pg.answer_within(driver, driver.execute(self._ping.sql), PING_TIMEOUT)
        except Exception:
            # Only an answered ping proves the lock. When the server ends the connection
            # mid-ping, asyncpg can also raise its InternalClientError ("cannot switch to
            # state 15; another operation is in progress"), which is none of _LOST: whatever
            # the driver raises instead of an answer, the lock counts as lost.
            return False
        return True

    async def release(self) -> None:
        """End the lock transaction (nothing was written in it) and close the connection."""
        driver, self._driver = self._driver, None
        transaction, self._lock_transaction = self._lock_transaction, None
        if driver is None:
            return
        try:
            if transaction is not None:
                await pg.answer_within(driver, transaction.rollback(), PING_TIMEOUT)
            await pg.answer_within(driver, driver.close(), PING_TIMEOUT)
        except _LOST:
            driver.terminate()
