"""Waiting on conditions with a deadline, never on a fixed sleep (Oban's ``with_backoff``), and
gates that hold a handler where a test wants it."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


async def eventually(
    probe: Callable[[], Awaitable[T]], *, timeout: float = 10.0, interval: float = 0.01
) -> T:
    """Poll ``probe`` until it returns a truthy value; fail with the last value at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value: {value!r})")
        await asyncio.sleep(interval)


def wait_for(probe: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.01) -> T:
    """The synchronous twin for probes that are not coroutines (files, processes)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value: {value!r})")
        time.sleep(interval)


async def ended_within(
    tasks: Sequence[asyncio.Task[R]],
    *,
    timeout: float = 30.0,
    about: str = "the tasks",
    describe: Callable[[], object] | None = None,
) -> list[R]:
    """The tasks' results once all have ended; at the deadline a failure that shows every
    task of the loop where it waits (a hang becomes a report of where, not a stuck run)."""
    _done, pending = await asyncio.wait(tasks, timeout=timeout)
    if pending:
        stacks = io.StringIO()
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.print_stack(limit=12, file=stacks)
        for task in pending:
            task.cancel()  # so that the test's teardown is not held up by them too
        raise AssertionError(
            f"{about}: {len(pending)} of {len(tasks)} not ended within {timeout}s"
            f"{f' ({describe()})' if describe is not None else ''}\n{stacks.getvalue()}"
        )
    return [task.result() for task in tasks]


class Gate:
    """Holds a handler until released, and says when it got there."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def hold(self) -> None:
        self.reached.set()
        await self.release.wait()
