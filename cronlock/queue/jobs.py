"""Jobs as values: handlers and their options, a claimed job, the backoff, and the checks of
what enqueueing accepts (pure).

A job is a row of ``jobs``; a handler is the coroutine registered for its ``job_type``. Nothing
here touches the database: enqueueing is ``enqueue.py``; claiming and running jobs is the
drainer's (``drainer.py`` and its parts), and what an attempt leaves in the row, the retry rule
included, is ``complete.py``.
"""

from __future__ import annotations

import enum
import json
import math
import random
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Protocol, TypeAlias

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from ..errors import InvalidJobOption, InvalidPayload, UnknownJobType
from ..sql.tables import DEFAULT_QUEUE

__all__ = [
    "MAX_CONCURRENCY_LIMIT",
    "MAX_DELAY",
    "MAX_NAME_LENGTH",
    "MAX_RETRIES_LIMIT",
    "AsyncHandler",
    "Backoff",
    "Enqueued",
    "Handler",
    "Job",
    "JobDefaults",
    "JobHandler",
    "JobOptions",
    "JobType",
    "PayloadModel",
    "check_concurrency",
    "check_concurrency_limit",
    "check_dedup_keys",
    "check_int4",
    "check_job_type",
    "check_max_retries",
    "check_queue",
    "handler_for",
    "job_options",
    "parse_json",
    "to_json",
    "to_payload",
]

AsyncHandler: TypeAlias = Callable[[AsyncSession, Any], Awaitable[Any]]
# A plain def handler gets the sync Session on the same transaction (queue/threads.py).
SyncHandler: TypeAlias = Callable[[Session, Any], Any]
JobHandler: TypeAlias = AsyncHandler | SyncHandler

MAX_RETRIES_LIMIT = 100
# The most jobs of one concurrency key that may run at once (a CHECK on jobs too): the claim
# tries a key's slots one by one.
MAX_CONCURRENCY_LIMIT = 100
# Job types, queue names and dedup keys: 1 to this many characters (a CHECK on job_type/queue).
MAX_NAME_LENGTH = 200
# The furthest ahead a delay may put a job (a larger one is almost certainly a unit mistake).
MAX_DELAY = timedelta(days=366)
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


class PayloadModel(Protocol):
    """A job type's model of its payloads or of its results (``@app.job(payload=Model,
    result=Model)``): a pydantic model's or a dataclass's (``queue.payloads``)."""

    @property
    def cls(self) -> type[Any]: ...
    @property
    def name(self) -> str: ...

    def dump(self, value: Any, what: str) -> str:
        """``value`` (an instance, a mapping, or None) as the JSON text to store; an
        InvalidPayload naming ``what`` and the fields that do not fit."""
        ...

    def load(self, value: Any, what: str) -> Any:
        """A stored JSON value as the model; an InvalidPayload when it does not fit."""
        ...

    def json_schema(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Handler:
    """A registered handler and its per-type options."""

    job_type: str
    func: JobHandler = field(repr=False)
    max_retries: int = 3
    backoff: Backoff = Backoff()
    timeout: float | None = None
    queue: str = DEFAULT_QUEUE
    # The lease commit mode: a job whose worker was lost this many times while it ran is
    # stopped (failed) instead of being handed on again (queue/liveness.py).
    max_lost_runs: int = 3
    # Jobs of this type with a concurrency key: at most this many with one key run at once.
    concurrency_limit: int | None = None
    threaded: bool = False  # a plain def: run in the drainer's thread pool (threads.py)
    # What the handler receives (the stored payload, loaded) and returns: None, JSON as is.
    payload_model: PayloadModel | None = None
    result_model: PayloadModel | None = None


class JobDefaults(Protocol):
    """What enqueueing reads of a job type: its name and its jobs' defaults (a ``Handler`` or
    a ``JobType``)."""

    @property
    def job_type(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def max_retries(self) -> int: ...
    @property
    def concurrency_limit(self) -> int | None: ...
    @property
    def payload_model(self) -> PayloadModel | None: ...
    @property
    def result_model(self) -> PayloadModel | None: ...


@dataclass(frozen=True)
class JobType:
    """A job type declared without its handler (``App.declare_job``): what a producer that
    does not import the worker's code needs to enqueue it, with the same checks. A drainer
    runs such a job only if its own app has the handler."""

    job_type: str
    queue: str = DEFAULT_QUEUE
    max_retries: int = 3
    concurrency_limit: int | None = None
    payload_model: PayloadModel | None = None
    result_model: PayloadModel | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_type": self.job_type,
            "queue": self.queue,
            "max_retries": self.max_retries,
            "concurrency_limit": self.concurrency_limit,
        }


@dataclass(frozen=True)
class Job:
    """A claimed job, as the drainer sees it. Its times are the database's clock: when it was
    enqueued and when the claim that handed it to this worker ran."""

    id: uuid.UUID
    job_type: str
    payload: Any
    retry_count: int
    max_retries: int
    created_at: datetime
    claimed_at: datetime  # the database's clock at the claim: the row's started_at
    timeout: float | None = None  # its own (the enqueue's), else its type's applies
    trace_context: str | None = None  # the enqueuing span's, claimed by a traced drainer only


@dataclass(frozen=True)
class Enqueued:
    """The answer to an enqueue: the job's id, and whether this call created it.

    ``created`` is False when a waiting job already held the dedup key: ``id`` is that job's.
    """

    id: uuid.UUID
    created: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"id": str(self.id), "created": self.created, "deduplicated": not self.created}


def _encode_default(value: Any) -> Any:
    """The documented encoding of values JSON has no type for (README "Payloads and results")."""
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{value} is not JSON")
        return str(value)  # exact, as a string: a JSON number would come back as a float
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, set | frozenset):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# A NUL escape PostgreSQL's jsonb refuses: an odd number of backslashes before u0000 (an even
# number is an escaped backslash followed by the text "u0000").
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# json.dumps with options builds an encoder per call: one, made once (every payload and result).
_ENCODE = json.JSONEncoder(
    allow_nan=False, separators=(",", ":"), ensure_ascii=False, default=_encode_default
).encode


def to_json(value: Any, what: str) -> str:
    """``value`` as JSON text PostgreSQL's jsonb accepts, or InvalidPayload saying why not.

    Decimal, datetime/date/time, UUID, enums and sets are encoded as README documents; NaN,
    Infinity, the NUL character (jsonb cannot store it), lone surrogates (no UTF-8 for them)
    and nesting deeper than Python's recursion limit are refused.
    """
    try:
        text = _ENCODE(value)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"{what} is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidPayload(f"{what} is nested too deeply") from None
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise InvalidPayload(
            f"{what} contains the NUL character (\\u0000), which jsonb cannot store"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPayload(f"{what} contains a lone surrogate (not valid Unicode)") from None
    return text


def to_payload(value: Any, what: str) -> str:
    """A job's payload as JSON text: a JSON object (``None`` is the empty one)."""
    if value is None:
        return "{}"
    if not isinstance(value, Mapping):
        raise InvalidPayload(f"{what} must be a JSON object, not {type(value).__name__}")
    return to_json(value, what)


def parse_json(text: str, what: str) -> Any:
    """JSON text from the command line, checked the way PostgreSQL will."""

    def reject(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(text, parse_constant=reject)
    except ValueError as exc:
        raise InvalidPayload(f"{what} is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidPayload(f"{what} is nested too deeply") from None


def check_int4(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT4 <= value < _INT4:
        raise InvalidJobOption(f"{name} must be an integer that fits in 32 bits, not {value!r}")


def storable(text: str) -> bool:
    """Whether PostgreSQL can store ``text`` in a text column: no NUL character, no lone
    surrogate (which has no UTF-8)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_queue(queue: str) -> str:
    if not isinstance(queue, str) or not 1 <= len(queue) <= MAX_NAME_LENGTH:
        raise InvalidJobOption(f"invalid queue name {queue!r}: 1 to {MAX_NAME_LENGTH} characters")
    if not storable(queue):
        raise InvalidJobOption(f"invalid queue name {queue!r}: a NUL or a lone surrogate")
    return queue


def check_max_retries(max_retries: int) -> int:
    check_int4("max_retries", max_retries)
    if not 0 <= max_retries <= MAX_RETRIES_LIMIT:
        raise InvalidJobOption(
            f"max_retries must be between 0 and {MAX_RETRIES_LIMIT}, not {max_retries}"
        )
    return max_retries


def check_job_type(job_type: str) -> str:
    if not isinstance(job_type, str) or not 1 <= len(job_type) <= MAX_NAME_LENGTH:
        raise InvalidJobOption(f"invalid job type {job_type!r}: 1 to {MAX_NAME_LENGTH} characters")
    if not storable(job_type):
        raise InvalidJobOption(f"invalid job type {job_type!r}: a NUL or a lone surrogate")
    return job_type


def handler_for(
    handlers: Mapping[str, JobDefaults], job_type: str, *, allow_unknown: bool = False
) -> JobDefaults:
    """The registered handler or declaration of ``job_type``; for an unknown type
    UnknownJobType, unless ``allow_unknown`` (then the defaults of a plain ``JobType``)."""
    try:
        return handlers[job_type]
    except KeyError:
        if allow_unknown:
            return JobType(check_job_type(job_type))
        known = ", ".join(sorted(handlers)) or "none"
        raise UnknownJobType(
            f"no handler registered for job type {job_type!r} (registered or declared: "
            f"{known}; --allow-unknown, or allow_unknown=True, enqueues it anyway)"
        ) from None


@dataclass(frozen=True)
class JobOptions:
    """A new job's options, validated, with the handler's defaults applied."""

    queue: str
    priority: int
    max_retries: int
    run_at: datetime | None
    delay: timedelta


def job_options(
    handler: JobDefaults,
    *,
    max_retries: int | None = None,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    queue: str | None = None,
) -> JobOptions:
    """The options of a new job, checked the same way for every caller (Python, the command
    line, HTTP): InvalidJobOption says what is wrong."""
    if delay is not None and run_at is not None:
        raise InvalidJobOption("give delay or run_at, not both")
    if isinstance(delay, timedelta):
        delay = delay.total_seconds()
    if delay is not None and (
        isinstance(delay, bool) or not isinstance(delay, int | float) or not math.isfinite(delay)
    ):
        raise InvalidJobOption(f"delay must be a number of seconds, not {delay!r}")
    if delay is not None and delay < 0:
        raise InvalidJobOption(f"delay must not be negative, not {delay}")
    if delay is not None and delay > MAX_DELAY.total_seconds():
        raise InvalidJobOption(
            f"delay must be at most {MAX_DELAY.total_seconds():g} seconds ({MAX_DELAY.days} "
            f"days), not {delay:g}: give run_at for a later time"
        )
    if run_at is not None and not isinstance(run_at, datetime):
        raise InvalidJobOption(f"run_at must be a datetime, not {type(run_at).__name__}")
    if run_at is not None and run_at.tzinfo is None:
        raise InvalidJobOption("run_at must be timezone-aware")
    check_int4("priority", priority)
    return JobOptions(
        queue=check_queue(queue if queue is not None else handler.queue),
        priority=priority,
        max_retries=check_max_retries(
            max_retries if max_retries is not None else handler.max_retries
        ),
        run_at=run_at,
        delay=timedelta(seconds=delay or 0),
    )


def check_timeout(timeout: float | None) -> float | None:
    """A job's or a job type's timeout: a positive, finite number of seconds, or None."""
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not timeout > 0
    ):
        raise InvalidJobOption(f"timeout must be a positive number of seconds, not {timeout!r}")
    return None if timeout is None else float(timeout)


def check_dedup_keys(keys: Sequence[str | None] | None, count: int) -> list[str | None]:
    """One dedup key (or None) per new job, each 1 to MAX_NAME_LENGTH characters."""
    if keys is None:
        return [None] * count
    checked = list(keys)
    if len(checked) != count:
        raise InvalidJobOption("give one dedup key (or None) per payload")
    for key in checked:
        if key is not None and (
            not isinstance(key, str) or not 1 <= len(key) <= MAX_NAME_LENGTH or not storable(key)
        ):
            raise InvalidJobOption(
                f"a dedup key is a string of 1 to {MAX_NAME_LENGTH} characters (no NUL, no lone "
                f"surrogate), not {key!r}"
            )
    return checked


def check_concurrency_limit(limit: int) -> int:
    check_int4("concurrency_limit", limit)
    if not 1 <= limit <= MAX_CONCURRENCY_LIMIT:
        raise InvalidJobOption(
            f"concurrency_limit must be between 1 and {MAX_CONCURRENCY_LIMIT}, not {limit}"
        )
    return limit


def check_concurrency(
    handler: JobDefaults, keys: Sequence[str | None] | None, limit: int | None, count: int
) -> tuple[list[str | None], list[int | None]]:
    """Each new job's concurrency key (or None) and its key's limit: the enqueue's ``limit``,
    else the job type's, else 1 (a key alone makes its jobs run one at a time)."""
    if keys is None:
        if limit is not None:
            raise InvalidJobOption("concurrency_limit needs a concurrency_key")
        return [None] * count, [None] * count
    checked = list(keys)
    if len(checked) != count:
        raise InvalidJobOption("give one concurrency key (or None) per payload")
    for key in checked:
        if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= MAX_NAME_LENGTH):
            raise InvalidJobOption(
                f"a concurrency key is a string of 1 to {MAX_NAME_LENGTH} characters, not {key!r}"
            )
    if limit is None:
        limit = handler.concurrency_limit if handler.concurrency_limit is not None else 1
    limit = check_concurrency_limit(limit)
    return checked, [None if key is None else limit for key in checked]
