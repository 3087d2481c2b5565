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
    LockKeyCollision,
    UnknownTask,
)
from .locks import lock_key, namespace_key
from .periodic import (
    ItemFailure,
    Misfire,
    PeriodicTask,
    Run,
    RunResult,
    RunStatus,
    RunTrigger,
    SkipReason,
    SlotPolicy,
)
from .scheduler import Scheduler

__all__ = [
    "App",
    "AppNotFound",
    "ConfigurationError",
    "CronSchedule",
    "CronlockError",
    "Database",
    "DatabaseUnavailable",
    "DuplicateName",
    "InvalidCron",
    "ItemFailure",
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
    "UnknownTask",
    "lock_key",
    "namespace_key",
]

# Show the public names as cronlock.X in reprs and docs, as httpx does.
for _name in __all__:
    globals()[_name].__module__ = "cronlock"
del _name
