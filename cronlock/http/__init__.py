"""The HTTP API: ``create_router(app)`` to mount in your own FastAPI application, and
``create_api(app)``, the application ``cronlock serve`` runs, with the dashboard
(``create_dashboard(app)``, ``dashboard/``) at ``/dashboard``. ``api.py`` holds the routes;
``access.py`` decides who may call them (the tokens, the public surfaces), before a body is
read."""

from __future__ import annotations

from .access import (
    MAX_BODY_BYTES,
    PUBLIC_ENV,
    READ_TOKEN_ENV,
    TOKEN_ENV,
    Access,
    is_loopback,
)
from .api import DASHBOARD_PATH, create_api, create_router
from .dashboard import create_dashboard

__all__ = [
    "DASHBOARD_PATH",
    "MAX_BODY_BYTES",
    "PUBLIC_ENV",
    "READ_TOKEN_ENV",
    "TOKEN_ENV",
    "Access",
    "create_api",
    "create_dashboard",
    "create_router",
    "is_loopback",
]
