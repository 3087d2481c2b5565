"""Retention: the built-in task ``prune``, which keeps jobs, runs and worker rows from growing
forever.

Like ``drain``, ``prune`` is built in: every App has it unless told otherwise
(``App(retention=False)``), ``cronlock run prune`` and ``cronlock prune [--dry-run]`` run it,
``cronlock list`` and ``cronlock crontab`` show it with its schedule, and ``cronlock scheduler``
fires it. It deletes completed jobs finished more than ``Retention.completed`` ago (7 days by
default), failed and cancelled ones after ``Retention.failed`` (30 days), runs after
``Retention.runs`` (30 days; a task's latest claimed slot and its latest success stay, however
old, since the backlog, overdue and "last success" read them), and worker rows whose heartbeat
stopped ``Retention.workers`` ago (an hour).

It never holds a long lock or a long transaction: each batch of ``batch_size`` rows is one
short transaction of its own, locked with ``FOR UPDATE SKIP LOCKED`` (a row someone else holds
is left for next time), and each walk resumes from where its last batch ended on an index of
the rows' age (``ix_jobs_finished``, ``ix_runs_started_at``), so the millionth row costs what
the first did. One prune runs at a time across hosts: it holds the advisory lock
(``cronlock``, ``prune``) in an idle transaction on a connection of its own, which has no
snapshot and no transaction id, so it holds back no vacuum; a second prune is skipped.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from . import pg, sql
from .cron import CronSchedule
from .database import Database
from .errors import ConfigurationError, InvalidCron
from .locks import lock_key, namespace_key
from .outcome import JobStatus, RunStatus

# A wait row older than this was left by a waiter that died (retention removes it).
STALE_WAIT = timedelta(days=1)

__all__ = ["DEFAULT_PRUNE_CRON", "PRUNE_TASK", "PruneResult", "Retention", "prune"]

logger = logging.getLogger("cronlock.retention")

PRUNE_TASK = "prune"
# Every hour at :17: each run removes about an hour's worth of rows, never a month's at once.
DEFAULT_PRUNE_CRON = "17 * * * *"
_LOCK = {"namespace": namespace_key("cronlock"), "key": lock_key(PRUNE_TASK)}
_BEFORE_ANY = datetime(1, 1, 1, tzinfo=UTC)
_NIL = uuid.UUID(int=0)


@dataclass(frozen=True)
class Retention:
    """How long finished jobs, runs and dead drainers' rows are kept, and when ``prune`` runs.

    Durations are ``timedelta`` or seconds; ``cron`` is the built-in task's schedule (UTC);
    ``batch_size`` rows are deleted per transaction.
    """

    completed: timedelta = timedelta(days=7)
    failed: timedelta = timedelta(days=30)  # failed and cancelled jobs
    runs: timedelta = timedelta(days=30)
    workers: timedelta = timedelta(hours=1)
    cron: str = DEFAULT_PRUNE_CRON
    batch_size: int = 1000
    schedule: CronSchedule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("completed", "failed", "runs", "workers"):
            value = getattr(self, name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                value = timedelta(seconds=value)
                object.__setattr__(self, name, value)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise ConfigurationError(f"retention: {name} must be a positive duration")
        if isinstance(self.batch_size, bool) or not 1 <= self.batch_size <= 100_000:
            raise ConfigurationError("retention: batch_size must be between 1 and 100000")
        try:
            schedule = CronSchedule.parse(self.cron, "UTC")
        except InvalidCron as exc:
            raise InvalidCron(f"retention: {exc}") from None
        object.__setattr__(self, "schedule", schedule)

    def to_dict(self) -> dict[str, Any]:
        return {
            "completed_s": self.completed.total_seconds(),
            "failed_s": self.failed.total_seconds(),
            "runs_s": self.runs.total_seconds(),
            "workers_s": self.workers.total_seconds(),
            "cron": self.cron,
            "batch_size": self.batch_size,
        }


@dataclass(frozen=True)
class PruneResult:
    """What a prune removed (or, with ``dry_run``, would remove)."""

    status: RunStatus  # completed, or skipped when another prune holds the lock
    dry_run: bool
    completed_jobs: int = 0
    failed_jobs: int = 0
    cancelled_jobs: int = 0
    runs: int = 0
    workers: int = 0
    batches: int = 0
    duration_s: float = 0.0
    skip_reason: str | None = None

    @property
    def removed(self) -> int:
        return (
            self.completed_jobs + self.failed_jobs + self.cancelled_jobs + self.runs + self.workers
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": PRUNE_TASK,
            "status": self.status.value,
            "dry_run": self.dry_run,
            "skip_reason": self.skip_reason,
            "completed_jobs": self.completed_jobs,
            "failed_jobs": self.failed_jobs,
            "cancelled_jobs": self.cancelled_jobs,
            "runs": self.runs,
            "workers": self.workers,
            "batches": self.batches,
            "duration_s": round(self.duration_s, 3),
        }


def _cutoffs(retention: Retention, now: datetime) -> dict[JobStatus, datetime]:
    return {
        JobStatus.COMPLETED: now - retention.completed,
        JobStatus.FAILED: now - retention.failed,
        JobStatus.CANCELLED: now - retention.failed,
    }


async def _count(database: Database, retention: Retention, now: datetime) -> dict[str, int]:
    counts: dict[str, int] = {}
    async with database.connect() as conn:
        for status, before in _cutoffs(retention, now).items():
            found = await conn.execute(sql.JOB_PRUNE_COUNT, {"status": status, "before": before})
            counts[status.value] = int(found.scalar_one())
        found = await conn.execute(sql.RUN_PRUNE_COUNT, {"before": now - retention.runs})
        counts["runs"] = int(found.scalar_one())
        found = await conn.execute(sql.WORKER_PRUNE_COUNT, {"older_than": retention.workers})
        counts["workers"] = int(found.scalar_one())
    return counts


async def _in_batches(
    database: Database,
    statement: Any,
    params: dict[str, Any],
    keyset: tuple[str, str],
    first: tuple[Any, Any],
    limit: int,
) -> tuple[int, int]:
    """``statement`` (a ``DELETE … RETURNING`` of its rows' keyset position) again and again,
    ``limit`` rows a transaction, from ``first`` on: the rows it removed, and the batches."""
    position, removed, batches = first, 0, 0
    while True:
        async with database.engine.begin() as conn:
            given = {**params, **dict(zip(keyset, position, strict=True)), "limit": limit}
            rows = (await conn.execute(statement, given)).all()
        batches += 1
        removed += len(rows)
        if len(rows) < limit:
            return removed, batches
        position = max((moment, key) for moment, key in rows)


def _result(
    counts: dict[str, int], *, dry_run: bool, started: float, batches: int = 0
) -> PruneResult:
    return PruneResult(
        RunStatus.COMPLETED,
        dry_run,
        completed_jobs=counts["completed"],
        failed_jobs=counts["failed"],
        cancelled_jobs=counts["cancelled"],
        runs=counts["runs"],
        workers=counts["workers"],
        batches=batches,
        duration_s=time.monotonic() - started,
    )


class _PruneLock:
    """The advisory lock one prune holds, in an idle transaction on a connection of its own."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self._driver: pg.DriverConnection | None = None

    async def take(self) -> bool:
        driver = self._driver = await pg.connect(self.database, "cronlock-prune")
        transaction = driver.transaction()
        await transaction.start()
        no_timeouts = pg.AsyncpgStatement.of(sql.NO_TIMEOUTS_LOCAL, self.database.schema)
        await driver.fetch(no_timeouts.sql, *no_timeouts.args())
        try_lock = pg.AsyncpgStatement.of(sql.LOCK_TRY_XACT, self.database.schema)
        taken = bool(await driver.fetchval(try_lock.sql, *try_lock.args(**_LOCK)))
        # By the simple protocol, which drops the portal (and its snapshot) fetchval left open.
        await driver.execute(pg.AsyncpgStatement.of(sql.PING, self.database.schema).sql)
        return taken

    async def release(self) -> None:
        if self._driver is not None:
            driver, self._driver = self._driver, None
            try:
                await driver.close()
            except Exception:
                driver.terminate()


async def prune(
    database: Database,
    retention: Retention,
    *,
    dry_run: bool = False,
    now: datetime | None = None,
) -> PruneResult:
    """Delete what ``retention`` no longer keeps (``dry_run``: count it, delete nothing);
    skipped while another prune runs. ``now`` (default: the clock) is what ages count from."""
    now = now or datetime.now(UTC)
    started = time.monotonic()
    if dry_run:
        return _result(await _count(database, retention, now), dry_run=True, started=started)
    lock = _PruneLock(database)
    try:
        if not await lock.take():
            logger.info("prune skipped: another prune is running", extra={"action": "prune_skip"})
            return PruneResult(
                RunStatus.SKIPPED, False, skip_reason="another prune is running", duration_s=0.0
            )
        limit, batches = retention.batch_size, 0
        removed: dict[str, int] = {}
        for status, before in _cutoffs(retention, now).items():
            keyset = ("after_completed_at", "after_id")
            params = {"status": status, "before": before}
            removed[status.value], more = await _in_batches(
                database, sql.JOB_PRUNE, params, keyset, (_BEFORE_ANY, _NIL), limit
            )
            batches += more
        params = {"before": now - retention.runs}
        keyset = ("after_started_at", "after_id")
        removed["runs"], more = await _in_batches(
            database, sql.RUN_PRUNE, params, keyset, (_BEFORE_ANY, 0), limit
        )
        batches += more
        async with database.engine.begin() as conn:
            gone = await conn.execute(sql.WORKER_PRUNE, {"older_than": retention.workers})
            removed["workers"] = int(gone.rowcount)
            # Cancel requests nobody settled (their job ended after its operator stopped
            # waiting), as old as the completed jobs retention removes.
            await conn.execute(sql.CANCEL_PRUNE, {"before": now - retention.completed})
            # Waits a dead waiter left (a live one removes its own when it ends); a day is
            # longer than any wait holds (GET ?wait= at most a minute).
            await conn.execute(sql.WAIT_PRUNE, {"before": now - STALE_WAIT})
    finally:
        await lock.release()
    result = _result(removed, dry_run=False, started=started, batches=batches)
    logger.info(
        "pruned %d row(s) in %d batch(es)",
        result.removed,
        result.batches,
        extra={"action": "pruned", **result.to_dict()},
    )
    return result
