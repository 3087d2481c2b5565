"""A command imports what it uses and no more (issue 26): every crontab line pays the start-up
of ``cronlock`` at every slot on every host.

``cronlock --help`` needs neither SQLAlchemy nor the app; ``cronlock run TASK`` needs the app
(and so SQLAlchemy) but none of the extras, alembic or the dashboard. Each is run as cron runs
it, in a subprocess, under ``python -X importtime``, whose report names every module imported
by an import statement (one loaded by ``importlib.import_module``, as the app's module and a
command's are, is left out of it, though what that module imports is in).
"""

from __future__ import annotations

import subprocess
import sys

import click
from alembic.config import Config
from alembic.script import ScriptDirectory
from cli import cli_env, cronlock_command

from cronlock import schema
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


def imported(*args: str, database_url: str | None = None) -> tuple[int, set[str]]:
    """``cronlock ARGS``'s exit code and the modules its process imported."""
    process = subprocess.run(
        [sys.executable, "-X", "importtime", *cronlock_command(*args)[1:]],
        env=cli_env(database_url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = [line for line in process.stderr.splitlines() if line.startswith("import time:")]
    assert report, process.stderr  # -X importtime did report
    return process.returncode, {line.rpartition("|")[2].strip() for line in report[1:]}


def unneeded(modules: set[str]) -> set[str]:
    return {m for m in modules if any(m == n or m.startswith(n + ".") for n in NEEDED_BY_SOME)}


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
    assert {"sqlalchemy", "cronlock.app", "cronlock.periodic.run"} <= modules
    assert unneeded(modules) == set()


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
