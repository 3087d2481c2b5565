"""The worker side: the project's cronlock App, whose job handlers are its Django tasks.

``project_app()`` sets Django up if it is not yet (``DJANGO_SETTINGS_MODULE``), imports the
project's task modules (``config``) and registers, on an App on the database of the cronlock
backends (their ``OPTIONS["DATABASE"]``: one for all of them), a handler for each task of a
cronlock backend (its job type is the task's module path) and each ``@periodic`` declaration.
``manage.py cronlock …`` is cronlock's command line on that App; so is ``cronlock --app
cronlock.contrib.django …`` with ``DJANGO_SETTINGS_MODULE`` set.

A task runs as a plain ``def`` handler: in the drainer's thread pool, never on its event loop
(an ``async def`` task too, through ``Task.call``). It uses the ORM on the Django connection of
its thread, not on the job's transaction: what it writes commits as Django's writes do, on
their own, before the job's completion does. So a task is run at least once: a worker that
dies after the task's commit and before the job's runs it again. A failed task's writes are
not rolled back unless it opened ``transaction.atomic()`` itself. Before and after each task
the thread's connections are treated as at a request's start and end (``connected``): an
unusable one, or one past ``CONN_MAX_AGE``, is closed, and the query log reset.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from traceback import format_exception
from typing import Any, TypeVar

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, reset_queries
from django.utils import timezone

from ...app import App
from ...errors import ConfigurationError
from ...queue.handling import current_job
from .api import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from .backend import CronlockBackend, cronlock_backends
from .config import database_url, import_tasks, task_modules
from .periodic_tasks import declared
from .results import WORKER_ID, AttemptFailed, arguments, raised

__all__ = ["TaskHandler", "connected", "project_app"]

logger = logging.getLogger("cronlock.django")

R = TypeVar("R")


def connected(func: Callable[..., R]) -> Callable[..., R]:
    """``func`` with the thread's Django connections looked after as a request's are:
    ``request_started`` resets the query log and closes an unusable or too old connection,
    ``request_finished`` closes them again."""

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> R:
        reset_queries()
        close_old_connections()
        try:
            return func(*args, **kwargs)
        finally:
            close_old_connections()

    return run


class TaskHandler:
    """The job handler of one Django task: a plain ``def`` (cronlock runs it in a thread)
    that calls the task with the job's arguments and returns its JSON return value."""

    def __init__(self, task: Task[Any, Any]) -> None:
        self.task = task
        self.__name__ = task.name
        self.__doc__ = task.func.__doc__

    def __call__(self, session: Any, job_payload: Any) -> Any:
        return self._run(job_payload)

    @connected
    def _run(self, job_payload: Any) -> Any:
        job = current_job()
        given = arguments(job_payload)
        if given is None:
            raise AttemptFailed(f"the payload of job {job.id} is not a Django task's")
        task = self.task
        now = timezone.now()
        result: TaskResult[Any] = TaskResult(
            task=task,
            id=str(job.id),
            status=TaskResultStatus.RUNNING,
            enqueued_at=job.enqueued_at,
            started_at=now,
            finished_at=None,
            last_attempted_at=now,
            args=given.args,
            kwargs=given.kwargs,
            backend=given.backend,
            errors=[],
            worker_ids=[WORKER_ID] * job.attempt,
        )
        task_started.send(sender=CronlockBackend, task_result=result)
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *given.args, **given.kwargs)
            else:
                value = task.call(*given.args, **given.kwargs)
            value = normalize_json(value)
        except Exception as exc:
            kind = type(exc)
            result.errors.append(
                TaskError(
                    exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                    traceback="".join(format_exception(exc)),
                )
            )
            _finish(result, TaskResultStatus.FAILED)
            raise raised(exc) from exc
        object.__setattr__(result, "_return_value", value)
        _finish(result, TaskResultStatus.SUCCESSFUL)
        return value


def _finish(result: TaskResult[Any], status: TaskResultStatus) -> None:
    """Django's own backends set a result's outcome so, and tell ``task_finished`` (whose
    receiver logs a failure with its traceback)."""
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    task_finished.send(sender=CronlockBackend, task_result=result)


def _setup() -> None:
    if apps.ready:
        return
    import django

    try:
        django.setup()
    except ImproperlyConfigured as exc:
        raise ConfigurationError(
            f"Django is not set up: {exc} (run `manage.py cronlock`, or set the "
            "DJANGO_SETTINGS_MODULE)"
        ) from None


def project_app() -> App:
    """The project's App (the module docstring), made anew from the settings."""
    _setup()
    try:
        backends = cronlock_backends()
        if not backends:
            raise ConfigurationError(
                "settings.TASKS has no backend 'cronlock.contrib.django.CronlockBackend'"
            )
        targets = {(options.database, options.schema) for options in backends.values()}
        if len(targets) > 1:
            raise ConfigurationError(
                "the cronlock backends of TASKS name different OPTIONS DATABASE or SCHEMA: "
                "one worker serves one database (give them the same)"
            )
        [(database, schema)] = targets
        app = App(database_url=database_url(database), schema=schema)
        extra = [module for options in backends.values() for module in options.modules]
        modules = task_modules(extra)
    except ImproperlyConfigured as exc:
        raise ConfigurationError(str(exc)) from None
    try:
        tasks = import_tasks(modules)
    except ConfigurationError:
        raise  # a bad declaration (@periodic's cron, a name taken) says it best itself
    except Exception as exc:
        raise ConfigurationError(
            f"cannot import the project's task modules ({', '.join(modules)}): "
            f"{type(exc).__name__}: {exc}"
        ) from None
    for task in tasks:
        options = backends.get(task.backend)
        if options is None:
            continue  # a task of another backend: not cronlock's to run
        app.job(task.module_path, max_retries=options.max_retries, queue=task.queue_name)(
            TaskHandler(task)
        )
    for declaration in declared():
        app.periodic(declaration.name, **declaration.options)(connected(declaration.body))
    logger.debug(
        "the project's App: %d tasks, %d periodic tasks",
        len(app.handlers),
        len(app.tasks),
        extra={"action": "django_app"},
    )
    return app
