"""``cronlock embedded status|stop|remove``: the embedded PostgreSQL (``cronlock.embedded``)."""

from __future__ import annotations

import click

from .. import embedded
from . import render

__all__ = ["embedded_group"]


@click.group("embedded")
def embedded_group() -> None:
    """The embedded PostgreSQL (the default with no database configured): status, stop, remove."""


@embedded_group.command("status")
def embedded_status() -> None:
    """Where the embedded server is, who owns it, and whether it is running."""
    click.echo(render.embedded_state(embedded.state()))


@embedded_group.command("stop")
def embedded_stop() -> None:
    """Stop the embedded server (the next command that needs it starts it again)."""
    before = embedded.stop()
    click.echo(render.embedded_stopped(before))


@embedded_group.command("remove")
def embedded_remove() -> None:
    """Stop the embedded server and delete its data directory (everything cronlock made)."""
    before = embedded.remove()
    click.echo(render.embedded_removed(before))
