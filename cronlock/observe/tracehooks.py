"""Where cronlock's traced paths find a tracer, without importing OpenTelemetry.

``cronlock.tracing`` (the 'otel' extra) implements ``Tracer`` and an app holds one only once
``cronlock.tracing.instrument(app)`` ran: the paths that could be traced check for ``None``
and go on as before, so an app that is not traced never imports the extra, and its enqueue,
claim and run statements are the untraced ones. A periodic run's items reach the run's span
through ``ITEM_EVENTS``, set for as long as the span is current.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..outcome import RunResult

__all__ = ["ITEM_EVENTS", "ItemEvent", "Tracer"]

# An item's end, told to the current run's span: its key, and the error if it failed.
ItemEvent = Callable[[object, BaseException | None], None]
ITEM_EVENTS: ContextVar[ItemEvent | None] = ContextVar("cronlock_item_events", default=None)


class Tracer(Protocol):
    """What the traced paths ask of ``cronlock.tracing.Tracing``."""

    def enqueue(self, job_type: str, count: int) -> AbstractContextManager[str]:
        """A span around an enqueue; it yields the trace context the jobs carry."""
        ...

    async def attempt(self, run: Callable[[], Awaitable[Any]], job: Any, queue: str) -> Any:
        """One attempt of ``job`` (``run``) in a span whose parent is the job's context."""
        ...

    async def periodic_run(
        self,
        task: str,
        slot: datetime | None,
        trigger: str,
        run: Callable[[], Awaitable[RunResult]],
    ) -> RunResult:
        """A run of the task named ``task`` in a span, its items as events."""
        ...
