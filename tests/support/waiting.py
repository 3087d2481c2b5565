"""Waiting on conditions with a deadline, never on a fixed sleep (Oban's ``with_backoff``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


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
