"""Signals before a long-running command serves: SIGTERM during start-up stops it cleanly.

``worker``, ``drain`` and ``scheduler`` install their signal handlers when they start serving
(``cronlock.service``); before that they import the app, connect and check the schema, which
can take a while (a slow import, a database that is slow to answer). A SIGTERM or SIGINT in
that window would kill the process with no result line (exit 143). ``StartUp`` covers it: from
the moment the command is entered, the first signal is remembered and cancels what start-up
is awaiting, and the command then ends as it would once serving, with its result line and its
exit code.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

__all__ = ["StartUp"]

T = TypeVar("T")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StartUp:
    """The signal, if any, that came before the command started serving."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._task: asyncio.Future[Any] | None = None

    @contextmanager
    def guarded(self) -> Iterator[StartUp]:
        """Remember the first SIGTERM/SIGINT from now on (Python's handlers, for the
        synchronous part: loading the app); the serve calls replace them with their own."""
        previous = {signum: signal.getsignal(signum) for signum in _SIGNALS}
        for signum in _SIGNALS:
            signal.signal(signum, self._remember)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _remember(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)
        if self._task is not None:
            # Python's handler runs between two bytecodes of the loop's thread: hand the
            # cancel to the loop rather than touching the task from here.
            self._task.get_loop().call_soon_threadsafe(self._task.cancel)

    async def run(self, start: Coroutine[Any, Any, T]) -> T | None:
        """Await ``start`` (the command's start-up); None if a signal came before or during
        it, which cancels it."""
        if self.received is not None:
            start.close()
            return None
        task: asyncio.Future[T] = asyncio.ensure_future(start)
        self._task = task
        try:
            started = await task
        except asyncio.CancelledError:
            if not self.signalled:
                raise
            return None
        finally:
            self._task = None
        # A signal as start-up ended: its cancel came too late, but it was asked for. From
        # here to the serve call's own handlers nothing awaits, so no signal slips between.
        return None if self.signalled else started

    @property
    def signalled(self) -> bool:
        return self.received is not None
