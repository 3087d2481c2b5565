"""Plain ``def`` handlers: run in a bounded thread pool, in the job's own transaction.

A ``def`` handler gets the sync ``Session`` its attempt's ``AsyncSession`` wraps
(``AsyncSession.sync_session``), so its writes are in the job's transaction (its savepoint; in
the lease mode, the completion's) and commit if and only if the job completes, as an ``async
def`` handler's do. It runs in a thread of its drainer's pool (``threads`` of them, the lane
count by default), so a blocking body (``time.sleep``, a sync HTTP call, a CPU-bound loop)
never holds the event loop: the lock keepalive, heartbeats, cancels and the other lanes go on.

The bridge is SQLAlchemy's own: every driver call of a sync session on an async engine goes
through ``sqlalchemy.util.concurrency.await_``, which hands its awaitable to the parent of a
greenlet marked ``__sqlalchemy_greenlet_provider__``. In the thread the handler runs in such a
greenlet; each awaitable it hands out runs on the drainer's event loop
(``run_coroutine_threadsafe``) and its result or exception is switched back in. It is sound
because one side at a time uses the session and its connection: while the thread runs, the
attempt on the loop only waits for it; every statement executes on the loop, where the asyncpg
connection lives; and the thread waits for each statement it asked for. ``current_job()``
works in the thread: it runs in a copy of the attempt's context.

A thread cannot be stopped. When the attempt ends before its thread does (its ``timeout``, an
operator's cancel, the drainer's abort), the bridge refuses every statement the thread asks
for from then on (``AttemptOver``, raised in the thread), cancels the one in flight, and marks
the session ``stranded``: the attempt never touches the session again and raises ``LostLease``,
so the lane throws its connection away (nothing of the job commits; in the batch mode the
batch's other jobs roll back and run again, no attempt consumed), records the failed or
cancelled attempt on a fresh connection and goes on. The thread runs on until it returns,
holding its pool slot until then, and the process waits for it at exit.

A plain ``def`` task body runs the same way, in a pool of one thread per run
(``periodic/run.py``): its ``with run.item(key)`` runs the item's async steps on the loop
through the same bridge. A run cancelled under it (the scheduler stopping) refuses its
thread's statements as above; the run's session is then closed on the loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from greenlet import getcurrent, greenlet

__all__ = ["AttemptOver", "Threads", "is_async"]


class AttemptOver(Exception):
    """Raised in a ``def`` handler's thread at a statement asked for after its attempt ended
    (its timeout, a cancel): the job's transaction is gone. A plain ``Exception``, so that
    SQLAlchemy, in the thread, does not invalidate the connection the lane is throwing away."""


class Strandable(Protocol):
    """A handler's sync session (``attempt.JobSession``/``LeaseSession``)."""

    stranded: bool


def is_async(func: Callable[..., Any]) -> bool:
    """Whether a handler is an ``async def`` (or a callable whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004 - a callable object's async __call__
    )


class _Provider(greenlet):  # type: ignore[misc]
    """A greenlet SQLAlchemy's ``await_`` switches out of with the awaitable to run."""

    __sqlalchemy_greenlet_provider__ = True


class _Call:
    """One handler run: the thread's side and the loop's, and which of them may go on."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.lock = threading.Lock()  # orders the thread's start and end with an abandon
        self.started = self.finished = self.abandoned = False
        self.statement: asyncio.Task[Any] | None = None  # in flight on the loop

    def thread_main(self, func: Callable[..., Any], *args: Any) -> Any:
        """In the pool's thread: the handler, in a provider greenlet, until it returns."""
        with self.lock:
            if self.abandoned:
                raise AttemptOver("the attempt ended before its thread started")
            self.started = True
        try:
            parent = getcurrent()
            child = _Provider(func, parent)
            child.gr_context = parent.gr_context  # current_job(): the attempt's context
            # ``child`` hands out an awaitable each time it needs the database.
            handed = child.switch(*args)
            while not child.dead:
                try:
                    value = self._on_loop(handed)
                except BaseException as exc:
                    handed = child.throw(exc)
                else:
                    handed = child.switch(value)
            return handed
        finally:
            with self.lock:
                self.finished = True

    def _on_loop(self, awaitable: Awaitable[Any]) -> Any:
        if self.abandoned:
            _close(awaitable)
            raise AttemptOver("the attempt ended (its timeout or a cancel): no more statements")
        future = asyncio.run_coroutine_threadsafe(self._statement(awaitable), self.loop)
        try:
            return future.result()
        except BaseException:
            if self.abandoned:
                raise AttemptOver("the attempt ended while this statement ran") from None
            raise

    async def _statement(self, awaitable: Awaitable[Any]) -> Any:
        # On the loop, as the abandon is: it comes before this check or after it, not within.
        if self.abandoned:
            _close(awaitable)
            raise AttemptOver("the attempt ended (its timeout or a cancel): no more statements")
        self.statement = asyncio.current_task()
        try:
            return await awaitable
        finally:
            self.statement = None

    async def abandon(self) -> bool:
        """The attempt ended first: refuse the thread's statements, stop the one in flight.
        Whether the thread is still running (then it may still touch the session)."""
        with self.lock:
            self.abandoned = True
            running = self.started and not self.finished
        statement = self.statement
        if statement is not None:
            statement.cancel()
            await asyncio.wait([statement])
        return running


def _close(awaitable: Awaitable[Any]) -> None:
    if inspect.iscoroutine(awaitable):
        awaitable.close()


class Threads:
    """A drainer's pool for ``def`` handlers: at most ``size`` run at once, the others wait
    (their wait counts against their timeout). Made on first use."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("threads must be at least 1")
        self.size = size
        self._pool: ThreadPoolExecutor | None = None

    async def run(
        self, func: Callable[..., Any], *args: Any, session: Strandable | None = None
    ) -> Any:
        """``func(*args)`` in a thread; its value, or what it raised. ``session`` is marked
        ``stranded`` if the caller stops waiting while the thread still runs."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.size, thread_name_prefix="cronlock-handler")
        loop = asyncio.get_running_loop()
        call = _Call(loop)
        context = contextvars.copy_context()
        future = loop.run_in_executor(self._pool, context.run, call.thread_main, func, *args)
        try:
            return await future
        except BaseException:
            if not future.done() or future.cancelled():  # the attempt ends first
                running = await call.abandon()
                if session is not None:
                    session.stranded = running
            raise

    def close(self) -> None:
        """Let the pool's threads end as they finish (a stranded one may still run)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
