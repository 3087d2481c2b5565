"""Serving: the long-running parts with a graceful shutdown, for the command line and for an
application that embeds cronlock.

``serve_worker`` runs a drainer as a worker (standby, then active, until stopped),
``serve_drain`` drains until nothing is due, ``serve_scheduler`` fires the periodic tasks and,
if given one, supervises a drainer beside them. Each stops when the caller's ``stop`` event is
set or, with ``handle_signals=True``, on SIGTERM or SIGINT; an application that owns its
signals leaves them alone and sets the event instead. The handlers are installed for as long
as the call serves and the previous ones are put back when it returns.

Stopping is graceful. A drainer stops claiming, its jobs in flight get ``grace_period``
seconds to finish and commit, claimed jobs not yet started are handed back; a signal after the
stop request, or the end of the grace period, aborts it (its jobs in flight roll back and are
due again). The scheduler stops firing and gives its runs in flight the Scheduler's
``shutdown_grace``.

A database restart or outage is ridden out: a worker (and the drainer beside the scheduler)
that loses its database waits for it with backoff and jitter and stands by again
(``outage.py``), and gives up only after the ``Reconnect``'s ``give_up_after``. A drainer
served beside the scheduler that ends on its own all the same is started again after
``restart_delay``: in one process the scheduler is its supervisor, and the process does not
exit for systemd to restart it. One that refused to serve its queue beside drainers of the
other kind (``DrainerConflict``, see ``queue/shared.py``) is logged and not started again;
``serve_worker`` and ``serve_drain`` raise it.

``asyncio.run`` is the caller's: the command line's, or the application's own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import signal
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from .errors import DrainerConflict
from .outage import DEFAULT_RECONNECT, Reconnect
from .outcome import DrainResult
from .queue.drainer import Drainer
from .scheduler import Scheduler

__all__ = [
    "DEFAULT_GRACE_PERIOD",
    "DRAINER_RESTART_DELAY",
    "OnSignal",
    "serve_drain",
    "serve_scheduler",
    "serve_worker",
]

logger = logging.getLogger("cronlock.drainer")

# Seconds a drainer's jobs in flight get to finish after a stop request (SIGTERM).
DEFAULT_GRACE_PERIOD = 30.0
# Seconds before a drainer that ended on its own (it lost its database) starts again.
DRAINER_RESTART_DELAY = 5.0

SIGNALS = (signal.SIGTERM, signal.SIGINT)


# Told of each signal a serve call handles: the signal, and whether it aborts (a signal after
# the stop request) rather than asks for a graceful stop. The command line says what happens.
OnSignal = Callable[[signal.Signals, bool], None]


class _Shutdown:
    """One serve call's stop requests: the caller's event, and the signals when asked.

    The first request sets ``stop``; a signal that comes after it sets ``urgent`` too."""

    def __init__(self, stop: asyncio.Event | None, on_signal: OnSignal | None = None) -> None:
        self.stop = stop if stop is not None else asyncio.Event()
        self.urgent = asyncio.Event()
        self.on_signal = on_signal

    def _signalled(self, signum: signal.Signals) -> None:
        urgent = self.stop.is_set()
        if urgent:
            self.urgent.set()
        self.stop.set()
        if self.on_signal is not None:
            self.on_signal(signum, urgent)

    @contextlib.contextmanager
    def signals(self, handle: bool) -> Iterator[None]:
        if not handle:
            yield
            return
        loop = asyncio.get_running_loop()
        previous: dict[signal.Signals, Any] = {}
        for signum in SIGNALS:
            previous[signum] = signal.getsignal(signum)
            loop.add_signal_handler(signum, self._signalled, signum)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                loop.remove_signal_handler(signum)
                if handler is not None:  # None: not set from Python, nothing to put back
                    signal.signal(signum, handler)


async def _serve(
    drainer: Drainer,
    run: Callable[[], Awaitable[DrainResult]],
    shutdown: _Shutdown,
    grace_period: float,
) -> DrainResult:
    """``run`` the drainer; on a stop request stop it, and abort it when the grace period
    ends or the request turns urgent."""

    async def stop_when_asked() -> None:
        await shutdown.stop.wait()
        drainer.stop()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(shutdown.urgent.wait(), grace_period)
        drainer.abort()

    watcher = asyncio.create_task(stop_when_asked())
    try:
        return await run()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def serve_worker(
    drainer: Drainer,
    *,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    reconnect: Reconnect | None = DEFAULT_RECONNECT,
    stop: asyncio.Event | None = None,
    handle_signals: bool = False,
    on_signal: OnSignal | None = None,
) -> DrainResult:
    """Run ``drainer`` (``app.drainer(...)``) as a worker until stopped: it stands by while
    another drainer of its queue is active, takes over when that one stops or dies, and
    processes jobs as they come. Returns its result once stopped (the module docstring says
    how a stop is graceful); ``cronlock worker`` is this. A database restart or outage is
    ridden out as ``reconnect`` says (``outage.py``; ``None``: the worker ends, failed).
    ``on_signal`` is told of each signal handled (the signal; whether it aborts)."""
    shutdown = _Shutdown(stop, on_signal)
    with shutdown.signals(handle_signals):
        return await _serve(
            drainer, functools.partial(drainer.work, reconnect=reconnect), shutdown, grace_period
        )


async def serve_drain(
    drainer: Drainer,
    *,
    max_seconds: float | None = None,
    grace_period: float = DEFAULT_GRACE_PERIOD,
    stop: asyncio.Event | None = None,
    handle_signals: bool = False,
    on_signal: OnSignal | None = None,
) -> DrainResult:
    """Drain with ``drainer`` until no job is due or ``max_seconds`` passed (skipped when
    another drainer is active), stopping gracefully when asked; ``cronlock drain`` is this.
    ``on_signal`` is ``serve_worker``'s."""
    shutdown = _Shutdown(stop, on_signal)
    with shutdown.signals(handle_signals):
        return await _serve(
            drainer, lambda: drainer.drain(max_seconds=max_seconds), shutdown, grace_period
        )


async def serve_scheduler(
    scheduler: Scheduler,
    *,
    drainer: Callable[[], Drainer] | None = None,
    restart_delay: float = DRAINER_RESTART_DELAY,
    stop: asyncio.Event | None = None,
    handle_signals: bool = False,
) -> None:
    """Fire the scheduler's tasks on time until stopped, then let runs in flight finish
    within its ``shutdown_grace``; ``cronlock scheduler`` is this.

    With ``drainer`` (a factory: ``app.drainer``, or a ``functools.partial`` of it for other
    options) a worker runs beside the tasks, its jobs in flight getting the same grace as the
    runs; it rides out a lost database as the scheduler does (its ``reconnect``), and one
    that ends on its own all the same is made again after ``restart_delay`` seconds. Returns
    when stopped, or when the scheduler gave up on the database (its ``gave_up`` says why).
    """
    shutdown = _Shutdown(stop)
    with shutdown.signals(handle_signals):
        supervisor = None
        if drainer is not None:
            supervisor = asyncio.create_task(
                _supervise(
                    drainer,
                    shutdown,
                    scheduler.shutdown_grace,
                    restart_delay,
                    scheduler.reconnect,
                )
            )
        try:
            await scheduler.serve(shutdown.stop)
        finally:
            shutdown.stop.set()  # the scheduler may have stopped on its own (it gave up)
            if supervisor is not None:
                await asyncio.gather(supervisor, return_exceptions=True)


async def _supervise(
    make: Callable[[], Drainer],
    shutdown: _Shutdown,
    grace_period: float,
    restart_delay: float,
    reconnect: Reconnect | None,
) -> None:
    # The scheduler's signals do not abort its drainer early: both get the one grace.
    calm = _Shutdown(shutdown.stop)
    while True:
        drainer = make()
        try:
            result = await _serve(
                drainer, functools.partial(drainer.work, reconnect=reconnect), calm, grace_period
            )
        except DrainerConflict as conflict:
            # Exclusive and shared drainers on one queue: a restart would meet them again.
            logger.error(
                "drainer not started: %s",
                conflict,
                extra={"action": "drainer_conflict", "queue": drainer.queue},
            )
            return
        logger.log(
            logging.INFO if shutdown.stop.is_set() else logging.WARNING,
            "drainer stopped: %s",
            json.dumps(result.to_dict()),
            extra={"action": "drainer_stopped", "queue": result.queue},
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(shutdown.stop.wait(), restart_delay)
        if shutdown.stop.is_set():
            return
