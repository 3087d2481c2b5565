"""One clock for Python and the database: a test freezes it, moves it, and both sides agree.

``TestClock`` is frozen at an instant. Python code reads it through cronlock's clock seams:
``clock.now`` is the callable ``Scheduler(app, clock=...)`` and ``App.drainer(clock=...)``
take, ``clock.now()`` the instant ``App.run(name, now=...)`` and ``Scheduler.wake(task,
now=...)`` take. The database reads it through its own ``now()``: the kit's test databases
(``cronlock.testing.databases``) resolve ``now()``, ``transaction_timestamp()``,
``statement_timestamp()`` and ``clock_timestamp()`` to functions that return the instant the
clock's one-row table holds (``cronlock.sql.testing``), and their tables' time defaults call
those functions. Setting the clock writes that row and commits, so every connection opened
by the app sees the new time in its next statement: a job's ``run_at``, a retry's backoff, a
worker's heartbeat and a run's slot are all on the test's time. ``clock.release()`` gives the
database its real clock back. Code that reads Python's own clock (``datetime.now()``: a run
without ``now=``, your code) is frozen at the same instant inside ``with
clock.python_frozen():`` (freezegun, which must be installed; the event loop's clock stays
real, so timeouts and polls keep working).

pg-boss's ``TestClock`` is the model; the difference is that cronlock's periodic side moves
too, so slots, grace, misfires and DST transitions are tested in milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Protocol

from .. import pg
from ..database import Database
from ..sql import testing as sql
from .databases import APPLICATION_NAME, run_sync


class _Freezer(Protocol):
    """What the clock needs of freezegun's frozen time: to move it."""

    def move_to(self, target_datetime: datetime) -> None: ...


__all__ = ["TestClock"]


async def _write(url: str, frozen_at: datetime | None) -> None:
    connection = await pg.connect(Database(url), APPLICATION_NAME)
    try:
        await connection.execute(sql.CLOCK_SET, frozen_at)
    finally:
        await connection.close()


async def _read(url: str) -> datetime:
    connection = await pg.connect(Database(url), APPLICATION_NAME)
    try:
        moment: datetime = await connection.fetchval(sql.CLOCK_NOW)
        return moment
    finally:
        await connection.close()


def _aware(moment: datetime) -> datetime:
    if not isinstance(moment, datetime) or moment.tzinfo is None:
        raise ValueError(f"the test clock takes a timezone-aware datetime, not {moment!r}")
    return moment.astimezone(UTC)


class TestClock:
    """The frozen time of one test database (its URL), for Python and SQL alike; see the
    module docstring. Made frozen at ``start`` (default: the real time now).

    The methods are synchronous, and callable from a coroutine too (they block its loop for
    the one short statement they write)."""

    __test__ = False  # a class named Test*, not a test class pytest should collect

    def __init__(self, url: str, start: datetime | None = None) -> None:
        self.url = url
        self._now = _aware(start) if start is not None else datetime.now(UTC)
        self._frozen = True
        self._python: _Freezer | None = None
        run_sync(_write(url, self._now))

    def now(self) -> datetime:
        """The frozen instant (UTC); the real time once ``release``d."""
        return self._now if self._frozen else datetime.now(UTC)

    def set(self, moment: datetime) -> datetime:
        """Freeze both clocks at ``moment`` (timezone-aware; any zone); it, in UTC."""
        self._now = _aware(moment)
        self._frozen = True
        run_sync(_write(self.url, self._now))
        if self._python is not None:
            self._python.move_to(self._now)
        return self._now

    def advance(self, delta: timedelta | None = None, /, **parts: float) -> datetime:
        """Move both clocks on by ``delta`` or by ``timedelta(**parts)`` (``minutes=5``);
        the new instant. Elapsed time is absolute: an hour across a DST change is an hour."""
        step = (delta or timedelta()) + timedelta(**parts)
        return self.set(self.now() + step)

    @contextmanager
    def python_frozen(self) -> Iterator[None]:
        """Freeze Python's ``datetime.now()`` and ``time.time()`` too (freezegun) at the
        clock's instant for the block, moved by every ``set`` and ``advance`` in it. The
        event loop keeps its real clock (freezegun's ``real_asyncio``)."""
        if not self._frozen:
            raise RuntimeError("the test clock is released: set() it before freezing Python")
        from freezegun import freeze_time

        with freeze_time(self._now, real_asyncio=True) as factory:
            self._python = factory
            try:
                yield
            finally:
                self._python = None

    def release(self) -> None:
        """Give Python and the database the real time back (``set`` freezes them again).
        Not inside ``python_frozen``."""
        if self._python is not None:
            raise RuntimeError("release() inside python_frozen(): leave the block first")
        self._frozen = False
        run_sync(_write(self.url, None))

    def database_now(self) -> datetime:
        """``now()`` as the database's sessions see it (a check that both clocks agree)."""
        return run_sync(_read(self.url))
