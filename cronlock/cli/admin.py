"""The schema and what the tables record: ``migrate``, ``status`` and ``prune``
(``App.migrate``, ``App.status``, ``App.prune``)."""

from __future__ import annotations

from typing import Any

import click

from .. import schema
from ..app import App
from ..errors import ConfigurationError
from ..retention import PruneResult
from . import render
from .context import EXIT_FAILED, Options, emit, exit_with, pass_options, run, run_ready

__all__ = ["migrate", "prune", "prune_now", "status"]


@click.command()
@click.option(
    "--check",
    is_flag=True,
    help="Migrate nothing: exit 1 when a migration is pending, 0 when at head (one line).",
)
@click.option(
    "--sql",
    "as_sql",
    is_flag=True,
    help="Migrate nothing: print the statements from the database's revision to head.",
)
@click.option(
    "--lock-timeout",
    type=click.FloatRange(min=0.01),
    default=0.5,
    show_default=True,
    help="Seconds a statement waits for a lock before its migration is retried.",
)
@click.option(
    "--retry-for",
    type=click.FloatRange(min=0),
    default=600.0,
    show_default=True,
    help="Seconds to keep retrying a migration whose locks are held (then exit 2).",
)
@pass_options
def migrate(
    options: Options, check: bool, as_sql: bool, lock_timeout: float, retry_for: float
) -> None:
    """Create or upgrade cronlock's schema (idempotent), online: no migration blocks the
    queue for more than --lock-timeout."""
    if check and as_sql:
        raise click.UsageError("--check and --sql do not go together")
    # Without --app no module needs to import: a bare App only carries the database.
    app = options.load_app() if options.app_given else App()
    database = options.database(app)
    if check or as_sql:
        current = run(lambda: schema.current_revision(database), app)
        pending = schema.pending_revisions(current)
        if as_sql:
            if pending is None:
                raise ConfigurationError(render.migration_check(database, current, pending))
            click.echo(schema.upgrade_sql(database, current) if pending else "-- at head")
            return
        click.echo(render.migration_check(database, current, pending))
        if pending:
            exit_with(EXIT_FAILED)
        return
    revision = run(lambda: app.migrate(lock_timeout=lock_timeout, retry_for=retry_for), app)
    click.echo(render.migrated(database, revision))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=5,
    show_default=True,
    help="Runs shown per task.",
)
@pass_options
def status(options: Options, as_json: bool, limit: int) -> None:
    """Last runs per task; the queue: counts, oldest due job, failures, rates, drainers."""
    app = options.connected_app()
    report: dict[str, Any] = run(lambda: app.status(limit=limit), app)
    emit(as_json, report, *render.describe_status(report))


def prune_now(options: Options, *, dry_run: bool, as_json: bool) -> None:
    """``cronlock prune`` (and ``cronlock run prune``): prune once, say what went."""
    app = options.load_app()
    if app.retention is None:
        # Before any connection: a usage error, one line (the App raises the same).
        raise ConfigurationError("retention is off for this app (App(retention=False))")
    options.database(app)
    result: PruneResult = run_ready(app, lambda: app.prune(dry_run=dry_run))
    emit(as_json, result.to_dict(), *render.pruned(result))


@click.command()
@click.option("--dry-run", is_flag=True, help="Count what would be removed; remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@pass_options
def prune(options: Options, dry_run: bool, as_json: bool) -> None:
    """The built-in retention now: delete completed jobs older than the app's retention (7
    days by default), failed and cancelled ones (30 days), runs (30 days) and stale worker
    rows, in short batches; say what went. Skipped while another prune runs."""
    prune_now(options, dry_run=dry_run, as_json=as_json)
