"""Jobs: handlers, enqueueing in the caller's transaction, and the retry rule.

A job is a row of ``jobs``; a handler is the coroutine registered for its ``job_type``.
Enqueueing validates everything before writing (a registered type, a JSON payload, options in
range) and then writes with one statement in the transaction the caller gives, so the job
commits or rolls back with the caller's own work; many jobs take the same single statement.
Given the ``Database`` instead of a transaction, the statement is sent alone on a pooled
connection and commits by itself: one round trip per job, the fast path for one at a time.
A dedup key makes a second *waiting* job with that key a no-op that returns the first one's id
(a partial unique index enforces it, so it holds under concurrent enqueues).

The retry rule (DESIGN.md): ``max_retries = N`` allows N retries, N+1 attempts. ``retry_count``
counts the retries made, and ``error_history`` gets one ``{attempt, error, at}`` entry per
failed attempt. ``outcome_of_failure`` is the rule in one pure function.
"""

from __future__ import annotations

import enum
import functools
import json
import math
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeAlias

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.sql import ClauseElement, Executable
from sqlalchemy.util import greenlet_spawn

from . import queries
from .database import Database
from .errors import InvalidJobOption, InvalidPayload, UnknownJobType
from .tables import SCHEMA

__all__ = [
    "Backoff",
    "Enqueued",
    "Handler",
    "Job",
    "JobHandler",
    "JobOutcome",
    "JobStatus",
    "enqueue_many",
    "outcome_of_failure",
    "outcome_of_success",
]

JobHandler: TypeAlias = Callable[[AsyncSession, Any], Awaitable[Any]]

MAX_RETRIES_LIMIT = 100
MAX_MESSAGE_LENGTH = 2000
DEFAULT_QUEUE = "default"
_INT4 = 2**31


class JobStatus(enum.StrEnum):
    """The reference's statuses. ``processing`` is what a job is inside the transaction that
    runs it; other sessions see it ``pending``/``retrying`` and locked (SKIP LOCKED skips it)."""

    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    RETRYING = "retrying"


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


def _check_int4(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT4 <= value < _INT4:
        raise InvalidJobOption(f"{name} must be an integer that fits in 32 bits, not {value!r}")


def check_queue(queue: str) -> str:
    if not isinstance(queue, str) or not 1 <= len(queue) <= 200:
        raise InvalidJobOption(f"invalid queue name {queue!r}: 1 to 200 characters")
    return queue


def check_max_retries(max_retries: int) -> int:
    _check_int4("max_retries", max_retries)
    if not 0 <= max_retries <= MAX_RETRIES_LIMIT:
        raise InvalidJobOption(
            f"max_retries must be between 0 and {MAX_RETRIES_LIMIT}, not {max_retries}"
        )
    return max_retries


@dataclass(frozen=True)
class _Options:
    queue: str
    priority: int
    max_retries: int
    run_at: datetime | None
    delay: timedelta


def _options(
    handler: Handler,
    *,
    max_retries: int | None,
    delay: float | timedelta | None,
    run_at: datetime | None,
    priority: int,
    queue: str | None,
) -> _Options:
    if delay is not None and run_at is not None:
        raise InvalidJobOption("give delay or run_at, not both")
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    if delay is not None and (not isinstance(delay, int | float) or not math.isfinite(delay)):
        raise InvalidJobOption(f"delay must be a number of seconds, not {delay!r}")
    if delay is not None and delay < 0:
        raise InvalidJobOption(f"delay must not be negative, not {delay}")
    if run_at is not None and run_at.tzinfo is None:
        raise InvalidJobOption("run_at must be timezone-aware")
    _check_int4("priority", priority)
    return _Options(
        queue=check_queue(queue if queue is not None else handler.queue),
        priority=priority,
        max_retries=check_max_retries(
            max_retries if max_retries is not None else handler.max_retries
        ),
        run_at=run_at,
        delay=timedelta(seconds=delay or 0),
    )


def handler_for(handlers: Mapping[str, Handler], job_type: str) -> Handler:
    try:
        return handlers[job_type]
    except KeyError:
        known = ", ".join(sorted(handlers)) or "none"
        raise UnknownJobType(
            f"no handler registered for job type {job_type!r} (registered: {known})"
        ) from None


async def enqueue_many(
    executor: AsyncSession | AsyncConnection | Database,
    handlers: Mapping[str, Handler],
    job_type: str,
    payloads: Sequence[Any],
    *,
    schema: str = SCHEMA,
    max_retries: int | None = None,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    queue: str | None = None,
    dedup_keys: Sequence[str | None] | None = None,
) -> list[Enqueued]:
    """Enqueue one job per payload; nothing is written on bad input.

    In the caller's transaction (an ``AsyncSession`` or ``AsyncConnection``): the caller commits
    (or rolls back) as with any of its own writes. Given a ``Database`` instead, the jobs are
    committed on their own before this returns (``_on_own_connection``), in its schema.
    """
    handler = handler_for(handlers, job_type)
    options = _options(
        handler,
        max_retries=max_retries,
        delay=delay,
        run_at=run_at,
        priority=priority,
        queue=queue,
    )
    texts = [to_json(payload, f"payload {i}") for i, payload in enumerate(payloads)]
    if dedup_keys is None:
        keys: list[str | None] = [None] * len(texts)
    else:
        keys = list(dedup_keys)
        if len(keys) != len(texts):
            raise InvalidJobOption("give one dedup key (or None) per payload")
        for key in keys:
            if key is not None and (not isinstance(key, str) or not key):
                raise InvalidJobOption(f"a dedup key is a non-empty string, not {key!r}")
    if not texts:
        return []
    common = {
        "job_type": job_type,
        "queue": options.queue,
        "priority": options.priority,
        "run_at": options.run_at,
        "delay": options.delay,
        "max_retries": options.max_retries,
    }
    if isinstance(executor, Database):
        return await _on_own_connection(executor, texts, keys, common)
    # The caller's engine may not translate cronlock's schema: say which one at execution.
    translate = {"schema_translate_map": {SCHEMA: schema}} if schema != SCHEMA else {}

    async def run(statement: Executable, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        result = await executor.execute(statement, params, execution_options=translate)
        rows: Sequence[Sequence[Any]] = result.all()
        return rows

    return await _insert(run, texts, keys, common)


_Run: TypeAlias = Callable[[Executable, dict[str, Any]], Awaitable[Sequence[Sequence[Any]]]]


async def _insert(
    run: _Run, texts: list[str], keys: list[str | None], common: dict[str, Any]
) -> list[Enqueued]:
    answers: list[Enqueued | None] = [None] * len(texts)
    todo = list(range(len(texts)))
    # A waiting job that held a key can finish between the insert and the look-up, freeing
    # the key: those rows are simply inserted again (a few rounds at most, in practice one).
    for _ in range(5):
        ids = {i: uuid.uuid4() for i in todo}
        params = {
            **common,
            "ids": list(ids.values()),
            "payloads": [texts[i] for i in todo],
            "dedup_keys": [keys[i] for i in todo],
        }
        inserted = {row[0] for row in await run(queries.JOB_INSERT_MANY, params)}
        for i, job_id in ids.items():
            if job_id in inserted:
                answers[i] = Enqueued(job_id)
        todo = [i for i in todo if answers[i] is None]
        if not todo:
            break
        taken = sorted({k for k in (keys[i] for i in todo) if k is not None})
        rows = await run(queries.JOB_BY_DEDUP_KEY, {"dedup_keys": taken})
        existing = {key: uuid.UUID(bytes=job_id.bytes) for key, job_id in rows}
        for i in todo:
            key = keys[i]
            if key is not None and key in existing:
                answers[i] = Enqueued(existing[key], created=False)
        todo = [i for i in todo if answers[i] is None]
        if not todo:
            break
    if todo:
        raise InvalidJobOption("dedup keys kept changing hands during the enqueue: enqueue again")
    return [answer for answer in answers if answer is not None]


@functools.cache
def _compiled(statement: Executable, schema: str) -> queries.AsyncpgStatement:
    assert isinstance(statement, ClauseElement)
    return queries.AsyncpgStatement.of(statement, schema)


async def _on_own_connection(
    database: Database, texts: list[str], keys: list[str | None], common: dict[str, Any]
) -> list[Enqueued]:
    """Enqueue on a pooled connection of ``database`` and commit: the fast path for one job.

    It skips SQLAlchemy's execution machinery (the statements are compiled once per schema
    and asyncpg keeps them prepared per connection) and, for jobs without a dedup key, sends
    the INSERT alone: one statement is its own transaction, one round trip instead of
    BEGIN/INSERT/COMMIT. Dedup keys may take more than one statement, so those run in one
    explicit transaction; behind PgBouncer (transaction mode) every enqueue does, since only
    a transaction keeps asyncpg's prepare and execute on one server connection.
    """

    single = not database.pgbouncer and all(key is None for key in keys)
    pooled = await database.engine.raw_connection()
    driver: Any = pooled.driver_connection

    async def run(statement: Executable, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        compiled = _compiled(statement, database.schema)
        rows: Sequence[Sequence[Any]] = await driver.fetch(compiled.sql, *compiled.args(**params))
        return rows

    try:
        if single:
            return await _insert(run, texts, keys, common)
        async with driver.transaction():
            return await _insert(run, texts, keys, common)
    except BaseException:
        # Cancelled or cut mid-statement, the connection's state is unknown: not back to the pool.
        await greenlet_spawn(pooled.invalidate)
        raise
    finally:
        await greenlet_spawn(pooled.close)
