"""Assertions on the queue and a drain to the end: what a test of "this enqueues that" needs.

``enqueued`` reads the jobs of a type whose payload matches (the jobs table is the whole
truth, so it is read, never a recording of calls); ``assert_enqueued`` fails with the jobs
that *were* enqueued when none matches. ``drain_until_idle`` drains until nothing is due, and
with a ``TestClock`` also moves the clock to each job still waiting (a retry's backoff, a
delayed job), so a test runs a job's whole life in milliseconds. ``eager`` is the honest
version of "jobs run at commit": whatever the block enqueued (and committed) is drained when
the block ends, before the test reads the results.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..app import App
from ..database import Database
from ..outcome import DrainResult, JobStatus, RunStatus
from ..queue.operate import MAX_PAGE_SIZE, JobFilter, JobInfo, list_jobs
from .clock import TestClock

__all__ = ["Drained", "assert_enqueued", "drain_until_idle", "eager", "enqueued"]

# The counters of a drain's stats that say it ran something.
_ACTIVITY = ("processed", "failed", "retried", "cancelled", "snoozed")
_WAITING = (JobStatus.PENDING, JobStatus.RETRYING)


@dataclass
class Drained:
    """What ``drain_until_idle`` did: each drain's result, the counters summed over them,
    and the instants it moved the clock to (none without a clock)."""

    drains: list[DrainResult] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)
    clock_moves: list[datetime] = field(default_factory=list)

    @property
    def processed(self) -> int:
        """Jobs completed."""
        return self.totals.get("processed", 0)

    @property
    def failed(self) -> int:
        """Jobs that failed for good."""
        return self.totals.get("failed", 0)

    @property
    def retried(self) -> int:
        """Attempts that failed and left the job retrying."""
        return self.totals.get("retried", 0)

    def _add(self, result: DrainResult) -> bool:
        self.drains.append(result)
        for name, value in result.stats.items():
            if isinstance(value, int) and not isinstance(value, bool):
                self.totals[name] = self.totals.get(name, 0) + value
        return any(result.stats.get(name) for name in _ACTIVITY)


def _database(source: App | Database) -> Database:
    return source.database if isinstance(source, App) else source


async def _jobs(database: Database, where: JobFilter) -> list[JobInfo]:
    found: list[JobInfo] = []
    cursor: str | None = None
    while True:
        page = await list_jobs(database, where, limit=MAX_PAGE_SIZE, cursor=cursor)
        found += page.jobs
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


def _matches(payload: Any, match: Mapping[str, Any]) -> bool:
    if not match:
        return True
    if not isinstance(payload, Mapping):
        return False
    return all(key in payload and payload[key] == value for key, value in match.items())


async def enqueued(
    source: App | Database,
    job_type: str,
    /,
    *,
    status: JobStatus | str | None = None,
    **match: Any,
) -> list[JobInfo]:
    """The jobs of ``job_type`` in ``source``'s database (an app's, or a ``Database``)
    whose payload has every key of ``match`` with an equal value (JSON values: a payload
    read back holds lists, not tuples), oldest first; of any status unless ``status``
    says which. Typed payloads are compared as their JSON (a model's fields)."""
    where = JobFilter(job_type=job_type, status=status)
    rows = await _jobs(_database(source), where)
    return [job for job in reversed(rows) if _matches(job.payload, match)]


def _describe(jobs: list[JobInfo]) -> str:
    if not jobs:
        return "no jobs at all"
    shown = [f"  {job.job_type} {job.status.value} {job.payload!r}" for job in jobs[:20]]
    more = [f"  … and {len(jobs) - 20} more"] if len(jobs) > 20 else []
    return "\n".join([f"{len(jobs)} job(s):", *shown, *more])


async def assert_enqueued(
    source: App | Database,
    job_type: str,
    /,
    *,
    count: int | None = None,
    status: JobStatus | str | None = None,
    **match: Any,
) -> list[JobInfo]:
    """Fail unless a job of ``job_type`` whose payload matches ``match`` exists (exactly
    ``count`` of them, if given); the matching jobs. The failure lists what was enqueued."""
    found = await enqueued(source, job_type, status=status, **match)
    if (not found and count is None) or (count is not None and len(found) != count):
        every = await _jobs(_database(source), JobFilter())
        wanted = f"{count} job(s)" if count is not None else "a job"
        where = f" ({status})" if status is not None else ""
        raise AssertionError(
            f"expected {wanted} {job_type!r}{where} with payload matching {match!r}, "
            f"found {len(found)}; enqueued: {_describe(list(reversed(every)))}"
        )
    return found


async def _next_waiting(database: Database, after: datetime) -> datetime | None:
    """The earliest run_at after ``after`` of a job waiting to run."""
    waiting = await _jobs(database, JobFilter(status=_WAITING))
    return min((job.run_at for job in waiting if job.run_at > after), default=None)


async def drain_until_idle(
    app: App,
    *,
    clock: TestClock | None = None,
    max_drains: int = 100,
    **options: Any,
) -> Drained:
    """Drain ``app``'s queue (``app.drain(**options)``, any ``DrainOptions`` field) until
    a drain runs nothing. With a ``clock``, then move it to the next job still waiting (a
    retry's backoff, a job enqueued to run later) and drain again, until none waits.

    A drain that was skipped (another exclusive drainer holds the queue) or failed, or more
    than ``max_drains`` drains, is an ``AssertionError``: a test should not pass on a queue
    it never drained."""
    drained = Drained()
    while len(drained.drains) < max_drains:
        result = await app.drain(**options)
        if result.status is RunStatus.SKIPPED or result.status is RunStatus.FAILED:
            why = result.skip_reason or result.error
            raise AssertionError(f"the drain was {result.status.value}: {why}")
        if drained._add(result):
            continue
        if clock is None:
            return drained
        moment = await _next_waiting(app.database, clock.now())
        if moment is None:
            return drained
        drained.clock_moves.append(clock.set(moment))
    raise AssertionError(f"the queue was still busy after {max_drains} drains")


@asynccontextmanager
async def eager(
    app: App, *, clock: TestClock | None = None, **options: Any
) -> AsyncIterator[Drained]:
    """Run what the block enqueued as soon as it ends: ``drain_until_idle`` at the block's
    exit (not at the exit of an exception), its ``Drained`` filled in then.

    Not run inside the enqueuing transaction: a job the block enqueued in a transaction it
    did not commit is not there to run, as in production."""
    drained = Drained()
    yield drained
    done = await drain_until_idle(app, clock=clock, **options)
    drained.drains, drained.totals, drained.clock_moves = (
        done.drains,
        done.totals,
        done.clock_moves,
    )
