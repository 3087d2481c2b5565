"""The schema and what the tables record: ``migrate`` and ``status`` (``App.migrate``,
``App.status``)."""

from __future__ import annotations

import json
from typing import Any

import click

from ..app import App
from . import render
from .context import Options, pass_options, run

__all__ = ["migrate", "status"]


@click.command()
@pass_options
def migrate(options: Options) -> None:
    """Create or upgrade cronlock's schema (idempotent)."""
    # Without --app no module needs to import: a bare App only carries the database.
    app = options.load_app() if options.app_given else App()
    database = options.database(app)
    revision = run(app.migrate, app)
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
    app = options.load_app()
    options.database(app)
    report: dict[str, Any] = run(lambda: app.status(limit=limit), app)
    if as_json:
        click.echo(json.dumps(report))
        return
    for line in render.describe_status(report):
        click.echo(line)
