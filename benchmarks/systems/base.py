"""The adapter every measured queue implements, so that one harness drives them all.

A workload (``benchmarks.agent``) only ever calls these methods; what "claimed" and
"completed" mean is read back from each system's own tables, with the database's timestamps
where the system writes them (see each adapter's ``window``).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["QueueSystem", "Unsupported", "Window"]


class Unsupported(Exception):
    """The system has no such mode (a raw baseline has no idle worker to measure)."""


@dataclass(frozen=True)
class Window:
    """A drain as the database recorded it: first claim, last completion (epoch seconds)."""

    first_claim: float
    last_completion: float
    completed: int
    # p95 of each job's claim -> completion, as the database recorded them (the reference's
    # table has this column); None when the system does not keep both timestamps.
    p95_ms: float | None = None

    @property
    def seconds(self) -> float:
        return self.last_completion - self.first_claim


class QueueSystem(abc.ABC):
    """One queue implementation with one set of options, on one database."""

    name: ClassVar[str]

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        self.url = url
        self.options = options
        # The p95 per-job latency the system itself reported for its last drain, if it keeps
        # one (cronlock's drainer does; it has no claim timestamp in the database).
        self.reported_p95_ms: float | None = None

    @abc.abstractmethod
    async def install(self) -> None:
        """Create the system's schema in the (empty) database."""

    async def close(self) -> None:  # noqa: B027 - optional: not every system holds connections
        """Release connections and pools."""

    @abc.abstractmethod
    async def enqueue_bulk(self, n: int) -> None:
        """Add ``n`` no-op jobs with the system's bulk API, committed."""

    @abc.abstractmethod
    async def enqueue_one(self) -> object:
        """Add one no-op job in a transaction of its own; its id."""

    @abc.abstractmethod
    async def drain(self) -> None:
        """Process jobs until none is left, then return."""

    async def serve(self, stop: asyncio.Event, ready: Callable[[], None]) -> None:
        """Run an idle worker until ``stop`` is set; call ``ready`` once it is running."""
        raise Unsupported(f"{self.name} has no long-running worker")

    @abc.abstractmethod
    async def window(self) -> Window:
        """First claim and last completion of the drain, from the database."""

    @abc.abstractmethod
    async def completed_at(self, ids: Sequence[object]) -> dict[object, float]:
        """Completion time (epoch seconds) of each of ``ids`` that is completed."""


async def noop(_payload: object = None) -> None:
    """The job every system runs: nothing, so the figures measure the queue itself."""
