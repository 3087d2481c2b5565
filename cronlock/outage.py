"""Riding out a database outage: wait, with backoff and jitter, until the server answers again.

A worker that loses its database (a restart, a failover, a network cut, a pooler restarted)
does not exit: it waits here, trying a fresh connection at growing intervals, one log line per
try, and stands by again once one succeeds (``queue/drainer.py``); the scheduler's tasks and
``serve`` need no such wait, each run and request opening its own connection. Nothing is lost
meanwhile: what was in flight rolled back with the connections (or, in the lease mode, is
returned by the liveness rule) and no attempt is charged for it (DESIGN.md invariant 9).

The intervals double from ``first_delay`` up to ``max_delay``, each drawn from its upper half,
so that the workers of one server do not all knock at the same instant when it comes back;
the short ceiling is what keeps draining within about two seconds of the server's return.
``give_up_after`` seconds without the database end the wait for good (``None``: never).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import pg, sql
from .database import Database
from .outcome import error_line

__all__ = ["DEFAULT_RECONNECT", "OutageEnd", "Reconnect", "RideOut", "ride_out"]

logger = logging.getLogger("cronlock.outage")

# A try that neither connects nor fails within this long counts as failed (a dropped route
# can leave a connect hanging for minutes).
_TRY_TIMEOUT = 10.0


@dataclass(frozen=True)
class Reconnect:
    """How to wait for a lost database: the backoff between tries and when to give up."""

    first_delay: float = 0.1
    max_delay: float = 1.5
    give_up_after: float | None = None  # seconds without the database; None: never

    def __post_init__(self) -> None:
        if not 0 < self.first_delay <= self.max_delay:
            raise ValueError("0 < first_delay <= max_delay, please")
        if self.give_up_after is not None and self.give_up_after < 0:
            raise ValueError("give_up_after must not be negative")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed try number ``attempt`` (1, 2, …)."""
        ceiling = min(self.max_delay, self.first_delay * 2.0 ** min(attempt - 1, 30))
        return ceiling * rng.uniform(0.5, 1.0)


DEFAULT_RECONNECT = Reconnect()


class OutageEnd(enum.Enum):
    BACK = "back"  # the database answers again
    STOPPED = "stopped"  # a stop was asked for meanwhile
    GAVE_UP = "gave_up"  # give_up_after passed without it


@dataclass(frozen=True)
class RideOut:
    """How a wait for the database ended, after how long and how many tries."""

    end: OutageEnd
    seconds: float
    attempts: int
    last_error: str | None

    def gave_up_line(self, who: str) -> str:
        return (
            f"{who}: gave up after {self.seconds:.0f} s without the database "
            f"({self.attempts} tries; last: {self.last_error})"
        )


async def ride_out(
    database: Database,
    policy: Reconnect,
    *,
    who: str,
    cause: str,
    stop: asyncio.Event,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> RideOut:
    """Wait until ``database`` takes a connection and answers, ``stop`` is set, or the policy
    gives up; ``who`` and ``cause`` name the waiter and what it lost, for the log."""
    rng = rng or random.Random()
    started = clock()
    logger.warning(
        "%s lost the database (%s): reconnecting%s",
        who,
        cause,
        f", giving up after {policy.give_up_after:g} s" if policy.give_up_after is not None else "",
        extra={"action": "database_lost"},
    )
    attempt = 0
    last_error: str | None = None
    while True:
        if stop.is_set():
            return RideOut(OutageEnd.STOPPED, clock() - started, attempt, last_error)
        attempt += 1
        error = await _try(database, who)
        down = clock() - started
        if error is None:
            logger.info(
                "%s: the database answers again after %.1f s (%d tries)",
                who,
                down,
                attempt,
                extra={"action": "database_back"},
            )
            return RideOut(OutageEnd.BACK, down, attempt, last_error)
        last_error = error
        if policy.give_up_after is not None and down >= policy.give_up_after:
            return RideOut(OutageEnd.GAVE_UP, down, attempt, last_error)
        wait = policy.delay(attempt, rng)
        if policy.give_up_after is not None:
            wait = min(wait, max(policy.give_up_after - down, 0.0))
        logger.warning(
            "%s: the database is still unreachable after %.1f s (try %d: %s); next try in %.2f s",
            who,
            down,
            attempt,
            error,
            wait,
            extra={"action": "database_unreachable"},
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)


async def _try(database: Database, who: str) -> str | None:
    """None if a fresh connection (no pool: the pool's may all be dead) runs a statement;
    else the one line of what failed."""
    try:
        async with asyncio.timeout(_TRY_TIMEOUT):
            driver = await pg.connect(database, f"cronlock {who} reconnecting")
            try:
                await driver.execute(pg.AsyncpgStatement.of(sql.PING, database.schema).sql)
            finally:
                with contextlib.suppress(Exception):
                    await driver.close()
    except TimeoutError:
        return f"no answer within {_TRY_TIMEOUT:g} s"
    except Exception as exc:
        if not pg.connection_lost(exc) and not isinstance(exc, pg.ServerError):
            raise
        return error_line(exc)
    return None
