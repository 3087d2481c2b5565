"""The handler's side of an attempt: what it may ask of its job, and what it may return.

A handler keeps the reference's signature, ``async def handler(session, payload)``. What it
knows of its job beyond the payload it asks for: ``current_job()`` is the ``JobContext`` of
the job the calling handler (or a task it started) runs — its id, type, queue, attempt number,
retry limit, when it was enqueued, and whether an operator asked to cancel it. The drainer
sets it for each attempt in a context variable, so a handler that never asks pays nothing and
a helper three calls down can ask without the context being passed along.

What a handler returns is its job's outcome. A value that is JSON is the result of a
completed job; two values end the job another way, River's ``JobCancel`` and ``JobSnooze``:

- ``JobCancel(reason)``: the job ends ``cancelled``, never retried, whatever retries it has
  left; ``reason`` is its ``error_message``.
- ``JobSnooze(delay)``: the job runs again after ``delay`` (seconds or a ``timedelta``, at most
  ``MAX_DELAY``) and the attempt is not counted: ``retry_count`` stays, the retry limit is not
  used up.

Both are outcomes, not failures: no failed attempt is logged or counted, and each leaves an
entry in the job's ``error_history`` with its ``outcome`` (``cancelled`` or ``snoozed``). As
with any value a handler returns, what the handler wrote in its session commits with the
outcome; an exception, as always, rolls it back.
"""

from __future__ import annotations

import contextvars
import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from ..errors import InvalidJobOption, NoCurrentJob
from ..outcome import MAX_MESSAGE_LENGTH
from .jobs import MAX_DELAY, Job

__all__ = ["JobCancel", "JobContext", "JobSnooze", "Requested", "current_job", "running"]


@dataclass(frozen=True)
class JobCancel:
    """Returned by a handler: its job ends ``cancelled`` and is never retried; ``reason`` is
    recorded as its error message and in its history."""

    reason: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str):
            raise InvalidJobOption(f"JobCancel's reason must be a str, not {self.reason!r}")


@dataclass(frozen=True)
class JobSnooze:
    """Returned by a handler: its job runs again after ``delay`` (seconds or a ``timedelta``,
    0 to ``MAX_DELAY``), and this attempt does not count against its retries."""

    delay: float | timedelta

    def __post_init__(self) -> None:
        delay = self.delay
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
        ):
            raise InvalidJobOption(f"JobSnooze's delay must be a number of seconds, not {delay!r}")
        if not 0 <= seconds <= MAX_DELAY.total_seconds():
            raise InvalidJobOption(
                f"JobSnooze's delay must be between 0 and {MAX_DELAY.total_seconds():g} "
                f"seconds ({MAX_DELAY.days} days), not {seconds:g}"
            )

    @property
    def seconds(self) -> float:
        delay = self.delay
        return delay.total_seconds() if isinstance(delay, timedelta) else float(delay)


HandlerOutcome = JobCancel | JobSnooze


@dataclass(frozen=True)
class JobContext:
    """The job a handler runs, as ``current_job()`` gives it."""

    id: uuid.UUID
    job_type: str
    queue: str
    attempt: int  # 1 for the first attempt; retries made + 1 (a snooze does not count)
    max_retries: int  # at most this many retries: max_retries + 1 attempts
    enqueued_at: datetime  # the job's created_at, the database's clock
    _scope: Requested | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def cancel_requested(self) -> bool:
        """Whether an operator asked to cancel the job: its handler is being stopped (it gets
        ``CancelledError`` at its next await; one that catches it should end soon)."""
        return self._scope is not None and self._scope.requested

    @property
    def last_attempt(self) -> bool:
        """Whether a failure of this attempt fails the job for good."""
        return self.attempt > self.max_retries

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "job_type": self.job_type,
            "queue": self.queue,
            "attempt": self.attempt,
            "max_retries": self.max_retries,
            "enqueued_at": self.enqueued_at.isoformat(),
            "cancel_requested": self.cancel_requested,
        }


# The claimed job and its queue, set around each attempt: the JobContext is built only when a
# handler asks (most never do), so an attempt pays for one context variable set and reset.
running: contextvars.ContextVar[tuple[Job, str, Requested]] = contextvars.ContextVar("cronlock_job")


class Requested(Protocol):
    """Whether an operator asked to cancel the running job (``cancel.Scope``)."""

    @property
    def requested(self) -> bool: ...


def current_job() -> JobContext:
    """The job the calling handler runs (also inside tasks the handler started); outside a
    handler, ``NoCurrentJob``."""
    try:
        job, queue, scope = running.get()
    except LookupError:
        raise NoCurrentJob() from None
    context = JobContext(
        id=job.id,
        job_type=job.job_type,
        queue=queue,
        attempt=job.retry_count + 1,
        max_retries=job.max_retries,
        enqueued_at=job.created_at,
    )
    object.__setattr__(context, "_scope", scope)
    return context


def reason_of(cancel: JobCancel) -> str:
    """The error message a handler's JobCancel leaves."""
    text = cancel.reason.strip()
    line = f"cancelled by its handler: {text}" if text else "cancelled by its handler"
    return line[:MAX_MESSAGE_LENGTH]
