"""Jobs as values: handlers and their options, a claimed job, and the retry rule (pure).

A job is a row of ``jobs``; a handler is the coroutine registered for its ``job_type``. Nothing
here touches the database: enqueueing is ``enqueue.py``, running and completing jobs is the
drainer's.

The retry rule (DESIGN.md): ``max_retries = N`` allows N retries, N+1 attempts. ``retry_count``
counts the retries made, and ``error_history`` gets one ``{attempt, error, at}`` entry per
failed attempt. ``outcome_of_failure`` is the rule in one pure function.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeAlias

from sqlalchemy.ext.asyncio import AsyncSession

from ..errors import InvalidJobOption, InvalidPayload, UnknownJobType
from ..outcome import MAX_MESSAGE_LENGTH, JobStatus
from ..sql.tables import DEFAULT_QUEUE

__all__ = [
    "Backoff",
    "Enqueued",
    "Handler",
    "Job",
    "JobHandler",
    "JobOutcome",
    "check_int4",
    "check_max_retries",
    "check_queue",
    "handler_for",
    "outcome_of_failure",
    "outcome_of_success",
    "parse_json",
    "to_json",
]

JobHandler: TypeAlias = Callable[[AsyncSession, Any], Awaitable[Any]]

MAX_RETRIES_LIMIT = 100
_INT4 = 2**31


@dataclass(frozen=True)
class Backoff:
    """Delay before retry number ``n`` (1-based): ``base * factor**(n-1)``, capped, jittered.

    The default is the reference's 1 s, 2 s, 4 s … with ±10 % jitter (so jobs that failed
    together do not come back together) and a one-hour cap.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.base < 0 or self.factor < 1 or self.cap < 0 or not 0 <= self.jitter <= 1:
            raise InvalidJobOption(f"invalid backoff {self!r}")

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        try:
            raw = min(self.base * self.factor ** max(retry - 1, 0), self.cap)
        except OverflowError:
            raw = self.cap
        if self.jitter:
            raw *= 1 + (rng or random).uniform(-self.jitter, self.jitter)
        return max(raw, 0.0)


@dataclass(frozen=True)
class Handler:
    """A registered handler and its per-type options."""

    job_type: str
    func: JobHandler = field(repr=False)
    max_retries: int = 3
    backoff: Backoff = Backoff()
    timeout: float | None = None
    queue: str = DEFAULT_QUEUE


@dataclass(frozen=True)
class Job:
    """A claimed job, as the drainer sees it."""

    id: uuid.UUID
    job_type: str
    payload: Any
    retry_count: int
    max_retries: int
    created_at: datetime


@dataclass(frozen=True)
class Enqueued:
    """The answer to an enqueue: the job's id, and whether this call created it.

    ``created`` is False when a waiting job already held the dedup key: ``id`` is that job's.
    """

    id: uuid.UUID
    created: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"id": str(self.id), "created": self.created, "deduplicated": not self.created}


@dataclass(frozen=True)
class JobOutcome:
    """What one attempt of a job leaves in its row (written in batches by JOB_FINISH_MANY)."""

    id: uuid.UUID
    status: JobStatus
    retry_count: int
    started_at: datetime
    finished_at: datetime
    run_at: datetime | None = None
    error: str | None = None
    error_entry: str | None = None
    result: str | None = None
    created_at: datetime | None = None

    @property
    def completed_at(self) -> datetime | None:
        return None if self.status is JobStatus.RETRYING else self.finished_at


def outcome_of_success(
    job: Job, result: str | None, started: datetime, now: datetime
) -> JobOutcome:
    return JobOutcome(
        id=job.id,
        status=JobStatus.COMPLETED,
        retry_count=job.retry_count,
        started_at=started,
        finished_at=now,
        result=result,
        created_at=job.created_at,
    )


def outcome_of_failure(
    job: Job,
    error: str,
    started: datetime,
    now: datetime,
    backoff: Backoff,
    rng: random.Random | None = None,
) -> JobOutcome:
    """The retry rule: retry while fewer than ``max_retries`` retries were made, then fail."""
    error = error[:MAX_MESSAGE_LENGTH]
    attempt = job.retry_count + 1
    entry = json.dumps({"attempt": attempt, "error": error, "at": now.isoformat()})
    if job.retry_count < job.max_retries:
        retry = job.retry_count + 1
        return JobOutcome(
            id=job.id,
            status=JobStatus.RETRYING,
            retry_count=retry,
            started_at=started,
            finished_at=now,
            run_at=now + timedelta(seconds=backoff.delay(retry, rng)),
            error=error,
            error_entry=entry,
            created_at=job.created_at,
        )
    return JobOutcome(
        id=job.id,
        status=JobStatus.FAILED,
        retry_count=job.retry_count,
        started_at=started,
        finished_at=now,
        error=error,
        error_entry=entry,
        created_at=job.created_at,
    )


def to_json(value: Any, what: str) -> str:
    """``value`` as JSON text PostgreSQL's jsonb accepts (no NaN, no Infinity)."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON: {exc}") from None


def parse_json(text: str, what: str) -> Any:
    """JSON text from the command line, checked the way PostgreSQL will."""

    def reject(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(text, parse_constant=reject)
    except ValueError as exc:
        raise InvalidPayload(f"{what} is not JSON: {exc}") from None


def check_int4(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT4 <= value < _INT4:
        raise InvalidJobOption(f"{name} must be an integer that fits in 32 bits, not {value!r}")


def check_queue(queue: str) -> str:
    if not isinstance(queue, str) or not 1 <= len(queue) <= 200:
        raise InvalidJobOption(f"invalid queue name {queue!r}: 1 to 200 characters")
    return queue


def check_max_retries(max_retries: int) -> int:
    check_int4("max_retries", max_retries)
    if not 0 <= max_retries <= MAX_RETRIES_LIMIT:
        raise InvalidJobOption(
            f"max_retries must be between 0 and {MAX_RETRIES_LIMIT}, not {max_retries}"
        )
    return max_retries


def handler_for(handlers: Mapping[str, Handler], job_type: str) -> Handler:
    try:
        return handlers[job_type]
    except KeyError:
        known = ", ".join(sorted(handlers)) or "none"
        raise UnknownJobType(
            f"no handler registered for job type {job_type!r} (registered: {known})"
        ) from None
