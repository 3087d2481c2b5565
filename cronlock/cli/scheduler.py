"""``cronlock scheduler``: ``cronlock.serve_scheduler`` with the signals handled."""

from __future__ import annotations

import logging

import click

from .. import schema
from ..scheduler import DEFAULT_SHUTDOWN_GRACE, Scheduler
from ..service import serve_scheduler
from . import render
from .context import Options, pass_options, run

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
@pass_options
def scheduler(
    options: Options, task_names: tuple[str, ...], shutdown_grace: float, with_drainer: bool
) -> None:
    """Long-running: fire every periodic task on time (APScheduler); SIGTERM is graceful.

    Each firing takes the same path as `cronlock run` (advisory lock, slot claim, savepoints),
    so several schedulers and crontab lines may fire the same task: one run per slot. On start,
    slots missed while no scheduler ran are handled by each task's misfire policy.
    """
    app = options.load_app()
    for name in task_names:
        app.task(name)  # an unknown task fails before any connection is made
    database = options.database(app)

    async def go() -> None:
        await schema.ensure_ready(database)
        daemon = Scheduler(app, tasks=task_names or None, shutdown_grace=shutdown_grace)
        names = [task.name for task in daemon.tasks]
        logger.info(
            render.scheduler_started(names, database, with_drainer),
            extra={"action": "scheduler_started"},
        )
        await serve_scheduler(
            daemon, drainer=app.drainer if with_drainer else None, handle_signals=True
        )

    run(go, app)
