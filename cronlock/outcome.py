"""Outcomes as values: the statuses a run, a job or a drainer ends in, and the result objects.

Every status set cronlock stores is an enum here, and the tables' CHECK constraints are derived
from these enums (``sql/tables.py``), so a status is spelled once. A run of a periodic task
ends in a ``RunResult``; a drain (or a worker, when it stops) in a ``DrainResult``; an item that
failed inside a run is an ``ItemFailure``. Errors are recorded the same way everywhere: the
driver's own exception behind SQLAlchemy's wrappers (``root_cause``) and the first line of its
message (``error_line``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = [
    "MAX_MESSAGE_LENGTH",
    "DrainResult",
    "ItemFailure",
    "JobStatus",
    "RunResult",
    "RunStatus",
    "RunTrigger",
    "SkipReason",
    "WorkerState",
    "error_line",
    "first_line",
    "iso",
    "root_cause",
]

# Error texts are cut to this many characters where they are stored (runs, jobs).
MAX_MESSAGE_LENGTH = 2000


class RunStatus(enum.StrEnum):
    """How a run of a periodic task (or a drain) ended; ``missed`` is a slot nobody ran.

    ``running`` and ``interrupted`` belong to chunked runs only (``commit_every``): a chunked
    run commits its row ``running`` when it starts and updates it with every chunk; one whose
    process or lock was lost before its end is found ``interrupted`` (by itself, or by the
    next run of the task), its committed chunks kept."""

    COMPLETED = "completed"
    PARTIAL = "partial"
    FAILED = "failed"
    SKIPPED = "skipped"
    MISSED = "missed"
    RUNNING = "running"
    INTERRUPTED = "interrupted"


# A slot is claimed by the row of the run that did (or tried and rolled back) its work, or is
# doing it (a chunked run's ``running`` row), or by the row saying nobody did: at most one such
# row per (task, slot). Skips never claim.
RUN_CLAIMING_STATUSES = (
    RunStatus.COMPLETED,
    RunStatus.PARTIAL,
    RunStatus.FAILED,
    RunStatus.MISSED,
    RunStatus.RUNNING,
    RunStatus.INTERRUPTED,
)
# A run that committed its work: the task's last success.
RUN_SUCCESS_STATUSES = (RunStatus.COMPLETED, RunStatus.PARTIAL)


class RunTrigger(enum.StrEnum):
    """Who started a run."""

    CRON = "cron"  # `cronlock run TASK` / App.run: an invocation mapped to its slot
    SCHEDULER = "scheduler"  # the scheduler, on time (within grace)
    CATCH_UP = "catch_up"  # the scheduler, for a slot missed while it was down
    MANUAL = "manual"  # asked for by hand, outside any slot


class SkipReason(enum.StrEnum):
    LOCK_BUSY = "lock_busy"  # another run holds the task's lock right now
    SLOT_DONE = "slot_done"  # this slot already has its outcome
    NO_SLOT = "no_slot"  # the invocation is outside every slot's grace and not manual
    PAUSED = "paused"  # an operator paused the task (cronlock task pause)


class JobStatus(enum.StrEnum):
    """The reference's statuses, plus ``cancelled`` and ``blocked``. In the transactional
    commit modes ``processing`` is what a job is inside the transaction that runs it; others see it
    ``pending``/``retrying`` and locked (SKIP LOCKED skips it). In the ``lease`` mode the claim
    commits it ``processing``, with its owner and attempt."""

    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    FAILED = "failed"
    RETRYING = "retrying"
    CANCELLED = "cancelled"  # by an operator, before it ran: it never runs
    # Enqueued with ``depends_on``: it waits, outside the claim, until every job it depends on
    # completed (then it is ``pending``, in that last completion's transaction), and is
    # cancelled when one of them fails or is cancelled (queue/dependencies.py).
    BLOCKED = "blocked"


# A job that is due to run (once its run_at has come): what the claim and the dedup index read.
JOB_WAITING_STATUSES = (JobStatus.PENDING, JobStatus.RETRYING)
# A job an operator's cancel ends at once: one waiting to run, or waiting for its parents.
JOB_CANCELLABLE_STATUSES = (*JOB_WAITING_STATUSES, JobStatus.BLOCKED)
# A job that is done for good: what retention prunes and what may be deleted.
JOB_FINISHED_STATUSES = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
# A job an operator's retry makes due now: one that failed for good, or waits for its retry.
JOB_RETRYABLE_STATUSES = (JobStatus.FAILED, JobStatus.RETRYING)


class WorkerState(enum.StrEnum):
    """A drainer process as the workers table shows it."""

    ACTIVE = "active"
    STANDBY = "standby"
    STOPPING = "stopping"


def root_cause(exc: BaseException) -> BaseException:
    """The driver's own exception behind SQLAlchemy's wrappers (asyncpg's names say more)."""
    found = getattr(exc, "orig", None) or exc
    cause = found.__cause__
    if cause is not None and type(cause).__module__.startswith("asyncpg"):
        return cause
    return found


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its root cause's), at most
    MAX_MESSAGE_LENGTH characters; the type's name when the message is empty."""
    cause = root_cause(exc)
    text = str(cause).strip()
    return text.splitlines()[0][:MAX_MESSAGE_LENGTH] if text else type(cause).__name__


def error_line(exc: BaseException) -> str:
    """``Type: first line of the message``: how cronlock records and reports an error."""
    cause = root_cause(exc)
    text = str(cause).strip()
    name = type(cause).__name__
    return f"{name}: {text.splitlines()[0][:MAX_MESSAGE_LENGTH]}" if text else name


def iso(moment: datetime | None) -> str | None:
    """A moment as the JSON reports give it (ISO 8601), None as None."""
    return None if moment is None else moment.isoformat()


@dataclass(frozen=True)
class ItemFailure:
    """One item that failed inside a run and was rolled back to its savepoint."""

    item: str | None
    error_type: str
    message: str

    @classmethod
    def from_exception(cls, item: object, exc: BaseException) -> ItemFailure:
        return cls(
            item=None if item is None else str(item),
            error_type=type(root_cause(exc)).__name__,
            message=first_line(exc),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"item": self.item, "error_type": self.error_type, "message": self.message}


@dataclass(frozen=True)
class RunResult:
    """The outcome of one run, as recorded in ``runs``."""

    task: str
    status: RunStatus
    slot: datetime | None
    started_at: datetime
    finished_at: datetime
    duration_ms: float
    items_ok: int = 0
    items_failed: int = 0
    failures: tuple[ItemFailure, ...] = ()
    error: str | None = None
    skip_reason: str | None = None
    run_id: int | None = None
    trigger: RunTrigger = RunTrigger.CRON
    lateness_ms: float | None = None
    # A chunked run's committed chunks (None: not chunked, the run was one transaction).
    chunks: int | None = None
    # Items left alone because they are parked (run.skip_parked).
    items_parked: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "status": self.status.value,
            "slot": iso(self.slot),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "duration_ms": round(self.duration_ms, 3),
            "items_ok": self.items_ok,
            "items_failed": self.items_failed,
            "items_parked": self.items_parked,
            "failures": [f.to_dict() for f in self.failures],
            "error": self.error,
            "skip_reason": self.skip_reason,
            "run_id": self.run_id,
            "trigger": self.trigger.value,
            "lateness_ms": None if self.lateness_ms is None else round(self.lateness_ms, 3),
            "chunks": self.chunks,
        }


@dataclass(frozen=True)
class DrainResult:
    """What a drain (or a worker, when it stops) did: a status and the stats."""

    queue: str
    status: RunStatus
    stats: dict[str, Any]
    skip_reason: str | None = None
    error: str | None = None
    paused: bool = False  # the queue was paused when the drainer started or ended

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": "drain",
            "queue": self.queue,
            "status": self.status.value,
            "skip_reason": self.skip_reason,
            "error": self.error,
            "paused": self.paused,
            **self.stats,
        }
