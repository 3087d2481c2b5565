"""cronlock: cron-style periodic tasks and a job queue that need nothing but PostgreSQL.

The public API is exactly ``__all__``, plus ``__version__`` and the optional ``cronlock.http``
(``create_router``, ``create_api``: the 'http' extra, kept out of this namespace so that
``import cronlock`` never needs an extra). Every other module is an implementation detail.
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
    DrainerConflict,
    DuplicateName,
    InvalidCron,
    InvalidJobOption,
    InvalidPayload,
    JobError,
    LockKeyCollision,
    NoCurrentJob,
    UnknownJobType,
    UnknownTask,
)
from .locks import lock_key, namespace_key
from .outage import Reconnect
from .outcome import (
    DrainResult,
    ItemFailure,
    JobStatus,
    RunResult,
    RunStatus,
    RunTrigger,
    SkipReason,
)
from .periodic import Misfire, PeriodicTask, Run, SlotPolicy, TaskBody
from .periodic.control import FailingItem, Tasks, TaskState
from .queue.control import QueueInfo, QueueState
from .queue.drainer import CommitMode, Drainer, DrainOptions, Keepalive
from .queue.handling import JobCancel, JobContext, JobSnooze, current_job
from .queue.jobs import Backoff, Enqueued, JobHandler, JobType
from .queue.operate import ChangeOutcome, JobChange, JobInfo, JobPage, JobsChanged
from .retention import PruneResult, Retention
from .scheduler import Scheduler
from .service import serve_drain, serve_scheduler, serve_worker

# Semantic versioning; the one source of the package's version (pyproject.toml reads it).
__version__ = "0.3.0.dev0"

__all__ = [
    "App",
    "AppNotFound",
    "Backoff",
    "ChangeOutcome",
    "CommitMode",
    "ConfigurationError",
    "CronSchedule",
    "CronlockError",
    "Database",
    "DatabaseUnavailable",
    "DrainOptions",
    "DrainResult",
    "Drainer",
    "DrainerConflict",
    "DuplicateName",
    "Enqueued",
    "FailingItem",
    "InvalidCron",
    "InvalidJobOption",
    "InvalidPayload",
    "ItemFailure",
    "JobCancel",
    "JobChange",
    "JobContext",
    "JobError",
    "JobHandler",
    "JobInfo",
    "JobPage",
    "JobSnooze",
    "JobStatus",
    "JobType",
    "JobsChanged",
    "Keepalive",
    "LockKeyCollision",
    "Misfire",
    "NoCurrentJob",
    "PeriodicTask",
    "PruneResult",
    "QueueInfo",
    "QueueState",
    "Reconnect",
    "Retention",
    "Run",
    "RunResult",
    "RunStatus",
    "RunTrigger",
    "Scheduler",
    "SkipReason",
    "SlotPolicy",
    "TaskBody",
    "TaskState",
    "Tasks",
    "UnknownJobType",
    "UnknownTask",
    "current_job",
    "lock_key",
    "namespace_key",
    "serve_drain",
    "serve_scheduler",
    "serve_worker",
]

# The type aliases (what a handler and a task body are) cannot be renamed.
_ALIASES = frozenset({"JobHandler", "TaskBody"})

# Show the public names as cronlock.X in reprs and docs, as httpx does.
for _name in __all__:
    if _name not in _ALIASES:
        globals()[_name].__module__ = "cronlock"
del _name
