"""Enqueueing: validate everything, then write with one statement.

Enqueueing validates everything before writing (a registered or declared type, unless the
caller allows an unknown one, a JSON payload that fits the type's model if it has one,
options in range) and then writes with one statement in the transaction the caller gives, so
the job commits or rolls back with the caller's own work; many jobs take the same single
statement.
Given the ``Database`` instead of a transaction, the statement is sent alone on a pooled
connection and commits by itself: one round trip per job, the fast path for one at a time.
A dedup key makes a second *waiting* job with that key a no-op that returns the first one's id
(a partial unique index enforces it, so it holds under concurrent enqueues).
Jobs with ``depends_on`` (ids of existing jobs) take three statements: the parents' locks,
their statuses, and the jobs with their edges (``blocked`` until every parent completed; the
``jobs_released`` trigger of ``sql/tables.py`` settles them in the parents' transactions).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeAlias, TypedDict, Unpack

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.sql import ClauseElement, Executable

from .. import sql
from ..database import Database
from ..errors import InvalidJobOption
from ..outcome import JobStatus
from ..pg import AsyncpgStatement, rows_of
from ..sql.tables import SCHEMA
from .jobs import (
    Enqueued,
    JobDefaults,
    check_concurrency,
    check_dedup_keys,
    check_timeout,
    handler_for,
    job_options,
    to_payload,
)

__all__ = [
    "Batch",
    "EnqueueOptions",
    "NewJobs",
    "Plan",
    "check_parents",
    "enqueue_many",
    "insert_plan",
    "prepare",
]


async def enqueue_many(
    executor: AsyncSession | AsyncConnection | Database,
    handlers: Mapping[str, JobDefaults],
    job_type: str,
    payloads: Sequence[Any],
    *,
    schema: str = SCHEMA,
    trace_context: str | None = None,
    **options: Unpack[NewJobs],
) -> list[Enqueued]:
    """Enqueue one job per payload; nothing is written on bad input.

    ``trace_context`` (a traced app's enqueue span, ``cronlock.tracing``) is written with
    every job; without it the statements are the untraced ones.

    In the caller's transaction (an ``AsyncSession`` or ``AsyncConnection``): the caller commits
    (or rolls back) as with any of its own writes. Given a ``Database`` instead, the jobs are
    committed on their own before this returns (``_on_own_connection``), in its schema.
    """
    batch = prepare(handlers, job_type, payloads, trace_context, **options)
    if batch is None:
        return []
    if isinstance(executor, Database):
        return await _on_own_connection(executor, batch)
    # The caller's engine may not translate cronlock's schema: say which one at execution.
    translate = {"schema_translate_map": {SCHEMA: schema}} if schema != SCHEMA else {}

    async def run(statement: Executable, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
        result = await executor.execute(statement, params, execution_options=translate)
        return rows_of(result)

    return await _insert(run, batch)


class EnqueueOptions(TypedDict, total=False):
    """The options every enqueue takes beside its payloads and keys (``App.enqueue``,
    ``enqueue_tx``, ``enqueue_many``, ``enqueue_many_tx`` and ``app.sync``'s; ``enqueue``
    says what each does)."""

    max_retries: int | None
    delay: float | timedelta | None
    run_at: datetime | None
    priority: int
    queue: str | None
    concurrency_limit: int | None
    timeout: float | None  # the job's own (seconds), beside its type's
    allow_unknown: bool
    depends_on: Sequence[uuid.UUID | str | Enqueued] | None  # jobs that must complete first


class NewJobs(EnqueueOptions, total=False):
    """What an enqueue says of its jobs beside their type and payloads (``prepare``)."""

    dedup_keys: Sequence[str | None] | None
    concurrency_keys: Sequence[str | None] | None


@dataclass(frozen=True)
class Batch:
    """Checked jobs ready to write: their payloads as JSON text, what differs per job (one
    entry per job) and the parameters they share."""

    texts: list[str]
    dedup_keys: list[str | None]
    concurrency_keys: list[str | None]
    concurrency_limits: list[int | None]
    common: dict[str, Any]
    depends_on: tuple[uuid.UUID, ...] = ()  # distinct, in the order given


def prepare(
    handlers: Mapping[str, JobDefaults],
    job_type: str,
    payloads: Sequence[Any],
    trace_context: str | None = None,
    *,
    allow_unknown: bool = False,
    max_retries: int | None = None,
    delay: float | timedelta | None = None,
    run_at: datetime | None = None,
    priority: int = 0,
    queue: str | None = None,
    dedup_keys: Sequence[str | None] | None = None,
    concurrency_keys: Sequence[str | None] | None = None,
    concurrency_limit: int | None = None,
    timeout: float | None = None,
    depends_on: Sequence[uuid.UUID | str | Enqueued] | None = None,
) -> Batch | None:
    """Every check an enqueue makes, on every client, before anything is written: the jobs
    to write, or None for no payloads. Raises a ``JobError`` naming what is wrong."""
    handler = handler_for(handlers, job_type, allow_unknown=allow_unknown)
    options = job_options(
        handler,
        max_retries=max_retries,
        delay=delay,
        run_at=run_at,
        priority=priority,
        queue=queue,
    )
    # A typed job type's model checks each payload (queue/payloads.py); else a JSON object.
    model = handler.payload_model
    dump = to_payload if model is None else model.dump
    if len(payloads) == 1:
        texts = [dump(payloads[0], "the payload")]
    else:
        texts = [dump(payload, f"payload {i}") for i, payload in enumerate(payloads)]
    keys = check_dedup_keys(dedup_keys, len(texts))
    limited, limits = check_concurrency(handler, concurrency_keys, concurrency_limit, len(texts))
    parents = check_parents(depends_on)
    if parents and any(key is not None for key in keys):
        raise InvalidJobOption("a job with depends_on cannot have a dedup key")
    if not texts:
        return None
    common = {
        "job_type": job_type,
        "queue": options.queue,
        "priority": options.priority,
        "run_at": options.run_at,
        "delay": options.delay,
        "max_retries": options.max_retries,
        "timeout": check_timeout(timeout),
    }
    if trace_context is not None:
        common["trace_context"] = trace_context
    return Batch(texts, keys, limited, limits, common, parents)


def check_parents(depends_on: Sequence[uuid.UUID | str | Enqueued] | None) -> tuple[uuid.UUID, ...]:
    """The ids of ``depends_on`` (UUIDs, their text, or enqueue answers), each once, in the
    order given; an ``InvalidJobOption`` for one that is not a job id."""
    if depends_on is None:
        return ()
    if isinstance(depends_on, str | uuid.UUID | Enqueued):
        raise InvalidJobOption("depends_on takes a list of job ids, not one")
    found: dict[uuid.UUID, None] = {}
    for given in depends_on:
        if isinstance(given, Enqueued):
            found[given.id] = None
        elif isinstance(given, uuid.UUID):
            found[given] = None
        else:
            try:
                found[uuid.UUID(str(given))] = None
            except ValueError:
                raise InvalidJobOption(f"depends_on: {given!r} is not a job id") from None
    return tuple(found)


# What an insert plan asks its runner: a statement and its parameters; the runner sends back
# the rows (the plan is the same for asyncpg, SQLAlchemy's sessions and the sync clients).
Step: TypeAlias = tuple[Executable, dict[str, Any]]
Plan: TypeAlias = Generator[Step, Sequence[Sequence[Any]], list[Enqueued]]


def insert_plan(batch: Batch) -> Plan:
    """The statements that write ``batch``: one INSERT, and for dedup keys already held, a
    look-up of the jobs that hold them. One job without a dedup key is a single-row INSERT
    (``sql.JOB_INSERT_ONE``, returning nothing), as on the app's own connection: no arrays to
    encode and unnest, and no conflict to skip."""
    keys = batch.dedup_keys
    texts = batch.texts
    traced = "trace_context" in batch.common
    if batch.depends_on:
        return (yield from _dependent_plan(batch))
    if len(texts) == 1 and keys[0] is None:
        job_id = uuid.uuid4()
        one = sql.JOB_INSERT_ONE_TRACED if traced else sql.JOB_INSERT_ONE
        yield (
            one,
            {
                **batch.common,
                "id": job_id,
                "payload": texts[0],
                "concurrency_key": batch.concurrency_keys[0],
                "concurrency_limit": batch.concurrency_limits[0],
            },
        )
        return [Enqueued(job_id)]
    answers: list[Enqueued | None] = [None] * len(texts)
    todo = list(range(len(texts)))
    # A waiting job that held a key can finish between the insert and the look-up, freeing
    # the key: those rows are simply inserted again (a few rounds at most, in practice one).
    for _ in range(5):
        ids = {i: uuid.uuid4() for i in todo}
        params = {
            **batch.common,
            "ids": list(ids.values()),
            "payloads": [texts[i] for i in todo],
            "dedup_keys": _column([keys[i] for i in todo]),
            "concurrency_keys": _column([batch.concurrency_keys[i] for i in todo]),
            "concurrency_limits": _column([batch.concurrency_limits[i] for i in todo]),
        }
        many = sql.JOB_INSERT_MANY_TRACED if traced else sql.JOB_INSERT_MANY
        rows = yield many, params
        # Every row inserted (the ids are ours and distinct): nothing to match.
        everyone = len(rows) == len(ids)
        inserted = set() if everyone else {_job_id(row[0]) for row in rows}
        for i, job_id in ids.items():
            if everyone or job_id in inserted:
                answers[i] = Enqueued(job_id)
        todo = [i for i in todo if answers[i] is None]
        if not todo:
            break
        taken = sorted({k for k in (keys[i] for i in todo) if k is not None})
        rows = yield sql.JOB_BY_DEDUP_KEY, {"dedup_keys": taken}
        existing = {key: uuid.UUID(str(job_id)) for key, job_id in rows}
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


def _dependent_plan(batch: Batch) -> Plan:
    """The jobs of ``batch`` after their parents: lock the parents' buckets, read their
    statuses, then write the jobs and their edges. An unknown parent is refused before
    anything is written. Every parent completed: the jobs are ``pending``. One failed or
    cancelled already: they are written ``cancelled`` at once, as they would be had it ended
    a moment later (a failed parent cancels its dependents, whichever comes first)."""
    parents = list(batch.depends_on)
    yield sql.DEPENDENCY_LOCK, {"parents": parents}
    rows = yield sql.DEPENDENCY_PARENTS, {"parents": parents}
    statuses = {_job_id(job_id): str(status) for job_id, status in rows}
    missing = [str(parent) for parent in parents if parent not in statuses]
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise InvalidJobOption(f"depends_on names no job {shown}: a parent must exist first")
    ended = [p for p in parents if statuses[p] in (JobStatus.FAILED, JobStatus.CANCELLED)]
    waiting_on = [p for p in parents if statuses[p] != JobStatus.COMPLETED]
    error = None
    if ended:
        status = JobStatus.CANCELLED
        error = f"cancelled: job {ended[0]} it depends on was {statuses[ended[0]]} already"
    elif waiting_on:
        status = JobStatus.BLOCKED
    else:
        status = JobStatus.PENDING
    ids = [uuid.uuid4() for _ in batch.texts]
    traced = "trace_context" in batch.common
    statement = sql.JOB_INSERT_DEPENDENT_TRACED if traced else sql.JOB_INSERT_DEPENDENT
    yield (
        statement,
        {
            **batch.common,
            "ids": ids,
            "payloads": batch.texts,
            "dedup_keys": None,
            "concurrency_keys": _column(batch.concurrency_keys),
            "concurrency_limits": _column(batch.concurrency_limits),
            "status": status.value,
            "parents_left": len(waiting_on),
            "depends_on": parents,
            "open_parents": waiting_on if status is JobStatus.BLOCKED else [],
            "error": error,
        },
    )
    return [Enqueued(job_id) for job_id in ids]


def _column(values: list[Any]) -> list[Any] | None:
    """A column of the new jobs as an array, or NULL when it holds only NULLs (no job has a
    dedup or concurrency key): the statement's ``unnest`` pads a NULL array with NULLs, and
    the driver has a thousand fewer elements to encode per column."""
    return None if values.count(None) == len(values) else values


def _job_id(value: Any) -> Any:
    """A returned id as the plan compares it: asyncpg's and psycopg's are UUIDs (asyncpg's
    compare equal to uuid.UUID), psycopg2 without its UUID adapter gives text."""
    return value if isinstance(value, uuid.UUID) else uuid.UUID(value)


_Run: TypeAlias = Callable[[Executable, dict[str, Any]], Awaitable[Sequence[Sequence[Any]]]]


async def _insert(run: _Run, batch: Batch) -> list[Enqueued]:
    plan = insert_plan(batch)
    try:
        step = next(plan)
        while True:
            step = plan.send(await run(*step))
    except StopIteration as done:
        answers: list[Enqueued] = done.value
        return answers


@functools.cache
def _compiled(statement: Executable, schema: str) -> AsyncpgStatement:
    assert isinstance(statement, ClauseElement)
    return AsyncpgStatement.of(statement, schema)


async def _on_own_connection(database: Database, batch: Batch) -> list[Enqueued]:
    """Enqueue on a connection of ``database`` and commit: the fast path for one job.

    It skips SQLAlchemy's execution machinery (the statements are compiled once per schema
    and asyncpg keeps them prepared per connection) and the pool's checkout (a connection is
    kept for it: ``pg.QuickConnections``). One job without a dedup key is one INSERT sent
    alone: one statement is its own transaction, one round trip instead of
    BEGIN/INSERT/COMMIT. Dedup keys may take more than one statement, so those run in one
    explicit transaction; behind PgBouncer (transaction mode) every enqueue does, since only
    a transaction keeps asyncpg's prepare and execute on one server connection.
    """
    keys = batch.dedup_keys
    texts = batch.texts
    common = batch.common
    alone = not database.pgbouncer and all(key is None for key in keys) and not batch.depends_on
    quick = database.quick
    driver, pooled = await quick.acquire()
    try:
        if len(texts) == 1 and keys[0] is None and not batch.depends_on:
            job_id = uuid.uuid4()
            one = sql.JOB_INSERT_ONE_TRACED if "trace_context" in common else sql.JOB_INSERT_ONE
            insert = _compiled(one, database.schema)
            args = insert.args(
                id=job_id,
                payload=texts[0],
                concurrency_key=batch.concurrency_keys[0],
                concurrency_limit=batch.concurrency_limits[0],
                **common,
            )
            if alone:
                await driver.execute(insert.sql, *args)
            else:
                async with driver.transaction():
                    await driver.execute(insert.sql, *args)
            answers = [Enqueued(job_id)]
        else:

            async def run(statement: Executable, params: dict[str, Any]) -> Sequence[Sequence[Any]]:
                compiled = _compiled(statement, database.schema)
                return await driver.fetch(compiled.sql, *compiled.args(**params))

            if alone:
                answers = await _insert(run, batch)
            else:
                async with driver.transaction():
                    answers = await _insert(run, batch)
    except BaseException:
        # Cancelled or cut mid-statement, the connection's state is unknown: thrown away.
        await quick.release(driver, pooled, broken=True)
        raise
    await quick.release(driver, pooled)
    return answers
