"""The project's settings: its one database from ``$DJANGOSITE_DATABASE_URL`` (the test's
database), and cronlock as its ``django.tasks`` backend."""

from __future__ import annotations

import importlib.util
import os
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


def database(url: str) -> dict[str, Any]:
    """A ``DATABASES`` entry for a ``postgresql://`` URL, a socket directory and port given as
    ``?host=…&port=…`` included (the embedded PostgreSQL's URLs: without them Django would
    reach the default socket's server, not the test's)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or query.get("host", [""])[0],
        "PORT": str(parts.port or query.get("port", [""])[0]),
    }


SECRET_KEY = "cronlock-tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
# Django's logging defaults stay out of the test process (cronlock's own tests read its logs).
LOGGING_CONFIG = None
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["cronlock.contrib.django", "djangosite.shop"]
if importlib.util.find_spec("django.tasks") is None:  # Django 5.2: the backport
    INSTALLED_APPS.append("django_tasks")
DATABASES = {
    "default": database(os.environ.get("DJANGOSITE_DATABASE_URL", "postgresql:///djangosite"))
}
TASKS = {
    "default": {
        "BACKEND": "cronlock.contrib.django.CronlockBackend",
        "QUEUES": ["default", "reports"],
    }
}
