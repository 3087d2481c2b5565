"""The exceptions cronlock raises for misuse and for an environment it cannot work in.

Outcomes are not exceptions: a skipped run, a failed item or a retried job is a value
(see ``cronlock.periodic.RunResult``). These classes are for what a caller must fix::

    CronlockError
    ├── ConfigurationError        exit code 2 on the command line
    │   ├── AppNotFound            --app does not import or names no App
    │   ├── DatabaseUnavailable    no database configured, reachable or migrated
    │   ├── DrainerConflict        exclusive and shared drainers meeting on one queue
    │   ├── InvalidCron            a cron expression or timezone that does not parse
    │   ├── LockKeyCollision       two tasks would share one advisory lock
    │   ├── DuplicateName          a task or job type registered twice
    │   └── UnknownTask            ``run`` of a task that is not registered
    ├── JobError                  a job that cannot be enqueued (exit code 2; nothing written)
    │   ├── UnknownJobType         no handler registered for that job type
    │   ├── InvalidPayload         a payload that is not JSON, or does not fit its type's model
    │   └── InvalidJobOption       a negative delay, absurd max_retries, a bad queue name…
    ├── JobFailed                 ``app.wait`` of a job that ended failed or cancelled (its ``job``)
    ├── JobNotFound               no such job: never enqueued, or deleted (a LookupError)
    └── NoCurrentJob              ``current_job()`` called outside a job's handler (a LookupError)

The docstring of each class is its default message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "AppNotFound",
    "ConfigurationError",
    "CronlockError",
    "DatabaseUnavailable",
    "DrainerConflict",
    "DuplicateName",
    "InvalidCron",
    "InvalidJobOption",
    "InvalidPayload",
    "JobError",
    "JobFailed",
    "JobNotFound",
    "LockKeyCollision",
    "NoCurrentJob",
    "UnknownJobType",
    "UnknownTask",
]


class CronlockError(Exception):
    """cronlock error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigurationError(CronlockError):
    """The configuration is not usable."""


class AppNotFound(ConfigurationError):
    """The cronlock app could not be loaded."""


class DatabaseUnavailable(ConfigurationError):
    """The database is not reachable."""


class DrainerConflict(ConfigurationError):
    """Exclusive and shared drainers cannot serve one queue at the same time."""


class InvalidCron(ConfigurationError):
    """Invalid cron expression."""


class LockKeyCollision(ConfigurationError):
    """Two periodic tasks would share one advisory lock key."""


class DuplicateName(ConfigurationError):
    """That name is already registered."""


class UnknownTask(ConfigurationError):
    """No periodic task by that name."""


# -- the job queue ------------------------------------------------------------------------


class JobError(CronlockError):
    """The job cannot be enqueued."""


class UnknownJobType(JobError):
    """No handler is registered for that job type."""


class InvalidPayload(JobError):
    """The payload is not JSON, or does not fit its job type's model."""

    def __init__(
        self, message: str | None = None, errors: Sequence[Mapping[str, Any]] = ()
    ) -> None:
        """A payload that does not fit its type's model (``@app.job(..., payload=Model)``)
        names the fields in its one line and carries them in ``errors``: one ``{"loc": [...],
        "msg": ..., "type": ...}`` per field, the shape pydantic gives and ``POST /jobs``
        answers with; ``errors`` is empty for every other payload error."""
        super().__init__(message)
        self.errors: list[dict[str, Any]] = [dict(error) for error in errors]


class InvalidJobOption(JobError):
    """An option of the job is out of range."""


class JobFailed(CronlockError):
    """The awaited job did not complete: it failed for good or was cancelled."""

    # ``job``: its row as it ended (a ``cronlock.JobInfo``): status, error, attempts.
    def __init__(self, job: Any = None) -> None:
        self.job = job
        if job is None:
            super().__init__()
            return
        error = job.error_message
        super().__init__(f"job {job.id} {job.status}" + (f": {error}" if error else ""))


class JobNotFound(CronlockError, LookupError):
    """No such job: it was never enqueued, or it was deleted."""


class NoCurrentJob(CronlockError, LookupError):
    """current_job() was called outside a job's handler."""
