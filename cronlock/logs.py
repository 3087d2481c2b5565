"""Logging as the command line sets it up: where lines go, what they look like, how many.

cronlock's modules only log, with the standard library's ``logging`` and structured fields in
``extra`` (``task``, ``slot``, ``run_id``, ``job_id``, ``queue``, ``attempt``, ``outcome``,
``duration_ms``, ...); importing cronlock installs no handler and sets no level, so an
application that embeds it configures logging the standard way. The command line calls
``configure`` once, for the command it runs:

- a line has a UTC timestamp, its level and its logger; ``--log-format json`` makes it one
  JSON object with the stable keys above (those a line has), ``ts``, ``level``, ``logger``
  and ``message``; ``ts`` and ``duration_ms`` are worker-side, the clock of the process that
  logs (for a job: its handler's start to its commit, as the worker timed it), while the
  times in cronlock's tables (a job's ``created_at``, ``started_at``, ``completed_at``) are
  the database's, the one clock all hosts share;
- the long-running commands (worker, scheduler, serve) say at INFO what they do: their start,
  active or standby, each periodic run; the others only warnings, ``-v`` adds INFO (and the
  line per job, ``cronlock.jobs``), ``-vv`` cronlock's DEBUG;
- other libraries (asyncio, SQLAlchemy, APScheduler, the embedded server's package) stay at
  WARNING unless ``-vvv``: ``-v`` is about cronlock, not its dependencies' internals.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from enum import Enum
from typing import Any, TextIO

__all__ = [
    "FORMATS",
    "JOBS_LOGGER",
    "RUNS_LOGGER",
    "STABLE_KEYS",
    "JsonFormatter",
    "TextFormatter",
    "configure",
]

# The fields a line may carry, in this order, under these names: what a log pipeline keys on.
STABLE_KEYS = (
    "action",
    "task",
    "slot",
    "run_id",
    "trigger",
    "job_id",
    "job_type",
    "queue",
    "attempt",
    "outcome",
    "duration_ms",
    "items_ok",
    "items_failed",
    "state",
    "worker_id",
    "error",
)
FORMATS = ("text", "json")
# The line per job: its own logger, so that it can be on (-v) while the rest stays quiet.
JOBS_LOGGER = "cronlock.jobs"
# The lines of a periodic run (its outcome, its failed items): what `cronlock run` prints as
# its result anyway, so it keeps them quiet unless -v.
RUNS_LOGGER = "cronlock.runs"


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)


class TextFormatter(logging.Formatter):
    """``2026-12-01T10:15:00.123Z INFO cronlock.scheduler: message``."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts``, ``level``, ``logger``, ``message``, then the stable
    keys the line carries (``STABLE_KEYS``), and ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in STABLE_KEYS:
            if key in record.__dict__:
                document[key] = _plain(record.__dict__[key])
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False)


def configure(
    verbosity: int = 0,
    log_format: str = "text",
    *,
    long_running: bool = False,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send log lines to ``stream`` (stderr) for a command: see the module docstring for the
    levels; the handler it installed on the root logger."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbosity >= 3 else logging.WARNING)
    base = logging.INFO if long_running else logging.WARNING
    logging.getLogger("cronlock").setLevel(max(base - 10 * verbosity, logging.DEBUG))
    logging.getLogger(JOBS_LOGGER).setLevel(logging.INFO if verbosity >= 1 else logging.WARNING)
    return handler
