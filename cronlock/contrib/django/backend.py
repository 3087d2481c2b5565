"""``CronlockBackend``: Django's tasks (``django.tasks``) as cronlock jobs.

``task.enqueue(...)`` writes the job with ``app.sync.enqueue_tx`` on Django's own connection to
the backend's database (``OPTIONS["DATABASE"]``, default ``"default"``), in whatever
transaction that connection is in. Inside ``transaction.atomic()`` the job is part of the block:
it exists if and only if the block commits, and no worker sees it before (the enqueue is not
deferred to ``on_commit``: Django dropped that option, and a job written in the transaction
cannot be lost between the commit and a deferred enqueue, nor sent for a transaction that rolled
back). Outside any atomic block it commits at once, as Django's autocommit writes do. Wrap the
enqueue in ``transaction.on_commit`` only to enqueue after a commit on *another* database.

A task's ``priority`` (-100 to 100, higher first), ``queue_name``, ``run_after`` (the job's
``run_at``) and arguments become the job's (``results`` says how); failed tasks are retried
``OPTIONS["MAX_RETRIES"]`` times (default 0). ``get_result`` reads the job's row on the same
connection (so inside the enqueuing block it sees its own uncommitted job) and returns what the
row says. The worker is ``manage.py cronlock worker`` (``worker.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.utils import timezone
from django.utils.module_loading import import_string

from ... import schema, sql
from ...app import App
from ...errors import ConfigurationError, DatabaseUnavailable, JobError
from ...queue.sync import runner_for
from .api import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from .config import BackendOptions, database_url, find_task, in_modules, task_modules
from .results import JobRow, arguments, payload, result_of

__all__ = ["CronlockBackend", "cronlock_backends", "project_modules"]

P = ParamSpec("P")
T = TypeVar("T")

_RESULT_COLUMNS = tuple(column.name for column in sql.JOB_TASK_RESULT.selected_columns)


class CronlockBackend(BaseTaskBackend):
    """The ``django.tasks`` backend whose tasks are cronlock jobs (the module docstring)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.cronlock = BackendOptions.of(alias, self.options)
        # The producer's app: it declares each task's job type, so that enqueueing one
        # checks it as any declared job type is; it never connects (the enqueue is on
        # Django's connection). Backends are made per thread, and so is this.
        self._app = App(schema=self.cronlock.schema, retention=False)
        self._modules: tuple[str, ...] | None = None

    @property
    def modules(self) -> tuple[str, ...]:
        """The project's task modules (``config``), found on first use."""
        if self._modules is None:
            self._modules = project_modules()
        return self._modules

    def validate_task(self, task: Task[Any, Any]) -> None:
        super().validate_task(task)
        path = task.module_path
        if not self._app.knows(path):
            try:
                self._app.declare_job(
                    path, max_retries=self.cronlock.max_retries, queue=task.queue_name
                )
            except ConfigurationError as exc:
                raise InvalidTask(f"task {path!r}: {exc}") from None

    def enqueue(
        self,
        task: Task[P, T],
        args: P.args,  # type: ignore[valid-type]
        kwargs: P.kwargs,  # type: ignore[valid-type]
    ) -> TaskResult[T]:
        self.validate_task(task)
        module = task.func.__module__
        if not in_modules(module, self.modules):
            raise InvalidTask(
                f"task {task.module_path!r}: cronlock's worker runs the tasks of each installed "
                f"app's tasks module and of OPTIONS['MODULES'] ({', '.join(self.modules)}): "
                f"define it in one of them or add {module!r} to MODULES"
            )
        given_args, given_kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        job_payload = payload(task, given_args, given_kwargs, self.alias)
        connection = connections[self.cronlock.database]
        try:
            enqueued = self._app.sync.enqueue_tx(
                connection,
                task.module_path,
                job_payload,
                priority=task.priority,
                queue=task.queue_name,
                run_at=_aware(task.run_after),
                max_retries=self.cronlock.max_retries,
            )
        except JobError as exc:
            raise InvalidTask(f"task {task.module_path!r}: {exc}") from None
        result: TaskResult[T] = TaskResult(
            task=task,
            id=str(enqueued.id),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=given_args,
            kwargs=given_kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The result of the job ``result_id`` as its row says it now, read on Django's
        connection (``TaskResultDoesNotExist`` for no such job, or one that is not a task's of
        this project)."""
        try:
            job_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        run = runner_for(connections[self.cronlock.database], self.cronlock.schema)
        try:
            rows = run(sql.JOB_TASK_RESULT, {"id": job_id})
        except Exception as exc:
            line = schema.schema_missing(None, self.cronlock.schema, exc)
            if line is None:
                raise
            raise DatabaseUnavailable(line) from None
        if not rows:
            raise TaskResultDoesNotExist(result_id)
        row = JobRow.from_row(_RESULT_COLUMNS, rows[0])
        given = arguments(row.payload)
        task = None if given is None else find_task(row.job_type, self.modules)
        if given is None or task is None:
            raise TaskResultDoesNotExist(result_id)
        return result_of(row, task, given, self.alias)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        try:
            database_url(self.cronlock.database)
        except ImproperlyConfigured as exc:
            return [checks.Error(str(exc), obj=f"TASKS[{self.alias!r}]", id="cronlock.E001")]
        return []


def _aware(moment: datetime | None) -> datetime | None:
    """A ``run_after`` as cronlock takes it: aware (a naive one, allowed when ``USE_TZ`` is
    off, is in Django's current time zone)."""
    if moment is None or timezone.is_aware(moment):
        return moment
    return timezone.make_aware(moment)


def cronlock_backends() -> dict[str, BackendOptions]:
    """Every ``TASKS`` entry whose backend is a ``CronlockBackend``, with its options."""
    found = {}
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        try:
            backend = import_string(params["BACKEND"])
        except (ImportError, KeyError):
            continue  # Django says so itself when the backend is used
        if isinstance(backend, type) and issubclass(backend, CronlockBackend):
            found[alias] = BackendOptions.of(alias, params.get("OPTIONS") or {})
    return found


def project_modules() -> tuple[str, ...]:
    """The task modules of the project: every app's ``tasks`` and every cronlock backend's
    ``MODULES``."""
    return task_modules(m for options in cronlock_backends().values() for m in options.modules)
