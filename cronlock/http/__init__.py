"""The HTTP API: ``create_router(app)`` to mount in your own FastAPI application, and
``create_api(app)``, the application ``cronlock serve`` runs. ``api.py`` holds the routes;
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
from .api import create_api, create_router

__all__ = [
    "MAX_BODY_BYTES",
    "PUBLIC_ENV",
    "READ_TOKEN_ENV",
    "TOKEN_ENV",
    "Access",
    "create_api",
    "create_router",
    "is_loopback",
]
