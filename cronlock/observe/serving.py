"""What ``cronlock status``, ``cronlock queue list``, the dashboard and the metrics read of a
queue the same way: whether it is served (one rule), and its jobs by status counted up to a cap.

A queue is *unserved* when jobs are due in it, it is not paused, no live drainer is active for
it (the workers table's liveness rule, ``sql.WORKER_LIST``'s ``alive``), and its oldest due job
has waited longer than ``UNSERVED_AFTER``. The wait keeps a queue drained from crontab (``drain
--max-seconds 55`` every minute: a drainer row exists only while it runs) from being flagged
between two runs; a queue that nobody drains at all is flagged two minutes after its first due
job. No process knows every other process's handlers, so this is the signal that works across
hosts: jobs that wait and nobody active to take them.

``capped_counts`` counts each queue's jobs per status up to ``COUNT_CAP`` (index-only scans
of ``ix_jobs_open`` and, for completed jobs, ``ix_jobs_finished``), so a read costs the same at
a thousand jobs and at a million; a count at the cap means "at least". ``cronlock status`` and
``queue list`` count completed jobs only up to ``COMPLETED_CAP``: each queue's completed count
is a walk of that many entries, and past a thousand the number tells an operator nothing more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .. import sql

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = [
    "COMPLETED_CAP",
    "COUNT_CAP",
    "UNSERVED_AFTER",
    "Drainer",
    "capped_counts",
    "is_unserved",
    "live_active",
]

# Jobs counted per (queue, status) before the count says "at least".
COUNT_CAP = 10_000
# Completed jobs counted per queue by status and queue list (the dashboard counts COUNT_CAP).
COMPLETED_CAP = 1_000

UNSERVED_AFTER = timedelta(minutes=2)


@dataclass(frozen=True)
class Drainer:
    """A drainer's row as status, the overview and the dashboard show it: ``state`` is
    active, standby, stopping, or gone (its heartbeat stopped: ``sql.WORKER_LIST``'s
    liveness rule)."""

    id: str
    queue: str
    state: str
    host: str
    pid: int | None
    heartbeat_age_seconds: float
    processed: int
    failed: int
    retried: int
    in_flight: int
    started_at: datetime

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Drainer:
        """From a ``sql.WORKER_LIST`` row."""
        return cls(
            id=str(row["id"]),
            queue=row["queue"],
            state=row["state"] if row["alive"] else "gone",
            host=row["host"],
            pid=row["pid"],
            heartbeat_age_seconds=round((row["now"] - row["heartbeat_at"]).total_seconds(), 3),
            processed=row["processed"],
            failed=row["failed"],
            retried=row["retried"],
            in_flight=row["in_flight"],
            started_at=row["started_at"],
        )

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "started_at": self.started_at.isoformat()}


def live_active(drainers: Iterable[Mapping[Any, Any]]) -> dict[str, int]:
    """Per queue, the live drainers that are active (or finishing), from WORKER_LIST rows."""
    active: dict[str, int] = {}
    for row in drainers:
        if row["alive"] and row["state"] in ("active", "stopping"):
            active[row["queue"]] = active.get(row["queue"], 0) + 1
    return active


def is_unserved(
    *, due: int, oldest_due_age_seconds: float | None, active_drainers: int, paused: bool
) -> bool:
    return (
        due > 0
        and not paused
        and active_drainers == 0
        and oldest_due_age_seconds is not None
        and oldest_due_age_seconds > UNSERVED_AFTER.total_seconds()
    )


async def capped_counts(
    conn: AsyncConnection, queues: Iterable[str] = (), *, completed_cap: int = COUNT_CAP
) -> tuple[dict[str, dict[str, int]], dict[str, frozenset[str]]]:
    """Per queue, its jobs by status, each counted up to ``COUNT_CAP`` (completed ones up to
    ``completed_cap``), and per queue the statuses whose count is at its cap ("at least"):
    every queue with jobs that did not complete, and of those and ``queues`` the completed
    jobs too (a queue with only completed jobs is counted when it is in ``queues``)."""
    counts: dict[str, dict[str, int]] = {}
    for pair in (await conn.execute(sql.JOB_COUNTS_CAPPED, {"cap": COUNT_CAP})).mappings():
        counts.setdefault(pair["queue"], {})[pair["status"]] = int(pair["count"])
    names = sorted(set(counts) | set(queues))
    done = await conn.execute(sql.JOB_COMPLETED_CAPPED, {"queues": names, "cap": completed_cap})
    for each in done.mappings():
        if each["count"]:
            counts.setdefault(each["queue"], {})["completed"] = int(each["count"])
    capped = {
        queue: frozenset(
            status
            for status, n in found.items()
            if n >= (completed_cap if status == "completed" else COUNT_CAP)
        )
        for queue, found in counts.items()
    }
    return counts, capped
