"""The periodic tasks' commands: ``run``, ``list``, ``crontab``, ``demo``."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import NoReturn

import click

from ..logs import RUNS_LOGGER
from ..outcome import RunResult
from . import render
from .context import EXIT_OK, Options, emit, exit_code, exit_with, pass_options, run, run_ready

__all__ = ["crontab", "demo", "list_tasks", "run_task"]


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--count",
    type=click.IntRange(1, 100),
    default=3,
    show_default=True,
    help="Next fire times shown per task.",
)
@pass_options
def list_tasks(options: Options, as_json: bool, count: int) -> None:
    """Periodic tasks: name, cron, timezone, lock key, next fire times (their zone and UTC);
    the job types: queue, retries, timeout, handled or only declared."""
    app = options.load_app()
    now = datetime.now(UTC)
    rows = render.task_entries(app, now, count)
    builtin = [] if app.retention is None else [render.retention_entry(app.retention, now, count)]
    job_types = render.job_type_entries(app)
    emit(
        as_json,
        {"tasks": rows, "builtin": builtin, "job_types": job_types},
        *render.task_table(rows, now),
        *(line for entry in builtin for line in render.builtin_lines(entry)),
        "",
        *render.job_type_table(job_types),
    )


@click.command("run")
@click.argument("task")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--skipped-exit-code",
    type=click.IntRange(0, 255),
    default=EXIT_OK,
    show_default=True,
    help="Exit code for a skipped run (for systemd or Kubernetes).",
)
@click.option(
    "--manual",
    is_flag=True,
    help="Run now outside any slot (recorded as manual; claims no slot).",
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds after a fire time that still belong to its slot (default: the task's).",
)
@pass_options
def run_task(
    options: Options,
    task: str,
    as_json: bool,
    skipped_exit_code: int,
    manual: bool,
    grace: float | None,
) -> None:
    """One run of TASK now, under its lock, for the slot it belongs to.

    From crontab the invocation maps to the fire time it is for (up to the task's grace
    late); a slot that already ran is skipped (slot_done). Outside every slot's grace nothing
    runs (skipped, no_slot) unless --manual. TASK may be the built-in `drain` (the job queue:
    see `cronlock drain`) or `prune` (retention: see `cronlock prune`).
    """
    # The built-ins' commands are imported by the built-in that runs: a periodic task's run
    # needs neither the drainer nor retention (issue 26: every crontab line's start-up).
    if task == "prune":
        from .admin import prune_now

        prune_now(options, dry_run=False, as_json=as_json)
        return
    if task == "drain":
        from ..queue.options import DrainOptions
        from ..service import DEFAULT_GRACE_PERIOD
        from .queue import drain_queue

        drain_queue(
            options,
            DrainOptions(),
            max_seconds=None,
            grace_period=DEFAULT_GRACE_PERIOD,
            as_json=as_json,
            skipped_exit_code=skipped_exit_code,
        )
    app = options.load_app()
    app.task(task)  # an unknown task fails before any connection is made
    options.database(app)
    grace_delta = None if grace is None else timedelta(seconds=grace)
    _quiet_run_lines()
    result = run_ready(app, lambda: app.run(task, manual=manual, grace=grace_delta))
    report_run(result, as_json, skipped_exit_code)


def report_run(result: RunResult, as_json: bool, skipped_exit_code: int = EXIT_OK) -> NoReturn:
    """Print a run's outcome (one JSON object, or its lines) and exit with its code."""
    emit(as_json, result.to_dict(), *render.describe(result))
    exit_with(exit_code(result, skipped_exit_code))


@click.command()
@click.option(
    "--directory",
    type=click.Path(file_okay=False),
    help="Project directory the lines cd to, for --app to import (default: this one).",
)
@click.option(
    "--cronlock",
    "cronlock_command",
    help="The command the lines run (default: this environment's cronlock, by absolute path).",
)
@click.option(
    "--log",
    help="File the lines append their output to (default: ~/.local/state/cronlock/cron.log).",
)
@click.option(
    "--env-file",
    help="A file of KEY=value lines (CRONLOCK_DATABASE_URL=…) each line sources: the place "
    "for a password.",
)
@click.option(
    "--cron-timezone",
    help="The zone cron runs in on the host the lines are for (default: this host's).",
)
@click.option("--user", help="System crontab format (/etc/cron.d) with this user field.")
@click.option(
    "--task",
    "task_names",
    multiple=True,
    help="Only this task's line (repeatable; drain and prune are the built-ins' lines).",
)
@pass_options
def crontab(
    options: Options,
    directory: str | None,
    cronlock_command: str | None,
    log: str | None,
    env_file: str | None,
    cron_timezone: str | None,
    user: str | None,
    task_names: tuple[str, ...],
) -> None:
    """Print crontab lines for the registered tasks that run as they are under cron.

    A task in another zone than cron's gets no line and one stderr line saying why; the other
    lines are printed and the exit is 0 (2 when no line at all could be printed)."""
    from .. import crontab as lines

    app = options.load_app()
    setup = lines.setup_for(
        app,
        options.app_spec,
        database_url=options.database_url,
        schema=options.schema,
        pgbouncer=options.pgbouncer,
        directory=directory,
        cronlock=cronlock_command,
        log=log,
        env_file=env_file,
        cron_timezone=cron_timezone,
        user=user,
        tasks=task_names,
    )
    text = lines.render(app, setup)
    for warning in lines.left_out(app, setup) + lines.warnings(setup):
        click.echo(render.warning(warning), err=True)
    click.echo(text, nl=False)


@click.command()
@pass_options
def demo(options: Options) -> None:
    """The whole story on the embedded default, end to end, with a summary."""
    from .. import embedded
    from ..demo import demo_app, run_demo

    app, setup, app_spec = demo_app(options.app_spec if options.app_given else None)
    where = (
        f"the embedded PostgreSQL in {embedded.data_directory()}"
        if options.database_url is None and app.database_url is None
        else "your database"
    )
    database = options.database(app)
    _quiet_run_lines()
    lines = run(lambda: run_demo(app, database, setup, where, app_spec), app)
    for line in lines:
        click.echo(line)


def _quiet_run_lines() -> None:
    """The command prints the run's outcome and every failed item itself: the log lines that
    say the same (``cronlock.runs``) stay quiet unless -v."""
    if logging.getLogger("cronlock").getEffectiveLevel() >= logging.WARNING:
        logging.getLogger(RUNS_LOGGER).setLevel(logging.CRITICAL)
