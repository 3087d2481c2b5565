"""The public names, imported at once: ``cronlock/__init__.py`` loads this module the first
time one of them is asked for, so that ``import cronlock.cli`` (``cronlock --help``) does not
pay for SQLAlchemy, and the names are renamed ``cronlock.X`` (as httpx shows its own) all at
once, whichever is asked for first.
"""

from __future__ import annotations

from . import __all__ as _public
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
    JobFailed,
    JobNotFound,
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
from .queue.operate import ChangeOutcome, JobChange, JobFilter, JobInfo, JobPage, JobsChanged
from .retention import PruneResult, Retention
from .scheduler import Scheduler
from .service import serve_drain, serve_scheduler, serve_worker

# The type aliases (what a handler and a task body are) cannot be renamed.
_ALIASES = frozenset({"JobHandler", "TaskBody"})

for _name in _public:
    if _name not in _ALIASES:
        globals()[_name].__module__ = "cronlock"
del _name
