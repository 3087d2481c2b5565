"""A command imports what it uses and no more (issue 26): every crontab line pays the start-up
of ``cronlock`` at every slot on every host.

``cronlock --help`` needs neither SQLAlchemy nor the app; ``cronlock run TASK`` needs the app
(and so SQLAlchemy) but none of the extras, alembic or the dashboard. Each is run as cron runs
it, in a subprocess, under ``python -X importtime``, whose report names every module imported
by an import statement (one loaded by ``importlib.import_module``, as the app's module, a
command's and ``cronlock.sql``'s statement modules are, is left out of it, though what that
module imports is in); the process also lists ``sys.modules`` as it exits, which has them all.

A run needs its own statements, not the queue's, the metrics' or the scheduler daemon's:
``cronlock.sql`` builds a statement module on first use, APScheduler is imported by
``Scheduler.start`` (``cronlock.triggers``), the embedded server only when it is the database.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import click
import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from cli import cli_env, cronlock_command

from cronlock import schema, sql
from cronlock.cli import COMMANDS, cli

# What only some commands need: migrating (alembic, with mako and pygments), serving (FastAPI,
# Starlette, uvicorn, Jinja2 and the dashboard), metrics, tracing, the benchmark, and pydantic
# (an app's typed payloads, if they are pydantic models).
NEEDED_BY_SOME = (
    "pydantic",
    "pydantic_core",
    "alembic",
    "mako",
    "pygments",
    "fastapi",
    "starlette",
    "uvicorn",
    "jinja2",
    "prometheus_client",
    "opentelemetry",
    "cronlock.http",
    "cronlock.observe.prometheus",
    "cronlock.tracing",
    "cronlock_bench",
)
# ... and what only some commands need of cronlock's own and of its dependencies: the scheduler
# daemon (APScheduler, its triggers), the embedded server, and the statements a periodic run
# never sends (the queue's, the metrics' rollups, the cancels, the waits).
NOT_FOR_A_RUN = (
    "apscheduler",
    "cronlock.triggers",
    "cronlock.embedded",
    "cronlock.sql.rollups",
    "cronlock.sql.jobs",
    "cronlock.sql.queues",
    "cronlock.sql.cancels",
    "cronlock.sql.waits",
)

# Run as `python -m cronlock` runs, listing every module the process holds when it exits.
_LISTING = "cronlock-startup-modules:"
_WRAPPER = f"""
import atexit, runpy, sys
atexit.register(lambda: print({_LISTING!r}, *sorted(sys.modules), file=sys.stderr))
runpy.run_module("cronlock", run_name="__main__", alter_sys=True)
"""


def imported(*args: str, database_url: str | None = None) -> tuple[int, set[str]]:
    """``cronlock ARGS``'s exit code and the modules its process imported."""
    assert cronlock_command()[1:] == ["-m", "cronlock"]  # _WRAPPER runs what it runs
    process = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", _WRAPPER, *args],
        env=cli_env(database_url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = process.stderr.splitlines()
    report = [line for line in lines if line.startswith("import time:")]
    assert report, process.stderr  # -X importtime did report
    listing = [line for line in lines if line.startswith(_LISTING)]
    assert len(listing) == 1, process.stderr
    modules = {line.rpartition("|")[2].strip() for line in report[1:]}
    return process.returncode, modules | set(listing[0].split()[1:])


def unneeded(modules: set[str], names: tuple[str, ...] = NEEDED_BY_SOME) -> set[str]:
    return {m for m in modules if any(m == n or m.startswith(n + ".") for n in names)}


def test_help_imports_neither_sqlalchemy_nor_the_app() -> None:
    code, modules = imported("--help")
    assert code == 0
    assert "click" in modules  # the report is the command's
    assert unneeded(modules) == set()
    assert {"sqlalchemy", "asyncpg", "cronlock.app", "cronlock.sql"} & modules == set()


def test_a_run_imports_the_app_and_no_extra(database_url: str) -> None:
    code, modules = imported(
        "--app", "testapps.crontabapp", "run", "minutely", "--manual", database_url=database_url
    )
    assert code == 0
    assert {"sqlalchemy", "cronlock.app", "cronlock.periodic.run", "cronlock.sql.runs"} <= modules
    assert unneeded(modules) == set()
    assert unneeded(modules, NOT_FOR_A_RUN) == set()


def test_help_imports_no_statement_and_no_scheduler() -> None:
    code, modules = imported("--help")
    assert code == 0
    assert unneeded(modules, NOT_FOR_A_RUN) == set()


def test_a_statement_module_is_built_when_a_name_of_its_is_first_asked_for() -> None:
    script = """
import sys
from cronlock import sql
before = sorted(m for m in sys.modules if m.startswith("cronlock.sql."))
from cronlock.sql import RUN_GATE
print(before, "cronlock.sql.rollups" in sys.modules, sql.RUN_GATE is RUN_GATE)
"""
    process = subprocess.run(
        [sys.executable, "-c", script],
        env=cli_env(None),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert process.stdout.split() == ["[]", "False", "True"]


def test_the_statements_table_is_the_modules_own() -> None:
    # cronlock.sql finds a name's module in _STATEMENTS: each module's __all__ (of histograms,
    # only the buckets, as before), no name in two modules.
    for module, names in sql._STATEMENTS.items():
        statements = importlib.import_module(f"cronlock.sql.{module}")
        exported = ["LATENCY_BUCKETS"] if module == "histograms" else statements.__all__
        assert sorted(names) == sorted(exported), module
        assert all(getattr(statements, name) is getattr(sql, name) for name in names)
    every = [name for names in sql._STATEMENTS.values() for name in names]
    assert sorted(every) == sorted(set(every)) == sorted(sql.__all__)
    missing = "JOB_NOTHING"
    with pytest.raises(AttributeError, match=missing):
        getattr(sql, missing)


def test_typed_payloads_of_dataclasses_load_no_pydantic() -> None:
    # import cronlock, an App, a dataclass payload checked at enqueue: pydantic stays unloaded.
    script = """
import sys
from dataclasses import dataclass
import cronlock
from cronlock.queue.enqueue import prepare

@dataclass
class Order:
    to: str

app = cronlock.App()
app.declare_job("order", payload=Order)
prepare(app.job_types, "order", [{"to": "a"}, Order("b")])
try:
    prepare(app.job_types, "order", [{"to": 1}])
except cronlock.InvalidPayload as exc:
    print(exc)
print(sorted(m for m in sys.modules if m.startswith("pydantic")))
"""
    process = subprocess.run(
        [sys.executable, "-c", script],
        env=cli_env(None),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert process.stdout.splitlines() == [
        "the payload does not fit Order: to: Input should be a valid string (got int)",
        "[]",
    ]


def test_the_listing_says_what_each_command_says_of_itself() -> None:
    context = click.Context(cli)
    for name, (_, _, summary) in COMMANDS.items():
        command = cli.get_command(context, name)
        assert command is not None and command.name == name
        assert command.get_short_help_str(limit=1000) == summary, name


def test_the_head_revision_is_alembics() -> None:
    # ensure_ready reads the scripts' head without alembic; alembic reads the same scripts.
    config = Config()
    config.set_main_option("script_location", str(schema.migrations_directory()))
    assert schema.head_revision() == ScriptDirectory.from_config(config).get_current_head()
