"""The App: the registry of periodic tasks (and, later, job handlers) and its database.

An App is declared at import time in the user's module; the command line finds it with
``--app MODULE[:ATTR]`` and gives it a database. Registration validates everything it can at
import: the cron expression and timezone, the name, and that no two tasks in one lock
namespace share an advisory lock key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from types import MappingProxyType

from .cron import CronSchedule
from .database import Database
from .errors import (
    ConfigurationError,
    DatabaseUnavailable,
    DuplicateName,
    InvalidCron,
    LockKeyCollision,
    UnknownTask,
)
from .locks import lock_key, namespace_key
from .periodic import PeriodicTask, RunResult, TaskBody, execute
from .tables import SCHEMA

__all__ = ["App"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$")
RESERVED_NAMES = frozenset({"drain"})


def _check_name(kind: str, name: str) -> None:
    if not _NAME.match(name):
        raise ConfigurationError(
            f"invalid {kind} name {name!r}: use letters, digits and . _ : - (at most 200)"
        )


class App:
    """The registry of periodic tasks and the database they run against."""

    def __init__(self, *, database_url: str | None = None, schema: str = SCHEMA) -> None:
        self.database_url = database_url
        self.schema = schema
        self._tasks: dict[str, PeriodicTask] = {}
        self._lock_owners: dict[tuple[int, int], str] = {}
        self._database: Database | None = None

    # -- registration --------------------------------------------------------------------

    def periodic(
        self,
        name: str,
        *,
        cron: str,
        namespace: str | int = "cron",
        timezone: str | None = None,
    ) -> Callable[[TaskBody], TaskBody]:
        """Declare a periodic task; the decorated coroutine function receives a ``Run``."""
        _check_name("task", name)
        if name in RESERVED_NAMES:
            raise DuplicateName(f"task name {name!r} is reserved for the built-in task")
        if name in self._tasks:
            raise DuplicateName(f"periodic task {name!r} is already registered")
        try:
            schedule = CronSchedule.parse(cron, timezone)
        except InvalidCron as exc:
            raise InvalidCron(f"task {name!r}: {exc}") from None
        ns, key = namespace_key(namespace), lock_key(name)
        owner = self._lock_owners.get((ns, key))
        if owner is not None:
            raise LockKeyCollision(
                f"tasks {owner!r} and {name!r} have the same lock key {key} in namespace "
                f"{namespace!r}: rename one or put it in another namespace"
            )

        def register(body: TaskBody) -> TaskBody:
            self._tasks[name] = PeriodicTask(
                name=name,
                schedule=schedule,
                namespace=namespace,
                lock_namespace=ns,
                lock_key=key,
                body=body,
                description=(body.__doc__ or "").strip().splitlines()[0] if body.__doc__ else "",
            )
            self._lock_owners[(ns, key)] = name
            return body

        return register

    @property
    def tasks(self) -> Mapping[str, PeriodicTask]:
        return MappingProxyType(self._tasks)

    def task(self, name: str) -> PeriodicTask:
        try:
            return self._tasks[name]
        except KeyError:
            known = ", ".join(sorted(self._tasks)) or "none"
            raise UnknownTask(f"unknown task {name!r} (registered: {known})") from None

    # -- database ------------------------------------------------------------------------

    def use_database(
        self, url: str, *, schema: str | None = None, pgbouncer: bool = False
    ) -> Database:
        """Point the app at a database (the command line does this from its options)."""
        self._database = Database(url, schema=schema or self.schema, pgbouncer=pgbouncer)
        return self._database

    @property
    def database(self) -> Database:
        if self._database is None:
            if self.database_url is None:
                raise DatabaseUnavailable("no database configured for this app")
            self.use_database(self.database_url)
        assert self._database is not None
        return self._database

    async def run(self, name: str, *, now: datetime | None = None) -> RunResult:
        """Run a periodic task once, now, under its lock."""
        return await execute(self.database, self.task(name), now=now)

    async def aclose(self) -> None:
        if self._database is not None:
            await self._database.dispose()
