"""The ``cronlock`` command line (click): the group, its options, errors as exit codes.

``asyncio.run`` lives in this package and nowhere else. Each command parses its options,
calls the library, renders what it got (``render``) and exits with its code (``context``):

    runs       run, list, crontab, demo       the periodic tasks
    queue      enqueue, drain, worker         the job queue
    operate    jobs …, queue …                find and act on jobs, pause and resume queues
    tasks      task …                         pause, resume, run now; parked items
    scheduler  scheduler                      the scheduler daemon
    admin      migrate, status, prune         the schema, what the tables record, retention
    embedded   embedded status|stop|remove    the embedded PostgreSQL
    serve      serve                          the HTTP API (extra 'http')
    bench      bench                          measure cronlock on this database

Exit codes (DESIGN.md): 0 completed or skipped, 1 the run failed and rolled back, 2 usage or
configuration error (one line on stderr, never a traceback), 3 partial; a drain a signal
stopped exits 128 + the signal's number (130 Ctrl-C, 143 SIGTERM).
"""

from __future__ import annotations

import sys
from typing import Any

import click
from sqlalchemy.exc import DBAPIError

from .. import logs
from ..errors import CronlockError
from ..logs import FORMATS
from . import admin, bench, embedded, operate, queue, runs, scheduler, serve, tasks
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


class CronlockGroup(click.Group):
    """Turns cronlock's errors into one line on stderr and exit code 2."""

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
        except (OSError, DBAPIError, TimeoutError) as exc:
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


for _command in (
    admin.migrate,
    runs.list_tasks,
    runs.run_task,
    admin.status,
    runs.crontab,
    runs.demo,
    embedded.embedded_group,
    queue.enqueue,
    queue.drain,
    queue.worker,
    operate.jobs_group,
    operate.queue_group,
    tasks.task_group,
    admin.prune,
    serve.serve,
    bench.bench,
    scheduler.scheduler,
):
    cli.add_command(_command)
del _command


def main() -> None:
    cli(prog_name="cronlock")
