"""A history for the dashboard: runs of every outcome and jobs in every state, as rows.

``seed(database, now)`` writes, relative to ``now``: for ``every-minute`` the last 30 slots
with each outcome (completed, partial with a failed item, failed, interrupted, a skip beside
a completed run and one alone, recorded misses, and one slot with no row at all: missed, not
recorded yet); for ``hourly-report`` a few completed hours; a run of ``retired-task``, which
no app registers; jobs pending, retrying, failed (with its error history), completed (with a
result) and cancelled in the queues ``default``, ``emails`` and ``reports``, with ``reports``
paused; and three drainers' rows for ``emails``: active, standby, and one gone (an old
heartbeat).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, update

from cronlock import Database
from cronlock.sql.tables import jobs, queues, runs, workers


@dataclass(frozen=True)
class Seeded:
    failed_job: uuid.UUID
    pending_job: uuid.UUID
    completed_job: uuid.UUID
    cancelled_job: uuid.UUID
    retrying_job: uuid.UUID
    missed_slot: datetime  # recorded missed
    unrecorded_slot: datetime  # no row at all, past its grace
    failed_run_slot: datetime
    first_slot: datetime  # every-minute's oldest seeded slot
    live_drainers: tuple[uuid.UUID, ...]  # the active and the standby row of emails


def _minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


async def seed(database: Database, now: datetime) -> Seeded:
    top = _minute(now) - timedelta(minutes=2)  # every slot well past its grace
    slots = [top - timedelta(minutes=n) for n in range(30)][::-1]
    rows: list[dict[str, Any]] = []

    def run(task: str, slot: datetime | None, status: str, **extra: Any) -> None:
        started = (slot or now - timedelta(minutes=3)) + timedelta(seconds=1)
        rows.append(
            {
                "task": task,
                "slot": slot,
                "status": status,
                "started_at": started,
                "finished_at": started + timedelta(milliseconds=250),
                "lateness_ms": None if slot is None else 1000.0,
                "trigger": "cron",
                "host": "host-a",
                "pid": 4242,
                "items_ok": 0,
                "items_failed": 0,
                "failures": [],
                "error": None,
                "skip_reason": None,
                **extra,
            }
        )

    missed_slot, unrecorded, failed_slot = slots[10], slots[20], slots[15]
    for slot in slots:
        if slot == unrecorded:
            continue
        if slot == missed_slot or slot == slots[11]:
            run("every-minute", slot, "missed", finished_at=None, lateness_ms=None)
        elif slot == failed_slot:
            run("every-minute", slot, "failed", error="RuntimeError: the report server is down")
        elif slot == slots[5]:
            run(
                "every-minute",
                slot,
                "partial",
                items_ok=9,
                items_failed=1,
                failures=[
                    {"item": "post-17", "error_type": "ValueError", "message": "bad encoding"}
                ],
            )
        elif slot == slots[3]:  # a chunked run whose process died: its chunks kept
            run("every-minute", slot, "interrupted", items_ok=4, error="the run's process died")
        elif slot == slots[8]:  # fired while the run before still held the lock
            run("every-minute", slot, "skipped", skip_reason="lock_busy", finished_at=None)
        else:
            run("every-minute", slot, "completed", items_ok=3)
            if slot == slots[7]:
                run("every-minute", slot, "skipped", skip_reason="lock_busy", finished_at=None)
    for hours in range(4, 0, -1):
        slot = _minute(now).replace(minute=5) - timedelta(hours=hours)
        run("hourly-report", slot, "completed", items_ok=1)
    run("retired-task", slots[0], "completed")

    ids = {name: uuid.uuid4() for name in ("failed", "pending", "completed", "cancelled", "retry")}
    created = now - timedelta(minutes=20)
    error_entry = {
        "attempt": 1,
        "error": "ConnectionError: smtp refused",
        "at": created.isoformat(),
    }
    job_rows: list[dict[str, Any]] = [
        {
            "id": ids["failed"],
            "job_type": "noop",
            "payload": {"to": "ana@example.com"},
            "status": "failed",
            "queue": "default",
            "max_retries": 0,
            "error_message": "ConnectionError: smtp refused",
            "error_history": [error_entry],
            "created_at": created,
            "run_at": created,
            "started_at": created,
            "completed_at": created + timedelta(seconds=1),
        },
        {
            "id": ids["pending"],
            "job_type": "noop",
            "payload": {"n": 1},
            "status": "pending",
            "queue": "reports",
            "created_at": created + timedelta(seconds=1),
            "run_at": created + timedelta(seconds=1),
        },
        {
            "id": ids["completed"],
            "job_type": "echo",
            "payload": {"n": 2},
            "status": "completed",
            "queue": "emails",
            "result": {"echo": {"n": 2}},
            "created_at": created + timedelta(seconds=2),
            "run_at": created + timedelta(seconds=2),
            "started_at": created + timedelta(seconds=3),
            "completed_at": now - timedelta(seconds=30),
        },
        {
            "id": ids["cancelled"],
            "job_type": "noop",
            "payload": {"n": 3},
            "status": "cancelled",
            "queue": "emails",
            "created_at": created + timedelta(seconds=3),
            "run_at": created + timedelta(seconds=3),
            "completed_at": created + timedelta(seconds=4),
        },
        {
            "id": ids["retry"],
            "job_type": "always_fail",
            "payload": {"n": 4},
            "status": "retrying",
            "queue": "emails",
            "retry_count": 1,
            "error_message": "ValueError: permanent error",
            "error_history": [{**error_entry, "error": "ValueError: permanent error"}],
            "created_at": created + timedelta(seconds=4),
            "run_at": now + timedelta(hours=1),
            "next_retry_at": now + timedelta(hours=1),
        },
    ]
    async with database.engine.begin() as conn:
        await conn.execute(insert(runs), rows)
        for row in job_rows:
            await conn.execute(insert(jobs).values(**row))
        await conn.execute(insert(queues).values(name="reports", paused_at=now))
        live = [uuid.uuid4(), uuid.uuid4()]
        for drainer, state, beat in (
            (live[0], "active", now),
            (live[1], "standby", now),
            (uuid.uuid4(), "active", now - timedelta(minutes=2)),
        ):
            await conn.execute(
                insert(workers).values(
                    id=drainer,
                    queue="emails",
                    state=state,
                    host="host-b",
                    pid=100,
                    started_at=now - timedelta(hours=2),
                    heartbeat_at=beat,
                    in_flight=2 if state == "active" and beat == now else 0,
                )
            )
    return Seeded(
        failed_job=ids["failed"],
        pending_job=ids["pending"],
        completed_job=ids["completed"],
        cancelled_job=ids["cancelled"],
        retrying_job=ids["retry"],
        missed_slot=missed_slot,
        unrecorded_slot=unrecorded,
        failed_run_slot=failed_slot,
        first_slot=slots[0],
        live_drainers=tuple(live),
    )


async def beat(database: Database, seeded: Seeded) -> None:
    """The seeded live drainers' heartbeat, now: they stay live (a row is gone 10 s after its
    last beat) however long a test takes to look at them."""
    async with database.engine.begin() as conn:
        await conn.execute(
            update(workers)
            .where(workers.c.id.in_(seeded.live_drainers))
            .values(heartbeat_at=func.now())
        )
