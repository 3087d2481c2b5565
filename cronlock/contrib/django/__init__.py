"""cronlock for Django projects (the ``django`` extra): a ``django.tasks`` backend, its worker
and periodic tasks declared in the project's apps.

- ``CronlockBackend`` (``backend.py``): ``TASKS = {"default": {"BACKEND":
  "cronlock.contrib.django.CronlockBackend"}}``; ``@task`` functions enqueued with
  ``.enqueue()`` become cronlock jobs in the caller's transaction, and ``get_result`` reads
  their rows.
- ``periodic`` (``periodic_tasks.py``): ``@periodic("name", cron="0 3 * * *")`` over a
  ``def body(run)`` in an app's task module.
- ``app``: the project's cronlock App (``worker.py``), made from the settings when asked for;
  ``manage.py cronlock …`` (the Django app ``cronlock.contrib.django`` in ``INSTALLED_APPS``)
  is cronlock's command line on it: ``worker``, ``drain``, ``scheduler``, ``crontab``, ``run``,
  ``migrate``, ``status``, ``jobs`` and the rest.

Nothing is imported until asked for: Django imports this package for ``INSTALLED_APPS``
before its settings are read, and ``import cronlock`` never imports Django.
"""

from __future__ import annotations

import typing as _typing

if _typing.TYPE_CHECKING:
    from ...app import App
    from .backend import CronlockBackend
    from .periodic_tasks import periodic

    app: App

__all__ = ["CronlockBackend", "app", "periodic"]

if not _typing.TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        if name == "CronlockBackend":
            from .backend import CronlockBackend

            return CronlockBackend
        if name == "periodic":
            from .periodic_tasks import periodic

            return periodic
        if name == "app":  # made each time: it follows the settings (the tests change them)
            from .worker import project_app

            return project_app()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
