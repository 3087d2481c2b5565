"""Whether a queue is served: the one rule ``cronlock status``, ``cronlock queue list`` and the
metrics share.

A queue is *unserved* when jobs are due in it, it is not paused, no live drainer is active for
it (the workers table's liveness rule, ``sql.WORKER_LIST``'s ``alive``), and its oldest due job
has waited longer than ``UNSERVED_AFTER``. The wait keeps a queue drained from crontab (``drain
--max-seconds 55`` every minute: a drainer row exists only while it runs) from being flagged
between two runs; a queue that nobody drains at all is flagged two minutes after its first due
job. No process knows every other process's handlers, so this is the signal that works across
hosts: jobs that wait and nobody active to take them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

__all__ = ["UNSERVED_AFTER", "is_unserved", "live_active"]

UNSERVED_AFTER = timedelta(minutes=2)


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
