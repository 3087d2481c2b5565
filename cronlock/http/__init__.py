"""The HTTP API: ``create_router(app)`` to mount in your own FastAPI application, and
``create_api(app)``, the application ``cronlock serve`` runs (``api.py``)."""

from __future__ import annotations

from .api import MAX_BODY_BYTES, TOKEN_ENV, create_api, create_router

__all__ = ["MAX_BODY_BYTES", "TOKEN_ENV", "create_api", "create_router"]
