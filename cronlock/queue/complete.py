"""The completion: what one attempt of a job leaves in its row, and how outcomes are written.

An attempt ends in a ``Success`` or a ``Failure``, or, when its handler returned ``JobCancel``
or ``JobSnooze`` (``handling.py``), in a ``Cancelled`` or a ``Snoozed``, each an entry of the
job's ``error_history`` with its ``outcome``. ``outcome_of_failure`` is the retry rule
(DESIGN.md): ``max_retries = N`` allows N retries, N+1 attempts, ``retry_count`` counts the
retries made, and ``error_history`` gets one ``{attempt, error, at}`` entry per failed
attempt (its ``at``, and a snooze's ``until``, stamped by the outcome statement on the
database's clock). A lane writes its batch's outcomes with one statement, in the transaction
that ran the handlers (``Completion.write``), so a job's completion commits with its
handler's writes or not at all: ``JOB_COMPLETE_ONE`` for a lone success (strict mode),
``JOB_COMPLETE_MANY`` for a batch of successes, ``JOB_FINISH_CLAIMED`` for a batch with a
failure in it (the batch's rows are the claim's, locked since: no status guard). A failure
whose transaction is gone, or whose batch rolled back, is written on its own, guarded by the
status (``JOB_FINISH_MANY``; ``Completion.record_lost``). Outcomes count in the drainer's
stats once committed (``count``).

One clock. The row's ``started_at`` and ``completed_at`` are the database's: the claim's time
(``Job.claimed_at``) and the outcome statement's, as ``created_at`` is, so that across hosts
no worker's clock skew is in them or in what is read from them (``cronlock_job_latency_seconds``,
``jobs show``, the API, the dashboard). What the worker still measures itself is named so:
an outcome's ``worker_started_at``/``worker_finished_at`` (its clock around the handler) and
``worker_run_at`` (a retry's or a snooze's due time by that clock: the row's is the database's
clock plus the same ``delay``), and the line per job's duration (its monotonic clock, from the
handler's start to the commit).
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy.exc import DBAPIError, InterfaceError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import ClauseElement

from .. import sql
from ..logs import JOBS_LOGGER
from ..observe.stats import DrainStats
from ..outcome import MAX_MESSAGE_LENGTH, JobStatus, error_line
from ..pg import AsyncpgStatement, DriverConnection
from .jobs import Backoff, Job

__all__ = [
    "Attempt",
    "Cancelled",
    "Completion",
    "Failure",
    "Snoozed",
    "Success",
    "cancelled",
    "count",
    "datetime_of",
    "given_up",
    "micros_now",
    "micros_of",
    "outcome_of_failure",
    "refused",
    "snoozed",
]

logger = logging.getLogger("cronlock.drainer")
jobs_logger = logging.getLogger(JOBS_LOGGER)


class Success(NamedTuple):
    """A successful attempt: its job and its result as JSON text (a small tuple, built once
    per job on the hot path). Its times are the database's, written by the outcome
    statement; the worker sends none."""

    job: Job
    result: str | None


@dataclass(frozen=True)
class Failure:
    """A failed attempt: its job retrying (due again ``delay`` seconds on) or failed for good.
    ``worker_run_at`` is when the retry is due by the worker's clock; the row's ``run_at`` is
    the database's clock plus the same ``delay`` (sql.JOB_FINISH_MANY)."""

    job: Job
    status: JobStatus  # RETRYING or FAILED
    retry_count: int
    worker_started_at: datetime  # the worker's clock, around its handler
    worker_finished_at: datetime
    error: str
    error_entry: str
    worker_run_at: datetime | None = None

    @property
    def delay(self) -> float | None:
        """Seconds until the retry (None: failed for good)."""
        if self.worker_run_at is None:
            return None
        return max((self.worker_run_at - self.worker_finished_at).total_seconds(), 0.0)


@dataclass(frozen=True)
class Cancelled:
    """An attempt that ended its job ``cancelled``, never retried: ``error`` says why."""

    job: Job
    worker_started_at: datetime  # the worker's clock, around its handler
    worker_finished_at: datetime
    error: str
    error_entry: str


@dataclass(frozen=True)
class Snoozed:
    """An attempt that put its job back, due ``delay`` seconds on, without counting it: the
    job's retry count and status stay (``retrying`` once it has retried, else ``pending``).
    ``worker_run_at`` is that time by the worker's clock, the row's is the database's."""

    job: Job
    worker_started_at: datetime  # the worker's clock, around its handler
    worker_finished_at: datetime
    worker_run_at: datetime
    error_entry: str

    @property
    def delay(self) -> float:
        """Seconds until the job is due again."""
        return max((self.worker_run_at - self.worker_finished_at).total_seconds(), 0.0)

    @property
    def status(self) -> JobStatus:
        return JobStatus.RETRYING if self.job.retry_count else JobStatus.PENDING


Attempt = Success | Failure | Cancelled | Snoozed


def cancelled(job: Job, error: str, started: datetime, now: datetime) -> Cancelled:
    """The job ends cancelled; its history says so, with the attempt that ended it."""
    error = error[:MAX_MESSAGE_LENGTH]
    entry = json.dumps(
        {
            "attempt": job.retry_count + 1,
            "outcome": JobStatus.CANCELLED.value,
            "error": error,
        }
    )
    return Cancelled(job, started, now, error, entry)


def snoozed(job: Job, seconds: float, started: datetime, now: datetime) -> Snoozed:
    """The job is due again ``seconds`` from ``now``, its attempt not counted."""
    run_at = now + timedelta(seconds=seconds)
    entry = json.dumps(
        {
            "attempt": job.retry_count + 1,
            "outcome": "snoozed",
            "error": None,
        }
    )
    return Snoozed(job, started, now, run_at, entry)


def outcome_of_failure(
    job: Job,
    error: str,
    started: datetime,
    now: datetime,
    backoff: Backoff,
    rng: random.Random | None = None,
) -> Failure:
    """The retry rule: retry while fewer than ``max_retries`` retries were made, then fail."""
    error = error[:MAX_MESSAGE_LENGTH]
    entry = json.dumps({"attempt": job.retry_count + 1, "error": error})
    if job.retry_count < job.max_retries:
        retry = job.retry_count + 1
        return Failure(
            job,
            JobStatus.RETRYING,
            retry,
            started,
            now,
            error,
            entry,
            worker_run_at=now + timedelta(seconds=backoff.delay(retry, rng)),
        )
    return Failure(job, JobStatus.FAILED, job.retry_count, started, now, error, entry)


def refused(outcome: Attempt, exc: BaseException) -> Failure:
    """The rule for an outcome the database refused to write (a constraint such as another
    job's dedup key, a trigger's error, a row it cannot take): its job fails for good with the
    refusal in its history, not retried (the same write would be refused again), and nothing
    raises out of the lane or the sweep. ``exc`` is the refusal."""
    started = None if isinstance(outcome, Success) else outcome.worker_started_at
    kind = "snoozed" if isinstance(outcome, Snoozed) else _finish_row(outcome)[1]
    error = f"its outcome could not be written ({kind}): {error_line(exc)}"
    return given_up(outcome.job, error, started)


def given_up(job: Job, error: str, started: datetime | None = None) -> Failure:
    """``job`` failed for good with ``error``, whatever its retries left: what no attempt can
    change (its outcome refused, its payload unreadable)."""
    now = datetime.now(UTC)
    error = error[:MAX_MESSAGE_LENGTH]
    entry = json.dumps({"attempt": job.retry_count + 1, "error": error})
    return Failure(job, JobStatus.FAILED, job.retry_count, started or now, now, error, entry)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros_of(moment: datetime) -> int:
    """A clock's reading in microseconds since the Unix epoch (a naive one taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _MICROSECOND


def micros_now(clock: Callable[[], datetime] | None) -> int:
    """The worker's clock now in microseconds since the Unix epoch: ``clock``'s reading (a
    test's), else the system's."""
    return micros_of(clock()) if clock is not None else time.time_ns() // 1000


def datetime_of(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


class Completion:
    """The outcome statements of one schema, compiled once for the lanes' driver: a
    transactional mode's (``write``) and the lease mode's, fenced (``write_fenced``)."""

    def __init__(self, schema: str, queue: str) -> None:
        self.queue = queue  # for the logs
        # write's: each with its fenced twin (sql.fenced), but the guarded JOB_FINISH_MANY,
        # which is never sent in the claim's transaction.
        self._one = _twins(sql.JOB_COMPLETE_ONE, sql.JOB_COMPLETE_ONE_FENCED, schema)
        self._many = _twins(sql.JOB_COMPLETE_MANY, sql.JOB_COMPLETE_MANY_FENCED, schema)
        self._finish = AsyncpgStatement.of(sql.JOB_FINISH_MANY, schema)
        self._finish_claimed = _twins(sql.JOB_FINISH_CLAIMED, sql.JOB_FINISH_CLAIMED_FENCED, schema)
        self._leased_many = AsyncpgStatement.of(sql.JOB_LEASE_COMPLETE_MANY, schema)
        self._leased_finish = AsyncpgStatement.of(sql.JOB_LEASE_FINISH_MANY, schema)

    async def write(
        self,
        driver: DriverConnection,
        outcomes: list[Attempt],
        now: datetime | None = None,
        *,
        held: bool = False,
        fence: Mapping[str, int] | None = None,
    ) -> bool:
        """Write a batch's outcomes with one statement: the narrow ones when all succeeded.
        ``now`` is a test clock's reading (None: the database's clock writes the times).
        ``held``: the rows are locked by this transaction's claim, so the statements need no
        status guard (JOB_COMPLETE_MANY, JOB_FINISH_CLAIMED); otherwise each outcome is
        written only to a job still waiting. ``fence`` (with ``held``): the exclusive
        drainer's commit fence (``lease.Fence.params``), checked in the same statement;
        False when it found the lock lost (roll back, do not commit)."""
        statement: tuple[AsyncpgStatement, AsyncpgStatement | None]
        params: dict[str, Any]
        successes = [o for o in outcomes if isinstance(o, Success)]
        if len(outcomes) == 1 and successes:
            (success,) = successes
            statement, params = self._one, {"id": success.job.id, "result": success.result}
        elif held and len(successes) == len(outcomes):
            ids = [s.job.id for s in successes]
            statement, params = self._many, {"ids": ids, "results": _results(successes)}
        else:
            statement = self._finish_claimed if held else (self._finish, None)
            params = _finish_columns(outcomes)
        plain, fenced = statement
        if fence is None:
            await driver.execute(plain.sql, *plain.args(now=now, **params))
            return True
        assert fenced is not None, "a fence goes with the claim's own transaction (held)"
        return not await driver.fetchval(fenced.sql, *fenced.args(now=now, **params, **fence))

    async def write_fenced(
        self,
        driver: DriverConnection,
        outcomes: list[Attempt],
        attempts: Mapping[uuid.UUID, int],
        owner: uuid.UUID,
        now: datetime | None = None,
    ) -> set[uuid.UUID]:
        """The lease mode's: write outcomes of ``owner``'s running jobs in one statement, each
        fenced by its attempt (``attempts``, by job); the ids written (the others' jobs were
        handed on since)."""
        successes = [o for o in outcomes if isinstance(o, Success)]
        if len(successes) == len(outcomes):
            statement = self._leased_many
            args = statement.args(
                ids=[o.job.id for o in successes],
                attempts=[attempts[o.job.id] for o in successes],
                results=_results(successes),
                worker=owner,
                now=now,
            )
        else:
            statement = self._leased_finish
            args = statement.args(worker=owner, now=now, **_finish_columns(outcomes, attempts))
        return {row[0] for row in await driver.fetch(statement.sql, *args)}

    async def record_lost(
        self, engine: AsyncEngine, failure: Failure | Cancelled, now: datetime | None = None
    ) -> bool:
        """Record a failed attempt whose transaction is gone, on a connection of its own
        (JOB_FINISH_MANY's status guard keeps it from overwriting a newer outcome); False,
        logged, when that fails too. Its started_at is still its claim's (``Job.claimed_at``)."""
        try:
            async with engine.begin() as conn:
                await conn.execute(sql.JOB_FINISH_MANY, {"now": now, **_finish_columns([failure])})
        except (OSError, DBAPIError, InterfaceError) as exc:
            logger.error(
                "could not record the failure of job %s: %s",
                failure.job.id,
                exc,
                extra={"action": "job_outcome_lost", "queue": self.queue},
            )
            return False
        return True


def _twins(
    plain: ClauseElement, fenced: ClauseElement, schema: str
) -> tuple[AsyncpgStatement, AsyncpgStatement]:
    return AsyncpgStatement.of(plain, schema), AsyncpgStatement.of(fenced, schema)


def _results(successes: list[Success]) -> list[str | None] | None:
    """The successes' results for a statement that reads each at its id's position; NULL when
    every one is (the handlers returned None), so the statement need not look them up."""
    results = [s.result for s in successes]
    return results if any(r is not None for r in results) else None


_FINISH_COLUMNS = (
    "ids",
    "statuses",
    "retry_counts",
    "delays",
    "errors",
    "error_entries",
    "results",
    "started_ats",
)


def _finish_row(outcome: Attempt) -> tuple[Any, ...]:
    """One outcome as a row of JOB_FINISH_MANY's arrays (a success keeps its retry count,
    run_at and errors: JOB_FINISH_MANY leaves NULLs as they are). The started_at sent is the
    claim's, on the database's clock; the statement writes completed_at itself."""
    job = outcome.job
    retries, delay, error, entry, result = job.retry_count, None, None, None, None
    if isinstance(outcome, Success):
        status, result = JobStatus.COMPLETED.value, outcome.result
    elif isinstance(outcome, Cancelled):
        status, error, entry = JobStatus.CANCELLED.value, outcome.error, outcome.error_entry
    elif isinstance(outcome, Snoozed):
        status, delay, entry = outcome.status.value, outcome.delay, outcome.error_entry
    else:
        status, retries, delay = outcome.status.value, outcome.retry_count, outcome.delay
        error, entry = outcome.error, outcome.error_entry
    return (job.id, status, retries, delay, error, entry, result, job.claimed_at)


def _finish_columns(
    outcomes: list[Attempt], attempts: Mapping[uuid.UUID, int] | None = None
) -> dict[str, list[Any]]:
    """Outcomes as the column arrays JOB_FINISH_MANY unnests; with ``attempts`` (the lease
    mode's fencing tokens by job), JOB_LEASE_FINISH_MANY's: each job's attempt instead of its
    claim's time (that statement leaves started_at as the committed claim wrote it)."""
    rows = zip(*(_finish_row(outcome) for outcome in outcomes), strict=True)
    columns = {name: list(values) for name, values in zip(_FINISH_COLUMNS, rows, strict=True)}
    if attempts is not None:
        del columns["started_ats"]
        columns["attempts"] = [attempts[job_id] for job_id in columns["ids"]]
    return columns


def count(
    stats: DrainStats,
    outcomes: list[Attempt],
    begun: list[float] | None = None,
    *,
    queue: str | None = None,
    claimed: float | None = None,
) -> None:
    """Count committed outcomes (called after the commit): a job's latency ends when its
    completion is committed (in batch mode, with its batch). ``begun`` holds each job's
    ``perf_counter`` at its start, ``claimed`` the ``perf_counter`` just before its claim
    began; each histogram takes the batch's latencies in one call. The end-to-end latency is
    created -> claimed on the database's clock (both its times) plus claimed -> committed on
    this worker's monotonic clock (a duration): no clock skew between the two hosts is in it,
    as there was when the worker's wall clock was subtracted from the server's created_at.
    With ``cronlock.jobs`` at INFO (``-v``), a line per job; otherwise one level check per
    batch is all it costs."""
    clock = time.perf_counter()
    if jobs_logger.isEnabledFor(logging.INFO):
        _log_jobs(outcomes, begun, clock, queue)
    run_times: list[float] = []
    waits: list[float] = []
    for i, outcome in enumerate(outcomes):
        if not isinstance(outcome, Success):
            if isinstance(outcome, Failure):
                if outcome.status is JobStatus.RETRYING:
                    stats.retried += 1
                else:
                    stats.failed += 1
            elif isinstance(outcome, Cancelled):
                stats.cancelled += 1
            else:
                stats.snoozed += 1
            continue
        stats.processed += 1
        if begun is not None:
            run_times.append(clock - begun[i])
        since = claimed if claimed is not None else begun[i] if begun is not None else None
        if since is not None:
            job = outcome.job
            waits.append((job.claimed_at - job.created_at).total_seconds() + clock - since)
    stats.run_time.record_many(run_times)
    stats.end_to_end.record_many(waits)


def _worker_ms(outcome: Failure | Cancelled | Snoozed) -> float:
    """How long the attempt took by the worker's wall clock, in milliseconds."""
    return (outcome.worker_finished_at - outcome.worker_started_at).total_seconds() * 1000


def _log_jobs(
    outcomes: list[Attempt], begun: list[float] | None, clock: float, queue: str | None
) -> None:
    """The line per committed attempt: job, type, queue, attempt, outcome, duration. The
    duration is the worker's own measure (its monotonic clock from the handler's start to the
    commit, or its wall clock around the handler for an outcome that carries those), and the
    line says so; the database's times of the job are in its row."""
    for i, outcome in enumerate(outcomes):
        job = outcome.job
        if isinstance(outcome, Failure | Cancelled):
            status, attempt = JobStatus.CANCELLED.value, job.retry_count + 1
            if isinstance(outcome, Failure):
                status = outcome.status.value
            elapsed = _worker_ms(outcome)
            detail = f": {outcome.error}"
        elif isinstance(outcome, Snoozed):
            status, attempt = "snoozed", job.retry_count + 1
            elapsed = _worker_ms(outcome)
            detail = f" until {outcome.worker_run_at.isoformat()} (the worker's clock)"
        else:
            status, attempt, detail = JobStatus.COMPLETED.value, job.retry_count + 1, ""
            elapsed = (clock - begun[i]) * 1000 if begun is not None else 0.0
        jobs_logger.info(
            "job %s %s (queue %s, attempt %d): %s in %.1f ms (worker-side)%s",
            job.id,
            job.job_type,
            queue,
            attempt,
            status,
            elapsed,
            detail,
            extra={
                "action": "job_finished",
                "job_id": job.id,
                "job_type": job.job_type,
                "queue": queue,
                "attempt": attempt,
                "outcome": status,
                "duration_ms": round(elapsed, 3),
            },
        )
