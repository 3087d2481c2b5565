"""The Django app ``cronlock.contrib.django``: what ``INSTALLED_APPS`` lists for the
``manage.py cronlock`` command (``management/commands/cronlock.py``)."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["CronlockConfig"]


class CronlockConfig(AppConfig):
    name = "cronlock.contrib.django"
    label = "cronlock"
    verbose_name = "cronlock"
