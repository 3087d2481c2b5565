"""The dashboard: server-rendered pages of tasks, slots, queues and jobs, and the forms that
operate the queue, served by the same FastAPI as the API.

``create_dashboard(app)`` is a router to mount under any prefix (``cronlock serve`` mounts it
at ``/dashboard``). ``pages.py`` holds the routes, ``auth.py`` who may read and write (the
API's tokens, kept by a login form in a cookie, and the forms' CSRF rules); what a page shows
is read by ``observe.overview`` and ``observe.slots`` on indexes. The templates, the stylesheet
and the script ship inside the package: nothing is built, nothing is loaded from elsewhere.
"""

from __future__ import annotations

from .auth import COOKIE
from .pages import create_dashboard

__all__ = ["COOKIE", "create_dashboard"]
