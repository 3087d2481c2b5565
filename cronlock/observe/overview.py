"""What the dashboard's overview shows, read on indexes so it costs the same at any size.

The overview reads, as ``cronlock status`` does, only a bounded part of each table: per task, a
few entries of ``ix_runs_task_started_at`` (its latest row, its latest success, its last
outcomes for the streaks and lateness), the schedule for overdue and the next fire time
(``periodic.backlog``) and its pause (``tasks``); per queue, each status's count up to
``COUNT_CAP`` (index-only scans of ``ix_jobs_open`` and, for completed jobs,
``ix_jobs_finished``), the due jobs
(``ix_jobs_claim``), the jobs finished in the last quarter of an hour (``ix_jobs_finished``) and
the drainers' rows. A count at the cap is shown as "at least". A queue is listed when it has
jobs that did not complete, jobs finished in the last quarter of an hour, a pause, drainers, or
a handler or declaration in the app.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from .. import sql
from ..app import App
from ..periodic import backlog
from ..periodic.task import PeriodicTask
from .serving import COUNT_CAP, Drainer, capped_counts, is_unserved, live_active
from .status import streak

__all__ = [
    "COUNT_CAP",
    "HEALTH_WINDOW",
    "Drainer",
    "Overview",
    "QueueHealth",
    "TaskHealth",
    "collect_overview",
]

# Outcomes per task read for the streaks and the lateness.
HEALTH_WINDOW = 50
RATE_WINDOWS = (1, 5, 15)


@dataclass(frozen=True)
class TaskHealth:
    """A periodic task as the overview shows it; ``task`` is None for a name found only in
    ``runs`` (a task this app does not register: removed, or another app's)."""

    name: str
    task: PeriodicTask | None
    next_fire: datetime | None
    last_run_id: int | None
    last_status: str | None
    last_started_at: datetime | None
    last_success: datetime | None
    consecutive_failures: int
    consecutive_misses: int
    overdue: backlog.Overdue | None
    lateness_last_ms: float | None
    lateness_mean_ms: float | None
    lateness_max_ms: float | None
    # Task control (periodic.control): paused by whom since when (None: not paused).
    paused_at: datetime | None = None
    paused_by: str | None = None

    @property
    def health(self) -> str:
        """One word a person reads first: paused, overdue, failing, missing, late or ok (or
        new)."""
        if self.paused_at is not None:
            return "paused"
        if self.overdue is not None:
            return "overdue"
        if self.consecutive_failures:
            return "failing"
        if self.consecutive_misses:
            return "missing"
        if self.last_status is None:
            return "new"
        return "ok"


@dataclass(frozen=True)
class QueueHealth:
    name: str
    paused: bool
    paused_at: datetime | None
    counts: dict[str, int]
    capped: frozenset[str]  # statuses whose count reached COUNT_CAP: "at least"
    due: int
    oldest_due_age_seconds: float | None
    per_minute: dict[int, float]  # jobs finished for good per minute, over 1, 5, 15 minutes
    failed_per_minute: dict[int, float]
    drainers: tuple[Drainer, ...]
    unserved: bool

    def drainers_in(self, state: str) -> int:
        return sum(1 for drainer in self.drainers if drainer.state == state)


@dataclass(frozen=True)
class Overview:
    now: datetime
    tasks: tuple[TaskHealth, ...]
    queues: tuple[QueueHealth, ...]
    count_cap: int = COUNT_CAP
    drainers: tuple[Drainer, ...] = field(default=())


async def collect_overview(app: App, *, now: datetime | None = None) -> Overview:
    """Every task (registered, or with rows in ``runs``) and every queue (with jobs, paused,
    drained, or handled by ``app``), at ``now`` (default: the clock)."""
    now = now or datetime.now(UTC)
    async with app.database.connect() as conn:
        names = sorted(set(app.tasks) | set((await conn.execute(sql.RUN_TASK_NAMES)).scalars()))
        latest = {
            row.task: row for row in await conn.execute(sql.RUN_LATEST_PER_TASK, {"tasks": names})
        }
        outcomes: dict[str, list[tuple[str, float | None]]] = {}
        rows = await conn.execute(
            sql.RUN_OUTCOMES_PER_TASK, {"tasks": names, "limit": HEALTH_WINDOW}
        )
        for row in rows:
            outcomes.setdefault(row.task, []).append((row.status, row.lateness_ms))
        overdue = await backlog.overdue_by_task(conn, app.tasks.values(), now)
        task_paused = {row.name: row for row in await conn.execute(sql.TASK_STATES)}

        due = {row.queue: row for row in await conn.execute(sql.JOB_OLDEST_DUE)}
        rates = {
            row["queue"]: row for row in (await conn.execute(sql.JOB_RATES_BY_QUEUE)).mappings()
        }
        paused = {row.name: row.paused_at for row in await conn.execute(sql.QUEUE_LIST)}
        drainer_rows = (await conn.execute(sql.WORKER_LIST)).mappings().all()
        handled = {defaults.queue for defaults in app.job_types.values()}
        known = set(due) | set(rates) | set(paused) | {row["queue"] for row in drainer_rows}
        counts, _ = await capped_counts(conn, known | handled)
        queue_names = sorted(set(counts) | known | handled)

    tasks = []
    for name in names:
        task = app.tasks.get(name)
        last = latest.get(name)
        recent = outcomes.get(name, [])
        lateness = [ms for status, ms in recent if ms is not None and status != "missed"][:10]
        tasks.append(
            TaskHealth(
                name=name,
                task=task,
                next_fire=None if task is None else task.schedule.next_fire_time(now),
                last_run_id=None if last is None else last.id,
                last_status=None if last is None else last.status,
                last_started_at=None if last is None else last.started_at,
                last_success=None if last is None else last.last_success,
                consecutive_failures=streak((s for s, _ in recent), "failed"),
                consecutive_misses=streak((s for s, _ in recent), "missed"),
                overdue=overdue.get(name),
                lateness_last_ms=lateness[0] if lateness else None,
                lateness_mean_ms=sum(lateness) / len(lateness) if lateness else None,
                lateness_max_ms=max(lateness) if lateness else None,
                paused_at=task_paused[name].paused_at if name in task_paused else None,
                paused_by=task_paused[name].paused_by if name in task_paused else None,
            )
        )

    drainers = tuple(Drainer.from_row(row) for row in drainer_rows)
    active = live_active(drainer_rows)
    queues = []
    for name in queue_names:
        waiting = due.get(name)
        age = (
            None
            if waiting is None
            else round((waiting.now - waiting.oldest_due_at).total_seconds(), 3)
        )
        number = 0 if waiting is None else int(waiting.due)
        rate = rates.get(name)
        since = paused.get(name)
        found = counts.get(name, {})
        queues.append(
            QueueHealth(
                name=name,
                paused=since is not None,
                paused_at=since,
                counts=found,
                capped=frozenset(s for s, n in found.items() if n >= COUNT_CAP),
                due=number,
                oldest_due_age_seconds=age,
                per_minute={
                    m: 0.0 if rate is None else (rate[f"completed_{m}m"] + rate[f"failed_{m}m"]) / m
                    for m in RATE_WINDOWS
                },
                failed_per_minute={
                    m: 0.0 if rate is None else rate[f"failed_{m}m"] / m for m in RATE_WINDOWS
                },
                drainers=tuple(d for d in drainers if d.queue == name),
                unserved=is_unserved(
                    due=number,
                    oldest_due_age_seconds=age,
                    active_drainers=active.get(name, 0),
                    paused=since is not None,
                ),
            )
        )
    return Overview(now=now, tasks=tuple(tasks), queues=tuple(queues), drainers=drainers)
