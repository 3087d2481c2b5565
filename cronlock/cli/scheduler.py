"""``cronlock scheduler``: ``cronlock.serve_scheduler`` with the signals handled."""

from __future__ import annotations

import logging

import click

from .. import schema
from ..outage import Reconnect
from ..scheduler import DEFAULT_SHUTDOWN_GRACE, Scheduler
from ..service import serve_scheduler
from . import render
from .context import EXIT_FAILED, Options, exit_with, give_up_option, pass_options, run
from .startup import StartUp

logger = logging.getLogger("cronlock.cli")

__all__ = ["scheduler"]


@click.command()
@click.option(
    "--task",
    "task_names",
    multiple=True,
    help="Fire only this task (repeatable; default: every registered task).",
)
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(min=0),
    default=DEFAULT_SHUTDOWN_GRACE,
    show_default=True,
    help="Seconds a run in flight may take to finish after SIGTERM before it is rolled back.",
)
@click.option(
    "--with-drainer",
    is_flag=True,
    help="Also drain the job queue in this process (a small deployment in one process).",
)
@give_up_option
@pass_options
def scheduler(
    options: Options,
    task_names: tuple[str, ...],
    shutdown_grace: float,
    with_drainer: bool,
    give_up_after: float | None,
) -> None:
    """Long-running: fire every periodic task on time (APScheduler); SIGTERM is graceful.

    Each firing takes the same path as `cronlock run` (advisory lock, slot claim, savepoints),
    so several schedulers and crontab lines may fire the same task: one run per slot. On start,
    slots missed while no scheduler ran are handled by each task's misfire policy, and so are
    slots a database restart or outage kept from running (--give-up-after S: exit 1 after S
    seconds without the database).
    """
    with StartUp().guarded() as startup:
        app = options.load_app()
        for name in task_names:
            app.task(name)  # an unknown task fails before any connection is made
        database = options.database(app)

        async def start() -> Scheduler:
            await schema.ensure_ready(database)
            daemon = Scheduler(
                app,
                tasks=task_names or None,
                shutdown_grace=shutdown_grace,
                reconnect=Reconnect(give_up_after=give_up_after),
            )
            names = [task.name for task in daemon.tasks]
            logger.info(
                render.scheduler_started(names, database, with_drainer),
                extra={"action": "scheduler_started"},
            )
            return daemon

        async def go() -> str | None:
            daemon = await startup.run(start())
            if daemon is None:
                return None
            await serve_scheduler(
                daemon, drainer=app.drainer if with_drainer else None, handle_signals=True
            )
            return daemon.gave_up

        gave_up = run(go, app)
    if gave_up is not None:
        click.echo(gave_up, err=True)
        exit_with(EXIT_FAILED)
    if startup.received is not None:
        click.echo(f"scheduler: stopped by {startup.received.name} during start-up", err=True)
