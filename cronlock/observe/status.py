"""What ``cronlock status`` reports, computed from the tables.

Per task: the last runs, and how its schedule is doing — the last success, how many failures
and missed slots in a row, how late recent runs started, and whether it is overdue (a slot past
its grace with no outcome, from the schedule at read time: ``periodic.backlog``), whether it is
paused (by whom, since when) and its parked items with their last error. The queue:
counts by status, the oldest due job, whether it is paused or unserved (due jobs that no live
drainer takes: ``observe.serving``), recent failures, rates, and the drainers.

Every read is bounded, as the dashboard's overview: per task a short walk of
``ix_runs_task_started_at``, per queue and status a count up to ``COUNT_CAP``, completed jobs up
to ``COMPLETED_CAP`` (``counts_capped`` names the statuses at their cap: "at least"), the latest
failures from the newest entries of ``ix_jobs_finished`` and ``ix_jobs_created``, the rates from
the last quarter of an hour of ``ix_jobs_finished``. A queue is listed when it has jobs that did
not complete, due jobs, jobs finished in the last quarter of an hour, or a pause.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .. import sql
from ..database import Database
from ..periodic import PeriodicTask, backlog
from .serving import COMPLETED_CAP, Drainer, capped_counts, is_unserved, live_active

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["collect", "streak"]


def _jsonable(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


async def collect(
    tasks: Mapping[str, PeriodicTask],
    database: Database,
    *,
    limit: int = 5,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The report on an app's registered ``tasks`` and whatever else ran; ``now`` (default:
    the clock) is when a registered task is overdue at."""
    now = now or datetime.now(UTC)
    async with database.connect() as conn:
        # Each read per task is a short walk of ix_runs_task_started_at (as the dashboard's).
        names = sorted(set(tasks) | set((await conn.execute(sql.RUN_TASK_NAMES)).scalars()))
        given = {"tasks": names, "limit": limit}
        by_task: dict[str, list[dict[str, Any]]] = {}
        for row in (await conn.execute(sql.RUN_RECENT_PER_TASK, given)).mappings():
            by_task.setdefault(row["task"], []).append(
                {key: _jsonable(value) for key, value in row.items()}
            )
        last_real = {
            row["task"]: {key: _jsonable(value) for key, value in row.items()}
            for row in (await conn.execute(sql.RUN_LAST_REAL_PER_TASK, given)).mappings()
        }
        health = await _slot_health(conn, names)
        overdue = await backlog.overdue_by_task(conn, tasks.values(), now)
        paused = {
            row.name: {"paused_at": _jsonable(row.paused_at), "paused_by": row.paused_by}
            for row in await conn.execute(sql.TASK_STATES)
            if row.paused_at is not None
        }
        parked: dict[str, list[dict[str, Any]]] = {}
        for row in (await conn.execute(sql.ITEMS_PARKED, {"limit": PARKED_LISTED})).mappings():
            parked.setdefault(row["task"], []).append(
                {key: _jsonable(row[key]) for key in _PARKED_KEYS}
            )
    return {
        "tasks": [
            {
                "task": name,
                # False: rows in the schema, no task of this app (another app's, or removed).
                "registered": name in tasks,
                "last_runs": by_task.get(name, []),
                "last_real_run": last_real.get(name),
                **health.get(name, _NO_HEALTH),
                "overdue": _overdue(overdue.get(name)),
                # Task control (periodic.control): who paused it, since when; parked items.
                "paused": paused.get(name),
                "parked_count": parked[name][0]["parked_count"] if name in parked else 0,
                "parked": parked.get(name, []),
            }
            for name in names
        ],
        "queue": await collect_queue(database, failures=max(limit, 10)),
    }


# Parked items listed per task (the count says how many there are).
PARKED_LISTED = 20
_PARKED_KEYS = ("item", "failures", "error", "parked_at", "last_failed_at", "parked_count")


def _overdue(late: backlog.Overdue | None) -> dict[str, Any] | None:
    return None if late is None else late.to_dict()


# -- scheduling health (issue 4) ----------------------------------------------------------

# Outcomes per task read to compute streaks and lateness.
HEALTH_WINDOW = 50

_NO_HEALTH: dict[str, Any] = {
    "last_success": None,
    "consecutive_failures": 0,
    "consecutive_misses": 0,
    "recent_lateness_ms": None,
}


def streak(statuses: Iterable[str], status: str) -> int:
    """How many of the newest outcomes in a row have ``status`` (status and the dashboard)."""
    return sum(1 for _ in itertools.takewhile(lambda each: each == status, statuses))


async def _slot_health(conn: AsyncConnection, names: list[str]) -> dict[str, dict[str, Any]]:
    """Per task of ``names``: last success, consecutive failures and misses, recent lateness.

    Streaks count the outcomes that claimed a slot (or a manual run), newest first; skips are
    not outcomes of their own and do not break a streak.
    """
    last_success = {
        row.task: row.last_success
        for row in await conn.execute(sql.RUN_LATEST_PER_TASK, {"tasks": names})
        if row.last_success is not None
    }
    outcomes: dict[str, list[Any]] = {}
    rows = await conn.execute(sql.RUN_OUTCOMES_PER_TASK, {"tasks": names, "limit": HEALTH_WINDOW})
    for row in rows:
        outcomes.setdefault(row.task, []).append(row)
    health: dict[str, dict[str, Any]] = {}
    for task in set(last_success) | set(outcomes):
        recent = outcomes.get(task, [])
        statuses = [row.status for row in recent]
        lateness = [
            row.lateness_ms
            for row in recent
            if row.lateness_ms is not None and row.status != "missed"
        ][:10]
        health[task] = {
            "last_success": _jsonable(last_success.get(task)),
            "consecutive_failures": streak(statuses, "failed"),
            "consecutive_misses": streak(statuses, "missed"),
            "recent_lateness_ms": None
            if not lateness
            else {
                "last": round(lateness[0], 3),
                "mean": round(sum(lateness) / len(lateness), 3),
                "max": round(max(lateness), 3),
                "runs": len(lateness),
            },
        }
    return health


# -- the job queue ----------------------------------------------------------------------------

_RATE_KEYS = [f"{outcome}_{m}m" for outcome in ("completed", "failed") for m in (1, 5, 15)]


async def collect_queue(database: Database, *, failures: int = 10) -> dict[str, Any]:
    """The queue as the tables tell it (``processing`` is in flight: see the workers)."""
    async with database.connect() as conn:
        due = {
            row.queue: {
                "due": row.due,
                "oldest_due_age_seconds": round((row.now - row.oldest_due_at).total_seconds(), 3),
            }
            for row in await conn.execute(sql.JOB_OLDEST_DUE)
        }
        recent = [
            {key: str(value) if key == "id" else _jsonable(value) for key, value in row.items()}
            for row in (await conn.execute(sql.JOB_RECENT_FAILURES, {"limit": failures})).mappings()
        ]
        by_queue = (await conn.execute(sql.JOB_RATES_BY_QUEUE)).mappings().all()
        rates_row = {key: sum(row[key] for row in by_queue) for key in _RATE_KEYS}
        paused = {row.name: row.paused_at for row in await conn.execute(sql.QUEUE_LIST)}
        seen = set(due) | set(paused) | {row["queue"] for row in by_queue}
        counts, capped = await capped_counts(conn, seen, completed_cap=COMPLETED_CAP)
        drainer_rows = (await conn.execute(sql.WORKER_LIST)).mappings().all()
        active = live_active(drainer_rows)
        workers = [Drainer.from_row(row).to_dict() for row in drainer_rows]
    queues = sorted(set(counts) | set(due) | {name for name, at in paused.items() if at})
    rates = {
        f"{outcome}_per_min_{minutes}m": round(rates_row[f"{outcome}_{minutes}m"] / minutes, 3)
        for outcome in ("completed", "failed")
        for minutes in (1, 5, 15)
    }
    return {
        "queues": [
            {
                "queue": queue,
                "counts": counts.get(queue, {}),
                # Counted up to COUNT_CAP (observe.serving): these statuses have at least it.
                "counts_capped": sorted(capped.get(queue, ())),
                "due": due.get(queue, {}).get("due", 0),
                "oldest_due_age_seconds": due.get(queue, {}).get("oldest_due_age_seconds"),
                # Queue control and who serves it (observe.serving: the one rule).
                "paused": paused.get(queue) is not None,
                "paused_at": _jsonable(paused.get(queue)),
                "active_drainers": active.get(queue, 0),
                "unserved": is_unserved(
                    due=due.get(queue, {}).get("due", 0),
                    oldest_due_age_seconds=due.get(queue, {}).get("oldest_due_age_seconds"),
                    active_drainers=active.get(queue, 0),
                    paused=paused.get(queue) is not None,
                ),
            }
            for queue in queues
        ],
        "rates": rates,
        "recent_failures": recent,
        "workers": workers,
    }
