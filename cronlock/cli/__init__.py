"""The ``cronlock`` command line (click): the group, its options, errors as exit codes.

``asyncio.run`` lives in this package and nowhere else. Each command parses its options,
calls the library, renders what it got (``render``) and exits with its code (``context``);
``COMMANDS`` says which module holds each (``runs``: the periodic tasks, ``queue``: enqueue
and the drainers, ``operate``: jobs and queue control, ``tasks``: task control and parked
items, ``admin``: the schema, the status, retention, and ``scheduler``, ``embedded``,
``serve``; ``bench`` is ``cronlock_bench``'s).

Exit codes (DESIGN.md): 0 completed or skipped, 1 the run failed and rolled back, 2 usage or
configuration error (one line on stderr, never a traceback), 3 partial; a drain a signal
stopped exits 128 + the signal's number (130 Ctrl-C, 143 SIGTERM).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from .. import logs
from ..errors import CronlockError
from ..logs import FORMATS
from .context import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, Options, UsageFailure

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_PARTIAL", "EXIT_USAGE", "cli", "main"]


# The commands that run until stopped: they say at INFO what they do (cronlock.logs).
LONG_RUNNING = frozenset({"worker", "scheduler", "serve"})
_GLOBAL_OPTIONS = (
    "--app",
    "--database-url",
    "--schema",
    "--pgbouncer",
    "--log-format",
    "-v",
    "-vv",
    "-vvv",
    "--verbose",
)


# Each command: its module (a relative name is in this package), its name there, and its
# summary. A command's module is imported when that command runs (as pip keeps its commands),
# so `cronlock --help` lists them from here and imports none, and `cronlock run TASK` none but
# its own: neither needs alembic, FastAPI or the dashboard, and --help not even SQLAlchemy.
# tests/unit/test_startup.py holds each summary to its command's own help.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "bench": (
        "cronlock_bench.command",  # the package beside cronlock's, in the same wheel
        "bench",
        "Measure cronlock on this database: enqueue and drain rates, latency, a periodic run, "
        "recovery after SIGKILL of the active worker; print a table (or --json).",
    ),
    "crontab": (
        ".runs",
        "crontab",
        "Print crontab lines for the registered tasks that run as they are under cron.",
    ),
    "demo": (
        ".runs",
        "demo",
        "The whole story on the embedded default, end to end, with a summary.",
    ),
    "drain": (
        ".queue",
        "drain",
        "Process due jobs until none is due or S seconds passed; skip if another (exclusive) "
        "drainer is active or the queue is paused (skipped: exit 0, or --skipped-exit-code).",
    ),
    "embedded": (
        ".embedded",
        "embedded_group",
        "The embedded PostgreSQL (the default with no database configured): status, stop, remove.",
    ),
    "enqueue": (
        ".queue",
        "enqueue",
        "Add a job of JOB_TYPE (PAYLOAD is JSON, default null); prints its id.",
    ),
    "jobs": (
        ".operate",
        "jobs_group",
        "Find jobs and act on them: list, show, wait, retry, cancel, delete.",
    ),
    "list": (
        ".runs",
        "list_tasks",
        "Periodic tasks: name, cron, timezone, lock key, next fire times (their zone and UTC); "
        "the job types: queue, retries, timeout, handled or only declared.",
    ),
    "migrate": (
        ".admin",
        "migrate",
        "Create or upgrade cronlock's schema (idempotent), online: no migration blocks the queue "
        "for more than --lock-timeout.",
    ),
    "prune": (
        ".admin",
        "prune",
        "The built-in retention now: delete completed jobs older than the app's retention "
        "(7 days by default), failed and cancelled ones (30 days), runs (30 days) and stale "
        "worker rows, in short batches; say what went.",
    ),
    "queue": (
        ".operate",
        "queue_group",
        "Queue control for every drainer on every host: list, pause, resume, delete.",
    ),
    "run": (
        ".runs",
        "run_task",
        "One run of TASK now, under its lock, for the slot it belongs to.",
    ),
    "scheduler": (
        ".scheduler",
        "scheduler",
        "Long-running: fire every periodic task on time (APScheduler); SIGTERM is graceful.",
    ),
    "task": (
        ".tasks",
        "task_group",
        "Pause, resume or run a periodic task now, everywhere; list its parked items.",
    ),
    "serve": (
        ".serve",
        "serve",
        "The HTTP API (POST /jobs, GET /jobs/{id}, /runs, /healthz, /metrics) and the "
        "dashboard (/dashboard/) on uvicorn.",
    ),
    "status": (
        ".admin",
        "status",
        "Last runs per task; the queue: counts, oldest due job, failures, rates, drainers.",
    ),
    "worker": (
        ".queue",
        "worker",
        "Long-running drainer: stands by while another is active, takes over when it stops or "
        "dies (with --shared: active beside the queue's other shared drainers at once).",
    ),
}


def _database_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the database's (a connection's OSError or timeout, SQLAlchemy's
    DBAPIError). SQLAlchemy's class is looked for only where SQLAlchemy was imported: a
    command that never imported it cannot have raised one."""
    sqlalchemy_errors = sys.modules.get("sqlalchemy.exc")
    kinds: tuple[type[BaseException], ...] = (OSError, TimeoutError)
    if sqlalchemy_errors is not None:
        kinds = (*kinds, sqlalchemy_errors.DBAPIError)
    return isinstance(exc, kinds)


class CronlockGroup(click.Group):
    """Turns cronlock's errors into one line on stderr and exit code 2, and loads each
    command when it runs (``COMMANDS``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attribute, _ = COMMANDS[cmd_name]
        command: click.Command = getattr(importlib.import_module(module, __name__), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, from the summaries: it imports no command."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            # click's own shortening, through its public API (click.utils's helper is
            # deprecated in click 8.5).
            (name, click.Command(name, help=summary).get_short_help_str(limit))
            for name, (_, _, summary) in sorted(COMMANDS.items())
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            own = {opt for param in command.params for opt in param.opts}
            misplaced = [
                arg
                for arg in rest
                if arg.partition("=")[0] in _GLOBAL_OPTIONS and arg.partition("=")[0] not in own
            ]
            if misplaced:
                option = misplaced[0].partition("=")[0]
                raise click.UsageError(
                    f"{option} is an option of cronlock itself: put it before the command "
                    f"(cronlock {option} … {name} …)",
                    ctx,
                )
        return name, command, rest

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CronlockError as exc:
            raise UsageFailure(str(exc)) from None
        except BrokenPipeError:  # stdout closed early (`| head`): nothing left to say
            sys.stderr.close()
            sys.exit(EXIT_OK)
        except Exception as exc:
            if not _database_error(exc):
                raise
            original = getattr(exc, "orig", None) or exc
            raise UsageFailure(f"database error: {type(original).__name__}: {original}") from None


@click.group(cls=CronlockGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--app",
    "app_spec",
    envvar="CRONLOCK_APP",
    default=None,
    help="MODULE[:ATTR] holding the cronlock App (env CRONLOCK_APP; default: tasks).",
)
@click.option(
    "--database-url",
    envvar="CRONLOCK_DATABASE_URL",
    help="postgresql://… (env CRONLOCK_DATABASE_URL; default: the embedded PostgreSQL).",
)
@click.option("--schema", envvar="CRONLOCK_SCHEMA", help="PostgreSQL schema for cronlock's tables.")
@click.option(
    "--pgbouncer",
    envvar="CRONLOCK_PGBOUNCER",
    is_flag=True,
    help="The URL is a PgBouncer in transaction mode (env CRONLOCK_PGBOUNCER=1).",
)
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="More logging on stderr: -v cronlock's INFO (a line per job), -vv its DEBUG, -vvv "
    "every library's.",
)
@click.option(
    "--log-format",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    envvar="CRONLOCK_LOG_FORMAT",
    help="Log lines as text or as one JSON object each (env CRONLOCK_LOG_FORMAT).",
)
@click.version_option(package_name="cronlock")
@click.pass_context
def cli(
    ctx: click.Context,
    app_spec: str | None,
    database_url: str | None,
    schema: str | None,
    pgbouncer: bool,
    verbose: int,
    log_format: str,
) -> None:
    """Periodic tasks and a job queue that need nothing but PostgreSQL."""
    logs.configure(verbose, log_format, long_running=ctx.invoked_subcommand in LONG_RUNNING)
    ctx.obj = Options(
        app_spec=app_spec or "tasks",
        app_given=app_spec is not None,
        database_url=database_url,
        schema=schema,
        pgbouncer=pgbouncer,
    )


def main() -> None:
    cli(prog_name="cronlock")
