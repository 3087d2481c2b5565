"""The exceptions cronlock raises for misuse and for an environment it cannot work in.

Outcomes are not exceptions: a skipped run, a failed item or a retried job is a value
(see ``cronlock.periodic.RunResult``). These classes are for what a caller must fix::

    CronlockError
    ├── ConfigurationError        exit code 2 on the command line
    │   ├── AppNotFound            --app does not import or names no App
    │   ├── DatabaseUnavailable    no database configured, reachable or migrated
    │   ├── InvalidCron            a cron expression or timezone that does not parse
    │   ├── LockKeyCollision       two tasks would share one advisory lock
    │   ├── DuplicateName          a task or job type registered twice
    │   └── UnknownTask            ``run`` of a task that is not registered
    └── (the queue adds its own below CronlockError)

The docstring of each class is its default message.
"""

from __future__ import annotations

__all__ = [
    "AppNotFound",
    "ConfigurationError",
    "CronlockError",
    "DatabaseUnavailable",
    "DuplicateName",
    "InvalidCron",
    "LockKeyCollision",
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


class InvalidCron(ConfigurationError):
    """Invalid cron expression."""


class LockKeyCollision(ConfigurationError):
    """Two periodic tasks would share one advisory lock key."""


class DuplicateName(ConfigurationError):
    """That name is already registered."""


class UnknownTask(ConfigurationError):
    """No periodic task by that name."""
