"""cronlock: cron-style periodic tasks and a job queue that need nothing but PostgreSQL.

The public API is exactly ``__all__``, plus ``__version__`` and the optional ``cronlock.http``
(``create_router``, ``create_api``: the 'http' extra, kept out of this namespace so that
``import cronlock`` never needs an extra). Every other module is an implementation detail.

The names are loaded when one is first asked for (``_api``), not by ``import cronlock``: a
command that needs no App (``cronlock --help``) starts without importing SQLAlchemy.
"""

from __future__ import annotations

import typing as _typing

if _typing.TYPE_CHECKING:
    from ._api import *  # noqa: F403


# Semantic versioning; the one source of the package's version (pyproject.toml reads it).
__version__ = "0.4.0.dev0"

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
    "JobFailed",
    "JobFilter",
    "JobHandler",
    "JobInfo",
    "JobNotFound",
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


# PEP 562. Hidden from the type checker, which reads the star import above: a misspelt
# cronlock.X stays an error in a user's code rather than Any.
if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        if name not in __all__:
            raise AttributeError(f"module 'cronlock' has no attribute {name!r}")
        from . import _api

        globals().update({public: getattr(_api, public) for public in __all__})
        return globals()[name]

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
