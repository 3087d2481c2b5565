"""What every command shares: the global options (the app, its database), the exit codes, and
the one ``asyncio.run``.

Exit codes (DESIGN.md): 0 completed or skipped, 1 the run failed and rolled back, 2 usage or
configuration error (one line on stderr, never a traceback), 3 partial.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from ..errors import InvalidJobOption
from ..outcome import DrainResult, RunResult, RunStatus

if TYPE_CHECKING:
    from ..app import App
    from ..database import Database

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_SIGNAL_BASE",
    "EXIT_USAGE",
    "Options",
    "UsageFailure",
    "emit",
    "exit_code",
    "exit_with",
    "give_up_option",
    "moment",
    "pass_options",
    "run",
    "run_ready",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3
# A drain a signal stopped exits 128 + its number (130 Ctrl-C, 143 SIGTERM), as shells report.
EXIT_SIGNAL_BASE = 128

T = TypeVar("T")


class UsageFailure(click.ClickException):
    exit_code = EXIT_USAGE


@dataclass
class Options:
    """The group's options, given to every command."""

    app_spec: str
    app_given: bool
    database_url: str | None
    schema: str | None
    pgbouncer: bool

    def load_app(self) -> App:
        # Imported here, as in database(): `cronlock --help` reads these options' module and
        # no more (cli/__init__.py's COMMANDS).
        from ..loader import load_app

        return load_app(self.app_spec)

    def connected_app(self) -> App:
        """The app, pointed at the database the options name."""
        app = self.load_app()
        self.database(app)
        return app

    def database(self, app: App | None = None) -> Database:
        """Point ``app`` at the database the options name (without an app: a bare Database),
        resolved as the Python API resolves it (``cronlock.database.resolve``)."""
        from ..database import Database, resolve
        from ..sql.tables import SCHEMA
        from . import render

        resolved = resolve(
            self.database_url,
            app_url=app.database_url if app else None,
            schema=self.schema,
            app_schema=app.schema if app else SCHEMA,
            pgbouncer=self.pgbouncer or None,
        )
        if resolved.server is not None:
            click.echo(render.embedded_note(resolved.server), err=True)
        if app is not None:
            return app.use_database(
                resolved.url, schema=resolved.schema, pgbouncer=resolved.pgbouncer
            )
        return Database(resolved.url, schema=resolved.schema, pgbouncer=resolved.pgbouncer)


pass_options = click.make_pass_decorator(Options)

# ``worker`` and ``scheduler``: how long a lost database is waited for (outage.py).
give_up_option = click.option(
    "--give-up-after",
    type=click.FloatRange(0),
    help="Seconds without the database (a restart, an outage) after which it exits 1; "
    "default: it waits for as long as it takes, reconnecting with backoff.",
)


def run(coro_fn: Callable[[], Awaitable[T]], *closing: App | Database) -> T:
    """The command's coroutine on a loop of its own, closing ``closing`` after it."""
    import asyncio  # here, not at the top: `cronlock --help` needs no event loop

    async def main() -> T:
        try:
            return await coro_fn()
        finally:
            from ..app import App

            for item in closing:
                await (item.aclose() if isinstance(item, App) else item.dispose())

    return asyncio.run(main())


def run_ready(app: App, coro_fn: Callable[[], Awaitable[T]]) -> T:
    """``run``, once the app's database is migrated to head (``schema.ensure_ready``: one
    line and exit 2 when it is not)."""
    from .. import schema

    async def ready() -> T:
        await schema.ensure_ready(app.database)
        return await coro_fn()

    return run(ready, app)


def moment(option: str, value: str | None) -> datetime | None:
    """An option's ISO 8601 time, which must name its zone (``--run-at``, ``--since``)."""
    if value is None:
        return None
    try:
        given = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidJobOption(f"{option}: not an ISO 8601 time: {value!r}") from None
    if given.tzinfo is None:
        raise InvalidJobOption(f"{option}: give a timezone (e.g. {value}+00:00 or {value}Z)")
    return given


def emit(as_json: bool, report: dict[str, Any], *lines: str) -> None:
    """What a command prints: ``report`` as one JSON object with ``--json``, else ``lines``."""
    if as_json:
        click.echo(json.dumps(report))
        return
    for line in lines:
        click.echo(line)


def exit_code(result: RunResult | DrainResult, skipped_exit_code: int = EXIT_OK) -> int:
    """A run's or a drain's exit code: 0 completed (or skipped, or missed), 1 failed (or
    interrupted), 3 partial (for a drain: some attempts failed, the rest committed)."""
    return {
        RunStatus.COMPLETED: EXIT_OK,
        RunStatus.SKIPPED: skipped_exit_code,
        RunStatus.FAILED: EXIT_FAILED,
        RunStatus.PARTIAL: EXIT_PARTIAL,
        RunStatus.MISSED: EXIT_OK,
        # A chunked run that lost its lock: not a success, though its committed chunks stay.
        RunStatus.INTERRUPTED: EXIT_FAILED,
    }[result.status]


def exit_with(code: int) -> NoReturn:
    sys.exit(code)
