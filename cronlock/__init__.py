"""cronlock: cron-style periodic tasks and a job queue that need nothing but PostgreSQL.

The public API is exactly ``__all__``; every other module is an implementation detail.
"""

from __future__ import annotations

from .app import App
from .cron import CronSchedule
from .database import Database
from .errors import (
    AppNotFound,
    ConfigurationError,
    CronlockError,
    DatabaseUnavailable,
    DuplicateName,
    InvalidCron,
    InvalidJobOption,
    InvalidPayload,
    JobError,
    LockKeyCollision,
    UnknownJobType,
    UnknownTask,
)
from .locks import lock_key, namespace_key
from .outcome import (
    DrainResult,
    ItemFailure,
    JobStatus,
    RunResult,
    RunStatus,
    RunTrigger,
    SkipReason,
)
from .periodic import Misfire, PeriodicTask, Run, SlotPolicy
from .queue.drainer import CommitMode, Drainer, Keepalive
from .queue.jobs import Backoff, Enqueued, Job
from .scheduler import Scheduler
from .service import serve_drain, serve_scheduler, serve_worker

__all__ = [
    "App",
    "AppNotFound",
    "Backoff",
    "CommitMode",
    "ConfigurationError",
    "CronSchedule",
    "CronlockError",
    "Database",
    "DatabaseUnavailable",
    "DrainResult",
    "Drainer",
    "DuplicateName",
    "Enqueued",
    "InvalidCron",
    "InvalidJobOption",
    "InvalidPayload",
    "ItemFailure",
    "Job",
    "JobError",
    "JobStatus",
    "Keepalive",
    "LockKeyCollision",
    "Misfire",
    "PeriodicTask",
    "Run",
    "RunResult",
    "RunStatus",
    "RunTrigger",
    "Scheduler",
    "SkipReason",
    "SlotPolicy",
    "UnknownJobType",
    "UnknownTask",
    "lock_key",
    "namespace_key",
    "serve_drain",
    "serve_scheduler",
    "serve_worker",
]

# Show the public names as cronlock.X in reprs and docs, as httpx does.
for _name in __all__:
    globals()[_name].__module__ = "cronlock"
del _name
