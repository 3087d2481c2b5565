"""The ``django.tasks`` API this integration is written against: Django's own (6.0 on), or
the ``django-tasks`` package that backports it to Django 5.2 (the ``django`` extra installs it
below Python 3.12, where there is no Django 6). The two agree on everything used here but two
exception names, given here under Django's (``InvalidTask``). The type checker reads the
backport's: it ships its types, Django none.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

__all__ = [
    "NEEDS",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

NEEDS = "cronlock.contrib.django needs Django: pip install 'cronlock[django]'"


def _builtin() -> bool:
    """Whether this Django has ``django.tasks`` (6.0 on)."""
    try:
        return importlib.util.find_spec("django.tasks") is not None
    except ModuleNotFoundError:  # no Django at all
        raise ImportError(NEEDS) from None


if TYPE_CHECKING or not _builtin():
    try:
        import django_tasks  # noqa: F401
    except ModuleNotFoundError:
        raise ImportError(
            f"{NEEDS} (below Django 6.0 it takes the django-tasks backport)"
        ) from None
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json
else:
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
